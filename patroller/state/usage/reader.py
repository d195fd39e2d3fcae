"""The usage store's reports, read in a thread of their own, on a connection of their own.

The event loop never touches the file: each report is handed to the one `usage-reader` thread,
made by the first report, at Config.usage_report_nice (a year-long report is background work).
Its read-only connection follows the file when the writer sets one aside and starts afresh
(`file_replaced`). WAL lets it read while the writer writes; each report is read in one
transaction (queries.py).

The same report asked again before anything is committed (a page reloaded, a dashboard,
several people looking) is answered from memory: SQLite's `PRAGMA data_version` tells when
another connection committed, and every answer is forgotten then. The answers kept hold at most
Config.usage_report_cache_rows rows in all, the least recently asked going first.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import tzinfo
from typing import Any, Optional, Tuple

from cachetools import LRUCache

from patroller.config import Config
from patroller.core.errors import Unavailable
from patroller.state.usage import groupings, queries, schema

log = logging.getLogger(__name__)


class Reader:
    """The reports of the usage store at `path`."""

    def __init__(self, path: str, config: Config) -> None:
        self.path = path
        self.config = config
        self.answered_again = 0  # reports answered from memory
        self._generation = 0  # how many times the file was replaced (the writer's count)
        self._thread: Optional[ThreadPoolExecutor] = None
        self._db: Optional[sqlite3.Connection] = None  # the reader thread's alone
        self._db_generation = -1
        self._answers: "LRUCache[Tuple[object, ...], queries.Totals]" = LRUCache(
            config.usage_report_cache_rows, getsizeof=lambda totals: len(totals.rows) + 1)
        self._answered: Optional[int] = None  # the data_version they were read at

    async def read(self, since: float, until: float, by: Any,
                   zone: Optional[tzinfo]) -> queries.Totals:
        """A report by `by` (a key: queries.py; keys in `zone`: groupings.py) over
        [since, until), read off the event loop. Unavailable if the store cannot be read."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reading(), self._read, since, until, by, zone)

    def file_replaced(self) -> None:
        """The writer set the file aside and starts a fresh one: the next report opens it."""
        self._generation += 1

    def close(self) -> None:
        if self._thread is not None:
            self._thread.submit(self._close)
            self._thread.shutdown(wait=False)

    def _reading(self) -> ThreadPoolExecutor:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="usage-reader",
                                              initializer=self._lower_priority)
        return self._thread

    def _read(self, since: float, until: float, by: Any,
              zone: Optional[tzinfo]) -> queries.Totals:
        try:
            if self._db is None or self._db_generation != self._generation:
                self._close()
                if not os.path.exists(self.path):
                    return queries.Totals()  # nothing written yet
                self._db_generation = self._generation
                self._db = sqlite3.connect(
                    f"file:{urllib.parse.quote(self.path)}?mode=ro", uri=True,
                    timeout=self.config.usage_busy_timeout, check_same_thread=False)
            if schema.version(self._db) != schema.LATEST:
                return queries.Totals()  # the writer has not made it a store yet
            return self._answer(self._db, since, until, by, zone)
        except (sqlite3.Error, OSError, schema.NotAStore) as exc:
            self._close()
            raise Unavailable(f"the usage store {self.path} cannot be read now ({exc}); try "
                              "again shortly") from None

    def _answer(self, db: sqlite3.Connection, since: float, until: float, by: Any,
                zone: Optional[tzinfo]) -> queries.Totals:
        """The report read, or the same one read before if nothing was committed since."""
        version = db.execute("PRAGMA data_version").fetchone()[0]
        if version != self._answered:
            self._answers.clear()
            self._answered = version
        key = queries.answer_key(since, until, by, zone)
        found = self._answers.get(key)
        if found is not None:
            self.answered_again += 1
            return found
        if zone is not None:
            found = groupings.totals(db, since, until, by, zone)
        else:
            found = queries.totals(db, since, until, by)
        if len(found.rows) < self._answers.maxsize:  # one larger than all of them is not kept
            self._answers[key] = found
        return found

    def _lower_priority(self) -> None:
        """In the reader thread: yield the CPU to serving (Config.usage_report_nice)."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                           self.config.usage_report_nice)
        except OSError as exc:  # not allowed here: reports run at the daemon's priority
            log.info("the usage reports' thread keeps the daemon's priority: %s", exc)

    def _close(self) -> None:
        self._answers.clear()  # a fresh connection's data_version may equal this one's
        if self._db is not None:
            self._db.close()
            self._db = None
