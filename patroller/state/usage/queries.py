"""The reports' queries: GPU-seconds by a key, user and category over a range, from the daily
and hourly totals. Run by the store's reader, on its own connection, in one read transaction.

A range counts whole hours (whole days, where only daily totals are left: before --usage-days):
those that begin at or after `since` rounded down to its hour (day), and before `until`. Every
day has a daily total, and the days of the last --usage-days have hourly ones too (schema.py),
so a range reads its whole days from `daily` and only the hours at its two ends from `hourly`
(`ranges`): a 365-day report at 8 GPUs reads some 42,000 daily rows and at most 46 hours' worth,
not 200,000 hourly rows. Each piece is one range scan of its table's primary key.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from patroller.core.usage import BY

HOUR = 3600
DAY = 86400
# The key of each grouping, as SQL over the totals (t), their party (p) and GPU (g).
KEYS = {
    "user": "p.user",
    "account": "p.account",
    "job": "p.job",
    "slurm_account": "p.slurm_account",
    "namespace": "p.namespace",
    "pod": "CASE WHEN p.pod = '' THEN '' ELSE p.namespace || '/' || p.pod END",
    "gpu": "g.uuid",
    "day": "strftime('%Y-%m-%d', t.start, 'unixepoch')",
}
assert set(KEYS) == set(BY)

Row = tuple[str | None, str | None, str, float]  # (key, user, category, seconds)


class TooLarge(Exception):
    """A report of more rows than it may hold (Config.usage_report_max_rows): found while it
    is read, so that such a report never takes the memory it would have taken."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} rows")
        self.limit = limit


@dataclass(frozen=True)
class Totals:
    """What a report is made of: GPU-seconds by key, user and category (None: no such key or
    user: a free GPU has no user, a host process no job), each GPU's last known index, and
    the earliest time the store has figures for (None: none at all)."""

    rows: list[Row] = field(default_factory=list)
    numbers: dict[str, int] = field(default_factory=dict)  # uuid -> index
    first: float | None = None


Span = tuple[float, float]  # [from, before): epoch seconds; empty where from >= before


@dataclass(frozen=True)
class Ranges:
    """Where a range is read: days of `daily` and hours of `hourly`, two spans of each."""

    days: tuple[Span, Span]
    hours: tuple[Span, Span]


def kept_from(db: sqlite3.Connection) -> int | None:
    """The start of the first day that has hourly totals (days before it have only daily
    ones), or None where none has."""
    first = db.execute("SELECT MIN(hour) FROM hourly").fetchone()[0]
    return None if first is None else int(first) // DAY * DAY


def ranges(
    hours_from: int, days_from: int, until: float, kept: int | None, whole_days: bool = True
) -> Ranges:
    """Where [from, until) is read: the days before `kept` (only daily totals are left of them)
    from `days_from`; from `kept` on, the hours from `hours_from` that begin before `until`,
    of which those of the days they cover whole are read as daily totals (unless not
    `whole_days`). `kept` None: no day has hourly totals."""
    if kept is None:
        return Ranges(((days_from, until), (until, until)), ((until, until), (until, until)))
    early = (days_from, min(until, kept))
    start = max(hours_from, kept)
    first_whole = -(-start // DAY) * DAY  # the first day that begins in the range
    last_hour_end = -(-until // HOUR) * HOUR  # the end of the last hour that begins before until
    after_whole = int(last_hour_end // DAY * DAY)
    if whole_days and first_whole < after_whole:
        return Ranges(
            (early, (first_whole, after_whole)), ((start, first_whole), (after_whole, until))
        )
    return Ranges((early, (until, until)), ((start, until), (until, until)))


def answer_key(since: float, until: float, by: object, zone: object) -> tuple[object, ...]:
    """What a report's answer depends on besides the file: the hour `since` is in (and so its
    day), the end of the hour `until` is in (a range counts whole hours and days that begin
    before it), the grouping and the zone. Two ranges with the same key read the same rows."""
    return int(since // HOUR), int(-(-until // HOUR)), by, zone


def statement(by: str) -> str:
    """The SQL of a report by `by`; its parameters are `bounds`'."""
    days = (
        "SELECT day AS start, gpu, category, party, seconds FROM daily WHERE day >= ? AND day < ?"
    )
    hours = "SELECT hour, gpu, category, party, seconds FROM hourly WHERE hour >= ? AND hour < ?"
    return (
        f"SELECT {KEYS[by]}, p.user, t.category, SUM(t.seconds) FROM ("
        f"{days} UNION ALL {days.replace(' AS start', '')} UNION ALL {hours} "
        f"UNION ALL {hours}) AS t "
        "JOIN parties AS p ON p.id = t.party JOIN gpus AS g ON g.id = t.gpu "
        "GROUP BY 1, 2, 3"
    )


def bounds(found: Ranges) -> tuple[float, ...]:
    """The parameters of `statement`: the spans of days, then those of hours."""
    return tuple(edge for span in found.days + found.hours for edge in span)


@dataclass(frozen=True)
class Texts:
    """A report as SQLite gives it, unparsed: its rows as JSON texts of at most
    Config.usage_report_chunk_rows rows each (each row a list: the key or keys, the user, the
    category and the seconds as text: `at_once`), `rows` of them in all, and what `known`
    says. Read in the reports' thread, which runs no other Python than the statements'; the
    rows are parsed on the event loop a text a turn (reader.py)."""

    texts: tuple[str, ...] = ()
    rows: int = 0
    numbers: dict[str, int] = field(default_factory=dict)
    first: float | None = None


def totals(
    db: sqlite3.Connection,
    since: float,
    until: float,
    by: str,
    limit: int | None = None,
    chunk: int | None = None,
) -> Totals:
    """GPU-seconds by `by`, user and category over [since, until) (epoch seconds), read in
    one transaction (`read`) and parsed in the calling thread. TooLarge past `limit` rows."""
    found = read(db, since, until, by, limit, chunk)
    return Totals(
        [row for text in found.texts for row in rows_of(json.loads(text))],
        found.numbers,
        found.first,
    )


def read(
    db: sqlite3.Connection,
    since: float,
    until: float,
    by: str,
    limit: int | None = None,
    chunk: int | None = None,
) -> Texts:
    """The texts of a report by `by` over [since, until), read in one transaction: what the
    writer writes meanwhile is seen whole or not at all. TooLarge past `limit` rows."""
    with reading(db):
        found = ranges(int(since // HOUR * HOUR), int(since // DAY * DAY), until, kept_from(db))
        pieces = texts(db, statement(by), bounds(found), 4, limit, chunk)
        return Texts(tuple(text for text, _ in pieces), sum(n for _, n in pieces), *known(db))


def rows_of(parsed: list[list[Any]]) -> list[Row]:
    """The rows of a parsed text of `read`'s."""
    return [
        (key or None, user or None, category, float(seconds))
        for key, user, category, seconds in parsed
    ]


def at_once(
    db: sqlite3.Connection,
    sql: str,
    parameters: tuple[float, ...],
    width: int,
    limit: int | None = None,
    chunk: int | None = None,
) -> list[list[Any]]:
    """The rows of `sql` (`texts`), parsed in the calling thread."""
    rows: list[list[Any]] = []
    for text, _ in texts(db, sql, parameters, width, limit, chunk):
        rows += json.loads(text)
    return rows


def texts(
    db: sqlite3.Connection,
    sql: str,
    parameters: tuple[float, ...],
    width: int,
    limit: int | None = None,
    chunk: int | None = None,
) -> list[tuple[str, int]]:
    """The rows of `sql` (`width` columns, the last a sum of seconds), read in one step of
    SQLite as JSON texts, each with its count of rows: SQLite runs without the interpreter's
    lock, which the module takes back after each row it steps to. Row by row, a report under
    load waited for the lock once a row (by day, a year of 8 GPUs is 20,000 rows), behind a
    loop that serves /status: 0.76-2.5 s where it took 0.12-0.15 s alone
    (docs/performance.md). Each sum is its text of 17 digits (the float it is, exactly); the
    rows in the order of their keys, as the grouping gives them. TooLarge past `limit` rows,
    found by SQLite, which stops one row past it. In texts of `chunk` rows at most (None:
    one): each is parsed in one call that holds the lock (a year by day in one held it
    10-19 ms, which /status's p99 showed)."""
    names = ", ".join(f"c{n}" for n in range(width))
    shown = ", ".join(f"c{n}" for n in range(width - 1)) + f", printf('%!.17g', c{width - 1})"
    keys = names.rsplit(", ", 1)[0]
    found: list[tuple[str, int]] = list(
        db.execute(
            f"WITH r({names}) AS ({sql}) "
            f"SELECT json_group_array(json_array({shown})), count(*) FROM "
            f"(SELECT *, (row_number() OVER (ORDER BY {keys}) - 1) / ? AS piece FROM r "
            f"ORDER BY {keys} LIMIT ?) GROUP BY piece ORDER BY piece",
            (*parameters, chunk or 1 << 62, -1 if limit is None else limit + 1),
        )
    )
    if limit is not None and sum(n for _, n in found) > limit:
        raise TooLarge(limit)
    return found


def known(db: sqlite3.Connection) -> tuple[dict[str, int], float | None]:
    """Each GPU's last index by its uuid, and the earliest time with figures (None: none)."""
    numbers = {uuid: number for uuid, number in db.execute("SELECT uuid, number FROM gpus")}
    day = db.execute("SELECT MIN(day) FROM daily").fetchone()[0]
    hour = db.execute("SELECT MIN(hour) FROM hourly").fetchone()[0]
    if hour is not None and (day is None or day >= hour // DAY * DAY):
        return numbers, float(hour)  # nothing folded: the hour of the first figures
    return numbers, None if day is None else float(day)


@contextlib.contextmanager
def reading(db: sqlite3.Connection) -> Iterator[None]:
    """One read transaction on `db` (a snapshot, in WAL mode), ended however the block ends."""
    db.execute("BEGIN")
    try:
        yield
    finally:
        db.execute("COMMIT")
