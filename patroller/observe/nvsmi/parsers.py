"""Pure parsers for the `nvidia-smi dmon` and `pmon` streams and the compute-apps query (the
pmon rows' intervals are intervals.py's).

Nothing here reads a pipe, sleeps or logs: a reader feeds lines in one at a time and decides
when to log from the counters the parsers keep. Columns are learned from the header line,
never assumed, because they change between drivers and `-s`/`-o` options.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar

Value = int | float | str | None
ProcessKey = tuple[int, int]  # (gpu index, pid)

# Header names that differ between drivers, mapped to the names the rest of Patroller uses.
STABLE_NAMES: Mapping[str, str] = {"pwr": "power", "temp": "gtemp"}
# Columns that are a share of the device, in %: a figure over 100 is another column's.
PERCENT = frozenset(("sm", "mem", "enc", "dec", "jpg", "ofa"))

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)")
# Control characters and an echoed `^C` mean the line was damaged by a terminal or a pipe.
_DAMAGE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]|\^C")
# First word of the units line: `# Idx ...`, `#YYYYMMDD HH:MM:SS Idx ...`, `#HH:MM:SS Idx ...`.
_UNITS_FIRST = frozenset({"idx", "yyyymmdd", "hh:mm:ss"})


class DmonRow(NamedTuple):
    """One dmon row: statistics of one device in one interval.

    Rows are NamedTuples, not dataclasses: hundreds of thousands are made a second.
    """

    gpu: int  # nvidia-smi index, not the minor number
    values: Mapping[str, Value] = MappingProxyType({})
    date: str | None = None  # with `-o D`/`-o DT`, as printed (YYYYMMDD)
    time: str | None = None  # with `-o T`/`-o DT`, as printed (HH:MM:SS)


class PmonRow(NamedTuple):
    """One pmon row: one process on one device in one interval, or an idle device (pid None)."""

    gpu: int
    pid: int | None
    type: str | None = None  # C, G, C+G
    command: str | None = None  # cut at 15 characters by nvidia-smi
    values: Mapping[str, Value] = MappingProxyType({})
    date: str | None = None
    time: str | None = None


def parse_value(token: str) -> Value:
    """One cell: `-` is None, digits are int, a decimal point makes a float, else the text."""
    if token == "-":
        return None
    if token.isdigit() and token.isascii():  # the common case, without a regex
        return int(token)
    if _INT.fullmatch(token):
        return int(token)
    if _FLOAT.fullmatch(token):
        return float(token)
    return token


class _Cells(dict[str, Any]):
    """parse_value with a memory: the same few hundred cell texts recur on every line."""

    LIMIT = 8192

    def __missing__(self, token: str) -> Value:
        value = parse_value(token)
        if len(self) < self.LIMIT:
            self[token] = value
        return value


def _index(token: str) -> int | None:
    """A gpu index or pid: non-negative digits only, else None."""
    return int(token) if token.isdigit() and token.isascii() else None


def _dash(token: str) -> str | None:
    """The text of a cell, None for `-`."""
    return None if token == "-" else token


Row = TypeVar("Row", "DmonRow", "PmonRow")


class _StreamParser(Generic[Row]):
    """Header learning and skip accounting shared by the dmon and pmon parsers."""

    required: tuple[str, ...] = ("gpu",)

    def __init__(self) -> None:
        self.columns: tuple[str, ...] | None = None  # lower-cased header names
        self.skipped = 0  # lines that could not be read, for the caller to log now and then
        self.last_skipped: str | None = None
        self.headers = 0  # header lines learned, repeats included
        self._cell = _Cells()

    def reset(self) -> None:
        """Forget the header, as when the child process is restarted."""
        self.columns = None

    def _skip(self, line: str) -> None:
        self.skipped += 1
        self.last_skipped = line

    def feed(self, line: str) -> Row | None:
        """Parse one line; a row for data lines, None for headers and skipped lines."""
        text = self._text(line)
        if text is None:
            return None
        row = self._row(text)
        if row is None:
            self._skip(line.strip())
        return row

    def _row(self, text: str) -> Row | None:
        raise NotImplementedError

    def _text(self, line: str) -> str | None:
        """The text of a data line, or None when the line is not one (and was dealt with)."""
        text = line.rstrip("\r\n")
        stripped = text.strip()
        if not stripped:
            return None  # empty lines are harmless: not counted
        if "^C" in text or (not text.isprintable() and _DAMAGE.search(text)):
            self._skip(stripped)
        elif stripped[0] == "#":
            self._comment(stripped, stripped[1:].split())
        elif self.columns is None:
            self._skip(stripped)  # data before any header cannot be read
        else:
            return text
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


class DmonParser(_StreamParser[DmonRow]):
    """Turns `nvidia-smi dmon` lines into rows; feed it every line, header lines included."""

    def __init__(self) -> None:
        super().__init__()
        self._names: tuple[str, ...] = ()
        # Where the gpu, date and time cells are, and (name, position) of every statistic:
        # worked out once per header, not once per line.
        self._gpu_at = 0
        self._date_at: int | None = None
        self._time_at: int | None = None
        self._values: tuple[tuple[str, int], ...] = ()

    def _comment(self, line: str, words: Sequence[str]) -> None:
        super()._comment(line, words)
        if self.columns is not None:
            self._names = tuple(self._stable(name, self.columns) for name in self.columns)
            at = {name: i for i, name in enumerate(self._names)}
            self._gpu_at = at["gpu"]
            self._date_at, self._time_at = at.get("date"), at.get("time")
            self._values = tuple(
                (name, i)
                for i, name in enumerate(self._names)
                if name not in ("gpu", "date", "time")
            )

    @staticmethod
    def _stable(name: str, columns: Sequence[str]) -> str:
        """The stable name of a column, unless that name is taken by another column."""
        stable = STABLE_NAMES.get(name, name)
        return name if stable != name and stable in columns else stable

    def _row(self, text: str) -> DmonRow | None:
        tokens = text.split()
        if len(tokens) != len(self._names) or not text.isascii():
            return None
        gpu = _index(tokens[self._gpu_at])
        if gpu is None:
            return None
        cell = self._cell
        values = {name: cell[tokens[i]] for name, i in self._values}
        date = None if self._date_at is None else _dash(tokens[self._date_at])
        time = None if self._time_at is None else _dash(tokens[self._time_at])
        return DmonRow(gpu, values, date, time)


class PmonParser(_StreamParser[PmonRow]):
    """Turns `nvidia-smi pmon` lines into rows; feed it every line, header lines included."""

    required = ("gpu", "pid")

    def __init__(self) -> None:
        super().__init__()
        # Positions worked out once per header: the named cells, and every statistic's.
        self._at: dict[str, int | None] = {}
        self._tail = False
        self._values: tuple[tuple[str, int], ...] = ()

    def _comment(self, line: str, words: Sequence[str]) -> None:
        super()._comment(line, words)
        if self.columns is not None:
            at = {name: i for i, name in enumerate(self.columns)}
            self._at = {
                key: at.get(key) for key in ("gpu", "pid", "type", "command", "date", "time")
            }
            self._tail = self.columns[-1] == "command"
            self._values = tuple(
                (name, i) for i, name in enumerate(self.columns) if name not in self._at
            )

    def _tokens(self, text: str) -> list[str] | None:
        """The cells in column order; a last column `command` takes the rest of the line."""
        count = len(self.columns or ())
        if self._tail:
            # A process name may hold spaces, so the command is everything after the fixed cells.
            tokens = text.split(None, count - 1)
            if len(tokens) != count or not (text.isascii() or all(map(str.isascii, tokens[:-1]))):
                return None
            tokens[-1] = tokens[-1].strip()
        else:
            tokens = text.split()
            if len(tokens) != count or not text.isascii():
                return None
        return tokens

    def _row(self, text: str) -> PmonRow | None:
        tokens = self._tokens(text)
        if tokens is None:
            return None
        at = self._at
        # a header without gpu or pid columns sets _at to None and no row is read after it
        gpu, pid_text = _index(tokens[at["gpu"]]), tokens[at["pid"]]  # type: ignore[index]
        pid = None if pid_text == "-" else _index(pid_text)
        if gpu is None or (pid is None and pid_text != "-"):
            return None
        cell = self._cell
        values = {name: cell[tokens[i]] for name, i in self._values}
        if self._misfit(tokens, values):
            return None
        named = [
            None if i is None else _dash(tokens[i])
            for i in (at["type"], at["command"], at["date"], at["time"])
        ]
        if pid is None:  # an idle device: the row is all `-`
            named[0] = named[1] = None
        return PmonRow(gpu, pid, named[0], named[1], values, named[2], named[3])

    def _misfit(self, tokens: Sequence[str], values: Mapping[str, Value]) -> bool:
        """Whether the row has more cells than its header, which the last column (`command`,
        which may hold spaces) would swallow: a name whose first word is a lone `-` or a number
        (the cell of a column the header lacks), or a share over 100 % (another column's
        figure)."""
        if self._tail:
            words = tokens[-1].split(None, 1)
            if len(words) == 2 and (words[0] == "-" or words[0].isdigit()):
                return True
        return any(
            name in PERCENT and isinstance(value, (int, float)) and not 0 <= value <= 100
            for name, value in values.items()
        )


# ---- --query-compute-apps ----------------------------------------------------------------------

_APP_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/-]+")
_APP_MIB = re.compile(r"(\d+)(?:\s*MiB)?")  # `4096`, or `4096 MiB` when `nounits` was lost


class ComputeApp(NamedTuple):
    """One line of `--query-compute-apps=gpu_uuid,pid,used_memory,process_name`."""

    uuid: str  # the GPU's uuid
    pid: int
    used_mib: int | None  # None for `[N/A]`, `[Insufficient Permissions]`, ...
    name: str | None  # as listed, not cut; None when empty or a placeholder


def parse_compute_apps(text: str, skipped: list[str] | None = None) -> list[ComputeApp]:
    """The processes listed by `nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,
    process_name --format=csv,noheader,nounits`. Never raises: blank lines are ignored, lines
    that cannot be read are left out and, when `skipped` is given, appended to it.
    """
    found = []
    for line in text.splitlines():
        if not line.strip():
            continue
        app = _compute_app(line)
        if app is not None:
            found.append(app)
        elif skipped is not None:
            skipped.append(line.strip())
    return found


def _compute_app(line: str) -> ComputeApp | None:
    # The name comes last and may hold `, ` itself: only the first three separators count.
    cells = line.split(",", 3)
    if len(cells) < 3 or not line.isprintable():
        return None
    uuid, pid_text, memory = (cell.strip() for cell in cells[:3])
    pid = _index(pid_text)
    if not _APP_UUID.fullmatch(uuid) or pid is None:
        return None
    found = _APP_MIB.fullmatch(memory)
    name: str | None = cells[3].strip() if len(cells) == 4 else ""
    if not name or name in ("N/A", "-") or (name.startswith("[") and name.endswith("]")):
        name = None  # `[N/A]`, `[Not Found]`, `[Insufficient Permissions]`
    return ComputeApp(uuid, pid, int(found.group(1)) if found else None, name)
