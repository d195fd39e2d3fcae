"""The lease book on disk: who holds which device, in <state-dir>/leases.json, so that
reservations survive a restart of the daemon.

The book is written whenever it changes (a holder, a deadline, a releasing flag), synchronously,
from the lease manager's change announcement, before the answer that made the change goes out: a
CUDA_VISIBLE_DEVICES handed out is on disk. Each write is whole or not at all: a new file
`leases-N.json`, then the link `leases.json` swung over to it with a rename, then the previous
file removed (bookfiles.py). A temporary renamed over `leases.json` would do the same job, but
ext4 (and btrfs) start writing back a file renamed over another one at the rename: on the
benchmark's disk 0.18 ms a write (median) when it is quiet, and 1 ms on average, 5 ms p99, up to
125 ms while other work loads it; swinging a link costs 0.07-0.09 ms (median), 0.2-0.4 ms p99,
quiet or loaded (the benchmark's `persistence`), so the write stays on the loop. No fsync: the
page cache outlives the daemon (kill -9, SIGTERM, a crash of Python); only a crash of the host
loses the last writes (an fsync'd write: 0.6 ms quiet, 8-12 ms loaded), and that ends every job
the book speaks for. The directory is locked (flock) for the daemon's life: one daemon, one
book. A device held for a process keeps its pid and start time, with the boot's id: it is held
again at start only if that very process still runs. What the file holds, and what a restart
makes of each entry, is schema.py's.

A state directory on a read-only filesystem is read, never written (`read_only`): the holds in
the book come back at start as always, and the daemon serves, but what it hands out from then on
is in no file and does not survive a restart. It says so at start, as an error (once), and in
/metrics (`patroller_lease_book_read_only`); a grant is not refused for it, as it is while
writes fail on a writable filesystem (a full disk recovers by itself, a read-only mount does not).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from patroller.config import Config
from patroller.core.leases import LeaseManager
from patroller.core.throttle import Throttle
from patroller.identify.procfs import boot_id, is_alive
from patroller.state import schema
from patroller.state.bookfiles import LinkedFiles
from patroller.state.directory import lock
from patroller.state.schema import Restored

log = logging.getLogger(__name__)

Clock = Callable[[], float]

# Bytes: a bigger file is not a lease book (one held device takes about 300 bytes: this is
# room for thousands; a bigger file would only cost the start its time).
MAX_SIZE = 1024 * 1024
# Seconds the wall clock may drift from the monotonic one before the offset follows: not a
# tuning value, the tolerance of comparing the two clocks (an unchanged deadline stays the same).
STEADY = 1.0


class LeaseBook:
    """The lease book of one daemon, in one locked directory."""

    def __init__(self, directory: str, config: Config, wall: Clock = time.time) -> None:
        self.directory = directory
        self.files = LinkedFiles(directory)  # each write whole: bookfiles.py
        self.path = self.files.path
        self.proc = config.proc_root
        self.report_every = config.repeat_log_every  # seconds between lines on failing writes
        self.retry_every = config.book_retry  # seconds between tries while writes fail
        self.wall = wall
        self.writes = 0
        self.failures = 0
        self.leases: LeaseManager | None = None
        self._lock: int | None = None
        self.read_only = False  # on a read-only filesystem: read at start, never written
        self._written: dict[str, Any] | None = None  # the snapshot last on disk
        self._offset: float | None = None
        self._boot: str | None = None  # this boot's id, read as the book is opened
        self._failing = False  # a write failed, and no write has worked since
        self._why = ""  # what the last failing write said
        self._retry: asyncio.TimerHandle | None = None  # the next try, while writes fail
        self._reports: Throttle | None = None  # on the lease manager's clock, once attached

    # -- life ---------------------------------------------------------------------------------

    def open(self) -> None:
        """Make the directory (private) if missing, private if it is not, and lock it
        (directory.py); BookError if any fails, or if someone else could have chosen where it
        leads."""
        self._boot = boot_id(self.proc)
        locked = lock(self.directory)
        self._lock, self.read_only = locked.fd, locked.read_only
        if locked.tightened.directory_mode is not None:  # in a private one, files were safe
            log.warning(
                "the state directory was open to other users, and is private now: %s "
                "(under systemd: StateDirectoryMode=0700 and UMask=0077, as `patroller "
                "systemd-unit` prints)",
                locked.tightened.words(self.directory),
            )
        if self.read_only:
            log.error(
                "the state directory %s is on a read-only filesystem: the lease book is "
                "read, never written; reservations made from now on do not survive a "
                "restart (mount it read-write to keep them)",
                self.directory,
            )
        if locked.open_mode is not None:
            log.error(
                "the state directory %s (mode %o) is open to other users and on a "
                "read-only filesystem, so it cannot be made private: they may read the "
                "usage history and the lease book there (chmod 700 it where it is "
                "writable)",
                self.directory,
                locked.open_mode,
            )

    def attach(self, leases: LeaseManager) -> Restored | None:
        """Load the book into a fresh lease manager, then keep the file up to date with it."""
        self.leases = leases
        self._reports = Throttle(1, self.report_every, clock=leases.clock)
        restored = self.restore()
        self.files.tidy()  # on a read-only filesystem, removes nothing (write() writes nothing)
        leases.on_change(self.write)
        self.write()
        return restored

    def close(self) -> None:
        """Write one last time, stop writing and unlock the directory (the lock file stays:
        removing it would race). A last write that fails leaves no try behind."""
        if self.leases is not None:
            self.write()
        self.leases = None
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def metrics(self) -> dict[str, Any]:
        """Counters for /metrics."""
        return {
            "path": self.path,
            "writes": self.writes,
            "failures": self.failures,
            "writable": not self._failing and not self.read_only,
            "read_only": self.read_only,
        }

    def refusal(self) -> str | None:
        """Why nothing may be handed out now (the book cannot be written: a reservation would
        not survive a restart), or None. The lease manager's gate."""
        if not self._failing:
            return None
        return (
            f"the lease book {self.path} cannot be written ({self._why}): no reservation is "
            "handed out until it can; try again shortly"
        )

    # -- reading ------------------------------------------------------------------------------

    def restore(self) -> Restored | None:
        """Give the devices in the file back to their holders; a bad file is set aside, logged."""
        assert self.leases is not None
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_SIZE + 1)
        except FileNotFoundError:
            if os.path.islink(self.path):
                self._set_aside(f"links to a missing file ({os.readlink(self.path)})")
            return None
        except OSError as exc:
            self._set_aside(f"cannot be read ({exc.strerror or exc})")
            return None
        try:
            if len(data) > MAX_SIZE:
                raise ValueError(f"over {MAX_SIZE} bytes")
            book = schema.decode(data)
            # A process's start time counts from boot: after a reboot no process is alive.
            same_boot = book.get("boot") is not None and book.get("boot") == self._boot
            alive = (lambda ref: is_alive(ref, self.proc)) if same_boot else schema.ended
            restored = schema.restore(
                self.leases, book.get("devices"), self._steady_offset(), alive=alive
            )
        except (ValueError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors
            self._set_aside(f"is not a lease book ({str(exc)[:200]})")
            return None
        log.info(
            "lease book %s: %d device(s) held again, %d expired during the downtime, "
            "%d whose process ended, %d no longer on this host",
            self.path,
            len(restored.held),
            len(restored.expired),
            len(restored.ended),
            len(restored.dropped),
        )
        return restored

    def _set_aside(self, why: str) -> None:
        """Set aside a file that cannot be restored (kept for a look: bookfiles.py), and say so
        once."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.wall()))
        try:
            aside = self.files.set_aside(stamp)
        except OSError as exc:
            log.warning(
                "lease book %s %s and cannot be set aside (%s); starting with no reservations",
                self.path,
                why,
                exc.strerror or exc,
            )
            return
        log.warning(
            "lease book %s %s; set aside as %s, starting with no reservations",
            self.path,
            why,
            aside,
        )

    # -- writing ------------------------------------------------------------------------------

    def write(self) -> None:
        """Write the book if it changed since the last write; a failure is logged, never raised."""
        if self.leases is None or self.read_only:
            return
        held = schema.snapshot(self.leases, self._steady_offset())
        if held == self._written and not self._failing:  # churn that leaves it as it was
            return
        body = schema.encode(held, self.wall(), self._boot)
        try:
            self.files.publish(body)
        except OSError as exc:
            self._failed(exc)
            return
        self._written = held
        self.writes += 1
        if self._failing:
            log.warning(
                "lease book %s is written again (%d write(s) failed); reservations are "
                "handed out again",
                self.path,
                self.failures,
            )
            self._failing = False
            if self._retry is not None:
                self._retry.cancel()
                self._retry = None
            self.leases.serve()  # the waiters held back meanwhile

    def _failed(self, exc: OSError) -> None:
        """Log a failing write now and then, not on every change."""
        assert self._reports is not None
        self.failures += 1
        self._failing = True
        self._why = str(exc.strerror or exc)
        self._try_again()
        if not self._reports.admit()[0]:
            return
        log.error(
            "cannot write the lease book %s: %s (%d failed write(s) so far); no "
            "reservation is handed out until it can be written",
            self.path,
            self._why,
            self.failures,
        )

    def _try_again(self) -> None:
        """While writes fail, try again every `retry_every` seconds (on the running loop, if
        any): the book recovers by itself when the disk does."""
        if self._retry is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (the rules driven by hand): the next change tries again
            return
        self._retry = loop.call_later(self.retry_every, self._retried)

    def _retried(self) -> None:
        self._retry = None
        self.write()

    def _steady_offset(self) -> float:
        """Wall clock minus the manager's clock, kept while it stays within STEADY.

        Kept so that an unchanged deadline always converts to the same epoch time (the book is
        compared, not rewritten); followed when the wall clock is set, so the file stays true.
        """
        assert self.leases is not None
        offset = self.wall() - self.leases.clock()
        if self._offset is None or abs(offset - self._offset) > STEADY:
            self._offset = offset
        return self._offset
