"""The fleet at 1,010 hosts on a busy machine: the fleet step's hosts (real test-mode daemons,
topped up to 1,000 with replicas, plus 5 refusing and 5 silent; bench/fleet.py), asked for
/fleet.json by wrk (4 connections, gzip accepted as by the page) first on the machine as it is,
then beside a CPU burner (BURNERS processes that spin, a run queue of about 20 on two cores);
and `patroller status --hosts` over up to 300 live hosts plus 5 refusing and 5 silent, with
and without the burner. One run, each figure beside its run queue (/proc/loadavg's runnable
count, sampled while it ran) and its one-minute load.

PBENCH_FLEET_BEFORE names another checkout (the code before a change): a second fleet daemon
from it over the same hosts, and its command line, are measured beside this one's, in turn.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .fleet import GZIP, INTERVAL, TestDaemon, fleet_hosts, status_hosts, stop_all
from .harness import ROOT, have_wrk, ratio, wrk

BURNERS = 18  # spinning processes: with the daemons, wrk and the rest, a run queue of ~20
LIVE = 300  # hosts `status --hosts` asks (real daemons first, then replicas)
NO_ANSWER = "no answer in the run"


class Load:
    """/proc/loadavg sampled every 0.2 s while a measurement runs: runnable tasks (mean, max)
    and the one-minute load at its end."""

    def __init__(self) -> None:
        self.runnable: list[int] = []
        self.last = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            with open("/proc/loadavg", encoding="ascii") as f:
                fields = f.read().split()
            self.runnable.append(int(fields[3].split("/")[0]) - 1)  # less this reader
            self.last = float(fields[0])

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def said(self) -> dict[str, float]:
        runnable = self.runnable or [0]
        return {
            "runnable_mean": round(sum(runnable) / len(runnable), 1),
            "runnable_max": max(runnable),
            "load1": self.last,
        }


@contextlib.contextmanager
def burning(count: int) -> Iterator[None]:
    """`count` processes that spin until stopped."""
    burners = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    try:
        if burners:
            time.sleep(1.0)  # all on the run queue
        yield
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


def measured(what: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    with Load() as load:
        result = what()
    return {**result, **load.said()}


def heard(daemon: TestDaemon, wanted: int, deadline: float) -> None:
    """Wait until the fleet daemon hears 90% of `wanted` hosts at least."""
    while json.loads(daemon.get("/fleet.json"))["totals"]["answering"] < 0.9 * wanted:
        if time.monotonic() > deadline:
            raise RuntimeError("the fleet daemon of PBENCH_FLEET_BEFORE hears too few hosts")
        time.sleep(0.5)


def fleet_at_load(ctx: Any) -> dict[str, Any]:
    if not have_wrk():
        return {"skipped": "wrk is not installed"}
    root = os.environ.get("PBENCH_FLEET_ROOT", ROOT)
    before = os.environ.get("PBENCH_FLEET_BEFORE")
    seconds = ctx.wrk_seconds
    old: TestDaemon | None = None
    # quick: 10 real daemons, replicas the other 990 hosts (the fleet step does the same)
    with fleet_hosts(root, 1000, 10 if ctx.quick else LIVE, ctx.log, ctx) as farm:
        if farm.skipped:
            return {"skipped": farm.skipped}
        result: dict[str, Any] = farm.described()
        assert farm.poller is not None
        sides = {"": (root, farm.poller)}
        try:
            if before:
                old = TestDaemon(before, "--fleet-file", farm.listing, "--fleet-interval", "5")
                heard(old.wait(time.monotonic() + 120), len(farm.hosts), time.monotonic() + 120)
                sides["_before"] = (before, old)
                result["before"] = before
            time.sleep(INTERVAL)  # a whole round in the steady state
            live = farm.hosts[:LIVE]
            runs = 2 if ctx.quick else 5
            for phase in ("quiet", "burning"):
                with burning(BURNERS if phase == "burning" else 0):
                    for side, (code, daemon) in sides.items():
                        url = daemon.url + "/fleet.json"
                        result[f"fleet_json_{phase}{side}"] = measured(
                            lambda url=url: wrk(url, seconds, 4, [GZIP])
                        )
                        result[f"status_hosts_{phase}{side}"] = measured(
                            lambda code=code: status_hosts(
                                code, live, farm.refusing, farm.quiet, runs
                            )
                        )
        finally:
            if old is not None:
                stop_all([old])
    result["burners"] = BURNERS
    for side in sides:
        result[f"p99_ratio{side}"] = ratio(
            result[f"fleet_json_burning{side}"]["p99_ms"],
            result[f"fleet_json_quiet{side}"]["p99_ms"],
        )
    return result


def checks(r: dict[str, Any]) -> list[tuple[str, Any, str, Callable[[Any], bool]]]:
    """The table's rows of this step: (what, measured, goal, met)."""
    return [
        (
            "/fleet.json p99 ms, 1,010 hosts at load (a CPU burner: run queue "
            f"{_get(r, 'fleet_json_burning', 'runnable_mean')})",
            _answered_p99(r.get("fleet_json_burning")),
            "< 50",
            lambda v: isinstance(v, (int, float)) and v < 50,
        ),
        (
            f"patroller status --hosts s (max), {min(LIVE, r.get('hosts', 1010) - 10)} live + "
            "5 refusing + 5 silent, at load (the same burner)",
            _get(r, "status_hosts_burning", "max_s"),
            "< 2",
            lambda v: v < 2,
        ),
    ]


def figures(r: dict[str, Any]) -> list[tuple[str, Any]]:
    """The other figures: each side and phase with its run queue and one-minute load."""
    found: list[tuple[str, Any]] = []
    for side, said in (("", "this code"), ("_before", f"before ({r.get('before')})")):
        for phase in ("quiet", "burning"):
            w, h = r.get(f"fleet_json_{phase}{side}"), r.get(f"status_hosts_{phase}{side}")
            if not w or not h:
                continue
            found.append(
                (
                    f"1,010 hosts, {said}, {'a CPU burner' if phase == 'burning' else 'no burner'}"
                    ": /fleet.json p99 ms (req/s); status --hosts s median, max, no answer yet; "
                    "run queue, load",
                    f"{w['p99_ms']} ({w['requests_per_s']}/s); {h['median_s']}, {h['max_s']}, "
                    f"{h['shown_no_answer_yet']}; {w['runnable_mean']}/{h['runnable_mean']}, "
                    f"{h['load1']}",
                )
            )
    return found


def _answered_p99(run: dict[str, Any] | None) -> float | str | None:
    """A wrk run's p99, or NO_ANSWER where nothing was answered in the run (wrk then says 0 ms,
    which is no latency met); None where it did not run."""
    if not run:
        return None
    if not run.get("requests_per_s"):
        return NO_ANSWER
    p99: float = run["p99_ms"]
    return p99


def _get(r: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        r = r.get(key) if isinstance(r, dict) else None  # type: ignore[assignment]
    return r
