"""What building /status costs the event loop, measured in-process (no daemon, no load):
at 8, 64 and 256 GPUs with 0, 500 and 5,000 processes, the first whole build, a body that is
only older (the clock's fields spliced in), a body after one lease change (a process starts
on a GPU), and the longest slice of the background rebuild after a second of new samples for
every device and process (the task is stepped by hand: each step is the time it held the
loop). Times are the CPU time of the thread (what the loop spends), so that a shared
machine's other work does not count. What a size sets up is frozen out of the cycle collector
before anything is timed, as the daemon freezes what it holds (patroller/heap.py): otherwise a
full collection walking the bench's own objects (28-59 ms at 5,000 processes) lands in some
slice, a pause the daemon does not have.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from patroller.config import Config, policy_of
from patroller.core.identity import Identity
from patroller.core.leases import LeaseManager
from patroller.http.statusview import StatusView
from patroller.observe.signals import ProcessSamples, Sample, Signals
from patroller.observe.stats import StatsStore
from patroller.observe.testmode import synthetic_inventory

SIZES = [(gpus, processes) for gpus in (8, 64, 256) for processes in (0, 500, 5000)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ms(took: list[float], digits: int = 2) -> dict[str, float]:
    return {
        "median": round(statistics.median(took) * 1000, digits),
        "max": round(max(took) * 1000, digits),
    }


def timed(action: Callable[[], Any], repeats: int, digits: int = 2) -> dict[str, float]:
    """The thread's CPU time `action` takes, in ms: median and max of `repeats` runs."""
    took = []
    for _ in range(repeats):
        began = time.thread_time()
        action()
        took.append(time.thread_time() - began)
    return ms(took, digits)


@dataclass
class Scene:
    """What one size measures, for a step that times more of it (bench/crowded.py)."""

    view: StatusView
    leases: LeaseManager
    devices: list[Any]
    clock: Clock


def one_size(
    gpus: int, processes: int, repeats: int, settled: Callable[[Scene], Any] = lambda scene: None
) -> dict[str, Any]:
    """One size; `settled(scene)` is called once it is set up, before anything is timed."""
    config, clock = Config(), Clock()
    inventory = synthetic_inventory(gpus)
    leases = LeaseManager(
        inventory,
        lease=config.lease,
        policy=policy_of(config),
        max_waiters=config.max_waiters,
        max_waiting_per_user=config.max_waiting_per_user,
        clock=clock,
    )
    stats = StatsStore(inventory, 3.0, config.history_every, config.history_points, clock=clock)
    signals = Signals()
    stats.connect(signals)
    devices = list(inventory)
    for n in range(processes):
        device, who = devices[n % gpus], n % gpus % 40  # one user a GPU
        owner = Identity(
            user=f"user{who}@lab.example", source="host", account=f"user{who}", uid=2000 + who
        )
        leases.process_started(device.uuid, 100_000 + n, owner, "python")
    view = StatusView(inventory, leases, stats, None, config.status_max_age, clock=clock)
    settled(Scene(view, leases, devices, clock))

    def second_of_samples() -> None:
        clock.now += 1.0
        for device in devices:
            signals.sample.send(
                None, record=Sample(device.uuid, {"sm": 50, "mem": 20, "fb": 30_000}, 0.0)
            )
        figures: dict[str, dict[int, dict[str, int]]] = {}
        for n in range(processes):
            figures.setdefault(devices[n % gpus].uuid, {})[100_000 + n] = {
                "sm": n % 100,
                "mem": 5,
                "fb": 900,
            }
        signals.process_sampled.send(None, record=ProcessSamples(figures, 0.0))

    began = time.thread_time()
    view.body()
    first = time.thread_time() - began

    def older() -> None:
        clock.now += config.status_max_age
        view.body()

    def lease_change() -> None:  # a process starts on the first GPU, shown, and ends
        clock.now += 0.001
        owner = Identity(user="user0@lab.example", source="host", account="user0", uid=2000)
        leases.process_started(devices[0].uuid, 99, owner, "python")
        view.body()
        leases.process_ended(devices[0].uuid, 99)

    slices: list[float] = []
    for _ in range(repeats):
        second_of_samples()
        slices.extend(_stepped(view))
    return {
        "gpus": gpus,
        "processes": processes,
        "bytes": len(view.body()),
        "first_build_ms": round(first * 1000, 2),
        "older_ms": timed(older, repeats),
        "lease_change_ms": timed(lease_change, repeats),
        "background_slice_ms": ms(slices) if slices else None,
        "parts_built": view.parts_built,
    }


def _stepped(view: StatusView) -> list[float]:
    """Run the background rebuild by hand, one step (a slice on the loop) at a time."""
    task = view._refresh_soon()  # the task the daemon runs, stepped here
    took = []
    try:
        while True:
            began = time.thread_time()
            task.send(None)
            took.append(time.thread_time() - began)
    except StopIteration:
        took.append(time.thread_time() - began)
    return took[1:]  # the first step only yields


def frozen(scene: Scene) -> None:
    """What is set up so far, `scene` with it, frozen out of the cycle collector as the daemon
    freezes what it holds (heap.py; gc.unfreeze() once the size is measured)."""
    gc.collect()
    gc.freeze()


def status_build(ctx: Any) -> list[dict[str, Any]]:
    """The step: every size, in this process."""
    rows = []
    for gpus, processes in SIZES:
        try:
            row = one_size(gpus, processes, 3 if ctx.quick else 10, frozen)
        finally:
            gc.unfreeze()
        ctx.log(
            f"status build {gpus} GPUs {processes} processes: first "
            f"{row['first_build_ms']} ms, older {row['older_ms']['max']} ms, lease change "
            f"{row['lease_change_ms']['max']} ms, background slice "
            f"{(row['background_slice_ms'] or {}).get('max')} ms"
        )
        rows.append(row)
    return rows
