"""pmon's sampling intervals: which processes came and went, from the rows the parser reads.
Pure, like the parser: the reader feeds rows and says when the stream has been quiet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from patroller.observe.nvsmi.parsers import PmonRow, ProcessKey


class PmonProcess(NamedTuple):
    """A process on a device, as pmon names it."""

    gpu: int
    pid: int
    type: str | None = None
    command: str | None = None


class IntervalChange:
    """The outcome of one completed pmon interval, compared with the previous one. Worked out
    when asked: a large host lists thousands of processes an interval, and the reader that ends
    intervals on the event loop asks none of it (it counts the rows as they come)."""

    __slots__ = ("_before", "_after")

    def __init__(
        self, before: Mapping[ProcessKey, PmonProcess], after: Mapping[ProcessKey, PmonProcess]
    ) -> None:
        self._before, self._after = before, after  # neither is changed after

    @property
    def appeared(self) -> tuple[PmonProcess, ...]:
        return tuple(self._after[key] for key in sorted(self._after.keys() - self._before.keys()))

    @property
    def disappeared(self) -> tuple[PmonProcess, ...]:
        return tuple(self._before[key] for key in sorted(self._before.keys() - self._after.keys()))

    @property
    def present(self) -> tuple[PmonProcess, ...]:
        """Every process of the completed interval, by gpu and pid."""
        return tuple(self._after[key] for key in sorted(self._after))

    def __bool__(self) -> bool:
        return self._before.keys() != self._after.keys()

    def __repr__(self) -> str:
        return (
            f"IntervalChange(appeared={self.appeared!r}, disappeared={self.disappeared!r}, "
            f"present={self.present!r})"
        )


class PmonIntervals:
    """Groups pmon rows into sampling intervals and reports the processes that came and went.

    pmon prints no end-of-sample marker, so an interval ends when a row cannot belong to it:
    the gpu index goes down, a (gpu, pid) or an idle row repeats for a device already seen
    (one-GPU hosts), a device switches between idle and busy, or the date/time changes. The
    caller also calls `end_interval()` when the stream has been quiet for a while, because
    rows of one interval come out in one burst.
    """

    def __init__(self) -> None:
        self._known: dict[ProcessKey, PmonProcess] = {}  # the last completed interval
        self._current: dict[ProcessKey, PmonProcess] = {}
        self._busy: set[int] = set()  # gpus with a process row in the current interval
        self._idle: set[int] = set()  # gpus with a `-` row in the current interval
        self._last_gpu = -1
        self._stamp: tuple[str | None, str | None] = (None, None)
        self._open = False

    @property
    def known(self) -> tuple[PmonProcess, ...]:
        """The processes of the last completed interval, by gpu and pid."""
        return tuple(self._known[key] for key in sorted(self._known))

    def feed(self, row: PmonRow) -> IntervalChange | None:
        """Add a row; the change of the previous interval when this row starts a new one."""
        change = self.end_interval() if self._starts_interval(row) else None
        self._add(row)
        return change

    def end_interval(self) -> IntervalChange | None:
        """Complete the current interval now; None when no row arrived since the last end."""
        if not self._open:
            return None
        change = IntervalChange(self._known, self._current)
        self._known = self._current  # reset() starts a new one
        self.reset()
        return change

    def reset(self) -> None:
        """Drop the partial interval but keep the known processes (the child restarted)."""
        self._current = {}
        self._busy, self._idle = set(), set()
        self._last_gpu = -1
        self._stamp = (None, None)
        self._open = False

    def _starts_interval(self, row: PmonRow) -> bool:
        if not self._open:
            return False
        stamp = (row.date, row.time)
        if stamp != (None, None) and self._stamp != (None, None) and stamp != self._stamp:
            return True
        if row.gpu < self._last_gpu:
            return True
        if row.pid is None:
            return row.gpu in self._idle or row.gpu in self._busy
        return (row.gpu, row.pid) in self._current or row.gpu in self._idle

    def _add(self, row: PmonRow) -> None:
        self._open = True
        self._last_gpu = row.gpu
        if row.date is not None or row.time is not None:
            self._stamp = (row.date, row.time)
        if row.pid is None:
            self._idle.add(row.gpu)
            return
        self._busy.add(row.gpu)
        self._current[(row.gpu, row.pid)] = PmonProcess(row.gpu, row.pid, row.type, row.command)
