"""The reports' queries: GPU-seconds by a key, user and category over a range, from the hourly
totals and, before --usage-days, the daily ones. Run by the store's reader, on its own
connection.

A range counts whole hours (whole days, where only daily totals are left): those that begin at
or after `since` rounded down to its hour (day), and before `until`. The totals are keyed by
hour and day (their primary keys), so a range is one index range scan of each: a 30-day report
at 8 GPUs reads about 720 hours x 8 GPUs x a few categories, some 20,000 rows.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

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

Row = Tuple[Optional[str], Optional[str], str, float]  # (key, user, category, seconds)


@dataclass(frozen=True)
class Totals:
    """What a report is made of: GPU-seconds by key, user and category (None: no such key or
    user: a free GPU has no user, a host process no job), each GPU's last known index, and
    the earliest time the store has figures for (None: none at all)."""

    rows: List[Row] = field(default_factory=list)
    numbers: Dict[str, int] = field(default_factory=dict)  # uuid -> index
    first: Optional[float] = None


def statement(by: str) -> str:
    """The SQL of a report by `by`; its parameters are `bounds`'."""
    return (f"SELECT {KEYS[by]}, p.user, t.category, SUM(t.seconds) FROM ("
            "SELECT hour AS start, gpu, category, party, seconds FROM hourly "
            "WHERE hour >= ? AND hour < ? "
            "UNION ALL SELECT day, gpu, category, party, seconds FROM daily "
            "WHERE day >= ? AND day < ?) AS t "
            "JOIN parties AS p ON p.id = t.party JOIN gpus AS g ON g.id = t.gpu "
            "GROUP BY 1, 2, 3")


def bounds(since: float, until: float) -> Tuple[int, float, int, float]:
    """The hours, then the days, that begin at or after `since` rounded down, before `until`."""
    return int(since // HOUR * HOUR), until, int(since // DAY * DAY), until


def totals(db: sqlite3.Connection, since: float, until: float, by: str) -> Totals:
    """GPU-seconds by `by`, user and category over [since, until) (epoch seconds)."""
    rows = [(found or None, user or None, category, float(seconds))
            for found, user, category, seconds in db.execute(statement(by),
                                                              bounds(since, until))]
    numbers = {uuid: number for uuid, number in db.execute("SELECT uuid, number FROM gpus")}
    starts = db.execute("SELECT MIN(day) FROM daily").fetchone()[0], \
        db.execute("SELECT MIN(hour) FROM hourly").fetchone()[0]
    known = [start for start in starts if start is not None]
    return Totals(rows, numbers, float(min(known)) if known else None)
