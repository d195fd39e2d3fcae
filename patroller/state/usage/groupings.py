"""Reports grouped by one key or two (`by=day,user`, `by=weekday,hour`), in a time zone: the
GPU-seconds of each pair of keys, user and category, from the hourly totals (and the daily
ones, before --usage-days), summed by SQLite. Run by the store's reader, on its own connection.

The place of an hour in time (its day, weekday, hour of the day) is read in the zone asked for.
The totals are kept per UTC hour, and a zone's offset changes at most a few times a year, so
the range is cut where it changes (`spans`: one piece, or two or three) and each piece is
summed with its own offset: SQLite does the summing, whatever the zone. An hour counts in the
local hour it begins in (in a zone half an hour off UTC, 08:30-09:30 counts as 08). A daily
total (before --usage-days) keeps its UTC day and that day's weekday, and has no hour of the
day: its key there is null.
"""
from __future__ import annotations

import sqlite3
from datetime import datetime, tzinfo
from typing import Dict, List, Optional, Tuple

from patroller.core.usage import WEEKDAYS
from patroller.state.usage.queries import DAY, HOUR, KEYS, Totals

# The keys that say where an hour lies in time, as SQL over the totals (t), whose `local` is
# the start of the hour (of the day, for a daily total) moved by the zone's offset.
TIMES = {
    "day": "strftime('%Y-%m-%d', t.local, 'unixepoch')",
    "weekday": "CAST(strftime('%w', t.local, 'unixepoch') AS INTEGER)",  # 0: Sunday
    "hour": "CASE WHEN t.daily THEN NULL ELSE strftime('%H', t.local, 'unixepoch') END",
}

Span = Tuple[Optional[int], Optional[int], int]  # (from, before: epoch s; None: open; offset)


def offset(zone: tzinfo, at: float) -> int:
    """The zone's offset from UTC at `at` (epoch seconds), in seconds."""
    found = datetime.fromtimestamp(at, zone).utcoffset()
    return int(found.total_seconds()) if found is not None else 0


def spans(since: float, until: float, zone: tzinfo) -> List[Span]:
    """[since, until) cut at the hours where the zone's offset changes, each piece with its
    offset; the first is open below, the last above. (The offset is read at every day's end,
    and hour by hour through a day where it changed: some 400 readings for a year.)"""
    day = int(max(since, 0.0) // HOUR * HOUR)  # nothing was kept before 1970
    pieces: List[Span] = []
    began: Optional[int] = None
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


def statement(by: Tuple[str, ...]) -> str:
    """The SQL of one piece of a report by `by`; its parameters are `parameters`'."""
    keys = ", ".join(TIMES[key] if key in TIMES else KEYS[key] for key in by)
    groups = ", ".join(str(n) for n in range(1, len(by) + 3))
    return (f"SELECT {keys}, p.user, t.category, SUM(t.seconds) FROM ("
            "SELECT hour AS start, hour + ? AS local, 0 AS daily, gpu, category, party, seconds "
            "FROM hourly WHERE hour >= ? AND hour < ? "
            "UNION ALL SELECT day, day, 1, gpu, category, party, seconds FROM daily "
            "WHERE day >= ? AND day < ?) AS t "
            "JOIN parties AS p ON p.id = t.party JOIN gpus AS g ON g.id = t.gpu "
            f"GROUP BY {groups}")


def parameters(since: float, until: float, span: Span) -> Tuple[float, ...]:
    """A piece's bounds: the hours, then the days, that begin in it and in [since rounded
    down, until)."""
    began, before, moved = span
    end = until if before is None else min(until, before)
    hours = int(since // HOUR * HOUR) if began is None else began
    days = int(since // DAY * DAY) if began is None else began
    return moved, hours, end, days, end


def totals(db: sqlite3.Connection, since: float, until: float, by: Tuple[str, ...],
           zone: tzinfo) -> Totals:
    """GPU-seconds by the keys `by`, user and category over [since, until) (epoch seconds);
    each row's key is a tuple of the keys."""
    found: Dict[Tuple[object, ...], float] = {}
    sql = statement(by)
    for span in spans(since, until, zone):
        for *keys, user, category, seconds in db.execute(sql, parameters(since, until, span)):
            shown = tuple(_key(name, value) for name, value in zip(by, keys))
            row = (shown, user or None, category)
            found[row] = found.get(row, 0.0) + float(seconds)
    numbers = {uuid: number for uuid, number in db.execute("SELECT uuid, number FROM gpus")}
    starts = db.execute("SELECT MIN(day) FROM daily").fetchone()[0], \
        db.execute("SELECT MIN(hour) FROM hourly").fetchone()[0]
    known = [start for start in starts if start is not None]
    rows = [(keys, user, category, seconds) for (keys, user, category), seconds in found.items()]
    return Totals(rows, numbers, float(min(known)) if known else None)  # type: ignore[arg-type]


def _key(name: str, value: object) -> Optional[str]:
    if value is None or value == "":
        return None
    if name == "weekday":
        return WEEKDAYS[(int(value) + 6) % 7]  # type: ignore[call-overload]  # SQLite's 0 is Sunday
    return str(value)
