"""The figures of every process on every device (pmon's sm, mem, ...; the cross-check's fb),
merged over the intervals: a figure not known in an interval (None: pmon prints `-` for an
interval without a sample, the cross-check knows memory alone) keeps the last one.

A large host lists thousands of processes an interval, and an interval's end runs on the event
loop. So an interval costs a few set operations per device when it arrives, and the merge of a
device's figures waits until they are read (the /status rebuild, which works a device at a time
in the background, or a scrape): the intervals are queued per device, with the ends of processes
between them, and folded in order then. At most `backlog` intervals wait for a device.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from patroller.observe.signals import NOTHING, Value

Figures = Mapping[str, Value]
Interval = Mapping[int, Figures]  # pid -> its figures in one interval
_NONE: Figures = {}


def has_figure(interval: Interval) -> bool:
    """Whether any process of the interval has a figure (stops at the first)."""
    return any(not NOTHING.issuperset(values.values()) for values in interval.values())


class ProcessFigures:
    """Per device and pid, the last known value of each figure."""

    def __init__(self, backlog: int = 4) -> None:
        self.backlog = backlog
        self._merged: dict[str, dict[int, dict[str, Value]]] = {}  # uuid -> pid -> figures
        # uuid -> what came since the last merge, in order: an interval, or a pid that ended
        self._queued: dict[str, list[Interval | int]] = {}
        self._pids: dict[str, set[int]] = {}  # uuid -> pids with an entry, merged or queued

    def add(self, uuid: str, interval: Interval, figured: bool | None = None) -> bool:
        """One interval's figures of the processes on a device (the mapping is kept: the sender
        must not change it); `figured`: whether any has a figure, if the sender knows. True if
        what is shown of them changes: a figure is known, or a process is new."""
        pids = self._pids.get(uuid)
        if pids is None:
            pids = self._pids[uuid] = set()
        new = not pids.issuperset(interval.keys())
        if new:
            pids.update(interval.keys())
        queued = self._queued.get(uuid)
        if queued is None:
            queued = self._queued[uuid] = []
        queued.append(interval)
        if len(queued) >= self.backlog:
            self._merge(uuid)
        return new or (has_figure(interval) if figured is None else figured)

    def end(self, uuid: str, pid: int) -> bool:
        """A process ended: its figures are forgotten. True if it had an entry."""
        pids = self._pids.get(uuid)
        if pids is None or pid not in pids:
            return False
        pids.discard(pid)
        if not pids:
            del self._pids[uuid]
        queued = self._queued.get(uuid)
        if queued is not None:
            queued.append(pid)  # folded in order: a later interval may bring the pid back
        else:
            merged = self._merged[uuid]
            del merged[pid]
            if not merged:
                del self._merged[uuid]
        return True

    def get(self, uuid: str, pid: int) -> Figures:
        """The process's figures (an empty mapping when none is known)."""
        if uuid in self._queued:
            self._merge(uuid)
        return self._merged.get(uuid, {}).get(pid, _NONE)

    def waiting(self, uuid: str) -> int:
        """How many intervals and ends of the device wait to be merged (fewer than `backlog`
        intervals)."""
        return len(self._queued.get(uuid, ()))

    def merging(self, uuid: str, step: int = 100) -> Iterator[None]:
        """Merge what waits for the device, `step` processes between two yields (an interval
        of 5,000 is 50 steps), so that the loop serves in between. What is read meanwhile is
        still right: a read merges the rest at once (the part merged already merges again to
        the same figures), and what comes meanwhile is merged after, in order."""
        queued = self._queued.get(uuid)
        while queued is not None and queued and self._queued.get(uuid) is queued:
            item = queued[0]
            if not isinstance(item, int):
                merged = self._merged.setdefault(uuid, {})
                for n, pid in enumerate(list(item), 1):  # the pids alone copied: no tuples
                    _fold(merged, pid, item[pid])
                    if n % step == 0:
                        yield
                        if self._queued.get(uuid) is not queued:
                            return  # a read merged it all meanwhile
                        merged = self._merged.setdefault(uuid, {})
            else:
                self._merged.get(uuid, {}).pop(item, None)
            queued.pop(0)
        if self._queued.get(uuid) is queued and queued is not None:
            del self._queued[uuid]
            if not self._merged.get(uuid, True):
                del self._merged[uuid]

    def _merge(self, uuid: str) -> None:
        merged = self._merged.setdefault(uuid, {})
        for item in self._queued.pop(uuid):
            if isinstance(item, int):
                merged.pop(item, None)
                continue
            for pid, values in item.items():
                _fold(merged, pid, values)
        if not merged:
            del self._merged[uuid]


def _fold(merged: dict[int, dict[str, Value]], pid: int, values: Figures) -> None:
    """One interval's figures of a process into those known: a None keeps the last one."""
    known = merged.get(pid)
    if known is None:
        merged[pid] = dict(values)
    elif not NOTHING.issuperset(values.values()):  # a figure known this time
        known.update({name: value for name, value in values.items() if value is not None})
