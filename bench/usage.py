"""The usage store at a lab's size: a year of one-minute samples written straight into the
store, the reports read from it through a daemon's `GET /usage`, the store's size, the
sampler's CPU cost, and `/status` while reports run.

The year is a made-up lab, the same every run (a seeded random): 20 users, each GPU in
four-hour blocks free (20 %), reserved and unused (10 %), claimed and computing part of the
time (55 %), shared with a trespasser (5 %), or a Slurm job's, a new job each block (10 %).
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from patroller.config import Config, policy_of
from patroller.core.identity import Identity
from patroller.core.leases import LeaseManager
from patroller.core.usage import GpuSample, Party, Present
from patroller.observe.signals import Sample, Signals
from patroller.observe.tally import Tally
from patroller.observe.testmode import synthetic_inventory
from patroller.state.usage import schema, tables
from patroller.state.usage.files import FILE
from patroller.state.usage.sampler import UsageSampler
from patroller.state.usage.store import UsageStore

from .harness import Daemon, have_wrk, wrk

MINUTE, DAY, BLOCK = 60, 86400, 4 * 3600
USERS = [Party(user=f"user{n}@lab.example", account=f"user{n}") for n in range(20)]


def block(rnd: random.Random, gpu: int, start: int) -> Callable[[random.Random], GpuSample]:
    """What a GPU does for one four-hour block: a maker of its one-minute samples."""
    uuid, roll = f"GPU-bench-{gpu:04d}", rnd.random()
    user, other = rnd.sample(USERS, 2)
    common = dict(uuid=uuid, number=gpu, seconds=float(MINUTE), name="NVIDIA A100-SXM4-80GB")
    if roll < 0.20:
        return lambda r: GpuSample(state="free", **common)
    if roll < 0.30:
        return lambda r: GpuSample(
            state="reserved", hold="lease", holder=user, reserved=True, **common
        )
    if roll < 0.40:
        job = Party(
            user=user.user,
            account=user.account,
            job=str(start // BLOCK * 64 + gpu),
            slurm_account="lab",
        )
        return lambda r: _computing(r, "claimed", "slurm", job, True, (job,), common)
    if roll < 0.45:
        return lambda r: _computing(r, "shared", "lease", user, True, (user, other), common)
    return lambda r: _computing(r, "claimed", "lease", user, rnd.random() < 0.7, (user,), common)


def _computing(
    r: random.Random,
    state: str,
    hold: str,
    holder: Party,
    reserved: bool,
    parties: tuple[Party, ...],
    common: dict[str, Any],
) -> GpuSample:
    busy = r.choice((0, 12, 45, 60, 60))
    present = tuple(
        Present(p, p == holder, (10_000 + n,), (f"{p.account}-job",))
        for n, p in enumerate(parties)
    )
    return GpuSample(
        state=state,
        hold=hold,
        holder=holder,
        reserved=reserved,
        present=present,
        readings=60,
        busy=busy,
        sm_mean=busy * 1.4,
        sm_max=min(100, busy * 2),
        mem_mean=busy * 0.5,
        mem_max=busy,
        fb_mean=30_000.0,
        fb_max=31_000.0,
        **common,
    )


def fill(directory: str, gpus: int, days: int, end: int) -> dict[str, Any]:
    """Write `days` of one-minute intervals for `gpus` GPUs, ending at `end`, into a fresh
    store in `directory`, as the store's writer writes them (tables.write_interval)."""
    path = os.path.join(directory, FILE)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    schema.migrate(db)
    keys, rnd = tables.Keys(), random.Random(gpus * 1000 + days)
    start = end - days * DAY
    makers: list[Callable[[random.Random], GpuSample]] = []
    began = time.monotonic()
    for at in range(start + MINUTE, end + 1, MINUTE):
        if (at - MINUTE - start) % BLOCK == 0:
            makers = [block(rnd, gpu, at) for gpu in range(gpus)]
        tables.write_interval(db, keys, at, [make(rnd) for make in makers])
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rows = db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    hourly = db.execute("SELECT COUNT(*) FROM hourly").fetchone()[0]
    daily = db.execute("SELECT COUNT(*) FROM daily").fetchone()[0]
    db.close()
    size = sum(
        os.path.getsize(path + tail)
        for tail in ("", "-wal", "-shm")
        if os.path.exists(path + tail)
    )
    gpu_years = gpus * days / 365
    return {
        "gpus": gpus,
        "days": days,
        "samples": rows,
        "hourly_rows": hourly,
        "daily_rows": daily,
        "write_s": round(time.monotonic() - began, 1),
        "intervals_per_s": round(days * DAY / MINUTE / (time.monotonic() - began)),
        "mib": round(size / 2**20, 1),
        "mib_per_gpu_year": round(size / 2**20 / gpu_years, 1),
    }


def store(ctx: Any, directory: str, gpus: int, days: int) -> dict[str, Any]:
    """`days` of `gpus` GPUs in the fresh store `directory`: written (fill) the first time a run
    asks for this size, copied from that first store after (the usage and reports steps read
    the same 8 GPUs' days: a store a step, the same samples, written once). The fill's figures,
    with `copied` true where the store was copied (its end then a few minutes back)."""
    kept = ctx.stores.get((gpus, days))
    if kept is None:
        row = fill(directory, gpus, days, int(time.time()) // MINUTE * MINUTE)
        template = tempfile.mkdtemp(prefix="pbench-store")
        _copy_store(directory, template)
        ctx.stores[(gpus, days)] = (template, row)
        return row
    template, row = kept
    _copy_store(template, directory)
    return {**row, "copied": True}


def _copy_store(source: str, target: str) -> None:
    for tail in ("", "-wal"):
        if os.path.exists(os.path.join(source, FILE + tail)):
            shutil.copy2(os.path.join(source, FILE + tail), os.path.join(target, FILE + tail))


def timed_reports(daemon: Daemon, spans: list[int], repeats: int) -> dict[str, Any]:
    """Seconds a `GET /usage` takes, per range and grouping: the median and the slowest of
    `repeats` reads (each range an hour shorter than the one before: the daemon answers the
    same report asked again from memory, which `again_s` times)."""
    found: dict[str, Any] = {}
    for days in spans:
        for by in ("user", "day", "gpu", "job"):
            took = []
            for n in range(repeats):
                began = time.monotonic()
                daemon.ok(f"/usage?since={days * 24 - n}h&by={by}")
                took.append(time.monotonic() - began)
            began = time.monotonic()
            daemon.ok(f"/usage?since={days * 24 - repeats + 1}h&by={by}")
            found[f"{days}d by {by}"] = {
                "median_s": round(statistics.median(took), 3),
                "max_s": round(max(took), 3),
                "again_s": round(time.monotonic() - began, 3),
            }
    return found


def status_during_reports(
    daemon: Daemon, seconds: float, days: int, rounds: int = 3
) -> dict[str, Any]:
    """/status under wrk alone, then while one client asks for `days`-day reports back to
    back, `rounds` times in turn (a shared machine's load changes); the median throughput
    while reports run as a fraction of the median alone. Each report's range differs from the
    last by an hour, so that each is read, not answered from memory."""
    alone: list[dict[str, float]] = []
    during: list[dict[str, float]] = []
    reports = 0
    for _ in range(rounds):
        alone.append(wrk(daemon.url + "/status", seconds))
        stop, done = threading.Event(), [0]

        def reporting() -> None:
            while not stop.is_set():
                daemon.ok(f"/usage?since={days * 24 - done[0] % 720}h&by=user")
                done[0] += 1

        thread = threading.Thread(target=reporting, daemon=True)
        thread.start()
        try:
            during.append(wrk(daemon.url + "/status", seconds))
        finally:
            stop.set()
            thread.join(60)
        reports += done[0]

    def median(rows: list[dict[str, float]]) -> dict[str, float]:
        return {
            key: statistics.median(row[key] for row in rows)
            for key in ("requests_per_s", "p99_ms")
        }

    typical, busy = median(alone), median(during)
    rate = typical["requests_per_s"]
    return {
        "alone": typical,
        "during": busy,
        "reports": reports,
        "rounds": rounds,
        "ratio": round(busy["requests_per_s"] / rate, 3) if rate else None,
    }


def sampler_cost(gpus: int, intervals: int) -> dict[str, Any]:
    """CPU time of the usage history at `gpus` GPUs, each with a holder and two processes, per
    one-minute interval: tallying 60 dmon readings a GPU and taking the samples (the event
    loop's part), and writing them (the store's writer thread); all of it as a fraction of one
    core at the default one-minute interval."""
    config = Config()
    inventory = synthetic_inventory(gpus)
    leases = LeaseManager(
        inventory,
        lease=config.lease,
        policy=policy_of(config),
        max_waiters=config.max_waiters,
        max_waiting_per_user=config.max_waiting_per_user,
        clock=time.monotonic,
    )
    for n, device in enumerate(inventory):
        owner = Identity(
            user=f"user{n % 20}@lab.example",
            source="host",
            account=f"user{n % 20}",
            uid=2000 + n % 20,
        )
        leases.request(owner, {device.group: 1})
        for pid in (100_000 + 2 * n, 100_001 + 2 * n):
            leases.process_started(device.uuid, pid, owner, "python")
    signals, tally = Signals(), Tally(inventory, config.usage_busy_sm)
    tally.connect(signals)
    directory = tempfile.mkdtemp(prefix="pbench-sampler")
    store = UsageStore(directory, config)
    store.open()
    sampler = UsageSampler(inventory, leases, tally, store, float(MINUTE))
    sampler._last = time.monotonic() - MINUTE  # as if started a minute ago
    readings = [
        Sample(d.uuid, {"sm": 40 + r % 50, "mem": 20, "fb": 30_000}, 0.0)
        for r in range(MINUTE)
        for d in inventory
    ]
    try:
        loop, total = 0.0, time.process_time()  # every thread's: the writer's too
        for _ in range(intervals):
            began = time.thread_time()
            for reading in readings:
                signals.sample.send(None, record=reading)
            sampler._last = time.monotonic() - MINUTE
            sampler.sample()
            loop += time.thread_time() - began
        store.close(600)  # the writer writes what is queued, then stops
        writer = time.process_time() - total - loop
        assert store.intervals == intervals, store.metrics()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    per_interval = (loop + writer) / intervals
    return {
        "gpus": gpus,
        "intervals": intervals,
        "loop_ms_per_interval": round(loop / intervals * 1000, 2),
        "writer_ms_per_interval": round(writer / intervals * 1000, 2),
        "core_fraction": round(per_interval / MINUTE, 5),
    }


def usage(ctx: Any) -> dict[str, Any]:
    """The usage step of the benchmark."""
    days, big_days = (30, 1) if ctx.quick else (365, 365)  # 64 GPUs: the store's size alone
    end = int(time.time()) // MINUTE * MINUTE
    results: dict[str, Any] = {"fills": []}
    for gpus, span in ((8, days), (64, big_days)):
        directory = tempfile.mkdtemp(prefix="pbench-usage")
        try:
            row = (
                store(ctx, directory, gpus, span)
                if gpus == 8
                else fill(directory, gpus, span, end)
            )
            results["fills"].append(row)
            ctx.log(
                f"usage: {span} days of {gpus} GPUs written in {row['write_s']} s, "
                f"{row['mib']} MiB ({row['mib_per_gpu_year']} MiB a GPU-year)"
            )
            if gpus != 8:
                continue
            daemon = Daemon(8, state_dir=directory).start()
            try:
                spans = sorted({min(30, span), span})
                results["reports"] = timed_reports(daemon, spans, 3 if ctx.quick else 5)
                ctx.log(f"usage: reports {results['reports']}")
                if have_wrk():
                    # one turn in quick mode (three in full: the median of three)
                    results["status_during_reports"] = status_during_reports(
                        daemon, ctx.wrk_seconds, span, 1 if ctx.quick else 3
                    )
                    ctx.log(
                        f"usage: /status during reports at "
                        f"{results['status_during_reports']['ratio']} of alone"
                    )
                else:
                    results["status_during_reports"] = {"skipped": "wrk is not installed"}
            finally:
                daemon.stop()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    results["sampler"] = sampler_cost(64, 20 if ctx.quick else 200)
    return results
