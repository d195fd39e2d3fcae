"""The measurements. Each returns plain data; `__main__` prints, saves and compares it."""

from __future__ import annotations

import asyncio
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from .harness import (
    ROOT,
    Containers,
    Daemon,
    Sleepers,
    Streams,
    have_wrk,
    processes_on,
    ratio,
    wrk,
)

LEASE = 2.0  # seconds, for the reaction runs: twice the sampling interval, so that the
# process-exit measurement cannot be answered by an expiring lease instead (it would then read
# 2 s, over its goal: seen, not hidden)


class Context:
    """What every measurement shares: the mode's sizes, processes and containers."""

    def __init__(self, quick: bool, log: Callable[[str], None]) -> None:
        self.quick = quick
        self.log = log
        self.sleepers = Sleepers()
        self.containers = Containers()
        self.docker = False
        self.pool: list[int] = []  # 500 processes that stand for GPU jobs
        # seconds a load runs: 3 in quick mode (some 45,000 requests a row, every step in five
        # minutes; the figures to quote come from the full mode, 10 s a row)
        self.wrk_seconds = 3 if quick else 10
        self.repeats = 3 if quick else 20
        self.steady_seconds = 5 if quick else 60  # five samples at the 1 s interval at least
        self.footprint_seconds = 5 if quick else 30
        self.parser_lines = 60_000 if quick else 600_000
        # usage stores written once a run, (GPUs, days) -> (directory, the fill's figures)
        self.stores: dict[tuple[int, int], tuple[str, dict[str, Any]]] = {}
        self.steps: list[str] = []  # the steps this run runs, in order
        self.step = ""  # the one running
        self.shared: dict[str, Any] = {}  # what a step leaves to a later one (bench/fleet.py)

    def start(self, processes: int = 500) -> None:
        self.docker = self.containers.start()
        if self.docker:
            per = processes // 5
            for n in range(5):
                _, pids = self.containers.run(f"user{n}@example.org", per)
                self.pool.extend(pids)
            self.log(f"{processes} processes in 5 labelled containers")
        else:
            self.pool = self.sleepers.start(processes)
            self.log(f"{processes} host processes (no Docker Engine: {self.containers.reason})")

    @property
    def docker_host(self) -> str | None:
        return self.containers.url if self.docker else None

    def stop(self) -> None:
        self.sleepers.stop()
        self.containers.stop()
        for directory, _ in self.stores.values():
            shutil.rmtree(directory, ignore_errors=True)
        for _, daemons in self.shared.values():  # left by a step whose follower did not run
            for daemon in daemons:
                daemon.stop()
                daemon.reap()


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


# 1. throughput and latency -----------------------------------------------------------------

# quick mode: the two sizes the table's rows read (the full mode measures all nine)
THROUGHPUT_QUICK = ((8, 0), (64, 500))
THROUGHPUT_FULL = tuple((gpus, count) for gpus in (8, 64, 256) for count in (0, 500, 5000))


def throughput(ctx: Context) -> list[dict[str, Any]]:
    """/status and /devices under 32 connections, for 8 GPUs with no process and 64 with 500
    (quick mode), or 8, 64 and 256 GPUs with 0, 500 and 5,000 (the 4,500 beyond the pool
    are host processes); and the same /status bytes from the ceiling (a bare asyncio server)
    under the same load: alone, and beside the simulator's dmon and pmon as the daemon ran
    them (the GPU's tools load a host whatever reads them; here they share its 2 cores)."""
    if not have_wrk():
        raise ImportError("wrk is not installed (apt-get install wrk)", name="wrk")
    results = []
    sizes = THROUGHPUT_QUICK if ctx.quick else THROUGHPUT_FULL
    most = max(count for _, count in sizes)
    if len(ctx.pool) < most:
        ctx.pool.extend(ctx.sleepers.start(most - len(ctx.pool)))
    for gpus, count in sizes:
        daemon = Daemon(gpus, docker_host=ctx.docker_host).start()
        try:
            if count:
                daemon.place(ctx.pool[:count])
                daemon.wait_for(lambda s: processes_on(s) == count, timeout=120)
            body = daemon.raw("/status")
            row: dict[str, Any] = {"gpus": gpus, "processes": count, "status_bytes": len(body)}
            for path in ("/status", "/devices"):
                row[path] = wrk(daemon.url + path, ctx.wrk_seconds)
            streams = Streams(daemon)
        finally:
            daemon.stop()
        with Ceiling(body) as ceiling:  # the same bytes and load, with nothing else running
            row["ceiling"] = wrk(ceiling.url, ctx.wrk_seconds)
            with streams:  # and beside the GPU's tools, as the daemon ran them
                row["ceiling_beside_streams"] = wrk(ceiling.url, ctx.wrk_seconds)
        row["of_ceiling"] = _of_ceiling(row["/status"], row["ceiling"])
        row["of_ceiling_beside_streams"] = _of_ceiling(
            row["/status"], row["ceiling_beside_streams"]
        )
        results.append(row)
        ctx.log(
            f"throughput {gpus} GPUs {count} processes: /status "
            f"{row['/status']['requests_per_s']}/s p99 {row['/status']['p99_ms']} ms; "
            f"ceiling {row['ceiling']['requests_per_s']}/s p99 {row['ceiling']['p99_ms']} ms, "
            f"beside the streams p99 {row['ceiling_beside_streams']['p99_ms']} ms"
        )
    return results


def _of_ceiling(ours: dict[str, Any], ceiling: dict[str, Any]) -> dict[str, float | None]:
    """Patroller's throughput as a fraction of the ceiling's, and its p99 as a multiple."""
    rate, p99 = ceiling.get("requests_per_s"), ceiling.get("p99_ms")
    return {
        "throughput": round(ours["requests_per_s"] / rate, 3) if rate else None,
        "p99": ratio(ours["p99_ms"], p99),
    }


class Ceiling:
    """bench/ceiling.py serving `body`: a bare asyncio server, in a process of its own."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.process: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> Ceiling:
        self.file = tempfile.NamedTemporaryFile(prefix="pceiling", suffix=".json")
        self.file.write(self.body)
        self.file.flush()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.ceiling", self.file.name],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.process.stdout.readline())}/status"
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(10)
        self.file.close()


# 2. reaction times ---------------------------------------------------------------------------


class Waiter(threading.Thread):
    """A /wait client in a thread: when was it answered, and with what."""

    def __init__(self, daemon: Daemon, query: str = "gpu=1") -> None:
        super().__init__(daemon=True)
        self.daemon_, self.query = daemon, query
        self.answered = 0.0
        self.result: Any = None

    def run(self) -> None:
        self.result = self.daemon_.get("/wait?" + self.query, timeout=60)
        self.answered = time.time()

    def begin(self) -> Waiter:
        before = self.daemon_.ok("/metrics.json")["waiting"]
        self.start()
        deadline = time.monotonic() + 10
        while self.daemon_.ok("/metrics.json")["waiting"] <= before:
            if time.monotonic() > deadline:
                raise RuntimeError("the waiter did not start waiting")
            time.sleep(0.005)
        return self


def _all_free(daemon: Daemon, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status = daemon.ok("/status")
        if all(e["claim"]["state"] == "free" for e in status.values()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                "devices not free: "
                + str(
                    [
                        (
                            e["claim"]["state"],
                            e["claim"]["processes"],
                            (e["claim"]["user"] or {}).get("user"),
                        )
                        for e in status.values()
                    ]
                )
            )
        time.sleep(0.01)


def _trace_time(daemon: Daemon, pid: int) -> float:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(daemon.trace, encoding="ascii") as f:
                for line in f:
                    when, traced, _ = line.split()
                    if int(traced) == pid:
                        return float(when)
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    raise RuntimeError("pid not traced")


def reactions(ctx: Context) -> dict[str, Any]:
    """pmon line -> /status; release, expiry and process exit -> a waiting /wait answered."""
    daemon = Daemon(8, interval=1.0, lease=LEASE, docker_host=ctx.docker_host).start()
    uuids = list(daemon.ok("/devices"))
    seen, released, expired, expiry_error, exited = [], [], [], [], []
    try:
        for n in range(ctx.repeats):
            gpu = n % 8
            [pid] = ctx.sleepers.start(1)
            daemon.write([{"pid": pid, "gpu": gpu}])
            visible = daemon.wait_for(
                lambda s: pid in s[uuids[gpu]]["claim"]["processes"], every=0.002
            )
            seen.append(visible - _trace_time(daemon, pid))
            # the process exits while another user's request waits for its device
            daemon.ok("/request?gpu=7")
            daemon.ok(f"/release?uuid={uuids[gpu]}")  # free as soon as the process ends
            waiter = Waiter(daemon).begin()
            killed = time.time()
            ctx.sleepers.kill(pid)
            waiter.join(30)
            exited.append(waiter.answered - killed)
            daemon.ok("/release")
            # a release wakes a waiter
            _all_free(daemon)
            daemon.ok("/request?gpu=8")
            waiter = Waiter(daemon).begin()
            before = time.time()
            daemon.ok(f"/release?uuid={uuids[gpu]}")
            waiter.join(30)
            released.append(waiter.answered - before)
            daemon.ok("/release")
            # an expiring lease wakes a waiter
            daemon.ok("/request?gpu=8")
            granted = time.time()
            waiter = Waiter(daemon)
            waiter.start()
            waiter.join(30)
            expired.append(waiter.answered - granted)
            expiry_error.append(waiter.answered - granted - LEASE)
            daemon.ok("/release")
    finally:
        daemon.stop()
    result = {
        "interval_s": 1.0,
        "lease_s": LEASE,
        "samples": ctx.repeats,
        "pmon_to_status_ms": {"median": ms(statistics.median(seen)), "max": ms(max(seen))},
        "release_to_wait_ms": {
            "median": ms(statistics.median(released)),
            "max": ms(max(released)),
        },
        "expiry_to_wait_ms": {"median": ms(statistics.median(expired)), "max": ms(max(expired))},
        "expiry_error_ms": {
            "median": ms(statistics.median(expiry_error)),
            "max": ms(max(expiry_error, key=abs)),
        },
        "exit_to_wait_ms": {"median": ms(statistics.median(exited)), "max": ms(max(exited))},
    }
    ctx.log(f"reactions: {result}")
    return result


# 3. identity cost ----------------------------------------------------------------------------


def identity_cost(ctx: Context) -> dict[str, Any]:
    """Docker calls and /proc reads per minute at steady state; a new container's first lookup."""
    daemon = Daemon(8, interval=1.0, docker_host=ctx.docker_host).start()
    result: dict[str, Any] = {"processes": len(ctx.pool), "docker": ctx.docker}
    try:
        daemon.place(ctx.pool)
        daemon.wait_for(lambda s: processes_on(s) == len(ctx.pool), timeout=120)
        time.sleep(2)
        before, start = daemon.ok("/metrics.json"), time.monotonic()
        time.sleep(ctx.steady_seconds)
        after, minutes = daemon.ok("/metrics.json"), (time.monotonic() - start) / 60
        result["docker_calls_per_min"] = round(
            (after["docker_calls"] - before["docker_calls"]) / minutes, 1
        )
        result["proc_reads_per_min"] = round(
            (after["proc_reads"] - before["proc_reads"]) / minutes, 1
        )
        result["docker_calls_to_resolve_all"] = before["docker_calls"]
        if ctx.docker:
            result.update(_new_container(ctx, daemon))
    finally:
        daemon.stop()
    ctx.log(f"identity: {result}")
    return result


def _new_container(ctx: Context, daemon: Daemon) -> dict[str, Any]:
    from dataclasses import replace

    from patroller.config import Config
    from patroller.identify.containers import ContainerDirectory
    from patroller.identify.resolver import ProcessIdentifier

    container, pids = ctx.containers.run("newcomer@example.org", 10)
    calls = daemon.ok("/metrics.json")["docker_calls"]
    daemon.place(ctx.pool + pids)
    daemon.wait_for(lambda s: processes_on(s) == len(ctx.pool) + 10, timeout=60, every=0.002)
    first = _trace_time(daemon, pids[0])
    visible = daemon.wait_for(
        lambda s: any(
            (
                e["claim"]["users"]
                and any(u["user"] == "newcomer@example.org" for u in e["claim"]["users"])
            )
            for e in s.values()
        ),
        every=0.002,
    )
    new_calls = daemon.ok("/metrics.json")["docker_calls"] - calls

    async def resolve_times() -> dict[str, float]:
        config = replace(Config(), docker_host=ctx.containers.url)
        identifier = ProcessIdentifier(config, ContainerDirectory(config))
        warm, _ = ctx.containers.run("warm@example.org", 1)
        await identifier.resolve(warm.pid)  # connect and negotiate first
        fresh, fresh_pids = ctx.containers.run("fresh@example.org", 1)
        began = time.perf_counter()
        await identifier.resolve(fresh_pids[0])
        cold = time.perf_counter() - began
        began = time.perf_counter()
        await identifier.resolve(fresh_pids[0])
        return {
            "first_resolution_ms": ms(cold),
            "cached_resolution_ms": ms(time.perf_counter() - began),
        }

    return {
        "new_container_docker_calls": new_calls,
        "new_container_visible_ms": ms(visible - first),
        **asyncio.run(resolve_times()),
    }


# 4. scale -----------------------------------------------------------------------------------


async def _hold_waiters(port: int, count: int) -> list[asyncio.Task]:
    async def one() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /wait?gpu=1 HTTP/1.1\r\nHost: bench\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(
                b":"
            )[1]
        )
        body = await reader.readexactly(length)
        answered = time.monotonic()
        uuid = body.split(b'"uuid":"')[1].split(b'"')[0].decode()
        writer.write(f"GET /release?uuid={uuid} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
        return answered

    return [asyncio.ensure_future(one()) for _ in range(count)]


def scale(ctx: Context, count: int = 1000) -> dict[str, Any]:
    """1,000 waiters held, /status p99 and memory meanwhile, then all served."""
    began = time.monotonic()
    daemon = _started(
        Daemon(8, interval=1.0, lease=600, docker_host=ctx.docker_host),
        PATROLLER_MAX_WAITING_PER_USER=str(count),
    )  # all are the bench's user
    result: dict[str, Any] = {"waiters": count, "start_s": round(time.monotonic() - began, 1)}
    try:
        daemon.ok("/request?gpu=8")
        time.sleep(1)
        rss_before = daemon.rss_mib()

        async def run() -> None:
            holding = time.monotonic()
            tasks = await _hold_waiters(daemon.port, count)
            loop = asyncio.get_running_loop()
            deadline = time.monotonic() + 120
            while (await loop.run_in_executor(None, daemon.ok, "/metrics.json"))[
                "waiting"
            ] < count:
                if time.monotonic() > deadline:
                    raise RuntimeError("the waiters were not all held")
                await asyncio.sleep(0.2)
            result["held_s"] = round(time.monotonic() - holding, 1)  # all waiting, from none
            result["rss_added_mib"] = round(daemon.rss_mib() - rss_before, 1)
            if have_wrk():
                result["status_while_waiting"] = await loop.run_in_executor(
                    None, wrk, daemon.url + "/status", ctx.wrk_seconds
                )
            began = time.monotonic()
            await loop.run_in_executor(None, daemon.ok, "/release")
            answered = await asyncio.gather(*tasks)
            result["all_served_s"] = round(max(answered) - began, 2)

        asyncio.run(run())
        result["rss_mib"] = round(daemon.rss_mib(), 1)
    finally:
        daemon.stop()
    ctx.log(f"scale: {result}")
    return result


# 5. footprint -------------------------------------------------------------------------------


def footprint(ctx: Context) -> dict[str, Any]:
    """CPU share of one core and RSS: idle with 16 GPUs, and while 500 processes churn."""
    result: dict[str, Any] = {}
    daemon = Daemon(16, interval=1.0, docker_host=ctx.docker_host).start()
    try:
        time.sleep(2)
        result["idle"] = _cpu_and_rss(daemon, ctx.footprint_seconds)
    finally:
        daemon.stop()
    daemon = Daemon(16, interval=1.0, docker_host=ctx.docker_host).start()
    churners = ctx.sleepers.start(500)
    try:
        daemon.place(churners)
        daemon.wait_for(lambda s: processes_on(s) == 500, timeout=120)
        stop = threading.Event()

        def churn() -> None:  # 50 processes end and 50 new ones start every second
            while not stop.wait(1.0):
                for pid in churners[:50]:
                    ctx.sleepers.kill(pid)
                del churners[:50]
                churners.extend(ctx.sleepers.start(50))
                if ctx.docker:  # the newcomers belong to a labelled container
                    _adopt(ctx, churners[-50:])
                daemon.place(churners)

        thread = threading.Thread(target=churn, daemon=True)
        thread.start()
        result["churn"] = _cpu_and_rss(daemon, ctx.footprint_seconds)
        stop.set()
        thread.join()
        result["churn"]["docker_calls"] = daemon.ok("/metrics.json")["docker_calls"]
    finally:
        daemon.stop()
        for pid in churners:
            if pid in ctx.sleepers.processes:
                ctx.sleepers.kill(pid)
    ctx.log(f"footprint: {result}")
    return result


def _adopt(ctx: Context, pids: list[int]) -> None:
    from dockerd import Container

    first = ctx.containers.engine.containers[0]
    main = int(ctx.containers.engine.docker("inspect", "-f", "{{.State.Pid}}", first).stdout)
    for pid in pids:
        Container.adopt_pid(main, pid)


def _cpu_and_rss(daemon: Daemon, seconds: float) -> dict[str, float]:
    cpu, began = daemon.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    share = (daemon.cpu_seconds() - cpu) / (time.monotonic() - began)
    return {"cpu_percent": round(100 * share, 2), "rss_mib": round(daemon.rss_mib(), 1)}


# 6. parsers ---------------------------------------------------------------------------------


def parsers(ctx: Context) -> dict[str, Any]:
    """Lines per second through the pure dmon and pmon parsers (and the pmon interval tracker)."""
    from patroller.observe.nvsmi.intervals import PmonIntervals
    from patroller.observe.nvsmi.parsers import DmonParser, PmonParser

    dmon = [
        "# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk ",
        "# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz ",
    ]
    dmon += [
        f"{g:>5}    {300 + g:>3}     {40 + g % 9:>2}     {50 + g % 7:>2}     {g % 100:>2}"
        f"     {g % 50:>2}      0      0      0      0   2619   1980 "
        for g in range(64)
    ]
    pmon = [
        "# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command ",
        "# Idx           #    C/G      %      %      %      %      %      %    name ",
    ]
    pmon += [
        f"{p % 64:>5}    {100000 + p:>7}     C     {p % 100:>2}     {p % 40:>2}      -      -"
        f"      -      -    python         "
        for p in sorted(range(500), key=lambda p: p % 64)
    ]

    def rate(lines: list[str], feed: Callable[[str], Any]) -> int:
        body = lines[2:]
        repeats = max(1, ctx.parser_lines // len(body))
        for line in lines[:2]:
            feed(line)
        began = time.perf_counter()
        for _ in range(repeats):
            for line in body:
                feed(line)
        return round(repeats * len(body) / (time.perf_counter() - began))

    tracker, pmon_parser = PmonIntervals(), PmonParser()

    def pmon_and_intervals(line: str) -> None:
        row = pmon_parser.feed(line)
        if row is not None:
            tracker.feed(row)

    result = {
        "dmon_lines_per_s": rate(dmon, DmonParser().feed),
        "pmon_lines_per_s": rate(pmon, PmonParser().feed),
        "pmon_with_intervals_lines_per_s": rate(pmon, pmon_and_intervals),
    }
    ctx.log(f"parsers: {result}")
    return result


# 7. waiters ---------------------------------------------------------------------------------


def waiters(ctx: Context) -> dict[str, Any]:
    """10,000 waiters from 100 users (1,000 from 10 in quick mode).

    What a registration, a change and a cancel cost the lease manager; then a live test-mode
    daemon: /status p99 with and without them, the per-user cap, a release answered past them,
    and the queue emptied when they all leave.
    """
    users, per_user = (10, 100) if ctx.quick else (100, 100)
    result: dict[str, Any] = {
        "waiters": users * per_user,
        "users": users,
        **_lease_manager_costs(users, per_user),
    }
    result.update(_live_waiters(ctx, users, per_user))
    ctx.log(f"waiters: {result}")
    return result


def _spread(samples: list[float]) -> dict[str, float]:
    """Median, p99 and max in milliseconds, to the microsecond."""
    ordered = sorted(samples)
    return {
        "median": round(statistics.median(ordered) * 1000, 3),
        "p99": round(ordered[int(len(ordered) * 0.99)] * 1000, 3),
        "max": round(ordered[-1] * 1000, 3),
    }


def _lease_manager_costs(users: int, per_user: int) -> dict[str, Any]:
    """The lease manager alone, on the 8 test-mode devices all held: each call timed."""
    from patroller.config import Config, policy_of
    from patroller.core.identity import named_user
    from patroller.core.leases import LeaseManager
    from patroller.observe.testmode import synthetic_inventory

    leases = LeaseManager(
        synthetic_inventory(8),
        lease=600.0,
        policy=policy_of(Config()),
        max_waiters=users * per_user,
        max_waiting_per_user=per_user,
    )
    leases.request(named_user("holder"), {"gpu": 8})
    names = [named_user(f"user{n}") for n in range(users)]
    registered, queued = [], []
    for n in range(users * per_user):  # users take turns; they want 1 to 4 devices
        began = time.perf_counter()
        queued.append(leases.wait(names[n % users], {"gpu": n % 4 + 1}, lambda d: None))
        registered.append(time.perf_counter() - began)
    served: list[float] = []
    uuids = [d.uuid for d in leases.inventory]
    for n in range(200):  # a device freed: the first waiter that fits takes it
        holder = leases.holder(uuids[n % 8])
        assert holder is not None
        began = time.perf_counter()
        leases.release(holder, uuids[n % 8])
        served.append(time.perf_counter() - began)
    cancelled = []
    for waiter in queued[-1000:]:
        began = time.perf_counter()
        leases.cancel(waiter)
        cancelled.append(time.perf_counter() - began)
    return {
        "register_ms": _spread(registered),
        "release_serving_ms": _spread(served),
        "cancel_ms": _spread(cancelled),
    }


def _started(daemon: Daemon, **settings: str) -> Daemon:
    """Start the harness's daemon with these PATROLLER_* settings besides its own flags."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)  # the daemon inherits them
    try:
        return daemon.start()
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _live_waiters(ctx: Context, users: int, per_user: int) -> dict[str, Any]:
    count = users * per_user
    # Test mode: callers name themselves with user=, so one client can be a hundred users.
    daemon = _started(
        Daemon(8, lease=600), PATROLLER_TEST="1", PATROLLER_MAX_WAITING_PER_USER=str(per_user)
    )
    result: dict[str, Any] = {}
    try:
        daemon.ok("/request?gpu=8&user=holder")
        if have_wrk():
            if ctx.quick:  # warmed up as the run with waiters will be, then measured once
                wrk(daemon.url + "/status", 1)
            result["status_without_waiters"] = wrk(daemon.url + "/status", ctx.wrk_seconds)

        async def waiting() -> int:
            loop = asyncio.get_running_loop()
            return (await loop.run_in_executor(None, daemon.ok, "/metrics.json"))["waiting"]

        async def run() -> None:
            first = await _open_wait(daemon.port, "user0")  # to be served past the rest
            while await waiting() < 1:
                await asyncio.sleep(0.01)
            began = time.monotonic()
            opened = [first]
            batch = 100  # connections opened at once: within the listen backlog (128)
            for start in range(1, count, batch):
                opened += await asyncio.gather(
                    *(
                        _open_wait(daemon.port, f"user{n % users}")
                        for n in range(start, min(start + batch, count))
                    )
                )
            while await waiting() < count:
                if time.monotonic() - began > 120:
                    raise RuntimeError(f"{await waiting()} of {count} waiters queued")
                await asyncio.sleep(0.05)
            result["register_wall_ms_each"] = round(
                (time.monotonic() - began) * 1000 / (count - 1), 3
            )
            loop = asyncio.get_running_loop()
            status, body = await loop.run_in_executor(None, daemon.get, "/wait?gpu=1&user=user0")
            result["over_the_cap"] = {
                "status": status,
                **{k: body.get(k) for k in ("limit", "waiting")},
            }
            if have_wrk():
                result["status_while_waiting"] = await loop.run_in_executor(
                    None, wrk, daemon.url + "/status", ctx.wrk_seconds
                )
            uuid = next(iter(await loop.run_in_executor(None, daemon.ok, "/devices")))
            began = time.monotonic()
            await loop.run_in_executor(None, daemon.ok, f"/release?user=holder&uuid={uuid}")
            reader, _ = first
            await reader.readuntil(b"\r\n\r\n")
            result["release_to_first_answered_ms"] = ms(time.monotonic() - began)
            began = time.monotonic()
            for _, writer in opened:
                writer.close()
            while await waiting() > 0:
                if time.monotonic() - began > 120:
                    raise RuntimeError("waiters stayed queued after their clients left")
                await asyncio.sleep(0.05)
            result["all_left_queue_empty_s"] = round(time.monotonic() - began, 2)

        asyncio.run(run())
        # Full mode: again, warmed up as the run with waiters was; the lower p99 counts.
        if have_wrk() and not ctx.quick:
            again = wrk(daemon.url + "/status", ctx.wrk_seconds)
            before = result["status_without_waiters"]["p99_ms"]
            if again["p99_ms"] is not None and (before is None or again["p99_ms"] < before):
                result["status_without_waiters"] = again
        result["rss_mib"] = round(daemon.rss_mib(), 1)
    finally:
        daemon.stop()
    without = result.get("status_without_waiters", {}).get("p99_ms")
    during = result.get("status_while_waiting", {}).get("p99_ms")
    if without and during:
        result["status_p99_ratio"] = round(during / without, 2)
    return result


async def _open_wait(port: int, user: str) -> Any:
    """A connection that has asked /wait?gpu=1 as `user`: (reader, writer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /wait?gpu=1&user={user} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


# 8. persistence ------------------------------------------------------------------------------


def persistence(ctx: Context) -> dict[str, Any]:
    """What keeping the lease book on disk costs: each write alone, and /request + /release
    round trips through a live daemon with and without --state-dir."""
    parent = tempfile.mkdtemp(prefix="pbench-book", dir="/var/tmp")  # on disk, as /var/lib
    try:
        result: dict[str, Any] = {
            "filesystem": _filesystem(parent),
            **_book_write_costs(os.path.join(parent, "alone"), ctx),
        }
        runs: dict[str, dict[str, Any]] = {}
        # Alternated, the better of two each: the machine is shared (one each in quick mode).
        for _ in range(1 if ctx.quick else 2):
            for name, state in (
                ("without_book", None),
                ("with_book", os.path.join(parent, "live")),
            ):
                row = _round_trips(state, ctx.wrk_seconds)
                if name not in runs or row["round_trips_per_s"] > runs[name]["round_trips_per_s"]:
                    runs[name] = row
        result.update(runs)
        result["request_p50_added_ms"] = round(
            runs["with_book"]["request_ms"]["median"]
            - runs["without_book"]["request_ms"]["median"],
            3,
        )
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    ctx.log(f"persistence: {result}")
    return result


def _filesystem(path: str) -> str:
    """The type of the filesystem `path` is on, from /proc/mounts (the longest mount point)."""
    best, kind = "", "unknown"
    with open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if path.startswith(fields[1].rstrip("/") + "/") and len(fields[1]) >= len(best):
                best, kind = fields[1], fields[2]
    return kind


def _book_write_costs(directory: str, ctx: Context) -> dict[str, Any]:
    """The lease manager's request/release with and without a book, 8 devices; and one write,
    with and without fsync (why the book does without it)."""
    from patroller.config import Config, policy_of
    from patroller.core.identity import Identity, named_user
    from patroller.core.leases import LeaseManager
    from patroller.observe.testmode import synthetic_inventory
    from patroller.state import book as bookmodule

    count = 2000 if ctx.quick else 20000
    someone = Identity(
        user="dana@example.org",
        source="container",
        email="dana@example.org",
        uid=1000,
        container=("0123456789ab", "train"),
        info=(("team", "vision"),),
    )

    def timed(leases: LeaseManager) -> list[float]:
        leases.request(someone, {"gpu": 7})  # the book holds 7 or 8 devices
        alice = named_user("alice@example.org")
        samples = []
        for _ in range(count):
            began = time.perf_counter()
            leases.request(alice, {"gpu": 1})
            leases.release(alice)
            samples.append(time.perf_counter() - began)
        return samples

    def manager() -> LeaseManager:
        config = Config()
        return LeaseManager(
            synthetic_inventory(8),
            lease=600.0,
            policy=policy_of(Config()),
            max_waiters=config.max_waiters,
            max_waiting_per_user=config.max_waiting_per_user,
        )

    bare = timed(manager())
    book = bookmodule.LeaseBook(directory, Config())
    book.open()
    leases = manager()
    book.attach(leases)
    try:
        booked = timed(leases)
        size = os.path.getsize(book.path)
        assert book.writes == 2 * count + 2, book.writes  # every change written, nothing more
    finally:
        book.close()
    # One write of the same bytes, three ways: the book's (a new file, the link swung to it),
    # a temporary renamed over the file, and that with the fsyncs a host crash would need.
    body = b"x" * size
    writer = bookmodule.LeaseBook(os.path.join(directory, "raw"), Config())
    os.makedirs(writer.directory)
    path = os.path.join(directory, "raw.json")
    linked: list[float] = []
    renamed: list[float] = []
    synced: list[float] = []
    ways: list[tuple[list[float], Callable[[], None]]] = [
        (linked, lambda: writer.files.publish(body)),
        (renamed, lambda: _rename_over(path, body)),
    ]
    for samples, write in ways:  # each way in a row, as a daemon writes: the disk's queue counts
        for _ in range(min(count, 3000)):
            began = time.perf_counter()
            write()
            samples.append(time.perf_counter() - began)
    for _ in range(200):  # fsync waits for the disk: slow, so fewer
        began = time.perf_counter()
        _rename_over(path, body, sync=True)
        synced.append(time.perf_counter() - began)
    return {
        "book_bytes": size,
        "request_release_ms": {"without_book": _spread(bare), "with_book": _spread(booked)},
        "write_ms": _spread(linked),
        "rename_over_ms": _spread(renamed),
        "rename_over_fsync_ms": _spread(synced),
    }


def _rename_over(path: str, body: bytes, sync: bool = False) -> None:
    """The usual atomic write: a temporary renamed over the file (with fsyncs: file, directory)."""
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, body)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    if sync:
        fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _round_trips(state_dir: str | None, seconds: float) -> dict[str, Any]:
    """/request?gpu=1 then /release on one keep-alive connection, for `seconds`, GPU host mode."""
    daemon = Daemon(8, lease=600, state_dir=state_dir).start()
    try:
        daemon.ok("/request?gpu=7")  # the book holds 7 or 8 devices, as above
        connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
        requests: list[float] = []
        trips = 0
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            start = time.perf_counter()
            for path in ("/request?gpu=1", "/release"):
                connection.request("GET", path)
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    raise RuntimeError(f"{path}: {response.status}")
                if path != "/release":
                    requests.append(time.perf_counter() - start)
            trips += 1
        elapsed = time.monotonic() - began
        connection.close()
        book = daemon.ok("/metrics.json").get("lease_book")
    finally:
        daemon.stop()
    return {
        "round_trips_per_s": round(trips / elapsed),
        "request_ms": _spread(requests),
        "book_writes": book["writes"] if book else 0,
    }


# 9. Prometheus scrapes ----------------------------------------------------------------------


def scrape(ctx: Context) -> dict[str, Any]:
    """/metrics at 64 GPUs and 500 processes: time per scrape and its size; then /status p99
    under load while Prometheus (Debian's, when installed) scrapes the daemon every second."""
    daemon = Daemon(64, docker_host=ctx.docker_host).start()
    result: dict[str, Any] = {"gpus": 64, "processes": len(ctx.pool[:500])}
    try:
        pids = ctx.pool[:500]
        daemon.write(
            [
                {
                    "pid": pid,
                    "gpu": n % 64,
                    "type": "C",
                    "name": "python",
                    "used_mib": 1024 + n,
                    "sm": n % 100,
                }
                for n, pid in enumerate(pids)
            ]
        )
        daemon.wait_for(lambda s: processes_on(s) == len(pids), timeout=120)
        times = []
        size = 0
        for _ in range(ctx.repeats * 5):
            began = time.perf_counter()
            body = daemon.raw("/metrics")
            times.append(time.perf_counter() - began)
            size = len(body)
        result["scrape_ms"] = _spread(times)
        result["scrape_bytes"] = size
        result["series"] = sum(
            1 for line in body.decode().splitlines() if line and not line.startswith("#")
        )
        if have_wrk():
            result["status_alone"] = wrk(daemon.url + "/status", ctx.wrk_seconds)
            with _Scraper(daemon) as scraper:
                result["status_while_scraped"] = wrk(daemon.url + "/status", ctx.wrk_seconds)
                result["scraper"] = scraper.kind
    finally:
        daemon.stop()
    ctx.log(f"scrape: {result}")
    return result


class _Scraper:
    """Prometheus scraping `daemon` every second (a thread doing the same where Prometheus is
    not installed)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.kind = "prometheus" if shutil.which("prometheus") else "thread"
        self.dir = tempfile.mkdtemp(prefix="pbench-prom")
        self.process: Any = None
        self.thread: threading.Thread | None = None
        self.stopping = threading.Event()

    def __enter__(self) -> _Scraper:
        if self.kind == "prometheus":
            import subprocess

            config = os.path.join(self.dir, "prometheus.yml")
            with open(config, "w", encoding="utf-8") as f:
                f.write(
                    "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
                    "scrape_configs:\n- job_name: patroller\n  static_configs:\n"
                    f"  - targets: ['127.0.0.1:{self.daemon.port}']\n"
                )
            self.process = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.dir}/data",
                    "--web.listen-address=127.0.0.1:0",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 30  # until it has scraped a few times
            before = self._scrapes()
            while self._scrapes() < before + 3 and time.monotonic() < deadline:
                time.sleep(0.2)
        else:

            def run() -> None:
                while not self.stopping.wait(1.0):
                    self.daemon.raw("/metrics")

            self.thread = threading.Thread(target=run, daemon=True)
            self.thread.start()
        return self

    def _scrapes(self) -> int:
        text = self.daemon.raw("/metrics").decode()
        found = [
            line
            for line in text.splitlines()
            if line.startswith('patroller_http_requests_total{endpoint="/metrics",status="200"}')
        ]
        return int(float(found[0].split()[-1])) if found else 0

    def __exit__(self, *exc: Any) -> None:
        self.stopping.set()
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)
        if self.thread is not None:
            self.thread.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)


# 10. The web page ---------------------------------------------------------------------------

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def page(ctx: Context) -> dict[str, Any]:
    """The web page at 8 GPUs with processes on them: the bytes a browser receives for /,
    /web/app.js, /web/style.css and the first /events snapshot (headers included, as sent on
    loopback), and the time from navigation start to the first GPU cards drawn, in headless
    Chromium (tests/browser.py) when it is installed."""
    daemon = Daemon(8, docker_host=ctx.docker_host).start()
    result: dict[str, Any] = {"gpus": 8}
    try:
        pids = ctx.pool[:16]
        daemon.write(
            [
                {
                    "pid": pid,
                    "gpu": n % 8,
                    "type": "C",
                    "name": "python",
                    "used_mib": 4096 + n,
                    "sm": 50 + n,
                }
                for n, pid in enumerate(pids)
            ]
        )
        daemon.wait_for(lambda s: processes_on(s) == len(pids), timeout=120)
        result["processes"] = len(pids)
        sizes = {
            path: _transferred(daemon.port, path, accept)
            for path, accept in (
                ("/", BROWSER_ACCEPT),
                ("/web/app.js", "*/*"),
                ("/web/style.css", "text/css,*/*;q=0.1"),
            )
        }
        sizes["/events (first snapshot)"] = _first_event(daemon.port)
        result["bytes"] = sizes
        result["total_bytes"] = sum(sizes.values())
        result["render"] = _first_render(daemon.url, 3 if ctx.quick else 20)
    finally:
        daemon.stop()
    ctx.log(f"page: {result}")
    return result


def _exchange(port: int, path: str, accept: str, until: Callable[[bytes], bool]) -> bytes:
    """What the daemon sends for one GET as a browser asks it, up to until(received)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: {accept}\r\n"
            "Accept-Encoding: gzip, deflate, br\r\nConnection: close\r\n\r\n".encode()
        )
        received = b""
        while not until(received):
            chunk = s.recv(65536)
            if not chunk:
                break
            received += chunk
    return received


def _transferred(port: int, path: str, accept: str) -> int:
    answer = _exchange(port, path, accept, lambda got: False)
    if not answer.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"{path}: {answer[:200]!r}")
    return len(answer)


def _first_event(port: int) -> int:
    """Headers, the retry line and the first snapshot event of /events."""

    def whole(got: bytes) -> bool:
        at = got.find(b"event: snapshot")
        return at >= 0 and got.find(b"\n\n", at) >= 0

    answer = _exchange(port, "/events", "text/event-stream", whole)
    if not whole(answer):
        raise RuntimeError(f"/events: no snapshot: {answer[:300]!r}")
    at = answer.find(b"event: snapshot")
    return answer.find(b"\n\n", at) + 2


def _first_render(url: str, loads: int) -> dict[str, Any]:
    """Navigation start to the first cards drawn (the page's own performance.now() when it
    set data-rendered), over `loads` loads after a first one that warms the browser."""
    import sys

    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    sys.path.insert(0, tests)
    try:
        from browser import Browser, BrowserUnavailable  # type: ignore[import-not-found]
    finally:
        sys.path.remove(tests)
    try:
        chromium = Browser(width=1400, height=1000)
    except BrowserUnavailable as exc:
        return {"measured": False, "why": str(exc)}
    try:
        times: list[float] = []
        for n in range(loads + 1):
            chromium.open(url + "/")
            chromium.until(
                lambda: chromium.js("return document.body.dataset.rendered"),
                "the first render",
                timeout=30,
            )
            drawn = float(chromium.js("return document.body.dataset.firstRender"))
            cards = chromium.js("return document.querySelectorAll('#gpus .card').length")
            if cards != 8:
                raise RuntimeError(f"{cards} cards drawn, not 8")
            if n == 0:
                first = drawn
            else:
                times.append(drawn / 1000)
        browser_bytes = chromium.js(
            "return performance.getEntriesByType('navigation').concat("
            "performance.getEntriesByType('resource')).reduce((n, e) => n + e.transferSize, 0)"
        )
        return {
            "measured": True,
            "cold_ms": round(first, 1),
            "ms": _spread(times),
            "browser_counted_bytes": browser_bytes,
            "browser": chromium.driver.capabilities.get("browserVersion"),
        }
    finally:
        chromium.quit()
