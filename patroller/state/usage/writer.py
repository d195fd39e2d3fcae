"""The usage store's writer: the one thread that writes its file.

Each interval the sampler queued is written in one transaction (tables.py); while writes fail,
the intervals wait in a backlog, and the store (store.py) says what went wrong, keeps the
counts and sets a file it cannot use aside (files.py). Old samples are folded into daily totals
at start and every Config.usage_fold_every.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from patroller.config import Config
from patroller.core.usage import GpuSample
from patroller.state.usage import files, schema, tables
from patroller.state.usage.files import damaged
from patroller.state.usage.keys import Keys

# its lines are the store's, under the store's name (what a log filter names)
log = logging.getLogger("patroller.state.usage.store")

STOP = object()
FAILING = "failing"  # the store's state while its writes fail (store.py's STATES)

Interval = tuple[float, Sequence[GpuSample]]  # (its end, epoch seconds; a sample per GPU)


class Books(Protocol):
    """What the writer reads and counts on its store (store.py's UsageStore)."""

    path: str
    config: Config
    wall: Callable[[], float]
    state: str
    rows: int
    intervals: int
    dropped: int

    def check_room(self) -> None: ...
    def drop_oldest(self) -> None: ...
    def aside(self, kind: str, why: str) -> bool: ...
    def failed(self, exc: BaseException, kept: int) -> None: ...
    def recovered(self) -> None: ...


class Writer:
    """The writer thread of `store`: started by `start`, fed by `queue`, ended by STOP."""

    def __init__(self, store: Books) -> None:
        config = store.config
        self.store = store
        self.keys = Keys(config.usage_parties_remembered, config.usage_new_parties)
        self.queue: queue.Queue[Any] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.held = 0  # intervals it holds, not yet written
        self.opening: sqlite3.Connection | None = None  # its connection, while it opens

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="usage-writer", daemon=True)
        self.thread.start()

    def stop(self, timeout: float) -> bool:
        """Blocking: what is queued written, within `timeout` seconds; whether it finished."""
        if self.thread is None:
            return True
        self.queue.put(STOP)
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def run(self) -> None:
        """The thread: each interval queued written, the backlog kept while writes fail, until
        STOP."""
        db: sqlite3.Connection | None = None
        keys = self.keys
        store = self.store
        backlog: deque[Interval] = deque()
        folded: float | None = None  # monotonic time of the last folding
        stopping = False
        db, folded = self.write(db, keys, backlog, folded)  # opened (and folded) at start
        while True:
            wait = (
                store.config.usage_retry
                if store.state == FAILING
                else store.config.usage_fold_every
            )
            try:
                item = self.queue.get(timeout=wait)
            except queue.Empty:
                item = None
            while item is not None:
                if item is STOP:
                    stopping = True
                else:
                    backlog.append(item)
                    if len(backlog) > store.config.usage_backlog:
                        backlog.popleft()
                        store.drop_oldest()
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    item = None
            db, folded = self.write(db, keys, backlog, folded)
            self.held = len(backlog)
            if stopping:
                break
        if backlog:
            log.warning(
                "usage store %s: %d interval(s) could not be written before the stop",
                store.path,
                len(backlog),
            )
        if db is not None:
            db.close()

    def write(
        self,
        db: sqlite3.Connection | None,
        keys: Keys,
        backlog: deque[Interval],
        folded: float | None,
    ) -> tuple[sqlite3.Connection | None, float | None]:
        """Open the file if need be, write the backlog, fold if due; a failure is recorded and
        the backlog kept. (the connection, or None; when it last folded)"""
        store = self.store
        for _ in range(2):  # a second time with a fresh file, after one is set aside
            try:
                store.check_room()
                if db is None:
                    db = self.connect()
                    keys.clear()
                while backlog:
                    at, samples = backlog[0]
                    try:
                        store.rows += tables.write_interval(db, keys, at, samples)
                    except (
                        sqlite3.IntegrityError,
                        sqlite3.ProgrammingError,
                        ValueError,
                        TypeError,
                    ) as exc:  # this interval alone: never written
                        log.error(
                            "usage store: an interval could not be written and is dropped: %s", exc
                        )
                        store.dropped += 1
                    else:
                        store.intervals += 1
                    backlog.popleft()
                if folded is None or time.monotonic() - folded >= store.config.usage_fold_every:
                    self.fold(db)
                    folded = time.monotonic()
                store.recovered()
                return db, folded
            except (sqlite3.Error, OSError, schema.NotAStore, schema.Newer) as exc:
                # Set aside before the connection closes: closing removes the WAL files of
                # the name it opened, and those of a file set aside go with it.
                opened, db, self.opening = db or self.opening, None, None
                if isinstance(exc, schema.Newer):
                    why, kind = f"was written by a newer Patroller: it {exc}", "newer"
                elif isinstance(exc, schema.NotAStore) or damaged(exc):
                    why, kind = f"is not a usable usage store ({exc})", "corrupt"
                else:
                    why, kind = "", ""
                done = bool(kind) and store.aside(kind, why)
                if opened is not None:
                    opened.close()
                if not done:
                    store.failed(exc, len(backlog))
                    return None, folded
        return db, folded

    def connect(self) -> sqlite3.Connection:
        """The file, in WAL mode, at the latest schema (files.py); while it is being opened,
        the connection is `opening`, for `write` to close after a failure."""
        path = self.store.path
        db = self.opening = files.connect(path, self.store.config.usage_busy_timeout)
        found = files.prepare(db)
        self.opening = None
        if found != schema.LATEST:
            log.info("usage store %s: schema version %d made from %d", path, schema.LATEST, found)
        return db

    def fold(self, db: sqlite3.Connection) -> None:
        """Samples and hourly totals older than --usage-days folded into daily ones."""
        days = self.store.config.usage_days
        before = tables.cutoff(self.store.wall(), days)
        samples, hours = tables.fold(db, before)
        if samples or hours:
            day = time.strftime("%Y-%m-%d", time.gmtime(before))
            log.info(
                "usage store: %d sample(s) and %d hourly total(s) before %s folded into "
                "daily totals (--usage-days %d)",
                samples,
                hours,
                day,
                days,
            )
