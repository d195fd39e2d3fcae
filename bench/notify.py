"""What telling people costs: /status beside an event storm, and the watch's look at every hold.

The storm: a test-mode daemon (its own process, `python -m bench.notify serve`) with one
`--notify` destination, a webhook that takes 5 s to answer each notice (a thread of this
process), and its state directory (the outbox on). With `--events N` the daemon's own loop
hands N trespass events a second (each a new episode: a new user on one of its GPUs) to the
notifier, as the lease rules do (through its turns: notify/turns.py). Three storms (STORMS):
`with`, no destination's rate and no escalation holds any back: every notice goes through the
words, the episodes, the outbox and a full queue, where most are dropped and counted;
`with_rate`, the default rate (10 notices in 10 minutes), which holds almost all back;
`with_defaults`, the default rate and escalation (a trespass waits 30 minutes before it
reaches the admin). Each storm has a daemon of its own:
SIGUSR1 starts its storm, which first fills the episodes remembered (10,000 at most, a thousand
events a tick) and, once the notifier has handled them all, says so by a file in its state
directory, then waits for the bench's
schedule (windows.py): quarter-seconds in cycles of three, in an order shuffled in each cycle,
one without the storm, one without it again (the control), one with it. The daemon storms in
the windows `with` alone, while one run of wrk measures /status throughout, each request
counted in the window it began in. Each arm's p99 is that of all its windows' requests; the
storm's ratio is its p99 over the p99 without, with a 90% interval from resampling the cycles;
the control's ratio, measured alike, is how far apart the same work reads in the windows of
the same run: a storm's ratio within the control's reach is no effect shown. The daemon's
memory is read every half second: what it holds (its heap, the bytes the C library's allocator
handed out and did not have back, which the daemon itself reads: _sample_heap) and its RSS,
each one's growth in the run's first quarter (the warm-up) and after it. The row judges the
heap: a leak grows it with every event, where the RSS also rises by the allocator's steps of
free memory kept (1.13 MiB each, at times in the run that differ from run to run).
Quick mode measures four cycles of the storm and without, no control; the full mode two hundred
cycles with the control (150 s a storm).

The cost: in this process, a test-mode daemon's notifier handed 20,000 trespass events (5,000 in
quick mode) in each storm's settings, the loop's thread time per event (the best of three):
the figure wrk's p99 moves around on a loaded two-core machine.

The rewrite: in this process, the outbox's journal written anew with 10,000 episodes told (as
its writer does every 40,000 lines in a storm): the thread time and wall time, the best of five.

The watch: in this process, the notifier's look for idle and ending holds and trespasses to
escalate (`Notifier.check`, on the loop every 30 s) over 256 GPUs, every one held (half for a
duration ending soon, all computing nothing for hours) and 5,000 processes: the CPU time of one
look, the first (which finds every hold due) and the next ones (each episode told already).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
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

from patroller.core.leases import Event

from . import windows
from .harness import ROOT, have_wrk, listening_port, rss_mib

ANSWER_AFTER = 5.0  # seconds the slow destination takes to answer each notice
HEAP = "heap"  # the storm's daemon writes its heap's readings there (_sample_heap)
FILLED = "storm-filled"  # the storm's daemon writes it in its state directory once filled
SCHEDULE = "storm-schedule"  # the bench writes the windows' schedule there (windows.py)
# each storm's --rate and --escalate (None: Config's default)
STORMS: dict[str, tuple[int | None, float | None]] = {
    "with": (10**9, 0.0),
    "with_rate": (None, 0.0),
    "with_defaults": (None, None),
}


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


ARMS = ("without", "again", "with")  # a cycle's three windows: `again` is the control
WIDTH = 0.25  # seconds a window
GUARD = 0.05  # a window's first seconds, not counted (the outbox's writer gathers 50 ms)
CONNECTIONS = 32


def storm(ctx: Any) -> dict[str, Any]:
    """/status p99 and throughput without and with 1,000 events a second; memory meanwhile.
    Each storm's daemon is measured in one run of wrk whose quarter-seconds take turns
    (windows.py): without its storm, without it again (the control: what the same work reads
    as in other windows), and with it, in an order shuffled in each cycle of three. Each arm's
    p99 is of all its windows' requests; the storm's ratio is its p99 over the p99 without,
    with its 90% interval from resampling the cycles, and the control's alike."""
    if not have_wrk():
        return {"skipped": "wrk is not installed"}
    hook = SlowHook()
    cycles = 4 if ctx.quick else 200
    # quick mode: no control (four cycles judge nothing; the step keeps to its budget)
    arms = ("without", "with") if ctx.quick else ARMS
    found: dict[str, dict[str, Any]] = {}
    try:
        for n, (mode, settings) in enumerate(STORMS.items()):
            found[mode] = _one_daemon(hook.url, settings, cycles, arms, seed=n)
    finally:
        hook.close()

    def p99(mode: str, arm: str) -> float | None:
        its = windows.pooled(found[mode]["cycles"], arm)
        return None if its is None else round(its, 3)

    def rate(mode: str, arm: str) -> int:
        measured = cycles * (WIDTH - GUARD)
        return round(windows.requests(found[mode]["cycles"], arm) / measured)

    compared = {mode: windows.compare(found[mode]["cycles"], "with", "without") for mode in STORMS}
    control = {
        mode: windows.compare(found[mode]["cycles"], "again", "without") if not ctx.quick else None
        for mode in STORMS
    }
    p99s = {mode: {arm: p99(mode, arm) for arm in arms} for mode in STORMS}
    ctx.log(
        "notify storm: /status p99 ms without / with 1,000 events/s: "
        + ", ".join(
            f"{mode} {p99s[mode]['without']} / {p99s[mode]['with']} ({said(compared[mode])}; "
            f"control {said(control[mode])})"
            for mode in STORMS
        )
    )

    def point(mode: str) -> float | None:
        its = compared[mode]
        return None if its is None else its["ratio"]

    return {
        "cycles": cycles,
        "window_s": WIDTH,
        "guard_s": GUARD,
        "connections": CONNECTIONS,
        "answer_after_s": ANSWER_AFTER,
        # each cycle's p99 and requests by arm, for a look at the run (the ratios are pooled)
        "runs": {
            mode: [
                {
                    arm: {
                        "p99_ms": windows.pooled([cycle], arm),
                        "requests": sum(cycle.get(arm, {}).values()),
                    }
                    for arm in arms
                }
                for cycle in found[mode]["cycles"]
            ]
            for mode in STORMS
        },
        "p99_ms": p99s,
        "p99_ratio": point("with"),  # the hardest: no rate, no escalation
        "p99_ratio_rate": point("with_rate"),
        "p99_ratio_defaults": point("with_defaults"),
        "p99_compared": compared,  # each storm's ratio and its 90% interval
        "p99_control": control,  # the same for the windows without the storm again
        "requests_per_s": {mode: {arm: rate(mode, arm) for arm in arms} for mode in STORMS},
        "errors": {mode: found[mode]["errors"] for mode in STORMS},
        # events counted as notices queued, dropped or held back (not those left to escalate)
        "events_per_s": {mode: found[mode]["events_per_s"] for mode in ("with", "with_rate")},
        # memory (its episodes filled before the run): what the daemon holds (its heap: the
        # bytes its allocator handed out and did not have back) grew after the run's first
        # quarter, where wrk's 32 connections and the first cycles warm it up (the row: the
        # most of the storms; None without glibc's count), and its RSS, which also counts
        # what the allocator keeps free (it rises in steps of 1.13 MiB, at times in the run
        # that differ from one run to the next, and stays); each storm's readings every 5 s
        "heap_growth_mib": _most(found[mode]["heap"] for mode in STORMS),
        "heap_mib": {mode: found[mode]["heap"] for mode in STORMS},
        "rss_growth_mib": max(found[mode]["rss"]["after"] for mode in STORMS),
        "rss_mib": {mode: found[mode]["rss"] for mode in STORMS},
        "rss_first_quarter_mib": max(found[mode]["rss"]["first_quarter"] for mode in STORMS),
    }


def _most(readings: Any) -> float | None:
    """The most growth after the first quarter among the storms' heaps (None where one was
    not read)."""
    found = list(readings)
    if any(heap is None for heap in found):
        return None
    return max(heap["after"] for heap in found)


def said(compared: dict[str, Any] | None) -> str:
    """A ratio and its interval, as the log and the table say them."""
    if compared is None:
        return "not measured"
    return f"{compared['ratio']}x ({compared['low']}-{compared['high']})"


def _one_daemon(
    url: str,
    settings: tuple[int | None, float | None],
    cycles: int,
    arms: tuple[str, ...],
    seed: int,
) -> dict[str, Any]:
    """One storm's daemon: SIGUSR1 starts its storm, which first fills the episodes
    remembered, then waits for the schedule (in its state directory) and storms in the
    windows of the arm `with`, 1,000 events a second, while wrk measures /status."""
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
            "1000",
            "--state-dir",
            directory,
            *(["--rate", str(settings[0])] if settings[0] is not None else []),
            *(["--escalate", str(settings[1])] if settings[1] is not None else []),
        ],
        cwd=ROOT,
        # on the C library's allocator, as `python -m patroller` runs (main.system_allocator)
        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONMALLOC": "malloc"},
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
        process.send_signal(signal.SIGUSR1)
        # the storm begun: as many episodes remembered as may be, the queue full
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(directory, FILLED)):
            if time.monotonic() > deadline:
                raise RuntimeError("the storm did not fill its episodes: " + _log(directory))
            time.sleep(0.2)
        schedule = windows.Schedule.shuffled(arms, cycles, WIDTH, GUARD, lead=1.0, seed=seed)
        counted = _notifications(base)
        sampled: list[float] = []
        sampler = threading.Thread(
            target=_sample_rss, args=(process.pid, schedule.end, sampled), daemon=True
        )
        sampler.start()
        found = windows.run(
            base + "/status", schedule, os.path.join(directory, SCHEDULE), CONNECTIONS
        )
        sampler.join()
        told = _handled(_notifications(base)) - _handled(counted)
        storming = schedule.phases.count(arms.index("with")) * WIDTH
        if settings[1] is not None and settings[1] <= 0 and told < 500 * storming:
            # a storm whose events are counted (no escalation) that did not storm measures
            # nothing: the step fails rather than saying so with figures
            raise RuntimeError(f"the storm handed over {told} events in {storming} s")
        # (one RSS reading at least: the sampler reads before it looks at the time)
        heap = _heap_read(os.path.join(directory, HEAP), schedule.start, schedule.end)
        return {
            "heap": _growth(heap) if heap else None,
            "cycles": schedule.cycles(found.windows),
            "errors": sum(found.errors.values()),
            "events_per_s": round(told / storming),
            "rss": _growth(sampled),
        }
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _growth(readings: list[float]) -> dict[str, Any]:
    """Readings (MiB, every half second): the most they grew, what they grew in the first
    quarter and after it, and one every 5 s."""
    quarter = len(readings) // 4
    return {
        "growth": round(max(readings) - readings[0], 2),
        "first_quarter": round(readings[quarter] - readings[0], 2),
        "after": round(readings[-1] - readings[quarter], 2),
        "every_5_s": [round(v, 2) for v in readings[::10]],
    }


def _sample_rss(pid: int, until: float, into: list[float]) -> None:
    """The daemon's RSS (MiB) every half second until `until` (time.monotonic())."""
    while True:
        into.append(rss_mib(pid))
        if time.monotonic() >= until:
            return
        time.sleep(0.5)


def _handled(notifications: dict[str, Any]) -> int:
    """The notices the storm's events became so far: queued, dropped or held back by the rate
    (a trespass waiting to be escalated is none of these: the storm with every default is not
    counted)."""
    trespass = notifications["by_kind"].get("trespass", {})
    return int(trespass.get("queued", 0) + trespass.get("dropped", 0) + notifications["held"])


def _notifications(base: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(base + "/metrics.json", timeout=30) as response:
        return json.loads(response.read())["notifications"]


def _log(directory: str) -> str:
    with open(os.path.join(directory, "log"), encoding="utf-8", errors="replace") as f:
        return f.read()[-2000:]


# -- the daemon of the storm (python -m bench.notify serve) -----------------------------------


def _storm_config(url: str, state_dir: str, rate: int | None, escalate: float | None) -> Any:
    """A test-mode daemon's settings for a storm: one destination told of trespasses, the
    storm's rate and escalation (None: Config's default), the outbox in `state_dir`."""
    from dataclasses import replace

    from patroller.config import Config

    config = Config(test=True, port=0, address="127.0.0.1")
    return replace(
        config,
        notify=(url,),
        notify_events=("trespass",),
        notify_escalate=config.notify_escalate if escalate is None else escalate,
        notify_rate=config.notify_rate if rate is None else rate,
        state_dir=state_dir,
        usage="none",
    )


def _trespass(n: int, devices: list[tuple[str, int]]) -> Any:
    """The storm's `n`th event: a new user's trespass (a new episode) on one of the GPUs (the
    event as the lease rules make it: its cost is the rules', in the storm's loop time)."""
    uuid, number = devices[n % len(devices)]
    return Event(
        "trespass", f"user{n}", ((uuid, number),), {"pid": 100_000 + n, "holder": "alice"}
    )


async def _serve(
    url: str, events: int, state_dir: str, rate: int | None, escalate: float | None
) -> None:
    from dataclasses import replace

    from tornado.ioloop import PeriodicCallback

    from patroller.app import build

    # a stop of 0.5 s rather than the default's 2: the destination hangs by design, and the
    # stop (waiting for its thread up to the grace) is no figure of the step
    config = replace(
        _storm_config(url, state_dir, rate, escalate),
        max_connections_per_caller=1_000_000,
        shutdown_grace=0.5,
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
    to_fill = [-1]  # events of the fill left (-1: the storm not begun; -2: filled)
    schedule: list[windows.Schedule] = []  # once read

    def begin() -> None:  # SIGUSR1: the storm begins, the fill first
        if to_fill[0] == -1:
            to_fill[0] = config.notify_episodes

    def tell() -> None:  # as the lease rules hand their events over (app/assembly.py)
        count[0] += 1
        notifier.turns.put(_trespass(count[0], devices))

    def storm() -> None:
        if to_fill[0] == -1:
            return
        if to_fill[0] > 0:  # first the episodes remembered are filled, a thousand a tick
            burst = min(to_fill[0], 1000)
            for _ in range(burst):
                tell()
            to_fill[0] -= burst
            return
        if to_fill[0] == 0:  # filled once the notifier has handled every event of the fill
            if notifier.turns.waiting:
                return
            to_fill[0] = -2
            with open(os.path.join(state_dir, FILLED), "w"):
                pass
            return
        if not schedule:  # then it waits for the bench's schedule
            path = os.path.join(state_dir, SCHEDULE)
            if not os.path.exists(path):
                return
            schedule.append(windows.Schedule.read(path))
        now = time.monotonic()
        plan = schedule[0]
        window = plan.window_at(now)
        if window is None or plan.arms[plan.phases[window]] != "with":
            due[:] = [now, 0.0]  # no storm in this window: nothing becomes due
            return
        # the events due since the last tick, or since this window began
        began = plan.start + plan.width * window
        due[1] += events * (now - max(due[0], began))
        due[0] = now
        for _ in range(int(due[1])):
            due[1] -= 1
            tell()

    loop = asyncio.get_running_loop()
    threading.Thread(
        target=_sample_heap, args=(os.path.join(state_dir, HEAP),), daemon=True
    ).start()
    if events:
        loop.add_signal_handler(signal.SIGUSR1, begin)
        PeriodicCallback(storm, every * 1000).start()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await daemon.stop(config.shutdown_grace)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _sample_heap(path: str, every: float = 0.5, until: threading.Event | None = None) -> None:
    """The C library's count of the bytes its allocator has handed out and not had back (in
    its heaps and mapped alone; every object, as the daemon runs on it: PYTHONMALLOC=malloc),
    every half second with the time it was read from (time.monotonic()), in `path`, for as
    long as the daemon runs (or until `until` is set). What the daemon holds, where its RSS
    also counts what the allocator keeps free (glibc's mallinfo2; nothing is written where
    there is none: musl, or glibc before 2.33)."""
    name = ctypes.util.find_library("c")
    mallinfo2 = getattr(ctypes.CDLL(name), "mallinfo2", None) if name else None
    if mallinfo2 is None:
        return
    mallinfo2.restype = _Mallinfo2
    until = until or threading.Event()
    with open(path, "w", encoding="ascii") as out:
        while True:
            at = time.monotonic()  # (a reading after a time was begun after it)
            found = mallinfo2()
            out.write(f"{at} {(found.uordblks + found.hblkhd) / 2**20:.3f}\n")
            out.flush()
            if until.wait(every):
                return


def _heap_read(path: str, start: float, end: float) -> list[float]:
    """The heap's readings (MiB) from `start` to `end` (time.monotonic(), the same clock in
    every process of the machine); none where the daemon wrote none."""
    try:
        with open(path, encoding="ascii") as f:
            rows = [line.split() for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []
    return [float(mib) for at, mib in rows if start <= float(at) <= end]


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


def notice_cost(ctx: Any) -> dict[str, float]:
    """The loop's thread time per trespass event handed to the notifier, in each storm's
    settings (microseconds, the best of three)."""
    return {
        mode: asyncio.run(_notice_cost(settings, 5_000 if ctx.quick else 20_000))
        for mode, settings in STORMS.items()
    }


async def _notice_cost(settings: tuple[int | None, float | None], events: int) -> float:
    from patroller.app import build

    rate, escalate = settings
    directory = tempfile.mkdtemp(prefix="pbench-notify")
    os.chmod(directory, 0o700)
    # nothing listens at the destination: each try fails, off the loop
    config = _storm_config("json://127.0.0.1:9/cost", directory, rate, escalate)
    daemon = await build(config)
    daemon.start()
    try:
        notifier = daemon.services.notifier
        assert notifier is not None
        devices = [(d.uuid, d.number) for d in daemon.services.inventory]
        best = float("inf")
        for round_ in range(3):
            began = time.thread_time()
            for n in range(round_ * events, (round_ + 1) * events):
                notifier.on_event(_trespass(n, devices))
            best = min(best, (time.thread_time() - began) / events * 1e6)
            await asyncio.sleep(0.2)  # the other threads catch up
        return round(best, 1)
    finally:
        await daemon.stop(config.shutdown_grace)
        shutil.rmtree(directory, ignore_errors=True)


def rewrite_cost(ctx: Any, episodes: int = 10_000) -> dict[str, float]:
    """The outbox's journal written anew (as its writer does every 40,000 lines of a storm)
    with `episodes` episodes told: the writer's thread time and wall time (ms, the best of
    five), the interpreter held for much of it."""
    from patroller.config import Config
    from patroller.notify.outbox import Outbox

    directory = tempfile.mkdtemp(prefix="pbench-outbox")
    os.chmod(directory, 0o700)
    outbox = Outbox(directory, Config())
    try:
        outbox.open(time.time())
        now = time.time()
        for n in range(episodes):
            outbox.told(("trespass", f"GPU-{n % 8}", f"user{n}", "alice"), now)
        if not outbox.flush(30):
            raise RuntimeError("the outbox's writer did not take the episodes")
        cpu, wall = [], []
        for _ in range(5):  # the writer waits for a line: this thread rewrites
            began, began_cpu = time.perf_counter(), time.thread_time()
            outbox._rewrite()
            wall.append(time.perf_counter() - began)
            cpu.append(time.thread_time() - began_cpu)
        return {
            "episodes": episodes,
            "cpu_ms": round(min(cpu) * 1000, 1),
            "wall_ms": round(min(wall) * 1000, 1),
        }
    finally:
        outbox.stop(5)
        shutil.rmtree(directory, ignore_errors=True)


def notify(ctx: Any) -> dict[str, Any]:
    """The step: the watch's cost, the loop's cost of a notice, then the storm."""
    found: dict[str, Any] = {"watch": watch_cost(ctx)}
    ctx.log(
        f"notify watch at 256 GPUs + 5000 processes: first {found['watch']['first_ms']} "
        f"ms, next {found['watch']['next_ms']['max']} ms (max)"
    )
    found["notice_us"] = notice_cost(ctx)
    ctx.log(f"notify: loop us per event handed over, by storm: {found['notice_us']}")
    found["rewrite"] = rewrite_cost(ctx)
    ctx.log(f"notify: the outbox's journal written anew: {found['rewrite']}")
    found["storm"] = storm(ctx)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.notify")
    parser.add_argument("what", choices=["serve"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--events", type=int, default=0)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--rate", type=int, default=None)
    parser.add_argument("--escalate", type=float, default=None)
    args = parser.parse_args()
    asyncio.run(_serve(args.url, args.events, args.state_dir, args.rate, args.escalate))


if __name__ == "__main__":
    main()
