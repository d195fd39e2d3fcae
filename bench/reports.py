"""Year-long usage reports on a busy daemon (issue 44's rows "reports under load" and "RSS after
reports"), each measured as ratios in one run:

- under load: while `wrk` loads `/status` (32 connections), one client asks `days`-day reports
  by day (the slowest grouping) back to back, each an hour shorter than the last so that each
  is read; the reports' time (median, max) and `/status`'s p99 against `wrk` alone just
  before, at the daemon's own priority for its reports' thread (Config.usage_report_nice), and
  at each of `NICES` (the thread reniced from here: what two cores allow at each);
- memory: bench/reportmemory.py's burst of eight clients against a daemon as it starts itself,
  and against one told to keep Python's own allocator (PYTHONMALLOC=pymalloc); RSS idle, at
  its highest and 30 s after;
- which part gives memory back (`--variants`): the reader alone, in a process of its own per
  variant, with SQLite's page cache bounded or not, its connection let go when idle or not,
  under each allocator.

    python -m bench.reports [--store DIR] [--days 365] [--seconds 10] [--variants]

Without --store, a store of `--days` days of 8 GPUs is written first (bench/usage.py's fill).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from . import reportmemory
from .harness import ROOT, Daemon, have_wrk, middle, ratio, wrk
from .usage import fill, store

NICES = (19, 10, 5, 0)  # the reports' thread's priorities weighed (0: the daemon's own)


def load() -> float:
    """The machine's load average over the last minute (a shared machine: said beside each
    figure)."""
    with open("/proc/loadavg", encoding="ascii") as f:
        return float(f.read().split()[0])


def reader_thread(pid: int, nice: int) -> int | None:
    """The thread id of the daemon's reports' thread: the one thread at `nice` (the daemon's
    Config.usage_report_nice); None if there is not exactly one."""
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[16]) == nice:  # field 19 of stat, the 17th after the name
            found.append(int(tid))
    return found[0] if len(found) == 1 else None


def reports_during(
    daemon: Daemon, days: int, seconds: float, start: int, by: str = "day"
) -> dict[str, Any]:
    """`/status` under wrk while one client asks `days`-day reports by day back to back (the
    first `start` hours short of `days`): wrk's figures, and each report's seconds."""
    stop, took = threading.Event(), []

    def reporting() -> None:
        n = start
        while not stop.is_set():
            began = time.monotonic()
            daemon.ok(f"/usage?since={days * 24 - n % 720}h&by={by}")
            took.append(time.monotonic() - began)
            n += 1

    thread = threading.Thread(target=reporting, daemon=True)
    thread.start()
    try:
        status = wrk(daemon.url + "/status", seconds)
    finally:
        stop.set()
        thread.join(120)
    return {"status": status, "took": took}


def under_load(
    daemon: Daemon,
    days: int,
    seconds: float,
    own_nice: int,
    rounds: int,
    nices: tuple[int, ...],
    by: str = "day",
) -> dict[str, Any]:
    """At the daemon's own priority (`own`) and at each of `nices`: `rounds` turns of wrk
    alone, then wrk with reports; the reports' median and slowest, /status's p99 during over
    alone (the medians of the turns)."""
    daemon.ok(f"/usage?since={days * 24}h&by=day")  # the reports' thread is made
    tid = reader_thread(daemon.process.pid, own_nice) if daemon.process else None
    found: dict[str, Any] = {}
    asked = 1
    for nice in ("own", *nices):
        if nice != "own":
            if tid is None:
                found[str(nice)] = {"skipped": "the reports' thread was not found"}
                continue
            try:
                os.setpriority(os.PRIO_PROCESS, tid, int(nice))
            except OSError as exc:  # lowering a niceness needs CAP_SYS_NICE
                found[str(nice)] = {"skipped": f"cannot renice the reports' thread: {exc}"}
                continue
        alone, during, took, loads = [], [], [], []
        for _ in range(rounds):
            loads.append(load())
            alone.append(wrk(daemon.url + "/status", seconds)["p99_ms"])
            turn = reports_during(daemon, days, seconds, asked, by)
            asked += len(turn["took"]) + 1
            during.append(turn["status"]["p99_ms"])
            took += turn["took"]
        p99_alone, p99_during = middle(alone), middle(during)
        found[str(nice)] = {
            "reports": len(took),
            "report_s": {
                "median": round(statistics.median(took), 3) if took else None,
                "max": round(max(took), 3) if took else None,
            },
            "status_p99_ms": {"alone": p99_alone, "during": p99_during},
            "p99_ratio": ratio(p99_during, p99_alone),
            "load": loads,
        }
    return found


def memory(
    daemon: Daemon,
    days: int,
    seconds: float,
    marks: tuple[int, ...] = (1, 15, 30),
    settle: float = 3.0,
) -> dict[str, Any]:
    """bench/reportmemory.py's burst, with the machine's load; what stays above idle the last
    of `marks` seconds after (30; 12 in quick mode: past the reader's letting go at 10 s, and
    RSS only falls after it, so a figure at 12 s is no better than one at 30 s), idle read
    `settle` s after the daemon's first answers (1 s in quick mode)."""
    before = load()
    found = reportmemory.measure(daemon, days, 8, seconds, marks, settle)
    found["load"] = [before, load()]
    found["above_idle_after_s"] = marks[-1]
    found["above_idle_mib"] = round(found["after_mib"][f"{marks[-1]}s"] - found["idle_mib"], 1)
    return found


def started(directory: str, environment: dict[str, str]) -> Daemon:
    """A daemon on the store in `directory`, with `environment` added to its own."""
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    try:
        return Daemon(8, state_dir=directory).start()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def measure(
    directory: str,
    days: int,
    seconds: float,
    rounds: int,
    burst: float,
    whole: bool = True,
    by: str = "day",
) -> dict[str, Any]:
    """Both measures against daemons on the store in `directory`; not `whole` (quick mode):
    at the daemon's own priority alone, and its burst on the allocator it starts itself on."""
    from patroller.config import Config

    results: dict[str, Any] = {"days": days}
    daemon = started(directory, {})
    try:
        if have_wrk():
            results["under_load"] = under_load(
                daemon, days, seconds, Config.usage_report_nice, rounds, NICES if whole else (), by
            )
        else:
            results["under_load"] = {"skipped": "wrk is not installed"}
    finally:
        daemon.stop()
    # each burst on a daemon of its own, so that idle is idle
    allocators = (("memory", {}), ("memory_pymalloc", {"PYTHONMALLOC": "pymalloc"}))
    for key, environment in allocators if whole else allocators[:1]:
        daemon = started(directory, environment)
        try:
            results[key] = (
                memory(daemon, days, burst)
                if whole
                else memory(daemon, days, burst, (1, 12), settle=1.0)
            )
        finally:
            daemon.stop()
    return results


def reports(ctx: Any) -> dict[str, Any]:
    """The reports step of the benchmark: 30 days in quick mode (the daemon as it is, no
    sweep of priorities nor of allocators; a burst of 5 s rather than 20, idle read 1 s after
    the daemon's first answers rather than 3, RSS 12 s after the burst rather than 30), a year
    in full mode."""
    days = 30 if ctx.quick else 365
    directory = tempfile.mkdtemp(prefix="pbench-reports")
    try:
        filled = store(ctx, directory, 8, days)
        ctx.log(
            f"reports: {days} days of 8 GPUs "
            + ("copied from the usage step's store" if filled.get("copied") else "written")
            + f" (written in {filled['write_s']} s)"
        )
        found = measure(
            directory,
            days,
            ctx.wrk_seconds,
            1 if ctx.quick else 2,
            5 if ctx.quick else 20,  # the burst's seconds: a 30-day report takes 0.1 s
            whole=not ctx.quick,
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ctx.log(f"reports: {json.dumps(found)}")
    return found


# -- which part gives memory back: the reader alone, a process per variant ----------------------

VARIANT = r"""
import asyncio, json, sys, time
from dataclasses import replace
from patroller.config import Config
from patroller.state.usage.reader import Reader
from bench.harness import rss_mib
import os

path, days, cache_kib, let_go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
reader = Reader(path, replace(Config(), usage_reader_cache_kib=cache_kib))
BY = ["user", "day", "job", "gpu", "account", ("day", "user")]

async def main():
    from datetime import timezone
    now = time.time()
    before = rss_mib(os.getpid())
    for n in range(36):
        by = BY[n % len(BY)]
        zone = timezone.utc if isinstance(by, tuple) else None
        await reader.read(now - days * 86400 + n * 3600, now, by, zone)
    await reader.read(now - 3600, now, "user", None)  # the last answer is held meanwhile: small
    peak = rss_mib(os.getpid())
    if let_go:
        reader._thread.submit(reader._let_go).result()
    print(json.dumps({"start_mib": round(before, 1), "peak_mib": round(peak, 1),
                      "after_mib": round(rss_mib(os.getpid()), 1)}))

asyncio.run(main())
"""


def variants(directory: str, days: int) -> list[dict[str, Any]]:
    """The reader alone over the store in `directory`, 36 reports of six groupings, in a fresh
    process per variant: the page cache at SQLite's 2 MiB or bounded to 256 KiB, the connection
    kept or let go (with the heap trimmed), under Python's allocator and the C library's."""
    path = os.path.join(directory, "usage.sqlite3")
    rows = []
    for allocator in ("pymalloc", "malloc"):
        for cache_kib in (2048, 256):
            for let_go in (False, True):
                out = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        VARIANT,
                        path,
                        str(days),
                        str(cache_kib),
                        str(int(let_go)),
                    ],
                    env={**os.environ, "PYTHONPATH": ROOT, "PYTHONMALLOC": allocator},
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=ROOT,
                )
                row = json.loads(out.stdout)
                row.update(allocator=allocator, cache_kib=cache_kib, let_go=let_go, load=load())
                row["above_start_mib"] = round(row["after_mib"] - row["start_mib"], 1)
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reports")
    parser.add_argument("--store", help="a directory holding usage.sqlite3 (else one is made)")
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--seconds", type=float, default=10.0, help="each wrk run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--burst", type=float, default=20.0, help="the memory burst's seconds")
    parser.add_argument("--variants", action="store_true", help="the reader alone, per variant")
    parser.add_argument("--by", default="day", help="the reports' grouping under load")
    args = parser.parse_args(argv)
    directory = args.store or tempfile.mkdtemp(prefix="pbench-reports")
    try:
        if args.store is None:
            fill(directory, 8, args.days, int(time.time()) // 60 * 60)
        if args.variants:
            print(json.dumps(variants(directory, args.days)))
        else:
            found = measure(
                directory, args.days, args.seconds, args.rounds, args.burst, by=args.by
            )
            print(json.dumps(found))
    finally:
        if args.store is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# -- the rows of the benchmark's table (__main__.py) --------------------------------------------


def checks(r: dict[str, Any]) -> list[tuple[str, Any, str, Any]]:
    """The targets of issue 44: a report under load, /status meanwhile, and RSS after."""
    own = (r.get("reports") or {}).get("under_load", {}).get("own") or {}
    days = (r.get("reports") or {}).get("days", 365)
    burst = (r.get("reports") or {}).get("memory") or {}
    after, mark = burst.get("above_idle_mib"), burst.get("above_idle_after_s", 30)
    return [
        (
            f"reports under load: a {days}-day GET /usage by day s (max) while wrk loads /status",
            (own.get("report_s") or {}).get("max"),
            "< 1",
            lambda v: v < 1,
        ),
        (
            "reports under load: /status p99 as a multiple of without",
            own.get("p99_ratio"),
            "<= 1.5",
            lambda v: v <= 1.5,
        ),
        (
            f"RSS after reports: MiB above idle {mark} s after 8 clients' {days}-day reports",
            after,
            "<= 10",
            lambda v: v <= 10,
        ),
    ]


def figures(found: dict[str, Any]) -> list[tuple[str, Any]]:
    """The figures behind them: each priority of the reports' thread; RSS under each allocator."""
    rows: list[tuple[str, Any]] = []
    for nice, row in (found.get("under_load") or {}).items():
        if "report_s" in row:
            rows.append(
                (
                    f"{found.get('days')}-day reports by day under /status load, the reports' "
                    f"thread at nice {nice}: s median, max; /status p99 ms alone, during; load",
                    f"{row['report_s']['median']}, {row['report_s']['max']}; "
                    f"{row['status_p99_ms']['alone']}, {row['status_p99_ms']['during']}; "
                    f"{row['load']}",
                )
            )
    for key, allocator in (("memory", "as it starts itself"), ("memory_pymalloc", "pymalloc")):
        row = found.get(key) or {}
        if "idle_mib" in row:
            rows.append(
                (
                    f"RSS MiB around a burst of reports ({allocator}): idle, highest, "
                    + ", ".join(mark.replace("s", " s") for mark in row["after_mib"])
                    + " after",
                    f"{row['idle_mib']}, {row['peak_mib']}, "
                    + ", ".join(str(mib) for mib in row["after_mib"].values()),
                )
            )
    return rows
