"""The usage store's schema, its version, and the migrations from each version to the next.

Version 1:
  schema_version  one row: the version of the schema the file holds
  gpus            every GPU ever sampled: its uuid (the key), its last index and model
  parties         whom GPU-time is counted for (core/usage.py's Party; "" where none); id 0 is
                  nobody (free GPU-time)
  samples         one row per GPU per interval: the interval's end (`at`, epoch seconds) and
                  length, the state, how it was held and by whom, whether by a reservation,
                  the processes on it (JSON: party, own, pids, containers), and the statistics
                  (readings with an SM figure, those busy, mean and highest SM %, memory-
                  controller % and memory held in MiB)
  hourly          GPU-seconds per hour (epoch seconds of its start, UTC), GPU, category and
                  party: what reports read, written with each sample
  daily           the same per day (UTC), for the hours folded in after --usage-days

Version 2: `daily` holds every day, written with each sample as `hourly` is; after
--usage-days only the hourly totals (and the samples) are removed. A report reads the whole
days of its range from `daily` (some 25 times fewer rows) and only its first and last hours from
`hourly`. The step adds up the hourly totals of the file into the days not yet folded.

A file with no table is version 0; each step runs in a transaction of its own, so a step that
fails leaves the file at the version before it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

LATEST = 2


class NotAStore(Exception):
    """A database, but not a usage store (tables and no version); the message says why."""


class Newer(Exception):
    """The file was written by a newer Patroller, whose schema this one does not know."""

    def __init__(self, version: int) -> None:
        super().__init__(f"holds schema version {version} (this Patroller knows up to {LATEST})")
        self.version = version


def _version_1(db: sqlite3.Connection) -> None:
    statements = (
        "CREATE TABLE schema_version (version INTEGER NOT NULL)",
        "CREATE TABLE gpus (id INTEGER PRIMARY KEY, uuid TEXT NOT NULL UNIQUE, "
        "number INTEGER NOT NULL, name TEXT NOT NULL DEFAULT '')",
        "CREATE TABLE parties (id INTEGER PRIMARY KEY, user TEXT NOT NULL, "
        "account TEXT NOT NULL, job TEXT NOT NULL, slurm_account TEXT NOT NULL, "
        "namespace TEXT NOT NULL, pod TEXT NOT NULL, "
        "UNIQUE (user, account, job, slurm_account, namespace, pod))",
        "INSERT INTO parties VALUES (0, '', '', '', '', '', '')",
        "CREATE TABLE samples (at REAL NOT NULL, gpu INTEGER NOT NULL REFERENCES gpus (id), "
        "seconds REAL NOT NULL, state TEXT NOT NULL, hold TEXT, "
        "holder INTEGER REFERENCES parties (id), reserved INTEGER NOT NULL, "
        "processes TEXT NOT NULL, readings INTEGER NOT NULL, busy INTEGER NOT NULL, "
        "sm_mean REAL, sm_max REAL, mem_mean REAL, mem_max REAL, fb_mean REAL, fb_max REAL)",
        "CREATE INDEX samples_at ON samples (at)",
        "CREATE TABLE hourly (hour INTEGER NOT NULL, gpu INTEGER NOT NULL, "
        "category TEXT NOT NULL, party INTEGER NOT NULL, seconds REAL NOT NULL, "
        "PRIMARY KEY (hour, gpu, category, party)) WITHOUT ROWID",
        "CREATE TABLE daily (day INTEGER NOT NULL, gpu INTEGER NOT NULL, "
        "category TEXT NOT NULL, party INTEGER NOT NULL, seconds REAL NOT NULL, "
        "PRIMARY KEY (day, gpu, category, party)) WITHOUT ROWID",
    )
    for statement in statements:
        db.execute(statement)


def _version_2(db: sqlite3.Connection) -> None:
    db.execute(
        "INSERT INTO daily (day, gpu, category, party, seconds) "
        "SELECT hour - hour % 86400, gpu, category, party, SUM(seconds) FROM hourly "
        "GROUP BY 1, 2, 3, 4 ON CONFLICT (day, gpu, category, party) "
        "DO UPDATE SET seconds = seconds + excluded.seconds"
    )


Step = Callable[[sqlite3.Connection], None]
# version -> the step that makes it from the version before (a new version adds one here)
STEPS: dict[int, Step] = {1: _version_1, 2: _version_2}


def version(db: sqlite3.Connection) -> int:
    """The schema version of the file: 0 with no table. NotAStore if it has other tables."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "schema_version" not in tables:
        if tables:
            raise NotAStore(
                f"holds tables ({', '.join(sorted(tables)[:5])}) but no schema "
                "version: not a usage store"
            )
        return 0
    row = db.execute("SELECT version FROM schema_version").fetchone()
    if row is None or not isinstance(row[0], int) or row[0] < 1:
        raise NotAStore("has no readable schema version")
    return row[0]


def migrate(
    db: sqlite3.Connection, latest: int | None = None, steps: dict[int, Step] | None = None
) -> int:
    """Bring the file (a connection in autocommit mode) to `latest` (LATEST), one step (STEPS)
    per transaction; the version it had. Newer if it is past `latest`, NotAStore if it is not
    a store."""
    latest = LATEST if latest is None else latest
    steps = STEPS if steps is None else steps
    found = version(db)
    if found > latest:
        raise Newer(found)
    for target in range(found + 1, latest + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            steps[target](db)
            db.execute("DELETE FROM schema_version")
            db.execute("INSERT INTO schema_version (version) VALUES (?)", (target,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return found
