"""The latest statistics of every device and of every process on it, and how fresh each
device's process list is, from the monitors.

Every device's entry has the same keys whatever the driver prints (FIELDS): a figure the driver
does not print is None, never a missing key, so a reader of /status can index any of them on
any host. Columns a future driver adds are passed on as they come.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from patroller.core.devices import Inventory
from patroller.observe.figures import ProcessFigures
from patroller.observe.signals import (
    GpuProcess,
    ProcessList,
    ProcessSamples,
    Sample,
    Signals,
    Value,
)

# The figures of a device, by their stable names (dmon's columns, `pwr` as power, r384's
# `temp` as gtemp), in the order /status shows them; `fb_total` comes from the inventory.
FIELDS = (
    "power",
    "gtemp",
    "mtemp",
    "sm",
    "mem",
    "enc",
    "dec",
    "jpg",
    "ofa",
    "mclk",
    "pclk",
    "fb",
    "fb_total",
    "bar1",
    "ccpm",
    "pviol",
    "tviol",
    "rxpci",
    "txpci",
)
# The figures of a process: pmon's `-s um` columns, or the cross-check's used memory (fb).
PROCESS_FIELDS = ("sm", "mem", "fb")
_EMPTY: Mapping[str, Value] = {name: None for name in FIELDS}


def iso_time(epoch: float) -> str:
    """An epoch time as ISO 8601 in UTC, to the millisecond."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")


class StatsStore:
    """Keeps the last sample per device; a device with no sample for `stale_after` s is stale.

    Its process list is stale the same way: when no complete pmon interval listed the device's
    processes for `stale_after` s (pmon down or hung), or none ever did. Each device's SM
    utilisation is also kept every `history_every` s, the last `history_points` of it.
    """

    def __init__(
        self,
        inventory: Inventory,
        stale_after: float,
        history_every: float,
        history_points: int,
        clock: Callable[[], float] = time.monotonic,
        backlog: int = 4,
    ) -> None:
        self.inventory = inventory
        self.stale_after = stale_after
        self.history_every = history_every
        self.history_points = history_points
        self.clock = clock
        self._last: dict[str, Sample] = {}
        self._seen: dict[str, float] = {}  # uuid -> clock() when the last sample arrived
        self._listed: dict[str, float] = {}  # uuid -> clock() when its processes were listed
        self.figures = ProcessFigures(backlog)  # of the processes, merged when read
        self._history: dict[str, deque[Value | None]] = {}  # uuid -> SM %, oldest first
        self._history_at: dict[str, float] = {}
        self._sampled: dict[str, int] = {}  # uuid -> samples of it kept
        self._figured: dict[str, int] = {}  # uuid -> changes of its processes' figures
        self._on_change: list[Callable[[], None]] = []

    def connect(self, signals: Signals) -> None:
        """Listen to the daemon's samples."""
        signals.sample.connect(self._on_sample)
        signals.processes_listed.connect(self._on_listed)
        signals.process_sampled.connect(self._on_process_sampled)
        signals.process_ended.connect(self._on_process_ended)

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after every sample, and when a stale process list is fresh again."""
        self._on_change.append(callback)

    def _on_sample(self, sender: Any, record: Sample) -> None:
        if self.inventory.get(record.uuid) is not None:
            self._last[record.uuid] = record
            self._sampled[record.uuid] = self._sampled.get(record.uuid, 0) + 1
            now = self._seen[record.uuid] = self.clock()
            last = self._history_at.get(record.uuid)
            if last is None or now - last >= self.history_every:
                self._history_at[record.uuid] = now
                points = self._history.setdefault(record.uuid, deque(maxlen=self.history_points))
                points.append(record.values.get("sm"))
            for callback in self._on_change:
                callback()

    def _on_listed(self, sender: Any, record: ProcessList) -> None:
        now = self.clock()
        revived = False
        for uuid in record.uuids:
            if self.inventory.get(uuid) is not None:
                revived = revived or self.processes_stale(uuid)
                self._listed[uuid] = now
        if revived:  # otherwise nothing shown changed: lists change through lease events
            for callback in self._on_change:
                callback()

    def _on_process_sampled(self, sender: Any, record: ProcessSamples) -> None:
        # Shown with the next change of /status. A figure not known this time (None) keeps the
        # last one (figures.py).
        figured = record.figured
        for uuid, interval in record.values.items():
            if self.figures.add(uuid, interval, None if figured is None else uuid in figured):
                self._figures_changed(uuid)

    def _on_process_ended(self, sender: Any, record: GpuProcess) -> None:
        if self.figures.end(record.uuid, record.pid):
            self._figures_changed(record.uuid)

    def _figures_changed(self, uuid: str) -> None:
        self._figured[uuid] = self._figured.get(uuid, 0) + 1

    def sample_version(self, uuid: str) -> int:
        """How many samples of the device came: what /status shows of its statistics is the
        same while this is (statusview.py)."""
        return self._sampled.get(uuid, 0)

    def figures_version(self, uuid: str) -> int:
        """How many times its processes' figures changed: what /status shows of them is the
        same while this is. A sample every second leaves it alone, so a device's process list
        (thousands of entries at most) is not built again for its statistics' sake."""
        return self._figured.get(uuid, 0)

    def stale(self, uuid: str) -> bool:
        """Whether no sample of the device came for `stale_after` seconds (or none ever)."""
        seen = self._seen.get(uuid)
        return seen is None or self.clock() - seen > self.stale_after

    def process_view(self, uuid: str, pid: int) -> dict[str, Value | None]:
        """A process's figures on a device: sm and mem in %, fb in MiB; None when not known."""
        values = self.figures.get(uuid, pid)
        return {name: values.get(name) for name in PROCESS_FIELDS}

    def history(self) -> dict[str, list[Value | None]]:
        """Per device, its SM utilisation every `history_every` s over the last minutes."""
        return {uuid: list(points) for uuid, points in self._history.items()}

    def processes_stale(self, uuid: str) -> bool:
        """Whether the device's process list may be out of date, so its ownership too."""
        listed = self._listed.get(uuid)
        return listed is None or self.clock() - listed > self.stale_after

    def view(self, uuid: str) -> dict[str, Any]:
        """The statistics part of one device's /status entry: every FIELDS key, then columns
        beyond them, then `updated` and `stale`."""
        sample = self._last.get(uuid)
        values: Mapping[str, Value] = sample.values if sample is not None else _EMPTY
        view: dict[str, Any] = {name: values.get(name) for name in FIELDS}
        device = self.inventory.get(uuid)
        view["fb_total"] = device.memory_mib if device is not None else None
        for name, value in values.items():
            if name not in view:
                view[name] = value
        if sample is None:
            view.update(updated=None, stale=True)
            return view
        view["updated"] = iso_time(sample.time)
        view["stale"] = self.clock() - self._seen[uuid] > self.stale_after
        return view
