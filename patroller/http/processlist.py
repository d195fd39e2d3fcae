"""One device's process list in /status, kept a row per process so that thousands of processes
never cost the event loop much at once.

Each process's row is serialized once, with either `trespass` flag (the holder decides it,
not the process), and serialized again only when what it shows of the process changed: its
owner, its command or its figures. The list as /status shows it is put together from the
rows (a join of bytes): a process starting or ending on a GPU with 5,000 processes serializes
one row and finds the rest unchanged in C (set differences, list comparisons); a new holder
serializes none, and flags each process again. New
figures for every process (every second) are serialized in the background, a few rows at a
time between which the loop serves (`refigure`); until the whole list is done, /status shows
the list as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from operator import attrgetter
from typing import Any, NamedTuple

from patroller.core.identity import Identity
from patroller.core.leases import Hold
from patroller.http.encoding import dumps
from patroller.http.views import trespasses

# Rows serialized between two chances for the loop to serve (a few hundred microseconds).
ROWS_A_STEP = 100

Figures = dict[str, Any]


class Row(NamedTuple):
    """One process as /status shows it, serialized with either trespass flag; never changed
    (replaced)."""

    pid: int
    owner: Identity
    command: str | None
    figures: Figures
    json: tuple[bytes, bytes]  # without, with `"trespass":true`


def row(pid: int, owner: Identity, command: str | None, figures: Figures) -> Row:
    head = dumps({"pid": pid, "user": owner.user, "command": command})[:-1] + b',"trespass":'
    tail = b"," + dumps(figures)[1:] if figures else b"}"
    return Row(pid, owner, command, figures, (head + b"false" + tail, head + b"true" + tail))


_OWNER, _COMMAND = attrgetter("owner"), attrgetter("command")


class Detail:
    """A device's process list as one body showed it: its JSON, and its data when asked (most
    bodies are only sent)."""

    __slots__ = ("json", "_rows", "_flags", "_data")

    def __init__(self, json: bytes, rows: list[Row], flags: list[bool]) -> None:
        self.json = json
        self._rows, self._flags = rows, flags
        self._data: list[dict[str, Any]] | None = None

    def data(self) -> list[dict[str, Any]]:
        """The list as data (never to be changed: it is shared)."""
        if self._data is None:
            self._data = [
                {
                    "pid": r.pid,
                    "user": r.owner.user,
                    "command": r.command,
                    "trespass": flag,
                    **r.figures,
                }
                for r, flag in zip(self._rows, self._flags, strict=True)
            ]
        return self._data


EMPTY = Detail(b"[]", [], [])  # before the first list is put together


class ProcessList:
    """The rows of one device's processes, in the order of the hold's, with their flags and
    their JSON; and the list last put together from them."""

    def __init__(self) -> None:
        self.rows: dict[int, Row] = {}
        self.flags: dict[int, bool] = {}
        self.pieces: dict[int, bytes] = {}  # each row's JSON with its flag
        self.shown = EMPTY
        self.rows_built = 0  # rows serialized, all told (the tests count them)
        self._holder: Any = None  # the holder and allocation the flags are for
        self._changed: dict[int, None] = {}  # pids whose row is new since the list was shown
        self._hold: Hold | None = None  # the hold the rows followed last, at which version
        self._version = -1

    def _make(self, pid: int, owner: Identity, command: str | None, figures: Figures) -> Row:
        made = self.rows[pid] = row(pid, owner, command, figures)
        self.rows_built += 1
        return made

    def put_together(self, hold: Hold, figures_of: Callable[[int], Figures]) -> bool:
        """The list of the processes on the device now, from the rows (those of new processes,
        or of a new owner or command, made with `figures_of(pid)`): shown from now on. False
        if it says what the list shown said (that one is kept).

        A process started or ended costs a few operations on the whole list in C (set
        differences, list comparisons) and a row; a new holder costs a flag a process."""
        if not self._follow(hold, figures_of):
            self._redo(hold, figures_of)
        holder = (hold.holder, hold.allocation)
        if holder != self._holder:
            self._holder = holder
            self._flag(hold, hold.processes)
        else:
            self._flag(hold, self._changed)
        self._changed.clear()
        self._hold, self._version = hold, hold.process_version
        json = b"[" + b",".join(self.pieces.values()) + b"]"
        if json == self.shown.json and self.shown is not EMPTY:
            return False
        self.shown = Detail(json, list(self.rows.values()), list(self.flags.values()))
        return True

    def _follow(self, hold: Hold, figures_of: Callable[[int], Figures]) -> bool:
        """Drop the rows of the processes that ended and add those of the processes that
        started since (the newest, last); whether the rows are then the hold's processes, in
        its order, with its owners and commands."""
        rows, processes, commands = self.rows, hold.processes, hold.commands
        # Changes since the rows followed this hold (each an add, a rename or a forget)
        moved = hold.process_version - self._version if self._hold is hold else None
        ended: set[int] = set()
        new: set[int] = set()
        if rows.keys() != processes.keys():
            ended = rows.keys() - processes.keys()
            for pid in ended:
                del rows[pid]
                self.pieces.pop(pid, None)
                self.flags.pop(pid, None)
                self._changed.pop(pid, None)
            new = processes.keys() - rows.keys()
            if new:
                newest = list(islice(reversed(processes), len(new)))
                if new.symmetric_difference(newest):
                    return False  # not the newest: an order to find again
                for pid in reversed(newest):
                    self._make(pid, processes[pid], commands.get(pid), figures_of(pid))
                    self._changed[pid] = None
        if moved == len(ended) + len(new):  # a start for each new, an end for each ended: no
            return True  # other change (a rename, a pid ended and reused) moved the rest
        return (
            list(rows) == list(processes)
            and list(map(_OWNER, rows.values())) == list(processes.values())
            and list(map(_COMMAND, rows.values())) == list(map(commands.get, processes))
        )

    def _redo(self, hold: Hold, figures_of: Callable[[int], Figures]) -> None:
        """The rows in the hold's order again, each kept if it still says the same."""
        old, self.rows, self.pieces, self.flags = self.rows, {}, {}, {}
        self._holder, self._changed = None, {}  # every flag and piece again, in order
        for pid, owner in hold.processes.items():
            command, kept = hold.commands.get(pid), old.get(pid)
            if kept is not None and kept.owner is owner and kept.command == command:
                self.rows[pid] = kept
            else:
                self._make(pid, owner, command, figures_of(pid))

    def _flag(self, hold: Hold, pids: Iterable[int]) -> None:
        """Flag the processes `pids` (in the hold's order where new) and set their pieces."""
        held, processes, rows = hold.holder is not None, hold.processes, self.rows
        flags, pieces = self.flags, self.pieces
        for pid in pids:
            flag = flags[pid] = held and trespasses(hold, processes[pid])
            pieces[pid] = rows[pid].json[flag]

    def refigure(self, hold: Hold, figures_of: Callable[[int], Figures]) -> Iterator[None]:
        """Serialize again the rows whose figures changed, ROWS_A_STEP processes between two
        yields, with the flags they have (a new holder flags them all again); the list shown
        stays as it was until `put_together`, which then only joins them. The processes are
        those with a row when it began and still there, with the owner their row shows, when
        their turn comes (the others are put together with the figures of their time)."""
        rows, processes, flags = self.rows, hold.processes, self.flags
        # the pids alone are copied (a tuple a row would cost the first step milliseconds)
        for n, pid in enumerate(list(rows), 1):
            kept = rows.get(pid)
            if kept is not None and processes.get(pid) is kept.owner:
                figures = figures_of(pid)
                if figures != kept.figures:
                    made = self._make(pid, kept.owner, kept.command, figures)
                    flag = flags.get(pid)
                    if flag is None:
                        self._changed[pid] = None
                    else:
                        self.pieces[pid] = made.json[flag]
            if n % ROWS_A_STEP == 0:
                yield
