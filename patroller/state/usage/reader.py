"""The usage store's reports, read in a thread of their own, on a connection of their own.

The event loop never touches the file: each report is handed to the one `usage-reader` thread,
made by the first report, at Config.usage_report_nice (a year-long report is background work,
but one that must end while /status is busy: settings.py says why 5). Each statement's rows
come in one step of SQLite, which reads without the interpreter's lock, as JSON texts
(queries.texts); the thread runs no other Python: the texts are parsed on the loop, in slices
(`_parsed`), as the answer is made (http/usage.py).
Its read-only connection follows the file when the writer sets one aside and starts afresh
(`file_replaced`). WAL lets it read while the writer writes; each report is read in one
transaction (queries.py).

The same report asked again before anything is committed (a page reloaded, a dashboard,
several people looking) is answered from memory: SQLite's `PRAGMA data_version` tells when
another connection committed, and every answer is forgotten then. The answers kept hold at most
Config.usage_report_cache_rows rows in all, the least recently asked going first.

What reports may take, bounded: Config.usage_reports_at_once run at once (`slot`, held by the
handler until its answer is written), Config.usage_reports_waiting wait for a turn, and the
next is a TooManyReports (429 with Retry-After); none
holds more than Config.usage_report_max_rows rows (a BadRequest, found while reading), the
connection's page cache is Config.usage_reader_cache_kib, and once no report has come for
Config.usage_reader_idle seconds the connection and the answers kept are let go and the heap
trimmed, so that most of the daemon's memory comes back (docs/performance.md has the figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import json
import logging
import os
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import tzinfo
from typing import Any

from cachetools import LRUCache

from patroller import background
from patroller.config import Config
from patroller.core.errors import BadRequest, TooManyReports, Unavailable
from patroller.durations import describe
from patroller.state.usage import groupings, queries, schema

log = logging.getLogger(__name__)


class Reader:
    """The reports of the usage store at `path`."""

    def __init__(self, path: str, config: Config) -> None:
        self.path = path
        self.config = config
        self.answered_again = 0  # reports answered from memory
        self._generation = 0  # how many times the file was replaced (the writer's count)
        self._thread: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None  # the reader thread's alone
        self._db_generation = -1
        # each answer as SQLite's texts of it, counted by its rows (`_answer` says why)
        self._answers: LRUCache[tuple[object, ...], queries.Texts] = LRUCache(
            config.usage_report_cache_rows, getsizeof=lambda kept: kept.rows + 1
        )
        self._answered: int | None = None  # the data_version they were read at
        self.running = 0  # reports between `slot` and their answer written (the loop's count)
        self.waiting = 0  # reports waiting for a turn
        self._turns: asyncio.Semaphore | None = None
        self.refused: dict[str, int] = {"busy": 0, "too_large": 0}
        self.let_go = 0  # times the idle connection and answers were let go
        self._last = 0.0  # monotonic time the last report ended
        self._idle: asyncio.TimerHandle | None = None

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """A report's turn, on the event loop, held until its answer is written: while
        Config.usage_reports_at_once hold one, it waits (holding nothing yet: the report page
        asks three at once), behind at most Config.usage_reports_waiting others; past them,
        TooManyReports."""
        limit = self.config.usage_reports_at_once
        if self.running >= limit and self.waiting >= self.config.usage_reports_waiting:
            self.refused["busy"] += 1
            retry = self.config.usage_report_retry_after
            raise TooManyReports(
                f"{self.running} usage report(s) are being answered and "
                f"{self.waiting} wait, the most there may be; ask again in "
                f"{describe(retry)}",
                running=self.running,
                limit=limit,
                waiting=self.waiting,
                retry_after=retry,
            )
        if self._turns is None:  # made on the loop that uses it
            self._turns = asyncio.Semaphore(limit)
        self.waiting += 1
        try:
            await self._turns.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._turns.release()
            self._last = time.monotonic()
            self._wait_idle()

    async def read(
        self, since: float, until: float, by: Any, zone: tzinfo | None
    ) -> queries.Totals:
        """A report by `by` (a key: queries.py; keys in `zone`: groupings.py) over
        [since, until): SQLite's part in the reports' thread, which returns its texts, and the
        Python of it on the event loop, in slices (`_parsed`). Unavailable if the store cannot
        be read."""
        loop = asyncio.get_running_loop()
        # where a zone's offset changes: some 400 readings of it for a year, one slice
        pieces = None if zone is None else groupings.spans(since, until, zone)
        try:
            found = await loop.run_in_executor(
                self._reading(), self._read, since, until, by, pieces
            )
            return await self._parsed(found, by if zone is not None else None)
        except queries.TooLarge as exc:
            self.refused["too_large"] += 1
            raise BadRequest(
                f"the report would hold more than {exc.limit} rows, the most one "
                "may: narrow the range (since=, until=) or the grouping (by=: one "
                "key rather than two, day rather than hour)",
                max_rows=exc.limit,
            ) from None

    async def _parsed(self, found: queries.Texts, grouped: Any) -> queries.Totals:
        """On the event loop, the texts of a report parsed and its rows made, a text (at most
        Config.usage_report_chunk_rows rows) a turn of the loop: the Python of a report in the
        reports' thread held the interpreter's lock in long C calls (json.loads: 1.5 ms a text
        of 2,000 rows), and the loop, which lets it go at each system call, waited for it back
        once a call: /status's p99 went from 4 to 23-28 ms. `grouped`: the keys of a grouped
        report, whose pieces are summed (groupings.Merged); None: a plain one."""
        if grouped is None:
            rows: list[queries.Row] = []
            for text in found.texts:
                rows += queries.rows_of(json.loads(text))
                await asyncio.sleep(0)
            return queries.Totals(rows, found.numbers, found.first)
        merged = groupings.Merged(grouped, self.config.usage_report_max_rows)
        for text in found.texts:
            merged.add(json.loads(text))
            await asyncio.sleep(0)
        size = self.config.usage_report_chunk_rows
        items = list(merged.found.items())
        rows = []
        for start in range(0, len(items), size):
            rows += groupings.summed(items[start : start + size])
            await asyncio.sleep(0)
        # what merged them let go a slice at a time (21,500 at once: 2.5 ms of the loop)
        while items:
            del items[-size:]
            for _ in range(min(size, len(merged.found))):
                merged.found.popitem()
            await asyncio.sleep(0)
        return queries.Totals(rows, found.numbers, found.first)

    def file_replaced(self) -> None:
        """The writer set the file aside and starts a fresh one: the next report opens it."""
        self._generation += 1

    def close(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        if self._thread is not None:
            self._thread.submit(self._close)
            self._thread.shutdown(wait=False)

    def _reading(self) -> ThreadPoolExecutor:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(
                1, thread_name_prefix="usage-reader", initializer=self._lower_priority
            )
        return self._thread

    def _read(
        self, since: float, until: float, by: Any, pieces: list[groupings.Span] | None
    ) -> queries.Texts:
        try:
            if self._db is None or self._db_generation != self._generation:
                self._close()
                if not os.path.exists(self.path):
                    return queries.Texts()  # nothing written yet
                self._db_generation = self._generation
                self._db = sqlite3.connect(
                    f"file:{urllib.parse.quote(self.path)}?mode=ro",
                    uri=True,
                    timeout=self.config.usage_busy_timeout,
                    check_same_thread=False,
                )
                self._db.execute(f"PRAGMA cache_size = -{int(self.config.usage_reader_cache_kib)}")
            if schema.version(self._db) != schema.LATEST:
                return queries.Texts()  # the writer has not made it a store yet
            return self._answer(self._db, since, until, by, pieces)
        except (sqlite3.Error, OSError, schema.NotAStore) as exc:
            self._close()
            raise Unavailable(
                f"the usage store {self.path} cannot be read now ({exc}); try again shortly"
            ) from None

    def _answer(
        self,
        db: sqlite3.Connection,
        since: float,
        until: float,
        by: Any,
        pieces: list[groupings.Span] | None,
    ) -> queries.Texts:
        """The report's texts, or those read before if nothing was committed since. They are
        kept as SQLite gave them, not as rows: a few large strings (memory of their own, not
        the allocator's arenas, which the rows' thousands of small objects pinned for as long
        as they were kept: a year of 8 GPUs' reports left 20 MiB more after they were let go),
        and no Python to run in this thread to keep or to take them back."""
        version = db.execute("PRAGMA data_version").fetchone()[0]
        if version != self._answered:
            self._answers.clear()
            self._answered = version
        # the pieces are the zone's, read on the loop: two zones with the same are one report
        key = queries.answer_key(since, until, by, None if pieces is None else tuple(pieces))
        kept = self._answers.get(key)
        if kept is not None:
            self.answered_again += 1
            return kept
        limit, chunk = self.config.usage_report_max_rows, self.config.usage_report_chunk_rows
        if pieces is not None:
            found = groupings.read(db, since, until, by, pieces, limit, chunk)
        else:
            found = queries.read(db, since, until, by, limit, chunk)
        if found.rows < self._answers.maxsize:  # one larger than all of them is not kept
            self._answers[key] = found
        return found

    def _lower_priority(self) -> None:
        """In the reader thread: yield the CPU to serving (Config.usage_report_nice)."""
        background.lower_priority(self.config.usage_report_nice, "the usage reports' thread")

    def _wait_idle(self, delay: float | None = None) -> None:
        """On the loop: let the connection go once no report came for usage_reader_idle s."""
        if self._idle is None and self._thread is not None:
            loop = asyncio.get_running_loop()
            wait = self.config.usage_reader_idle if delay is None else delay
            self._idle = loop.call_later(wait, self._idle_check)

    def _idle_check(self) -> None:
        self._idle = None
        left = self.config.usage_reader_idle - (time.monotonic() - self._last)
        if self.running or left > 0:  # a report came meanwhile: wait from its end
            self._wait_idle(max(left, 0.05))
        elif self._thread is not None:
            self._thread.submit(self._let_go)

    def _let_go(self) -> None:
        """In the reader thread, idle: the connection (its page cache), the answers kept, and
        the C heap's free pages given back (glibc keeps them otherwise: without the trim, a
        burst of year-long reports left some 12 MiB more; docs/performance.md)."""
        if self._db is None and not self._answers:
            return
        self._close()
        self.let_go += 1
        trim = _trim()
        if trim is not None:
            trim(0)

    def _close(self) -> None:
        self._answers.clear()  # a fresh connection's data_version may equal this one's
        if self._db is not None:
            self._db.close()
            self._db = None


@functools.lru_cache(maxsize=1)
def _trim() -> Any | None:
    """glibc's malloc_trim (None elsewhere: musl, or no C library found), found once."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
