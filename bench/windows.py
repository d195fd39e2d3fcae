"""Two settings measured in one run of wrk, in windows that take turns.

A machine like this one runs the same work at speeds that differ by a half from one
quarter-second to the next (a loop of the interpreter counting as fast as it can counts from
0.78 to 1.43 million in 0.25 s), so runs of a few seconds each, one setting after the other,
differ by more than a tenth even when they do the same work. Here the settings take turns in
short windows (a `Schedule`: cycles of one window an arm, in an order shuffled in each cycle)
while wrk runs the whole time; the daemon measured reads the same schedule and sets itself as
each window says, and wrk's script (windows.lua) counts each request's latency in the window
in which it began (a window's first `guard` seconds are not counted: what the window before it
set off is over by then). Each arm's p99 is that of all its windows' requests together, and a
ratio of two arms has its interval from resampling whole cycles, so that the machine's speed,
the same for the windows of a cycle, moves both arms alike.
"""

from __future__ import annotations

import bisect
import math
import os
import random
import re
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "windows.lua")
BUCKET_MS = 0.01  # the latency buckets' width (10 us, windows.lua)

Histogram = dict[int, int]  # latency bucket -> requests


@dataclass(frozen=True)
class Schedule:
    """Windows of `width` seconds from `start` (time.monotonic()), each one arm's: `phases[k]`
    is window k's index into `arms`. A cycle is len(arms) windows, one of each arm."""

    start: float
    width: float
    guard: float
    arms: tuple[str, ...]
    phases: tuple[int, ...]

    @classmethod
    def shuffled(
        cls,
        arms: Sequence[str],
        cycles: int,
        width: float,
        guard: float,
        lead: float,
        seed: int,
    ) -> Schedule:
        """`cycles` cycles, each arm once in each in a shuffled order, from `lead` s on."""
        draw = random.Random(seed)
        phases: list[int] = []
        for _ in range(cycles):
            order = list(range(len(arms)))
            draw.shuffle(order)
            phases += order
        return cls(time.monotonic() + lead, width, guard, tuple(arms), tuple(phases))

    @property
    def end(self) -> float:
        return self.start + len(self.phases) * self.width

    def window_at(self, at: float) -> int | None:
        """The window `at` (time.monotonic()) falls in; None before the first or after the last."""
        window = math.floor((at - self.start) / self.width)
        return window if 0 <= window < len(self.phases) else None

    def arm_at(self, at: float) -> str | None:
        window = self.window_at(at)
        return None if window is None else self.arms[self.phases[window]]

    def write(self, path: str) -> None:
        """The file windows.lua and the daemon read (written whole, then renamed in place)."""
        with open(path + ".part", "w", encoding="ascii") as f:
            f.write(f"{self.start!r} {self.width!r} {self.guard!r}\n")
            f.write(" ".join(map(str, self.phases)) + "\n")
            f.write("arms " + " ".join(self.arms) + "\n")  # after the numbers windows.lua reads
        os.replace(path + ".part", path)

    @classmethod
    def read(cls, path: str) -> Schedule:
        with open(path, encoding="ascii") as f:
            times, phases, arms = f.read().splitlines()
        start, width, guard = (float(w) for w in times.split())
        return cls(
            start, width, guard, tuple(arms.split()[1:]), tuple(int(w) for w in phases.split())
        )

    def cycles(self, windows: dict[int, Histogram]) -> list[dict[str, Histogram]]:
        """Each cycle's histogram of each arm (empty where its window counted no request)."""
        size = len(self.arms)
        return [
            {
                self.arms[self.phases[window]]: windows.get(window, {})
                for window in range(first, first + size)
            }
            for first in range(0, len(self.phases) - size + 1, size)
        ]


@dataclass
class Counted:
    """What wrk counted: each window's histogram, and its answers other than 200."""

    windows: dict[int, Histogram]
    errors: dict[int, int]


def run(url: str, schedule: Schedule, path: str, connections: int = 32) -> Counted:
    """wrk on `url` from now until the schedule's end, `connections` threads of one connection
    each, its script reading the schedule written at `path`."""
    schedule.write(path)
    seconds = max(1, math.ceil(schedule.end - time.monotonic() + 0.2))
    result = subprocess.run(
        [
            "wrk",
            f"-t{connections}",
            f"-c{connections}",
            f"-d{seconds}s",
            "-s",
            SCRIPT,
            url,
            "--",
            path,
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"wrk failed ({result.returncode}): {result.stderr[-500:]}")
    return parse(result.stdout)


def parse(text: str) -> Counted:
    """windows.lua's lines ("W <key> <requests>") into windows' histograms and errors."""
    counted = Counted({}, {})
    for key_text, count_text in re.findall(r"^W (-?\d+) (\d+)$", text, re.M):
        key, count = int(key_text), int(count_text)
        if key < 0:
            counted.errors[-key - 1] = counted.errors.get(-key - 1, 0) + count
        else:
            window, bucket = divmod(key, 100_000)
            histogram = counted.windows.setdefault(window, {})
            histogram[bucket] = histogram.get(bucket, 0) + count
    return counted


class Pool:
    """Histograms to be pooled with weights (each cycle's, as resampling draws it), and their
    pooled percentile found by a search over the buckets (no merged histogram made)."""

    def __init__(self, histograms: Sequence[Histogram]) -> None:
        self.buckets = sorted({b for h in histograms for b in h})
        # each histogram's buckets ascending and the requests up to and including each
        self._parts: list[tuple[list[int], list[int]]] = []
        for histogram in histograms:
            keys = sorted(histogram)
            running, upto = 0, []
            for key in keys:
                running += histogram[key]
                upto.append(running)
            self._parts.append((keys, upto))

    def percentile(self, q: float, weights: Sequence[int] | None = None) -> float | None:
        """The `q` quantile (0-1) of the pooled requests, in ms (a bucket's middle); None when
        the weighted histograms hold no request."""
        weights = weights or [1] * len(self._parts)
        drawn = [(part, w) for part, w in zip(self._parts, weights, strict=True) if w and part[0]]
        total = sum(part[1][-1] * w for part, w in drawn)
        if not total:
            return None
        wanted = q * total

        def up_to(bucket: int) -> int:
            count = 0
            for (keys, upto), w in drawn:
                i = bisect.bisect_right(keys, bucket)
                if i:
                    count += upto[i - 1] * w
            return count

        low, high = 0, len(self.buckets) - 1  # the first bucket with `wanted` at or below it
        while low < high:
            middle = (low + high) // 2
            if up_to(self.buckets[middle]) >= wanted:
                high = middle
            else:
                low = middle + 1
        return (self.buckets[low] + 0.5) * BUCKET_MS


def pooled(cycles: Sequence[dict[str, Histogram]], arm: str, q: float = 0.99) -> float | None:
    """`arm`'s `q` quantile over every cycle's requests (ms)."""
    return Pool([cycle.get(arm, {}) for cycle in cycles]).percentile(q)


def requests(cycles: Iterable[dict[str, Histogram]], arm: str) -> int:
    return sum(sum(cycle.get(arm, {}).values()) for cycle in cycles)


def compare(
    cycles: Sequence[dict[str, Histogram]],
    arm: str,
    base: str,
    q: float = 0.99,
    seed: int = 1,
    resamples: int = 1000,
    level: float = 0.9,
) -> dict[str, Any] | None:
    """`arm`'s pooled `q` quantile as a multiple of `base`'s, and its `level` interval from
    resampling whole cycles (both arms of a drawn cycle drawn together). None when either arm
    counted nothing."""
    arms, bases = Pool([c.get(arm, {}) for c in cycles]), Pool([c.get(base, {}) for c in cycles])
    point_arm, point_base = arms.percentile(q), bases.percentile(q)
    if point_arm is None or point_base is None:
        return None
    draw = random.Random(seed)
    spread = []
    for _ in range(resamples):
        weights = [0] * len(cycles)
        for i in draw.choices(range(len(cycles)), k=len(cycles)):
            weights[i] += 1
        a, b = arms.percentile(q, weights), bases.percentile(q, weights)
        if a is not None and b:
            spread.append(a / b)
    spread.sort()
    tail = (1 - level) / 2
    return {
        "ratio": round(point_arm / point_base, 3),
        "low": round(spread[int(tail * len(spread))], 3),
        "high": round(spread[min(len(spread) - 1, int((1 - tail) * len(spread)))], 3),
        "cycles": len(cycles),
    }
