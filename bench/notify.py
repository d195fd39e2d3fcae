"""What telling people costs: /status beside an event storm, and the watch's look at every hold.

The storm: a test-mode daemon (its own process, `python -m bench.notify serve`) with one
`--notify` destination, a webhook that takes 5 s to answer each notice (a thread of this
process), and its state directory (the outbox on). With `--events N` the daemon's own loop
hands N trespass events a second (each a new episode: a new user on one of its GPUs) to the
notifier, as the lease rules would, and no destination's rate holds any back: every notice
goes through the words, the episodes, the outbox and a full queue, where most are dropped and
counted. wrk measures /status without the storm and with it, in turn, `rounds` times (a shared
machine's load changes). The storm runs FILL_S seconds first, so that the episodes remembered
(10,000 at most) are full: the daemon's RSS, read before and after each run, then shows whether
its memory is bounded.

The watch: in this process, the notifier's look for idle and ending holds and trespasses to
escalate (`Notifier.check`, on the loop every 30 s) over 256 GPUs, every one held (half for a
duration ending soon, all computing nothing for hours) and 5,000 processes: the CPU time of one
look, the first (which finds every hold due) and the next ones (each episode told already).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .harness import ROOT, have_wrk, listening_port, rss_mib, wrk

ANSWER_AFTER = 5.0  # seconds the slow destination takes to answer each notice
FILL_S = 12.0  # seconds of the storm before it is measured: 10,000 episodes remembered


class SlowHook:
    """A webhook that answers every POST after ANSWER_AFTER seconds."""

    def __init__(self) -> None:
        self.received = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.received += 1
                time.sleep(ANSWER_AFTER)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"json://127.0.0.1:{self._server.server_address[1]}/hook"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def storm(ctx: Any) -> dict[str, Any]:
    """/status p99 and throughput without and with 1,000 events a second; memory after."""
    if not have_wrk():
        return {"skipped": "wrk is not installed"}
    hook = SlowHook()
    rounds = 2 if ctx.quick else 3
    seconds = ctx.wrk_seconds
    found: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    try:
        for _ in range(rounds):
            for mode, events in (("without", 0), ("with", 1000)):
                found[mode].append(_one_run(hook.url, events, seconds))
    finally:
        hook.close()

    def median(rows: list[dict[str, Any]], *path: str) -> float | None:
        values = [_dig(row, path) for row in rows]
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    without = median(found["without"], "status", "p99_ms")
    during = median(found["with"], "status", "p99_ms")
    ctx.log(f"notify storm: /status p99 {without} ms without, {during} ms with 1,000 events/s")
    return {
        "rounds": rounds,
        "seconds": seconds,
        "answer_after_s": ANSWER_AFTER,
        "runs": found,
        "p99_ms": {"without": without, "with": during},
        "p99_ratio": round(during / without, 3) if without and during else None,
        "requests_per_s": {
            "without": median(found["without"], "status", "requests_per_s"),
            "with": median(found["with"], "status", "requests_per_s"),
        },
        "events_per_s": median(found["with"], "events_per_s"),
        "rss_growth_mib": _growth(found["with"]),
        "rss_growth_mib_without": _growth(found["without"]),
    }


def _growth(rows: list[dict[str, Any]]) -> float | None:
    """The most the daemon's RSS grew during one measured run."""
    return (
        round(max((row["rss_after_mib"] - row["rss_before_mib"] for row in rows), default=0.0), 2)
        if rows
        else None
    )


def _dig(row: dict[str, Any], path: Any) -> float | None:
    value: Any = row
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) else None


def _one_run(url: str, events: int, seconds: float) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="pbench-notify")
    os.chmod(directory, 0o700)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.notify",
            "serve",
            "--url",
            url,
            "--events",
            str(events),
            "--state-dir",
            directory,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(directory, "log"), "w"),  # noqa: SIM115 (the child owns it)
    )
    try:
        deadline = time.monotonic() + 30
        port = 0
        while not port and time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError("the daemon exited: " + _log(directory))
            port = listening_port(process.pid)
            time.sleep(0.05)
        if not port:
            raise RuntimeError("the daemon did not start: " + _log(directory))
        base = f"http://127.0.0.1:{port}"
        # the storm under way: the queue full, and as many episodes remembered as may be
        time.sleep(FILL_S if events else 1.0)
        before = rss_mib(process.pid)
        counted = _notifications(base)
        began = time.monotonic()
        status = wrk(base + "/status", seconds)
        took = time.monotonic() - began
        after = rss_mib(process.pid)
        ended = _notifications(base)
        told = sum(
            ended["by_kind"].get("trespass", {}).get(r, 0) for r in ("queued", "dropped")
        ) - sum(counted["by_kind"].get("trespass", {}).get(r, 0) for r in ("queued", "dropped"))
        return {
            "events": events,
            "status": status,
            "rss_before_mib": before,
            "rss_after_mib": after,
            "events_per_s": round(told / took) if events else 0,
            "pending": ended["pending"],
            "dropped": ended["by_kind"].get("trespass", {}).get("dropped", 0),
        }
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _notifications(base: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(base + "/metrics.json", timeout=30) as response:
        return json.loads(response.read())["notifications"]


def _log(directory: str) -> str:
    with open(os.path.join(directory, "log"), encoding="utf-8", errors="replace") as f:
        return f.read()[-2000:]


# -- the daemon of the storm (python -m bench.notify serve) -----------------------------------


async def _serve(url: str, events: int, state_dir: str) -> None:
    from dataclasses import replace

    from tornado.ioloop import PeriodicCallback

    from patroller.app import build
    from patroller.config import Config
    from patroller.core.leases import Event

    config = replace(
        Config(test=True, port=0, address="127.0.0.1"),
        notify=(url,),
        notify_events=("trespass",),
        notify_escalate=0,
        notify_rate=10**9,
        state_dir=state_dir,
        usage="none",
        max_connections_per_caller=1_000_000,
    )
    daemon = await build(config)
    daemon.start()
    daemon.listen(0, "127.0.0.1", None)
    notifier = daemon.services.notifier
    assert notifier is not None
    devices = [(d.uuid, d.number) for d in daemon.services.inventory]
    count = [0]
    every = 0.01  # seconds between ticks; each hands over the events due since the last
    due = [time.monotonic(), 0.0]

    def storm() -> None:
        now = time.monotonic()
        due[1] += events * (now - due[0])
        due[0] = now
        for _ in range(int(due[1])):
            due[1] -= 1
            count[0] += 1
            uuid, number = devices[count[0] % len(devices)]
            notifier.on_event(
                Event(
                    "trespass",
                    f"user{count[0]}",
                    ((uuid, number),),
                    {"pid": 100_000 + count[0], "holder": "alice"},
                )
            )

    if events:
        PeriodicCallback(storm, every * 1000).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await daemon.stop(config.shutdown_grace)


def watch_cost(ctx: Any, gpus: int = 256, processes: int = 5000) -> dict[str, Any]:
    """The CPU time of the notifier's watch over every hold, first and after."""
    return asyncio.run(_watch_cost(gpus, processes, 3 if ctx.quick else 20))


async def _watch_cost(gpus: int, processes: int, repeats: int) -> dict[str, Any]:
    from dataclasses import replace

    from patroller.config import Config, policy_of
    from patroller.core.identity import Identity
    from patroller.core.leases import LeaseManager
    from patroller.notify import Notifier
    from patroller.observe.testmode import synthetic_inventory

    now = [1_800_000_000.0]
    clock = lambda: now[0]
    config = replace(Config(), notify=("json://127.0.0.1:9/x",))
    inventory = synthetic_inventory(gpus)
    leases = LeaseManager(
        inventory,
        lease=config.lease,
        policy=policy_of(config),
        max_waiters=config.max_waiters,
        max_waiting_per_user=config.max_waiting_per_user,
        clock=clock,
    )
    devices = list(inventory)
    for n in range(len(devices)):
        who = Identity(
            user=f"user{n % 40}", source="host", account=f"user{n % 40}", uid=2000 + n % 40
        )
        leases.request(who, {"gpu": 1}, duration=600.0 if n % 2 else None)
    for n in range(processes):
        device = devices[n % gpus]
        owner = Identity(
            user=f"user{n % gpus % 40}",
            source="host",
            account=f"user{n % gpus % 40}",
            uid=2000 + n % gpus % 40,
        )
        leases.process_started(device.uuid, 100_000 + n, owner, "python")
    told: list[str] = []
    notifier = Notifier(
        config,
        "bench",
        None,
        None,
        leases=leases,
        quiet_for=lambda uuid: 5 * 3600.0,
        clock=clock,
        senders=[lambda title, body: told.append(title) or True],
    )
    notifier.start()
    try:
        began = time.thread_time()
        notifier.check()
        first = time.thread_time() - began
        took = []
        for _ in range(repeats):
            now[0] += config.notify_check_every
            began = time.thread_time()
            notifier.check()
            took.append(time.thread_time() - began)
        notices = notifier.metrics()
    finally:
        notifier.stop(5)
    return {
        "gpus": gpus,
        "processes": processes,
        "first_ms": round(first * 1000, 2),
        "next_ms": {
            "median": round(statistics.median(took) * 1000, 3),
            "max": round(max(took) * 1000, 3),
        },
        "notices_first": sum(
            k.get("queued", 0) + k.get("dropped", 0) for k in notices["by_kind"].values()
        ),
        "repeats": notices["repeats"],
    }


def notify(ctx: Any) -> dict[str, Any]:
    """The step: the watch's cost, then the storm."""
    found: dict[str, Any] = {"watch": watch_cost(ctx)}
    ctx.log(
        f"notify watch at 256 GPUs + 5000 processes: first {found['watch']['first_ms']} "
        f"ms, next {found['watch']['next_ms']['max']} ms (max)"
    )
    found["storm"] = storm(ctx)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.notify")
    parser.add_argument("what", choices=["serve"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--events", type=int, default=0)
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.url, args.events, args.state_dir))


if __name__ == "__main__":
    main()
