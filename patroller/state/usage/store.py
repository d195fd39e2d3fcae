"""The usage store on disk, <state-dir>/usage.sqlite3: one writer thread, one reader thread.

The event loop never touches the file. Every `--usage-interval` the sampler hands the store one
interval's samples (`put`: a queue); the writer thread writes each interval in one transaction,
in WAL mode with `synchronous=NORMAL`: a committed interval survives the daemon's death (kill -9
included; a crash of the host may lose the last ones), so a restart loses at most the interval
in progress. Reports read on a connection of their own, in a thread of their own (reader.py):
WAL lets them read while the writer writes.

What goes wrong, and what the store does:
  - a write fails (a full disk, a file it cannot open or write): one log line (then one a
    `repeat_log_every`), state `failing` in /metrics, the intervals kept in memory (up to
    `usage_backlog`, then the oldest dropped, counted) and tried again every `usage_retry`
    seconds; the first write that works writes them all and says so. Serving goes on.
  - the file is not a database, is damaged, or is not a usage store: renamed
    `usage.sqlite3.corrupt-<time>` (with its -wal and -shm), never deleted, one log line, and a
    fresh store in its place; a file of a newer schema likewise, as `.newer-<time>`.
  - its directory is on a read-only filesystem at start: no store, said at start and in
    /metrics (state `read_only`).
  - another connection holds the file's lock (a reader holding it, SQLITE_BUSY): each write
    waits `usage_busy_timeout` at most, then fails as above: the writer is never stuck, the
    backlog is kept, and once full its oldest intervals are dropped, counted and logged (one
    line a `repeat_log_every`).
  - its filesystem has fewer than `usage_reserve` bytes free: nothing is written, as when a
    write fails, so that the lease book can still be written (room.py); /metrics says so
    (`saving_room`). Names are cut and new parties bounded per interval (keys.py).
Old samples are folded into daily totals (tables.py) at start and every `usage_fold_every`.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Sequence
from datetime import tzinfo
from typing import Any

from patroller.config import Config
from patroller.core.throttle import Throttle
from patroller.core.usage import GpuSample
from patroller.durations import describe
from patroller.state.usage import files, queries, room
from patroller.state.usage.files import FILE
from patroller.state.usage.keys import cut_sample
from patroller.state.usage.reader import Reader
from patroller.state.usage.writer import FAILING, Writer

log = logging.getLogger(__name__)

# States, as /metrics shows them.
STARTING, WRITABLE, READ_ONLY, STOPPED = ("starting", "writable", "read_only", "stopped")
STATES = (STARTING, WRITABLE, FAILING, READ_ONLY, STOPPED)


class UsageStore:
    """The usage store in `directory` (the state directory)."""

    def __init__(
        self, directory: str, config: Config, wall: Callable[[], float] = time.time
    ) -> None:
        self.directory = directory
        self.path = os.path.join(directory, FILE)
        self.config = config
        self.wall = wall
        self.state = STARTING
        self.why = ""  # what the last failure said
        self.rows = 0  # sample rows written
        self.intervals = 0  # intervals written
        self.failures = 0  # writes (or openings) that failed
        self.set_aside = 0  # files renamed out of the way
        self.dropped = 0  # intervals dropped: the backlog was full, or they could not be written
        self.free: int | None = None  # bytes free on its filesystem, at the last write
        self.saving_room = False  # not written: the room left is the lease book's (room.py)
        self._drops = Throttle(1, config.repeat_log_every)  # intervals dropped, said
        self._reports = Throttle(1, config.repeat_log_every)
        self._unmovable = Throttle(1, config.repeat_log_every)  # files it cannot set aside
        self.reader = Reader(self.path, config)
        self.writer = Writer(self)

    # -- life (on the event loop) --------------------------------------------------------------

    def open(self) -> None:
        """At start: a store, unless its directory is on a read-only filesystem (said once);
        the file itself is opened by the writer thread."""
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            read_only = bool(os.statvfs(self.directory).f_flag & os.ST_RDONLY)
        except OSError as exc:
            read_only = exc.errno == errno.EROFS  # it could not even be made
        if read_only:
            self.state = READ_ONLY
            log.warning(
                "the usage store's directory %s is on a read-only filesystem: running "
                "without a usage store (no usage history is kept)",
                self.directory,
            )
            return
        config = self.config
        log.info(
            "usage store %s: a sample of every GPU every %s, kept %d days, then daily totals",
            self.path,
            describe(config.usage_interval),
            config.usage_days,
        )
        self.writer.start()

    def put(self, at: float, samples: Sequence[GpuSample]) -> None:
        """One interval's samples, for the writer (never blocks), their names cut (keys.py):
        what waits in memory while the store cannot be written is bounded too."""
        if self.writer.thread is not None and self.state != STOPPED:
            self.writer.queue.put((at, tuple(cut_sample(sample) for sample in samples)))

    def close(self, timeout: float) -> None:
        """Blocking: write what is queued, within `timeout` seconds, and close."""
        if not self.writer.stop(timeout):
            log.warning("the usage store did not finish writing within %s", describe(timeout))
        self.reader.close()
        if self.state != READ_ONLY:
            self.state = STOPPED

    def metrics(self) -> dict[str, Any]:
        """Counters for /metrics."""
        return {
            "path": self.path,
            "state": self.state,
            "rows": self.rows,
            "intervals": self.intervals,
            "failures": self.failures,
            "set_aside": self.set_aside,
            "pending": self.writer.held + self.writer.queue.qsize(),
            "dropped": self.dropped,
            "answered_again": self.reader.answered_again,
            "free": self.free,
            "saving_room": self.saving_room,
            "parties_overflow": self.writer.keys.overflow,
            "reports_running": self.reader.running,
            "reports_waiting": self.reader.waiting,
            "reports_busy": self.reader.refused["busy"],
            "reports_too_large": self.reader.refused["too_large"],
        }

    # -- reading (reader.py: a thread of its own) ---------------------------------------------

    async def report(self, since: float, until: float, by: str) -> queries.Totals:
        """GPU-seconds by `by` over [since, until), read off the event loop. Unavailable if the
        store cannot be read."""
        return await self.reader.read(since, until, by, None)

    async def grouped(
        self, since: float, until: float, by: tuple[str, ...], zone: tzinfo
    ) -> queries.Totals:
        """GPU-seconds by one key or two (`by`), their time in `zone`, over [since, until)
        (groupings.py), read off the event loop as `report` is; each row's key is a tuple."""
        return await self.reader.read(since, until, by, zone)

    # -- what the writer tells it (writer.py) --------------------------------------------------

    def aside(self, kind: str, why: str) -> bool:
        """Rename the file (and its WAL files) `<file>.<kind>-<time>`, saying why; False if it
        cannot be renamed."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.wall()))
        try:
            aside = files.set_aside(self.path, kind, stamp)
        except OSError as exc:  # said once a repeat_log_every: it is tried at every retry
            if self._unmovable.admit()[0]:
                log.error(
                    "usage store %s %s and cannot be set aside: %s",
                    self.path,
                    why,
                    exc.strerror or exc,
                )
            return False
        self.set_aside += 1
        self.reader.file_replaced()
        log.warning(
            "usage store %s %s; set aside as %s, and a fresh store starts",
            self.path,
            why,
            os.path.basename(aside),
        )
        return True

    def check_room(self) -> None:
        """Before each write: room.Low (an OSError: a failed write) while the room left on
        the filesystem is the lease book's."""
        try:
            self.free = room.ensure(self.directory, self.config.usage_reserve)
        except room.Low as exc:
            self.free, self.saving_room = exc.free, True
            raise
        self.saving_room = False

    def drop_oldest(self) -> None:
        """The backlog is full (the store has not been written for that long): its oldest
        interval goes, counted, and said once a repeat_log_every."""
        self.dropped += 1
        if self._drops.admit()[0]:
            log.warning(
                "usage store %s: %d interval(s) wait in memory, the most kept "
                "(usage_backlog): the oldest is dropped (%d dropped so far): %s",
                self.path,
                self.config.usage_backlog,
                self.dropped,
                self.why or "the store cannot be written",
            )

    def failed(self, exc: BaseException, kept: int) -> None:
        self.failures += 1
        self.state = FAILING
        self.why = str(getattr(exc, "strerror", None) or exc)
        if self._reports.admit()[0]:
            log.error(
                "cannot write the usage store %s: %s (%d failure(s) so far); serving goes "
                "on, %d interval(s) kept in memory, tried again every %s",
                self.path,
                self.why,
                self.failures,
                kept,
                describe(self.config.usage_retry),
            )

    def recovered(self) -> None:
        if self.state == FAILING:
            log.warning(
                "usage store %s is written again after %d failure(s); the intervals "
                "kept meanwhile are written",
                self.path,
                self.failures,
            )
        self.state = WRITABLE
        self.why = ""


def store_for(config: Config) -> UsageStore | None:
    """The usage store the configuration asks for: in the state directory (or `usage_dir`),
    unless --usage none or there is no state directory."""
    directory = config.usage_dir or config.state_dir
    if config.usage == "none":
        return None
    if (
        directory is None
    ):  # as found: --usage sqlite with no state directory kept nothing, silently
        # a warning on a GPU host; in test mode, whose default is no state directory (test
        # daemons run many at once, and the quick start gives one), a debug line
        (log.debug if config.test else log.warning)(
            "no usage history is kept: --usage %s needs a state directory, and there is none "
            "(%s); give --state-dir DIR to keep one, or --usage none",
            config.usage,
            "test mode's default" if config.test else "--state-dir none",
        )
        return None
    return UsageStore(directory, config)
