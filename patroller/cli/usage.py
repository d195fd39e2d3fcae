"""`patroller report`'s words: a /usage answer (checked, and summed over hosts, by
usageanswers.py) drawn as a table fitted to the terminal or written as CSV.

Pure: tested on answers from live daemons; the command (cli/report.py) only asks and prints.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from patroller.cli.render import duration
from patroller.cli.table import Cut, Drop, Rest, Shorten, Step, fit
from patroller.cli.usageanswers import IN_TIME
from patroller.safetext import CSV_QUOTING, csv_cell, printable

KEYS = {
    "user": "USER",
    "account": "ACCOUNT",
    "job": "JOB",
    "slurm_account": "SLURM ACCOUNT",
    "namespace": "NAMESPACE",
    "pod": "POD",
    "gpu": "GPU",
    "day": "DAY",
    "weekday": "WEEKDAY",
    "hour": "HOUR",
}
# The categories' columns, in the words of `patroller users` where it has them.
COLUMNS = {
    "active": "ACTIVE",
    "idle_held": "IDLE-HELD",
    "reserved_unused": "UNUSED",
    "trespass": "TRESPASS",
    "unreserved": "UNASKED",
    "free": "FREE",
    "lost": "LOST",
}
NONE = "(none)"  # a row whose key is null: GPU-time with no such key (free GPUs have no user)


def hours_text(value: float) -> str:
    """GPU-hours as the table says them: 0, <0.01, 0.25, 12.5, 1234. The report page says
    them by the same rule (http/web/charts.js `hours`): a tie rounds up, as JavaScript's
    toFixed rounds the exact value of the number (0.125 is 0.13 on both)."""
    if not value > 0:
        return "0"
    if value < 0.01:
        return "<0.01"
    places = 2 if value < 10 else 1 if value < 1000 else 0
    try:
        return str(Decimal(value).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP))
    except InvalidOperation:  # past 28 digits (a host that lies), or infinite
        return f"{value:.0f}"


def share_text(value: float) -> str:
    """A share of the whole as a percentage, as UTIL is: 0%, <1%, 42%."""
    if value == 0:
        return "0%"
    return "<1%" if value * 100 < 0.5 else f"{value * 100:.0f}%"


def when(text: str) -> str:
    """An answer's ISO time to the minute: 2026-11-26T09:00Z."""
    return text[:16] + "Z" if text.endswith("+00:00") and len(text) >= 16 else text


def counted(answer: dict[str, Any]) -> tuple[datetime, datetime] | None:
    """The whole hours a report counts (patroller/state/usage/queries.py): from the hour
    `since` is in to the end of the hour `until` is in; None for times that are not ISO."""
    try:
        since = datetime.fromisoformat(answer["since"])
        until = datetime.fromisoformat(answer["until"])
    except (TypeError, ValueError):
        return None
    start = since.replace(minute=0, second=0, microsecond=0)
    end = until.replace(minute=0, second=0, microsecond=0)
    return start, end if end == until else end + timedelta(hours=1)


def minute(moment: datetime) -> str:
    return when(moment.isoformat())


def title(answer: dict[str, Any], width: int | None = None) -> list[str]:
    """What the report counts: 'GPU-hours by user in the whole hours from 2026-11-26T09:00Z to
    2026-12-03T10:00Z (7d01h)' (in two lines, before 'from', where one is wider than
    `width`), and 'nothing recorded before 2026-12-02T04:00Z' when the store's first figures
    (the hour of its first sample) come later than that."""
    hours = counted(answer)
    if hours is None:
        return [f"GPU-hours by {answer['by']} from {answer['since']} to {answer['until']}"]
    lines = [
        f"GPU-hours by {answer['by']} in the whole hours",
        f"from {minute(hours[0])} to {minute(hours[1])} "
        f"({duration((hours[1] - hours[0]).total_seconds())})",
    ]
    if width is None or len(" ".join(lines)) <= width:
        lines = [" ".join(lines)]
    try:
        # null before the store has any figure: the TypeError below
        first = datetime.fromisoformat(answer.get("first"))  # type: ignore[arg-type]
    except (TypeError, ValueError):  # none yet (null)
        return lines
    if first > hours[0]:
        lines.append(f"nothing recorded before {minute(first)}")
    return lines


def key_cells(row: dict[str, Any], names: list[str], headers: list[str]) -> dict[str, str]:
    """The row's key, a cell per key: a GPU by its number (after its host's name, over many
    hosts), as nvidia-smi numbers it; `(none)` for no such key."""
    key = row.get("key")
    keys = key if isinstance(key, list) else [key]
    cells = {}
    for name, header, value in zip(names, headers, keys, strict=True):
        if name == "gpu" and row.get("number") is not None:
            number = str(row["number"])
            cells[header] = f"{row['host']} {number}" if row.get("host") else number
        else:
            cells[header] = NONE if value is None else str(value)
    return cells


# Short words of the headers, said when the table is too wide for the terminal.
SHORT = {"GPU-HOURS": "HOURS", "IDLE-HELD": "IDLE", "TRESPASS": "TRESP", "UNASKED": "UNASK"}


def plan(keys: list[str], names: list[str], zeros: list[str]) -> list[Step]:
    """What gives way, in order, to a narrow terminal: the GPUs' uuids; two long headers'
    words; the categories with no GPU-time in any row (a line under the table names them);
    keys past 24 characters (not times); two more headers; and last the names, cut to what
    the other columns leave them (a name that fits is never cut)."""
    cut = [header for header, name in zip(keys, names, strict=True) if name not in IN_TIME]
    dropped = [
        n
        for n in ("LOST", "TRESPASS", "UNASKED", "FREE", "UNUSED", "IDLE-HELD", "ACTIVE")
        if n in zeros
    ]
    return [
        Drop("UUID"),
        Shorten("GPU-HOURS", SHORT["GPU-HOURS"]),
        Shorten("IDLE-HELD", SHORT["IDLE-HELD"]),
        *(Drop(n) for n in dropped),
        *(Cut(k, 24) for k in cut),
        Shorten("TRESPASS", SHORT["TRESPASS"]),
        Shorten("UNASKED", SHORT["UNASKED"]),
        *(Rest(k) for k, name in zip(keys, names, strict=True) if k in cut and name != "gpu"),
    ]


def table(answer: dict[str, Any], colour: bool = False, width: int | None = None) -> str:
    """What is counted, then a row per key (a column per key: by two, two): its GPU-hours,
    its share of the whole and its hours per category; then the total and each category's
    share; fitted to `width` (`plan`). By gpu, the uuid last."""
    by = answer["by"]
    if not answer["rows"]:
        said = " ".join(title(answer)[:2])
        return f"no GPU-time recorded: {printable(said[len('GPU-hours ') :])}\n"
    names = by.split(",")
    keys = [KEYS.get(name, name.upper()) for name in names]
    categories = list(answer["categories"])
    columns = [COLUMNS.get(c, c.upper()) for c in categories]
    headers = [*keys, "GPU-HOURS", "SHARE", *columns] + (["UUID"] if by == "gpu" else [])
    rows = []
    for row in answer["rows"]:
        cells = {
            **key_cells(row, names, keys),
            "GPU-HOURS": hours_text(row["gpu_hours"]),
            "SHARE": share_text(row["share"]),
            "UUID": str(row.get("key") or "-"),
        }
        cells.update(
            {
                n: hours_text(row["hours"].get(c, 0.0))
                for c, n in zip(categories, columns, strict=True)
            }
        )
        rows.append(cells)
    total = answer["total"]
    last = {
        keys[0]: "total",
        "GPU-HOURS": hours_text(total["gpu_hours"]),
        "SHARE": "100%" if total["gpu_hours"] else "0%",
    }
    last.update(
        {
            n: hours_text(total["hours"].get(c, 0.0))
            for c, n in zip(categories, columns, strict=True)
        }
    )
    shares = {keys[0]: "share"}
    shares.update(
        {
            n: share_text(total["shares"].get(c, 0.0))
            for c, n in zip(categories, columns, strict=True)
        }
    )
    zeros = [n for c, n in zip(categories, columns, strict=True) if not total["hours"].get(c, 0.0)]
    layout = fit(
        headers,
        rows + [last, shares],
        width,
        plan(keys, names, zeros),
        right=headers[len(keys) : len(keys) + len(columns) + 2],
    )
    lines = [printable(line) for line in title(answer, width)]  # a host's words in it
    lines += [layout.header_line(colour)]
    lines += [layout.line(cells, colour) for cells in rows]
    lines += [layout.line(last, colour, bold=True), layout.line(shares, colour)]
    left_out = [n for n in columns if n not in layout.headers]
    if left_out:
        lines.append(f"no GPU-time in {', '.join(left_out)}")
    return "".join(line + "\n" for line in lines)


def csv_text(answer: dict[str, Any], hosts: bool = False) -> str:
    """A header, then one row per key: the key (empty for null; with two keys, a column each),
    by gpu (alone or with another key) its number (and with `hosts` its host), the GPU-hours,
    the share and the hours per category, as answered. Every cell goes through
    safetext.csv_cell: a key is a user's, an account's or a job's name, which its owner chose,
    and must not run in a spreadsheet nor drive a terminal."""
    by = answer["by"]
    categories = answer["categories"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n", quoting=CSV_QUOTING)
    gpu = "gpu" in by.split(",")  # by gpu alone, or with another key (gpu,user)
    extra = (["host"] if hosts and gpu else []) + (["number"] if gpu else [])
    rows = [[*by.split(","), *extra, "gpu_hours", "share", *categories]]
    for row in answer["rows"]:
        ours = ([row.get("host", "")] if hosts and gpu else []) + (
            [row.get("number", "")] if gpu else []
        )
        key = row.get("key")
        rows.append(
            [
                *("" if k is None else k for k in (key if isinstance(key, list) else [key])),
                *ours,
                row["gpu_hours"],
                row["share"],
                *(row["hours"].get(c, 0.0) for c in categories),
            ]
        )
    writer.writerows([csv_cell(cell) for cell in cells] for cells in rows)
    return out.getvalue()
