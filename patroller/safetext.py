"""Text that others chose, as a command writes it out: the one rule for every command's output,
the client side's and the doctor's.

What a command prints comes in part from others: a daemon's answer carries user names, container
labels, Slurm accounts from the job map, process commands; another host in `--hosts` may answer
anything; the doctor reads sockets that users run. Written raw, such text drives the terminal (an
escape sequence retitles, clears or rewrites it; a newline starts a line that seems the
command's own) or, in CSV, a spreadsheet (a cell `=HYPERLINK(...)` is run as a formula).

- On a terminal (`printable`): every C0 and C1 control character and DEL is shown as `?`, one
  character for one, so that tables keep their widths. The command's own colours are added
  after, around text already made printable.
- In CSV (`csv_cell`): text is printable as above, and a cell that begins as a formula does
  (`=`, `+`, `-`, `@`, a tab, a carriage return) gets a single quote before it, as OWASP's CSV
  injection advice has it; figures (ints and floats) stay numbers, a negative one included,
  because only text is ever read as a formula. The writer quotes every text cell
  (`CSV_QUOTING`), so a cell is one cell whatever separator a spreadsheet splits on.
- As JSON (`json_text`): exact, every string as it came, with every character outside printable
  ASCII escaped (`\\u001b`): the same string to a JSON reader, and nothing a terminal acts on.

Standard library only: the command line imports it where only the client is installed. The
daemon's log has a rule of its own (core/text.py): it escapes such characters as Python does, so
that whoever reads the log sees which bytes came.
"""

from __future__ import annotations

import csv
import json
from typing import Any, Literal

# C0 and C1 control characters and DEL: each is shown as "?".
CONTROLS = dict.fromkeys([*range(0x20), *range(0x7F, 0xA0)], "?")
# How a cell that a spreadsheet would take for a formula begins (OWASP, "CSV Injection").
FORMULA = ("=", "+", "-", "@", "\t", "\r")
CSV_QUOTING: Literal[2] = csv.QUOTE_NONNUMERIC  # every text cell in double quotes; figures bare


def printable(text: str) -> str:
    """`text` with every control character shown as "?"."""
    return text.translate(CONTROLS)


def csv_cell(value: Any) -> str | int | float | None:
    """A cell of a CSV a command writes: a figure as it is; text printable, with a single quote
    before it when it begins as a formula does."""
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    text = str(value)
    return ("'" if text.startswith(FORMULA) else "") + printable(text)


def json_text(data: Any, indent: int | None = None) -> str:
    """`data` as JSON, exact, with no control character raw: ensure_ascii escapes C0, DEL and
    C1 alike (and the rest of Unicode, which a JSON reader takes back the same)."""
    separators = (",", ":") if indent is None else None
    return json.dumps(data, indent=indent, separators=separators, ensure_ascii=True)
