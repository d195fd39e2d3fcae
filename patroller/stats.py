"""The latest statistics of every device, kept from the monitor's samples."""
from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List

from .devices import Inventory
from .signals import Sample, Signals


def iso_time(epoch: float) -> str:
    """An epoch time as ISO 8601 in UTC, to the millisecond."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")


class StatsStore:
    """Keeps the last sample per device; a device with no sample for `stale_after` s is stale."""

    def __init__(self, inventory: Inventory, stale_after: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inventory = inventory
        self.stale_after = stale_after
        self.clock = clock
        self._last: Dict[str, Sample] = {}
        self._seen: Dict[str, float] = {}  # uuid -> clock() when the last sample arrived
        self._subscribers: List[Callable[[], None]] = []

    def connect(self, signals: Signals) -> None:
        """Listen to the daemon's samples."""
        signals.sample.connect(self._on_sample)

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after every sample."""
        self._subscribers.append(callback)

    def _on_sample(self, sender: Any, record: Sample) -> None:
        if self.inventory.get(record.uuid) is not None:
            self._last[record.uuid] = record
            self._seen[record.uuid] = self.clock()
            for callback in self._subscribers:
                callback()

    def view(self, uuid: str) -> Dict[str, Any]:
        """The statistics part of one device's /status entry."""
        sample = self._last.get(uuid)
        if sample is None:
            return {"updated": None, "stale": True}
        view: Dict[str, Any] = dict(sample.values)
        view["updated"] = iso_time(sample.time)
        view["stale"] = self.clock() - self._seen[uuid] > self.stale_after
        return view

