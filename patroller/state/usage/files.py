"""The usage store's file: made private and opened at the latest schema in WAL mode, or set
aside (renamed with its -wal and -shm) when it is damaged, not a store, or of a newer schema.

The writer (store.py) decides when; this module only does it to the files.
"""

from __future__ import annotations

import os
import sqlite3

from patroller.state import private
from patroller.state.usage import schema

FILE = "usage.sqlite3"
SIDECARS = ("-wal", "-shm")  # WAL's files, which go where the database goes


def damaged(exc: BaseException) -> bool:
    """Whether SQLite says the file is not a database, or a damaged one."""
    name = getattr(exc, "sqlite_errorname", "")  # Python 3.11 and later
    text = str(exc)
    return (
        name in ("SQLITE_CORRUPT", "SQLITE_NOTADB")
        or "file is not a database" in text
        or "malformed" in text
    )


def connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """A connection to the file at `path`, made 0600 first (SQLite makes it with the umask's
    mode, and its -wal and -shm with the file's), or made 0600 if an older version left it
    open to others. Nothing is read yet: `prepare` does, and may fail."""
    private.touch(path)
    for suffix in SIDECARS:
        private.tighten(path + suffix)
    return sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)


def prepare(db: sqlite3.Connection) -> int:
    """The file made a store at the latest schema, in WAL mode (schema.Newer, before anything
    is written to it, if a newer Patroller wrote it); the schema version it was found at."""
    if schema.version(db) > schema.LATEST:
        raise schema.Newer(schema.version(db))
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    return schema.migrate(db)


def set_aside(path: str, kind: str, stamp: str) -> str:
    """Rename the file (and its WAL files) `<file>.<kind>-<stamp>` (a number added if that is
    taken); the name it was given. OSError if it cannot be renamed."""
    aside, n = f"{path}.{kind}-{stamp}", 1
    while os.path.lexists(aside):
        n += 1
        aside = f"{path}.{kind}-{stamp}-{n}"
    os.rename(path, aside)
    for suffix in SIDECARS:
        if os.path.lexists(path + suffix):
            os.rename(path + suffix, aside + suffix)
    return aside
