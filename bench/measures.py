"""The six measurements. Each returns plain data; `__main__` prints, saves and compares it."""
from __future__ import annotations

import asyncio
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from .harness import Containers, Daemon, Sleepers, have_wrk, processes_on, wrk

LEASE = 3.0  # seconds, for the reaction runs: longer than a sampling interval, so that the
# process-exit measurement cannot be answered by an expiring lease instead


class Context:
    """What every measurement shares: the mode's sizes, processes and containers."""

    def __init__(self, quick: bool, log: Callable[[str], None]) -> None:
        self.quick = quick
        self.log = log
        self.sleepers = Sleepers()
        self.containers = Containers()
        self.docker = False
        self.pool: List[int] = []  # 500 processes that stand for GPU jobs
        self.wrk_seconds = 2 if quick else 10
        self.repeats = 3 if quick else 20
        self.steady_seconds = 8 if quick else 60
        self.footprint_seconds = 5 if quick else 30
        self.parser_lines = 60_000 if quick else 600_000

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
    def docker_host(self) -> Optional[str]:
        return self.containers.url if self.docker else None

    def stop(self) -> None:
        self.sleepers.stop()
        self.containers.stop()


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


# 1. throughput and latency -----------------------------------------------------------------

def throughput(ctx: Context) -> List[Dict[str, Any]]:
    """/status and /devices under 32 connections, for 8 and 64 GPUs, 0 and 500 processes."""
    if not have_wrk():
        ctx.log("wrk is not installed: throughput skipped (apt-get install wrk)")
        return []
    results = []
    for gpus, count in ((8, 0), (8, 500), (64, 0), (64, 500)):
        daemon = Daemon(gpus, docker_host=ctx.docker_host).start()
        try:
            if count:
                daemon.place(ctx.pool[:count])
                daemon.wait_for(lambda s: processes_on(s) == count, timeout=120)
            row: Dict[str, Any] = {"gpus": gpus, "processes": count,
                                   "status_bytes": len(daemon.raw("/status"))}
            for path in ("/status", "/devices"):
                row[path] = wrk(daemon.url + path, ctx.wrk_seconds)
            results.append(row)
            ctx.log(f"throughput {gpus} GPUs {count} processes: /status "
                    f"{row['/status']['requests_per_s']}/s p99 {row['/status']['p99_ms']} ms")
        finally:
            daemon.stop()
    return results


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

    def begin(self) -> "Waiter":
        before = self.daemon_.ok("/metrics")["waiting"]
        self.start()
        deadline = time.monotonic() + 10
        while self.daemon_.ok("/metrics")["waiting"] <= before:
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
            raise RuntimeError("devices not free: " + str(
                [(e["claim"]["state"], e["claim"]["processes"], (e["claim"]["user"] or {}).get("user"))
                 for e in status.values()]))
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


def reactions(ctx: Context) -> Dict[str, Any]:
    """pmon line -> /status; release, expiry and process exit -> a waiting /wait answered."""
    daemon = Daemon(8, interval=1.0, lease=LEASE, docker_host=ctx.docker_host).start()
    uuids = list(daemon.ok("/devices"))
    seen, released, expired, expiry_error, exited = [], [], [], [], []
    try:
        for n in range(ctx.repeats):
            gpu = n % 8
            [pid] = ctx.sleepers.start(1)
            daemon.write([{"pid": pid, "gpu": gpu}])
            visible = daemon.wait_for(lambda s: pid in s[uuids[gpu]]["claim"]["processes"],
                                      every=0.002)
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
        "interval_s": 1.0, "lease_s": LEASE, "samples": ctx.repeats,
        "pmon_to_status_ms": {"median": ms(statistics.median(seen)), "max": ms(max(seen))},
        "release_to_wait_ms": {"median": ms(statistics.median(released)), "max": ms(max(released))},
        "expiry_to_wait_ms": {"median": ms(statistics.median(expired)), "max": ms(max(expired))},
        "expiry_error_ms": {"median": ms(statistics.median(expiry_error)),
                            "max": ms(max(expiry_error, key=abs))},
        "exit_to_wait_ms": {"median": ms(statistics.median(exited)), "max": ms(max(exited))},
    }
    ctx.log(f"reactions: {result}")
    return result


# 3. identity cost ----------------------------------------------------------------------------

def identity_cost(ctx: Context) -> Dict[str, Any]:
    """Docker calls and /proc reads per minute at steady state; a new container's first lookup."""
    daemon = Daemon(8, interval=1.0, docker_host=ctx.docker_host).start()
    result: Dict[str, Any] = {"processes": len(ctx.pool), "docker": ctx.docker}
    try:
        daemon.place(ctx.pool)
        daemon.wait_for(lambda s: processes_on(s) == len(ctx.pool), timeout=120)
        time.sleep(2)
        before, start = daemon.ok("/metrics"), time.monotonic()
        time.sleep(ctx.steady_seconds)
        after, minutes = daemon.ok("/metrics"), (time.monotonic() - start) / 60
        result["docker_calls_per_min"] = round((after["docker_calls"] - before["docker_calls"]) / minutes, 1)
        result["proc_reads_per_min"] = round((after["proc_reads"] - before["proc_reads"]) / minutes, 1)
        result["docker_calls_to_resolve_all"] = before["docker_calls"]
        if ctx.docker:
            result.update(_new_container(ctx, daemon))
    finally:
        daemon.stop()
    ctx.log(f"identity: {result}")
    return result


def _new_container(ctx: Context, daemon: Daemon) -> Dict[str, Any]:
    from patroller.containers import ContainerDirectory
    from patroller.resolver import ProcessIdentifier

    container, pids = ctx.containers.run("newcomer@example.org", 10)
    calls = daemon.ok("/metrics")["docker_calls"]
    daemon.place(ctx.pool + pids)
    daemon.wait_for(lambda s: processes_on(s) == len(ctx.pool) + 10, timeout=60, every=0.002)
    first = _trace_time(daemon, pids[0])
    visible = daemon.wait_for(lambda s: any(
        (e["claim"]["users"] and any(u["user"] == "newcomer@example.org" for u in e["claim"]["users"]))
        for e in s.values()), every=0.002)
    new_calls = daemon.ok("/metrics")["docker_calls"] - calls

    async def resolve_times() -> Dict[str, float]:
        identifier = ProcessIdentifier(ContainerDirectory(ctx.containers.url))
        warm, _ = ctx.containers.run("warm@example.org", 1)
        await identifier.resolve(warm.pid)  # connect and negotiate first
        fresh, fresh_pids = ctx.containers.run("fresh@example.org", 1)
        began = time.perf_counter()
        await identifier.resolve(fresh_pids[0])
        cold = time.perf_counter() - began
        began = time.perf_counter()
        await identifier.resolve(fresh_pids[0])
        return {"first_resolution_ms": ms(cold), "cached_resolution_ms": ms(time.perf_counter() - began)}

    return {"new_container_docker_calls": new_calls,
            "new_container_visible_ms": ms(visible - first), **asyncio.run(resolve_times())}


# 4. scale -----------------------------------------------------------------------------------

async def _hold_waiters(port: int, count: int) -> List[asyncio.Task]:
    async def one() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /wait?gpu=1 HTTP/1.1\r\nHost: bench\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
        body = await reader.readexactly(length)
        answered = time.monotonic()
        uuid = body.split(b'"uuid":"')[1].split(b'"')[0].decode()
        writer.write(f"GET /release?uuid={uuid} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
        return answered
    return [asyncio.ensure_future(one()) for _ in range(count)]


def scale(ctx: Context, count: int = 1000) -> Dict[str, Any]:
    """1,000 waiters held, /status p99 and memory meanwhile, then all served."""
    daemon = Daemon(8, interval=1.0, lease=600, docker_host=ctx.docker_host).start()
    result: Dict[str, Any] = {"waiters": count}
    try:
        daemon.ok("/request?gpu=8")
        time.sleep(1)
        rss_before = daemon.rss_mib()

        async def run() -> None:
            tasks = await _hold_waiters(daemon.port, count)
            loop = asyncio.get_running_loop()
            deadline = time.monotonic() + 120
            while (await loop.run_in_executor(None, daemon.ok, "/metrics"))["waiting"] < count:
                if time.monotonic() > deadline:
                    raise RuntimeError("the waiters were not all held")
                await asyncio.sleep(0.2)
            result["rss_added_mib"] = round(daemon.rss_mib() - rss_before, 1)
            if have_wrk():
                result["status_while_waiting"] = await loop.run_in_executor(
                    None, wrk, daemon.url + "/status", ctx.wrk_seconds)
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

def footprint(ctx: Context) -> Dict[str, Any]:
    """CPU share of one core and RSS: idle with 16 GPUs, and while 500 processes churn."""
    result: Dict[str, Any] = {}
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
        result["churn"]["docker_calls"] = daemon.ok("/metrics")["docker_calls"]
    finally:
        daemon.stop()
        for pid in churners:
            if pid in ctx.sleepers.processes:
                ctx.sleepers.kill(pid)
    ctx.log(f"footprint: {result}")
    return result


def _adopt(ctx: Context, pids: List[int]) -> None:
    from dockerd import Container

    first = ctx.containers.engine.containers[0]
    main = int(ctx.containers.engine.docker("inspect", "-f", "{{.State.Pid}}", first).stdout)
    for pid in pids:
        Container.adopt_pid(main, pid)


def _cpu_and_rss(daemon: Daemon, seconds: float) -> Dict[str, float]:
    cpu, began = daemon.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    share = (daemon.cpu_seconds() - cpu) / (time.monotonic() - began)
    return {"cpu_percent": round(100 * share, 2), "rss_mib": round(daemon.rss_mib(), 1)}


# 6. parsers ---------------------------------------------------------------------------------

def parsers(ctx: Context) -> Dict[str, Any]:
    """Lines per second through the pure dmon and pmon parsers (and the pmon interval tracker)."""
    from patroller.nvsmi.parsers import DmonParser, PmonIntervals, PmonParser

    dmon = ["# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk ",
            "# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz "]
    dmon += [f"{g:>5}    {300 + g:>3}     {40 + g % 9:>2}     {50 + g % 7:>2}     {g % 100:>2}"
             f"     {g % 50:>2}      0      0      0      0   2619   1980 " for g in range(64)]
    pmon = ["# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command ",
            "# Idx           #    C/G      %      %      %      %      %      %    name "]
    pmon += [f"{p % 64:>5}    {100000 + p:>7}     C     {p % 100:>2}     {p % 40:>2}      -      -"
             f"      -      -    python         " for p in sorted(range(500), key=lambda p: p % 64)]

    def rate(lines: List[str], feed: Callable[[str], Any]) -> int:
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

    result = {"dmon_lines_per_s": rate(dmon, DmonParser().feed),
              "pmon_lines_per_s": rate(pmon, PmonParser().feed),
              "pmon_with_intervals_lines_per_s": rate(pmon, pmon_and_intervals)}
    ctx.log(f"parsers: {result}")
    return result

