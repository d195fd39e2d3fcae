"""Tables that fit the terminal: columns as wide as their content, two spaces apart, numbers
to the right; a table wider than the terminal follows its plan, step by step, until it fits:
say a column's cells (and its header) in their short words, cut them to a narrower width (`…`
ends a cut cell), cut them to what the others leave, or leave the column out. A table that
fits, or goes to a pipe, cuts nothing but where its caller caps a column.

Pure: the width is given (None: as wide as the content); `width_of` says what it is for an
output stream. Colours are ANSI codes around a cell's text, after its padding is counted, so
that they never move a column.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TextIO

# Every cell's text is printable (patroller/safetext.py): from another host's answer, an escape
# sequence could retitle, recolour or rewrite the terminal.
from patroller.safetext import printable

CUT = "…"
GAP = "  "  # between two columns
BOLD = "1"


class Cell(NamedTuple):
    """A cell's text, its colour (an ANSI code such as "32") and its short words, if it has
    them (`4m53s left` for `expires in 4m53s`)."""

    text: str
    colour: str | None = None
    short: str | None = None


Cells = Sequence[str | Cell]


@dataclass(frozen=True)
class Cut:
    """A plan's step: cut the column to at most `width` characters."""

    header: str
    width: int


@dataclass(frozen=True)
class Drop:
    """A plan's step: leave the column out."""

    header: str


@dataclass(frozen=True)
class Shorten:
    """A plan's step: the column's cells in their short words, and its header in `title`
    when given (`IDLE` for `IDLE-HELD`)."""

    header: str
    title: str | None = None


@dataclass(frozen=True)
class Rest:
    """A plan's step: cut the column to the width the other columns leave it (at least its
    header's): words that run on (an event's detail), or names, last, cut only as far as the
    width needs (a Cut to a fixed width would cut a name that fits)."""

    header: str


Step = Cut | Drop | Shorten | Rest


def width_of(out: TextIO) -> int | None:
    """The width to fit: COLUMNS when it is set to a number (a script, or a shell that exports
    it, chooses it so), else the terminal's, on a terminal that says; None for a pipe or a
    file, whose reader (grep, a log) gets every character."""
    given = os.environ.get("COLUMNS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        columns = os.get_terminal_size(out.fileno()).columns if out.isatty() else 0
    except (OSError, ValueError):  # not a real file (a test's StringIO), or closed
        return None
    return columns or None  # 0: a terminal that does not say (a fresh pty, a serial line)


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + CUT


def text_of(cell: str | Cell, short: bool = False) -> str:
    if not isinstance(cell, Cell):
        return cell
    return cell.short if short and cell.short is not None else cell.text


def colour_of(cell: str | Cell) -> str | None:
    return cell.colour if isinstance(cell, Cell) else None


class Layout:
    """Which columns a table shows, and how wide: `fit` makes one."""

    def __init__(
        self, headers: Sequence[str], widths: dict[str, int], right: Sequence[str] = ()
    ) -> None:
        self.headers = list(headers)  # shown, in order
        self.widths = widths
        self.right = set(right)
        self.short: set[str] = set()  # the columns said in their short words
        self.titles: dict[str, str] = {}  # a header said in its short words

    def title(self, header: str) -> str:
        return self.titles.get(header, header)

    def total(self) -> int:
        return sum(self.widths[h] for h in self.headers) + len(GAP) * (len(self.headers) - 1)

    def offset(self, header: str) -> int:
        """Where the column starts, counted from the line's start."""
        at = 0
        for shown in self.headers:
            if shown == header:
                return at
            at += self.widths[shown] + len(GAP)
        raise KeyError(header)

    def line(
        self, cells: Mapping[str, str | Cell], colour: bool = False, bold: bool = False
    ) -> str:
        """One row: each shown column's cell, cut, padded, coloured; no trailing blanks."""
        out = []
        for n, header in enumerate(self.headers):
            cell = cells.get(header, "")
            text = cut(printable(text_of(cell, header in self.short)), self.widths[header])
            pad = " " * (self.widths[header] - len(text))
            code = BOLD if bold else colour_of(cell)
            shown = f"\033[{code}m{text}\033[0m" if colour and code and text else text
            if header in self.right:
                out.append(pad + shown)
            else:
                out.append(shown + (pad if n < len(self.headers) - 1 else ""))
        return GAP.join(out).rstrip()

    def header_line(self, colour: bool = False) -> str:
        return self.line({h: self.title(h) for h in self.headers}, colour, bold=True)


def fit(
    headers: Sequence[str],
    rows: Sequence[Mapping[str, str | Cell]],
    width: int | None,
    plan: Sequence[Step] = (),
    right: Sequence[str] = (),
    widest: dict[str, int] | None = None,
) -> Layout:
    """The layout of `rows` (cells by header) under `headers`: each column as wide as its
    widest cell (at most `widest`'s, for a column it names), then `plan`'s steps in order
    while it is wider than `width`."""
    limits = widest or {}
    widths = {
        h: min(
            max([len(h)] + [len(text_of(r.get(h, ""))) for r in rows]), limits.get(h, sys.maxsize)
        )
        for h in headers
    }  # printable() keeps the length: one "?" a character
    layout = Layout(headers, widths, right)
    for step in plan:
        if width is None or layout.total() <= width:
            break
        if step.header not in layout.headers:
            continue
        if isinstance(step, Drop):
            layout.headers.remove(step.header)
        elif isinstance(step, Shorten):
            layout.short.add(step.header)
            if step.title is not None:
                layout.titles[step.header] = step.title
            widths[step.header] = min(
                widths[step.header],
                max(
                    [len(layout.title(step.header))]
                    + [len(text_of(r.get(step.header, ""), True)) for r in rows]
                ),
            )
        elif isinstance(step, Rest):
            left = width - (layout.total() - widths[step.header])
            widths[step.header] = min(
                widths[step.header], max(left, len(layout.title(step.header)))
            )
        else:
            widths[step.header] = min(
                widths[step.header], max(step.width, len(layout.title(step.header)))
            )
    return layout


def format_table(
    headers: Sequence[str],
    rows: Sequence[Cells],
    colour: bool = False,
    width: int | None = None,
    plan: Sequence[Step] = (),
    right: Sequence[str] = (),
) -> str:
    """Rows of cells in the order of `headers`, under a bold header line, fitted to `width`."""
    by_header = [dict(zip(headers, row, strict=True)) for row in rows]
    layout = fit(headers, by_header, width, plan, right)
    return "".join(
        line + "\n"
        for line in [layout.header_line(colour)] + [layout.line(row, colour) for row in by_header]
    )
