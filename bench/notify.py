"""What telling people costs: /status beside an event storm, and the watch's look at every hold.

The storm: a test-mode daemon (its own process, `python -m bench.notify serve`) with one
`--notify` destination, a webhook that takes 5 s to answer each notice (a thread of this
process), and its state directory (the outbox on). With `--events N` the daemon's own loop
hands N trespass events a second (each a new episode: a new user on one of its GPUs) to the
notifier, as the lease rules would. Three storms (STORMS): `with`, no destination's rate and no
escalation holds any back: every notice goes through the words, the episodes, the outbox and
a full queue, where most are dropped and counted; `with_rate`, the default rate (10 notices
in 10 minutes), which holds almost all back; `with_defaults`, the default rate and escalation
(a trespass waits 30 minutes before it reaches the admin). Each storm has a daemon of its own:
SIGUSR1 starts its storm, which first fills the episodes remembered (10,000 at most, a thousand
events a tick) and says so by a file in its state directory; SIGUSR2 pauses it and SIGUSR1
goes on with it. wrk measures /status in rounds of three short runs, their order shuffled in
each round: without the storm, without it again (the control), with it. The storm's ratio is
the median of its p99s over the median of those without, with a 90% interval from resampling
the rounds; the control's ratio, measured alike, is how far apart two runs of the same work
read on the machine at the time: a storm's ratio within the control's reach is no effect
shown. The daemon's RSS, read before and after each run: the most it grew in one run with the
storm, and its growth in the first round (whose first run with the storm warms its structures
up) and after it.
Quick mode measures two rounds of 1 s runs a storm, without the control; the full mode twenty
of 2 s.

The cost: in this process, a test-mode daemon's notifier handed 20,000 trespass events (5,000 in
quick mode) in each storm's settings, the loop's thread time per event (the best of three):
the figure wrk's p99 moves around on a loaded two-core machine.

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
import random
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

from .harness import ROOT, compare, have_wrk, listening_port, middle, rss_mib, wrk

ANSWER_AFTER = 5.0  # seconds the slow destination takes to answer each notice
FILLED = "storm-filled"  # the storm's daemon writes it in its state directory once filled
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


ARMS = ("without", "again", "with")  # a round's three runs: `again` is the control


def storm(ctx: Any) -> dict[str, Any]:
    """/status p99 and throughput without and with 1,000 events a second; memory after. Each
    storm's daemon is measured in rounds of three runs in a shuffled order: without its storm,
    without it again (the control: what two runs that do the same work differ by here), and
    with it. The storm's ratio is the median of its p99s with over the median without, with its
    90% interval from resampling the rounds; the control's ratio beside it says how far apart
    the same work reads on this machine."""
    if not have_wrk():
        return {"skipped": "wrk is not installed"}
    hook = SlowHook()
    rounds = 2 if ctx.quick else 20
    seconds = 1 if ctx.quick else 2
    # quick mode: no control (two rounds judge nothing; the step keeps to its budget)
    arms = ("without", "with") if ctx.quick else ARMS
    found: dict[str, list[dict[str, dict[str, Any]]]] = {}
    try:
        for n, (mode, settings) in enumerate(STORMS.items()):
            found[mode] = _one_daemon(hook.url, seconds, settings, rounds, arms, seed=n)
    finally:
        hook.close()

    def median(values: list[float | None]) -> float | None:  # of those measured, rounded
        found = middle(values)
        return None if found is None else round(found, 3)

    def each(mode: str, arm: str, *path: str) -> list[float | None]:
        return [_dig(row[arm], path) for row in found[mode]]

    def p99s(mode: str) -> list[dict[str, float | None]]:
        return [{arm: _dig(row[arm], ("status", "p99_ms")) for arm in arms} for row in found[mode]]

    compared = {mode: compare(p99s(mode), "with", "without") for mode in STORMS}
    control = {mode: compare(p99s(mode), "again", "without") for mode in STORMS}
    without = [v for mode in STORMS for v in each(mode, "without", "status", "p99_ms")]
    p99 = {"without": median(without)}
    p99 |= {mode: median(each(mode, "with", "status", "p99_ms")) for mode in STORMS}

    def point(mode: str) -> float | None:
        its = compared[mode]
        return None if its is None else its["ratio"]

    ctx.log(
        f"notify storm: /status p99 {p99['without']} ms without; with 1,000 events/s: "
        + ", ".join(
            f"{mode} {p99[mode]} ms ({said(compared[mode])} its own without; control "
            f"{said(control[mode])})"
            for mode in STORMS
        )
    )
    rps_without = [v for m in STORMS for v in each(m, "without", "status", "requests_per_s")]
    return {
        "rounds": rounds,
        "seconds": seconds,
        "answer_after_s": ANSWER_AFTER,
        "runs": found,
        "p99_ms": p99,
        "p99_ratio": point("with"),  # the hardest: no rate, no escalation
        "p99_ratio_rate": point("with_rate"),
        "p99_ratio_defaults": point("with_defaults"),
        "p99_compared": compared,  # each storm's ratio and its 90% interval
        "p99_control": control,  # the same for a second run without the storm
        "requests_per_s": {
            "without": median(rps_without),
            **{mode: median(each(mode, "with", "status", "requests_per_s")) for mode in STORMS},
        },
        # events counted as notices queued, dropped or held back (not those left to escalate)
        "events_per_s": {
            mode: median(each(mode, "with", "events_per_s")) for mode in ("with", "with_rate")
        },
        # memory: the most it grew in one run with the storm (the row); what the first round
        # took (its first run with the storm warms the structures up) and the rounds after it
        "rss_growth_mib": max(_most_in_a_run(found[mode], "with") for mode in STORMS),
        "rss_first_round_mib": max(_rss_growth(found[mode][:1]) for mode in STORMS),
        "rss_after_first_round_mib": max(_rss_growth(found[mode][1:]) for mode in STORMS),
    }


def said(compared: dict[str, Any] | None) -> str:
    """A ratio and its interval, as the log and the table say them."""
    if compared is None:
        return "not measured"
    return f"{compared['ratio']}x ({compared['low']}-{compared['high']})"


def _most_in_a_run(rounds: list[dict[str, Any]], arm: str) -> float:
    """The most the daemon's RSS grew during one run of `arm` (MiB)."""
    return round(
        max((r[arm]["rss_after_mib"] - r[arm]["rss_before_mib"] for r in rounds), default=0.0), 2
    )


def _rss_growth(rounds: list[dict[str, Any]]) -> float:
    """How much more the daemon's RSS was after the last run of `rounds` than before their
    first (MiB; the runs in the order they ran)."""
    if not rounds:
        return 0.0
    first, last = next(iter(rounds[0].values())), list(rounds[-1].values())[-1]
    return round(last["rss_after_mib"] - first["rss_before_mib"], 2)


def _dig(row: dict[str, Any], path: Any) -> float | None:
    value: Any = row
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) else None


def _one_daemon(
    url: str,
    seconds: float,
    settings: tuple[int | None, float | None],
    rounds: int,
    arms: tuple[str, ...],
    seed: int,
) -> list[dict[str, dict[str, Any]]]:
    """One storm's daemon: /status measured in `rounds` rounds, each a run of every one of
    `arms` (of ARMS) in a shuffled order (SIGUSR1 starts the storm: first the episodes
    remembered are filled, then 1,000 events a second; SIGUSR2 pauses it, SIGUSR1 goes on)."""
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
        process.send_signal(signal.SIGUSR2)

        def measured(storm: bool) -> dict[str, Any]:
            process.send_signal(signal.SIGUSR1 if storm else signal.SIGUSR2)
            time.sleep(0.3)  # the storm under way again (a tick every 10 ms), or its last over
            return _measured(process.pid, base, seconds)

        shuffle = random.Random(seed)
        found = []
        for _ in range(rounds):
            order = list(arms)
            shuffle.shuffle(order)
            found.append({arm: measured(arm == "with") for arm in order})
        return found
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _measured(pid: int, base: str, seconds: float) -> dict[str, Any]:
    """wrk on /status for `seconds`; the daemon's RSS and the notices handled meanwhile."""
    before = rss_mib(pid)
    counted = _notifications(base)
    began = time.monotonic()
    status = wrk(base + "/status", seconds)
    took = time.monotonic() - began
    after = rss_mib(pid)
    ended = _notifications(base)
    told = _handled(ended) - _handled(counted)
    return {
        "status": status,
        "rss_before_mib": before,
        "rss_after_mib": after,
        "events_per_s": round(told / took),
        "pending": ended["pending"],
        "dropped": ended["by_kind"].get("trespass", {}).get("dropped", 0),
    }


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
    to_fill = [-1]  # events of the fill left (-1: the storm not begun)
    paused = [False]

    def begin() -> None:  # SIGUSR1: the storm begins (the fill first), or goes on
        if to_fill[0] < 0:
            to_fill[0] = config.notify_episodes
        paused[0] = False
        due[:] = [time.monotonic(), 0.0]

    def pause() -> None:  # SIGUSR2
        paused[0] = True

    def tell() -> None:
        count[0] += 1
        notifier.on_event(_trespass(count[0], devices))

    def storm() -> None:
        if to_fill[0] < 0 or paused[0]:
            return
        if to_fill[0] > 0:  # first the episodes remembered are filled, a thousand a tick
            burst = min(to_fill[0], 1000)
            for _ in range(burst):
                tell()
            to_fill[0] -= burst
            if to_fill[0] == 0:
                with open(os.path.join(state_dir, FILLED), "w"):
                    pass
                due[:] = [time.monotonic(), 0.0]
            return
        now = time.monotonic()
        due[1] += events * (now - due[0])
        due[0] = now
        for _ in range(int(due[1])):
            due[1] -= 1
            tell()

    loop = asyncio.get_running_loop()
    if events:
        loop.add_signal_handler(signal.SIGUSR1, begin)
        loop.add_signal_handler(signal.SIGUSR2, pause)
        PeriodicCallback(storm, every * 1000).start()
    stop = asyncio.Event()
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


def notify(ctx: Any) -> dict[str, Any]:
    """The step: the watch's cost, the loop's cost of a notice, then the storm."""
    found: dict[str, Any] = {"watch": watch_cost(ctx)}
    ctx.log(
        f"notify watch at 256 GPUs + 5000 processes: first {found['watch']['first_ms']} "
        f"ms, next {found['watch']['next_ms']['max']} ms (max)"
    )
    found["notice_us"] = notice_cost(ctx)
    ctx.log(f"notify: loop us per event handed over, by storm: {found['notice_us']}")
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
