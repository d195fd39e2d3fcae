"""One GPU with 5,000 processes (a notebook server gone wild, a fork bomb): what it costs the
event loop, measured in-process as bench/statusbuild.py measures /status (the thread's CPU
time; no daemon, no load). The longest slice is the most of: a body only older, a process
starting, a body showing it, the process ending, a body showing that (each a turn of the loop
of its own in the daemon: a pmon line, a request), each step of the background rebuild after a
second of new figures for all 5,000 (the task stepped by hand).
The first build of the list, once when the daemon starts or the GPU is found again, is shown
beside it. What is set up is frozen out of the cycle collector first, as the daemon freezes
what it holds (patroller/heap.py): otherwise a full collection walking the bench's own
100,000 objects lands in some slice.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from patroller.core.identity import Identity

from .harness import ROOT
from .statusbuild import Scene, frozen, ms, one_size

PROCESSES = 5000
TURNS = ("process_started", "body_after_start", "process_ended", "body_after_end")


def crowded(ctx: Any) -> dict[str, Any]:
    """The step, in a process of its own on the C library's allocator, as `python -m
    patroller` runs (main.system_allocator): as the daemon's, its heap holds only what it made
    (after the bench's other in-process steps, the same turns read up to twice as long)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.crowded", "--quick" if ctx.quick else "--full"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONMALLOC": "malloc"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.crowded failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    ctx.log(
        f"one GPU with {PROCESSES} processes: longest slice {result['longest_slice_ms']} ms "
        f"(first build {result['first_build_ms']} ms); "
        + ", ".join(f"{turn} {result[turn + '_ms']['max']} ms" for turn in TURNS)
    )
    return result


def measure(quick: bool) -> dict[str, Any]:
    """The measurement, in this process (three of each turn in quick mode, ten in full)."""
    repeats = 3 if quick else 10
    scenes: list[Scene] = []

    def settled(scene: Scene) -> None:
        scenes.append(scene)
        frozen(scene)

    try:
        row = one_size(1, PROCESSES, repeats, settled)
        turns = _turns(scenes[0], repeats)
    finally:
        gc.unfreeze()
    slices = [row["older_ms"]["max"], *(turns[turn]["max"] for turn in TURNS)]
    if row["background_slice_ms"]:
        slices.append(row["background_slice_ms"]["max"])
    return {
        "processes": PROCESSES,
        "longest_slice_ms": max(slices),
        "first_build_ms": row["first_build_ms"],
        "older_ms": row["older_ms"],
        **{f"{turn}_ms": turns[turn] for turn in TURNS},
        "background_slice_ms": row["background_slice_ms"],
        "bytes": row["bytes"],
    }


def _turns(scene: Scene, repeats: int) -> dict[str, dict[str, float]]:
    """A process starting and ending on the GPU, each turn of the loop timed alone."""
    uuid, leases, view = scene.devices[0].uuid, scene.leases, scene.view
    owner = Identity(user="user0@lab.example", source="host", account="user0", uid=2000)
    actions: dict[str, Callable[[], Any]] = {
        "process_started": lambda: leases.process_started(uuid, 99, owner, "python"),
        "body_after_start": view.body,
        "process_ended": lambda: leases.process_ended(uuid, 99),
        "body_after_end": view.body,
    }
    took: dict[str, list[float]] = {turn: [] for turn in TURNS}
    for _ in range(repeats):
        for turn in TURNS:
            scene.clock.now += 0.001
            began = time.thread_time()
            actions[turn]()
            took[turn].append(time.thread_time() - began)
    return {turn: ms(times) for turn, times in took.items()}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1:] == ["--quick"])))
