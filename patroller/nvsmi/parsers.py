"""Pure parsers for the `nvidia-smi dmon` and `pmon` streams, and pmon interval tracking.

Nothing here reads a pipe, sleeps or logs: a reader feeds lines in one at a time and decides
when to log from the counters the parsers keep. Columns are learned from the header line,
never assumed, because they change between drivers and `-s`/`-o` options.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

Value = Union[int, float, str, None]
ProcessKey = Tuple[int, int]  # (gpu index, pid)

# Header names that differ between drivers, mapped to the names the rest of Patroller uses.
STABLE_NAMES: Mapping[str, str] = {"pwr": "power", "temp": "gtemp"}

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)")
_INDEX = re.compile(r"\d+")
_TOKEN = re.compile(r"\S+")
# Control characters and an echoed `^C` mean the line was damaged by a terminal or a pipe.
_DAMAGE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]|\^C")
# First word of the units line: `# Idx ...`, `#YYYYMMDD HH:MM:SS Idx ...`, `#HH:MM:SS Idx ...`.
_UNITS_FIRST = frozenset({"idx", "yyyymmdd", "hh:mm:ss"})


@dataclass(frozen=True)
class DmonRow:
    """One dmon row: statistics of one device in one interval."""

    gpu: int  # nvidia-smi index, not the minor number
    values: Mapping[str, Value] = field(default_factory=dict, hash=False)
    date: Optional[str] = None  # with `-o D`/`-o DT`, as printed (YYYYMMDD)
    time: Optional[str] = None  # with `-o T`/`-o DT`, as printed (HH:MM:SS)


@dataclass(frozen=True)
class PmonRow:
    """One pmon row: one process on one device in one interval, or an idle device (pid None)."""

    gpu: int
    pid: Optional[int]
    type: Optional[str] = None  # C, G, C+G
    command: Optional[str] = None  # cut at 15 characters by nvidia-smi
    values: Mapping[str, Value] = field(default_factory=dict, hash=False)
    date: Optional[str] = None
    time: Optional[str] = None


def parse_value(token: str) -> Value:
    """One cell: `-` is None, digits are int, a decimal point makes a float, else the text."""
    if token == "-":
        return None
    if _INT.fullmatch(token):
        return int(token)
    if _FLOAT.fullmatch(token):
        return float(token)
    return token


def _index(token: str) -> Optional[int]:
    """A gpu index or pid: non-negative digits only, else None."""
    return int(token) if _INDEX.fullmatch(token) else None


def _dash(token: str) -> Optional[str]:
    """The text of a cell, None for `-`."""
    return None if token == "-" else token


def _date_cell(token: Optional[str]) -> Optional[str]:
    """A date or time cell: None when the column is absent or shows `-`."""
    return None if token is None else _dash(token)


class _StreamParser:
    """Header learning and skip accounting shared by the dmon and pmon parsers."""

    required: Tuple[str, ...] = ("gpu",)

    def __init__(self) -> None:
        self.columns: Optional[Tuple[str, ...]] = None  # lower-cased header names
        self.skipped = 0  # lines that could not be read, for the caller to log now and then
        self.last_skipped: Optional[str] = None
        self.headers = 0  # header lines learned, repeats included

    def reset(self) -> None:
        """Forget the header, as when the child process is restarted."""
        self.columns = None

    def _skip(self, line: str) -> None:
        self.skipped += 1
        self.last_skipped = line

    def _tokens(self, line: str) -> Optional[List[re.Match]]:
        """The cells of a data line, or None when the line is not one (and was dealt with)."""
        text = line.rstrip("\r\n")
        stripped = text.strip()
        if not stripped:
            return None  # empty lines are harmless: not counted
        if _DAMAGE.search(text):
            self._skip(stripped)
        elif stripped.startswith("#"):
            self._comment(stripped, stripped[1:].split())
        elif self.columns is None:
            self._skip(stripped)  # data before any header cannot be read
        else:
            return list(_TOKEN.finditer(text))
        return None

    def _comment(self, line: str, words: Sequence[str]) -> None:
        """Learn a header line, ignore a units line, count anything else."""
        names = tuple(word.lower() for word in words)
        if names and names[0] in _UNITS_FIRST:
            return
        if all(name in names for name in self.required) and len(set(names)) == len(names):
            self.columns = names
            self.headers += 1
        else:
            self._skip(line)  # keep the old header: rows after a damaged repeat still match it


class DmonParser(_StreamParser):
    """Turns `nvidia-smi dmon` lines into rows; feed it every line, header lines included."""

    def __init__(self) -> None:
        super().__init__()
        self._names: Tuple[str, ...] = ()

    def _comment(self, line: str, words: Sequence[str]) -> None:
        super()._comment(line, words)
        if self.columns is not None:
            self._names = tuple(self._stable(name, self.columns) for name in self.columns)

    @staticmethod
    def _stable(name: str, columns: Sequence[str]) -> str:
        """The stable name of a column, unless that name is taken by another column."""
        stable = STABLE_NAMES.get(name, name)
        return name if stable != name and stable in columns else stable

    def feed(self, line: str) -> Optional[DmonRow]:
        """Parse one line; a row for data lines, None for headers and skipped lines."""
        spans = self._tokens(line)
        if spans is None:
            return None
        row = self._row([span.group() for span in spans])
        if row is None:
            self._skip(line.strip())
        return row

    def _row(self, tokens: Sequence[str]) -> Optional[DmonRow]:
        if len(tokens) != len(self._names) or not all(token.isascii() for token in tokens):
            return None
        cells = dict(zip(self._names, tokens))
        gpu = _index(cells.pop("gpu"))
        if gpu is None:
            return None
        date, time = cells.pop("date", None), cells.pop("time", None)
        values = {name: parse_value(token) for name, token in cells.items()}
        return DmonRow(gpu, values, _date_cell(date), _date_cell(time))


class PmonParser(_StreamParser):
    """Turns `nvidia-smi pmon` lines into rows; feed it every line, header lines included."""

    required = ("gpu", "pid")

    def feed(self, line: str) -> Optional[PmonRow]:
        """Parse one line; a row for data lines, None for headers and skipped lines."""
        spans = self._tokens(line)
        if spans is None:
            return None
        row = self._row(line.rstrip("\r\n"), spans)
        if row is None:
            self._skip(line.strip())
        return row

    def _cells(self, text: str, spans: Sequence[re.Match]) -> Optional[Dict[str, str]]:
        """Cells by column name; a last column `command` takes the rest of the line."""
        columns = self.columns or ()
        tail = columns[-1] == "command"
        fixed = len(columns) - 1 if tail else len(columns)
        if len(spans) < len(columns) or (not tail and len(spans) > fixed):
            return None
        cells = {name: span.group() for name, span in zip(columns, spans[:fixed])}
        if not all(token.isascii() for token in cells.values()):
            return None
        if tail:
            # A process name may hold spaces, so the command is everything after the fixed cells.
            cells["command"] = text[spans[fixed].start():].strip()
        return cells

    def _row(self, text: str, spans: Sequence[re.Match]) -> Optional[PmonRow]:
        cells = self._cells(text, spans)
        if cells is None:
            return None
        gpu, pid_text = _index(cells.pop("gpu")), cells.pop("pid")
        pid = None if pid_text == "-" else _index(pid_text)
        if gpu is None or (pid is None and pid_text != "-"):
            return None
        kind, command = _dash(cells.pop("type", "-")), _dash(cells.pop("command", "-"))
        date, time = cells.pop("date", None), cells.pop("time", None)
        values = {name: parse_value(token) for name, token in cells.items()}
        if pid is None:
            kind = command = None  # an idle device: the row is all `-`
        return PmonRow(gpu, pid, kind, command, values, _date_cell(date), _date_cell(time))


@dataclass(frozen=True)
class PmonProcess:
    """A process on a device, as pmon names it."""

    gpu: int
    pid: int
    type: Optional[str] = None
    command: Optional[str] = None


@dataclass(frozen=True)
class IntervalChange:
    """The outcome of one completed pmon interval, compared with the previous one."""

    appeared: Tuple[PmonProcess, ...]
    disappeared: Tuple[PmonProcess, ...]
    present: Tuple[PmonProcess, ...]  # every process of the completed interval

    def __bool__(self) -> bool:
        return bool(self.appeared or self.disappeared)


class PmonIntervals:
    """Groups pmon rows into sampling intervals and reports the processes that came and went.

    pmon prints no end-of-sample marker, so an interval ends when a row cannot belong to it:
    the gpu index goes down, a (gpu, pid) or an idle row repeats for a device already seen
    (one-GPU hosts), a device switches between idle and busy, or the date/time changes. The
    caller also calls `end_interval()` when the stream has been quiet for a while, because
    rows of one interval come out in one burst.
    """

    def __init__(self) -> None:
        self._known: Dict[ProcessKey, PmonProcess] = {}  # the last completed interval
        self._current: Dict[ProcessKey, PmonProcess] = {}
        self._busy: Set[int] = set()  # gpus with a process row in the current interval
        self._idle: Set[int] = set()  # gpus with a `-` row in the current interval
        self._last_gpu = -1
        self._stamp: Tuple[Optional[str], Optional[str]] = (None, None)
        self._open = False

    @property
    def known(self) -> Tuple[PmonProcess, ...]:
        """The processes of the last completed interval, by gpu and pid."""
        return tuple(self._known[key] for key in sorted(self._known))

    def feed(self, row: PmonRow) -> Optional[IntervalChange]:
        """Add a row; the change of the previous interval when this row starts a new one."""
        change = self.end_interval() if self._starts_interval(row) else None
        self._add(row)
        return change

    def end_interval(self) -> Optional[IntervalChange]:
        """Complete the current interval now; None when no row arrived since the last end."""
        if not self._open:
            return None
        before, after = self._known, self._current
        change = IntervalChange(
            appeared=tuple(after[key] for key in sorted(after.keys() - before.keys())),
            disappeared=tuple(before[key] for key in sorted(before.keys() - after.keys())),
            present=tuple(after[key] for key in sorted(after)),
        )
        self._known = dict(after)
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
