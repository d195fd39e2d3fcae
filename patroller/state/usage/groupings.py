"""Reports grouped by one key or two (`by=day,user`, `by=weekday,hour`), in a time zone: the
GPU-seconds of each pair of keys, user and category, from the hourly totals (and the daily
ones, before --usage-days), summed by SQLite. Run by the store's reader, on its own connection,
in one read transaction.

The place of an hour in time (its day, weekday, hour of the day) is read in the zone asked for.
The totals are kept per UTC hour, and a zone's offset changes at most a few times a year, so
the range is cut where it changes (`spans`: one piece, or two or three) and each piece is
summed with its own offset: SQLite does the summing, whatever the zone. An hour counts in the
local hour it begins in (in a zone half an hour off UTC, 08:30-09:30 counts as 08). A daily
total (before --usage-days) keeps its UTC day and that day's weekday, and has no hour of the
day: its key there is null. Where no key needs the hour and the days are UTC days (in UTC, or
grouped by no time at all), the days a piece covers whole are read as daily totals, as the
one-key reports are (queries.ranges).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, tzinfo
from typing import Any

from patroller.core.usage import WEEKDAYS
from patroller.state.usage.queries import (
    DAY,
    HOUR,
    KEYS,
    Row,
    Texts,
    TooLarge,
    Totals,
    kept_from,
    known,
    ranges,
    reading,
    texts,
)

# The keys that say where an hour lies in time, as SQL over the totals (t), whose `local` is
# the start of the hour (of the day, for a daily total) moved by the zone's offset.
TIMES = {
    "day": "strftime('%Y-%m-%d', t.local, 'unixepoch')",
    "weekday": "CAST(strftime('%w', t.local, 'unixepoch') AS INTEGER)",  # 0: Sunday
    "hour": "CASE WHEN t.daily THEN NULL ELSE strftime('%H', t.local, 'unixepoch') END",
}

Span = tuple[int | None, int | None, int]  # (from, before: epoch s; None: open; offset)


def offset(zone: tzinfo, at: float) -> int:
    """The zone's offset from UTC at `at` (epoch seconds), in seconds."""
    found = datetime.fromtimestamp(at, zone).utcoffset()
    return int(found.total_seconds()) if found is not None else 0


def spans(since: float, until: float, zone: tzinfo) -> list[Span]:
    """[since, until) cut at the hours where the zone's offset changes, each piece with its
    offset; the first is open below, the last above. (The offset is read at every day's end,
    and hour by hour through a day where it changed: some 400 readings for a year.)"""
    day = int(max(since, 0.0) // HOUR * HOUR)  # nothing was kept before 1970
    pieces: list[Span] = []
    began: int | None = None
    current = offset(zone, day)
    while day < until:
        following = day + DAY
        if offset(zone, min(following, until)) != current:
            for hour in range(day + HOUR, following + HOUR, HOUR):
                if hour >= until:
                    break
                found = offset(zone, hour)
                if found != current:
                    pieces.append((began, hour, current))
                    began, current = hour, found
        day = following
    pieces.append((began, None, current))
    return pieces


def statement(by: tuple[str, ...]) -> str:
    """The SQL of one piece of a report by `by`; its parameters are `parameters`'."""
    keys = ", ".join(TIMES[key] if key in TIMES else KEYS[key] for key in by)
    groups = ", ".join(str(n) for n in range(1, len(by) + 3))
    first = (
        "SELECT hour AS start, hour + ? AS local, 0 AS daily, gpu, category, party, "
        "seconds FROM hourly WHERE hour >= ? AND hour < ?"
    )
    hours = (
        "SELECT hour, hour + ?, 0, gpu, category, party, seconds FROM hourly "
        "WHERE hour >= ? AND hour < ?"
    )
    days = (
        "SELECT day, day, 1, gpu, category, party, seconds FROM daily WHERE day >= ? AND day < ?"
    )
    return (
        f"SELECT {keys}, p.user, t.category, SUM(t.seconds) FROM ("
        f"{first} UNION ALL {hours} UNION ALL {days} UNION ALL {days}) AS t "
        "JOIN parties AS p ON p.id = t.party JOIN gpus AS g ON g.id = t.gpu "
        f"GROUP BY {groups}"
    )


def whole_days(by: tuple[str, ...], moved: int) -> bool:
    """Whether a piece may read the days it covers whole as daily totals: where no key needs
    the hour, and the days it groups by are UTC days (or it groups by no time at all)."""
    return "hour" not in by and (moved == 0 or not set(by) & set(TIMES))


def parameters(
    since: float, until: float, span: Span, kept: int | None, by: tuple[str, ...]
) -> tuple[float, ...]:
    """A piece's bounds: the hours, then the days, that begin in it and in [since rounded
    down, until) (queries.ranges: the days before `kept` have only daily totals)."""
    began, before, moved = span
    end = until if before is None else min(until, before)
    hours = int(since // HOUR * HOUR) if began is None else began
    days = int(since // DAY * DAY) if began is None else began
    found = ranges(hours, days, end, kept, whole_days(by, moved))
    return (moved, *found.hours[0], moved, *found.hours[1], *found.days[0], *found.days[1])


def totals(
    db: sqlite3.Connection,
    since: float,
    until: float,
    by: tuple[str, ...],
    zone: tzinfo,
    limit: int | None = None,
    chunk: int | None = None,
) -> Totals:
    """GPU-seconds by the keys `by`, user and category over [since, until) (epoch seconds),
    read in one transaction (`read`) and summed in the calling thread; each row's key is a
    tuple of the keys. TooLarge past `limit` rows."""
    found = read(db, since, until, by, spans(since, until, zone), limit, chunk)
    merged = Merged(by, limit)
    for text in found.texts:
        merged.add(json.loads(text))
    return Totals(summed(list(merged.found.items())), found.numbers, found.first)


def read(
    db: sqlite3.Connection,
    since: float,
    until: float,
    by: tuple[str, ...],
    pieces: list[Span],
    limit: int | None = None,
    chunk: int | None = None,
) -> Texts:
    """The texts of a report by the keys `by` over [since, until) cut in `pieces` (`spans`),
    read in one transaction: one step of SQLite a piece, not one a row (queries.texts). A piece
    of more than `limit` rows is one the whole report has too: TooLarge."""
    sql = statement(by)
    found: list[tuple[str, int]] = []
    with reading(db):
        kept = kept_from(db)
        for span in pieces:
            found += texts(
                db, sql, parameters(since, until, span, kept, by), len(by) + 3, limit, chunk
            )
        return Texts(tuple(text for text, _ in found), sum(n for _, n in found), *known(db))


class Merged:
    """The rows of a grouped report's pieces, parsed, summed by keys, user and category (a
    pair of keys may be in two pieces: an offset changed within its day); TooLarge past
    `limit` of them. Fed a parsed text at a time (reader.py, on the loop)."""

    def __init__(self, by: tuple[str, ...], limit: int | None) -> None:
        self.by, self.limit = by, limit
        self.found: dict[tuple[object, ...], float] = {}

    def add(self, parsed: list[list[Any]]) -> None:
        by, limit, found = self.by, self.limit, self.found
        for *keys, user, category, seconds in parsed:
            shown = tuple(_key(name, value) for name, value in zip(by, keys, strict=True))
            row = (shown, user or None, category)
            if limit is not None and row not in found and len(found) >= limit:
                raise TooLarge(limit)
            found[row] = found.get(row, 0.0) + float(seconds)


def summed(items: list[tuple[tuple[Any, ...], float]]) -> list[Row]:
    """`Merged.found`'s items as rows; a grouped row's key is a tuple of keys, where Row types
    the one key of a plain report."""
    return [(keys, user, category, seconds) for (keys, user, category), seconds in items]


def _key(name: str, value: object) -> str | None:
    if value is None or value == "":
        return None
    if name == "weekday":
        return WEEKDAYS[(int(value) + 6) % 7]  # type: ignore[call-overload]  # SQLite's 0 is Sunday
    return str(value)
