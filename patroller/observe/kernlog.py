"""The kernel log followed for Xid lines (observe/xid.py), each sent as an `xid` signal.

The log is `Config.kernel_log`: /dev/kmsg (root may read it; each read gives one record), or
in tests a file or a FIFO. It is read in a thread of its own, never on the loop, without
blocking: a read that finds nothing new waits `kernel_log_poll` s (or the stop) and tries
again. It starts from now, not from the whole ring: the records already there are read once at
start, and of them only the Xids logged within `xid_recall` s count (a /dev/kmsg record says
when, in microseconds since boot; a line of a plain file, which says nothing, does not count).
A log that cannot be opened is tried again every `kernel_log_retry` s; the monitor then says
it fails, once in the log.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
import time

from patroller.config import Config
from patroller.durations import describe
from patroller.observe.monitor import FAILING, IDLE, UP, KernelLogMetrics, Monitor
from patroller.observe.signals import Signals
from patroller.observe.xid import XidLine, parse_xid

log = logging.getLogger(__name__)

CHUNK = 8192  # bytes per read: a /dev/kmsg record is at most 1 KiB of text, and its dictionary
RECALL_BYTES = 1 << 20  # bytes of a plain file read back at start at most (its end)


class KernelLog(Monitor):
    """Follows the kernel log in a thread; each Xid line is an `xid` signal on the loop."""

    name = "kernel_log"

    def __init__(self, signals: Signals, config: Config) -> None:
        self.signals = signals
        self.path = str(config.kernel_log)
        self.recall = config.xid_recall
        self.poll = config.kernel_log_poll
        self.retry = config.kernel_log_retry
        self.lines = 0  # lines read, the recalled ones included
        self.xids = 0  # Xid lines sent
        self.failures = 0  # opens and reads that failed
        self._open = False
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="kernel-log", daemon=True)
        self._thread.start()

    async def stop(self, grace: float) -> None:
        self._halt.set()
        thread = self._thread
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, grace)

    def metrics(self) -> KernelLogMetrics:
        state = UP if self._open else FAILING if self.failures else IDLE
        return KernelLogMetrics(
            state=state, lines=self.lines, xids=self.xids, failures=self.failures
        )

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        told = False
        while not self._halt.is_set():
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                self.failures += 1
                if not told:
                    log.warning(
                        "cannot read the kernel log %s (%s): Xid errors are not seen; "
                        "trying again every %s",
                        self.path,
                        exc.strerror,
                        describe(self.retry),
                    )
                    told = True
                self._halt.wait(self.retry)
                continue
            self._open = True
            try:
                self._follow(fd)
            finally:
                self._open = False
                os.close(fd)

    def _follow(self, fd: int) -> None:
        """Read what is there (the recent Xids count), then what comes, until the stop."""
        if os.path.isfile(self.path):
            size = os.fstat(fd).st_size
            os.lseek(fd, max(0, size - RECALL_BYTES), os.SEEK_SET)
        now, rest = time.monotonic(), [b""]
        for line in self._drain(fd, rest):
            found = parse_xid(line)
            if (
                found is not None
                and found.uptime is not None
                and now - found.uptime <= self.recall
            ):
                self._send(found)
            self.lines += 1
        pending = rest[0]
        while not self._halt.is_set():
            chunk = self._read(fd)
            if chunk is None:
                return  # the log failed: open it again
            if not chunk:
                self._halt.wait(self.poll)
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self._line(raw.decode("utf-8", "replace"))

    def _drain(self, fd: int, rest: list[bytes]) -> list[str]:
        """The lines in the log now (the last, unended, left in `rest`)."""
        data = b""
        while not self._halt.is_set():
            chunk = self._read(fd)
            if not chunk:
                break
            data += chunk
        *lines, rest[0] = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]

    def _read(self, fd: int) -> bytes | None:
        """The next bytes; b"" when there are none now; None when the log failed."""
        try:
            return os.read(fd, CHUNK)
        except BlockingIOError:
            return b""
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # /dev/kmsg: records overwritten before read
                return b""
            self.failures += 1
            log.warning(
                "reading the kernel log %s failed (%s): opening it again", self.path, exc.strerror
            )
            self._halt.wait(self.retry)
            return None

    def _line(self, line: str) -> None:
        found = parse_xid(line)
        if found is not None:
            self._send(found)
        self.lines += 1  # after the send: a reader that sees it counted sees the Xid sent

    def _send(self, found: XidLine) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        self.xids += 1
        try:
            loop.call_soon_threadsafe(self._deliver, found)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _deliver(self, found: XidLine) -> None:
        self.signals.xid.send(self, record=found)
