"""Every device's statistics summed between two usage samples: how many readings, how many found
its SM busy, and the mean and the highest SM use, memory-controller use and memory held.

The usage store (state/usage) takes each device's tally once per `--usage-interval`; the
statistics store keeps only the last reading, and a mean over the interval needs them all.

An interval with no SM reading from a device that has given one before (its dmon stream was
down the whole interval: restarting, or the GPU removed and back) carries that last reading,
as one reading, busy or not as it was. Only a device that never gave an SM figure (MIG, whose
driver prints none) keeps no reading, which core/usage.py counts as computing throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from patroller.core.devices import Inventory
from patroller.observe.signals import Sample, Signals, Value

FIGURES = ("sm", "mem", "fb")  # SM %, memory-controller %, memory used (MiB)


@dataclass(frozen=True)
class Figures:
    """One device's readings over an interval (None: no reading gave that figure)."""

    readings: int = 0  # readings with an SM figure
    busy: int = 0  # of them, those with SM at least the threshold
    sm_mean: float | None = None
    sm_max: float | None = None
    mem_mean: float | None = None
    mem_max: float | None = None
    fb_mean: float | None = None
    fb_max: float | None = None


class _Sums:
    """Count, sum and highest of each figure, and the busy readings."""

    def __init__(self) -> None:
        self.count = dict.fromkeys(FIGURES, 0)
        self.sum = dict.fromkeys(FIGURES, 0.0)
        self.high: dict[str, float | None] = dict.fromkeys(FIGURES, None)
        self.busy = 0

    def add(self, values: dict[str, float], busy_sm: float) -> None:
        for name, value in values.items():
            self.count[name] += 1
            self.sum[name] += value
            high = self.high[name]
            self.high[name] = value if high is None else max(high, value)
        if values.get("sm", -1.0) >= busy_sm:
            self.busy += 1

    def figures(self) -> Figures:
        def mean(name: str) -> float | None:
            return round(self.sum[name] / self.count[name], 2) if self.count[name] else None

        return Figures(
            readings=self.count["sm"],
            busy=self.busy,
            sm_mean=mean("sm"),
            sm_max=self.high["sm"],
            mem_mean=mean("mem"),
            mem_max=self.high["mem"],
            fb_mean=mean("fb"),
            fb_max=self.high["fb"],
        )


class Tally:
    """Sums each device's readings until `take` hands them over and starts again."""

    def __init__(self, inventory: Inventory, busy_sm: float) -> None:
        self.inventory = inventory
        self.busy_sm = busy_sm  # % of SM use from which a reading counts as computing
        self._sums: dict[str, _Sums] = {}
        self._last_busy: dict[str, bool] = {}  # whether each device's last SM reading was busy

    def connect(self, signals: Signals) -> None:
        """Listen to the daemon's samples."""
        signals.sample.connect(self._on_sample)

    def _on_sample(self, sender: Any, record: Sample) -> None:
        if self.inventory.get(record.uuid) is None:
            return
        values = {
            name: number
            for name in FIGURES
            for number in [_number(record.values.get(name))]
            if number is not None
        }
        self._sums.setdefault(record.uuid, _Sums()).add(values, self.busy_sm)
        if "sm" in values:
            self._last_busy[record.uuid] = values["sm"] >= self.busy_sm

    def take(self, uuid: str) -> Figures:
        """The device's figures since the last take (or the start), and a fresh start; with no
        SM reading since, the last one carried (the module's docstring)."""
        sums = self._sums.pop(uuid, None)
        figures = sums.figures() if sums is not None else Figures()
        if figures.readings == 0 and uuid in self._last_busy:
            return replace(figures, readings=1, busy=int(self._last_busy[uuid]))
        return figures


def _number(value: Value) -> float | None:
    """A figure as a number: None for `-`, text, and what is not finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") else None
