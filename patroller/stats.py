"""The latest statistics of every device, and how fresh its process list is, from the monitors."""
from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List

from .devices import Inventory
from .signals import ProcessList, Sample, Signals


def iso_time(epoch: float) -> str:
    """An epoch time as ISO 8601 in UTC, to the millisecond."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")


class StatsStore:
    """Keeps the last sample per device; a device with no sample for `stale_after` s is stale.

    Its process list is stale the same way: when no complete pmon interval listed the device's
    processes for `stale_after` s (pmon down or hung), or none ever did.
    """

    def __init__(self, inventory: Inventory, stale_after: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inventory = inventory
        self.stale_after = stale_after
        self.clock = clock
        self._last: Dict[str, Sample] = {}
        self._seen: Dict[str, float] = {}  # uuid -> clock() when the last sample arrived
        self._listed: Dict[str, float] = {}  # uuid -> clock() when its processes were listed
        self._subscribers: List[Callable[[], None]] = []

    def connect(self, signals: Signals) -> None:
        """Listen to the daemon's samples."""
        signals.sample.connect(self._on_sample)
        signals.processes_listed.connect(self._on_listed)

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after every sample, and when a stale process list is fresh again."""
        self._subscribers.append(callback)

    def _on_sample(self, sender: Any, record: Sample) -> None:
        if self.inventory.get(record.uuid) is not None:
            self._last[record.uuid] = record
            self._seen[record.uuid] = self.clock()
            for callback in self._subscribers:
                callback()

    def _on_listed(self, sender: Any, record: ProcessList) -> None:
        now = self.clock()
        revived = False
        for uuid in record.uuids:
            if self.inventory.get(uuid) is not None:
                revived = revived or self.processes_stale(uuid)
                self._listed[uuid] = now
        if revived:  # otherwise nothing shown changed: lists change through lease events
            for callback in self._subscribers:
                callback()

    def processes_stale(self, uuid: str) -> bool:
        """Whether the device's process list may be out of date, so its ownership too."""
        listed = self._listed.get(uuid)
        return listed is None or self.clock() - listed > self.stale_after

    def view(self, uuid: str) -> Dict[str, Any]:
        """The statistics part of one device's /status entry."""
        sample = self._last.get(uuid)
        if sample is None:
            return {"updated": None, "stale": True}
        view: Dict[str, Any] = dict(sample.values)
        view["updated"] = iso_time(sample.time)
        view["stale"] = self.clock() - self._seen[uuid] > self.stale_after
        return view

