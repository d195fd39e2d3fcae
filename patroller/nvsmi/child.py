"""A supervised child process whose output lines are read on the event loop, without threads.

Lifecycle: start, read lines, exit detected (end of its stdout), exit status and stderr logged,
restarted after a growing delay (1 s doubling to 30 s, back to 1 s after a run that went well),
terminated and then killed on stop. A closed pipe ends the read loop: it never spins.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import subprocess
import time
from typing import Callable, Deque, Dict, List, Mapping, Optional

from tornado.iostream import PipeIOStream, StreamClosedError

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024  # a line longer than this is garbage: dropped, not buffered for ever
STDERR_TAIL = 2048  # bytes of stderr kept for the log when the child exits


class Backoff:
    """Restart delays: `first` doubling up to `limit`; back to `first` after a healthy run."""

    def __init__(self, first: float = 1.0, limit: float = 30.0, healthy: float = 60.0) -> None:
        self.first, self.limit, self.healthy = first, limit, healthy
        self._next = first

    def delay(self, ran: float) -> float:
        """The delay before the next start, given how long the last run lasted."""
        if ran >= self.healthy:
            self._next = self.first
        delay = self._next
        self._next = min(self.limit, self._next * 2)
        return delay


class ChildStream:
    """Runs `argv`, hands each stdout line to `on_line`, and restarts it whenever it exits."""

    def __init__(self, name: str, argv: List[str], on_line: Callable[[str], None],
                 on_start: Optional[Callable[[], None]] = None,
                 env: Optional[Mapping[str, str]] = None,
                 backoff: Optional[Backoff] = None) -> None:
        self.name = name
        self.argv = argv
        self.on_line = on_line
        self.on_start = on_start
        self.env = dict(env) if env is not None else None
        self.backoff = backoff or Backoff()
        self.process: Optional[subprocess.Popen] = None
        self.starts = 0  # how many times the child was started
        self.last_exit: Optional[int] = None
        self._stopping = False
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional["asyncio.Future[None]"] = None
        self._recent: Deque[str] = collections.deque(maxlen=3)
        self._failed_at = -60.0

    def metrics(self) -> Dict[str, object]:
        """Counters for /metrics."""
        running = self.process is not None and self.process.poll() is None
        return {"starts": self.starts, "running": running, "last_exit": self.last_exit}

    def start(self) -> None:
        """Begin supervising on the running loop."""
        self._wake = asyncio.Event()  # made here: on Python 3.9 an Event binds to a loop
        self._task = asyncio.ensure_future(self._supervise())

    async def stop(self, grace: float = 1.0) -> None:
        """Terminate the child (kill it after `grace` s) and stop restarting it."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self.process is not None and self.process.poll() is None:
            self._signal(signal.SIGTERM)
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), grace)
            except asyncio.TimeoutError:
                self._signal(signal.SIGKILL)
                await self._task

    async def _supervise(self) -> None:
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._run_once()
            except Exception:  # a bug in a line handler must not end the supervision
                log.exception("%s: reader failed", self.name)
            if self._stopping:
                break
            delay = self.backoff.delay(time.monotonic() - started)
            log.warning("%s: restarting in %.0f s", self.name, delay)
            assert self._wake is not None
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                pass

    async def _run_once(self) -> None:
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out_write, stderr=err_write,
                env=self.env, start_new_session=True)  # its own group: we stop all of it
        except OSError as exc:
            for fd in (out_read, out_write, err_read, err_write):
                os.close(fd)
            log.error("%s: cannot start %s: %s", self.name, self.argv[0], exc.strerror or exc)
            self.last_exit = None
            return
        os.close(out_write)
        os.close(err_write)
        self.starts += 1
        self._recent.clear()
        log.info("%s: started pid %d", self.name, self.process.pid)
        if self.on_start is not None:
            self.on_start()
        stderr = bytearray()
        errors = asyncio.ensure_future(self._drain(err_read, stderr))
        started = time.monotonic()
        finished = False
        try:
            await self._read_lines(out_read)
            finished = True
        finally:
            if not finished:
                self._signal(signal.SIGTERM)  # cancelled: never leave it behind
            code = await self._reap(self.process)
            await errors
        self.last_exit = code
        self._log_exit(code, time.monotonic() - started, bytes(stderr))

    async def _read_lines(self, fd: int) -> None:
        stream = PipeIOStream(fd)
        pending = b""
        discarding = False  # inside a line that grew too long: drop it up to its end
        try:
            while True:
                pending += await stream.read_bytes(65536, partial=True)
                *lines, pending = pending.split(b"\n")
                if lines and discarding:
                    discarding = False
                    lines = lines[1:]
                if len(pending) > MAX_LINE:
                    pending, discarding = b"", True
                for line in lines:
                    if len(line) <= MAX_LINE:
                        self._deliver(line)
        except StreamClosedError:
            pass  # end of output: the child exited or closed its stdout
        finally:
            stream.close()
        if pending and not discarding:
            self._deliver(pending)

    def _deliver(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace")
        self._recent.append(line)
        try:
            self.on_line(line)
        except Exception:  # a handler's bug loses one line, not the stream
            now = time.monotonic()
            if now - self._failed_at >= 60:
                self._failed_at = now
                log.exception("%s: handling a line failed: %r", self.name, line[:200])

    @staticmethod
    async def _drain(fd: int, into: bytearray) -> None:
        stream = PipeIOStream(fd)
        try:
            while True:
                into += await stream.read_bytes(4096, partial=True)
                del into[:-STDERR_TAIL]
        except StreamClosedError:
            pass
        finally:
            stream.close()

    async def _reap(self, process: subprocess.Popen, grace: float = 2.0) -> int:
        """Wait for the exit after end of output; a child that lingers is killed. No zombie."""
        deadline = time.monotonic() + grace
        while process.poll() is None:
            if time.monotonic() > deadline:
                self._signal(signal.SIGKILL)
            await asyncio.sleep(0.02)
        return process.returncode

    def _signal(self, signum: int) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _log_exit(self, code: int, ran: float, stderr: bytes) -> None:
        if self._stopping:
            log.info("%s: stopped (status %s)", self.name, code)
            return
        said = stderr.decode("utf-8", "replace").strip() or " / ".join(self._recent).strip()
        status = f"signal {-code}" if code < 0 else f"status {code}"
        log.warning("%s: exited with %s after %.1f s%s", self.name, status, ran,
                    f": {said[-500:]}" if said else "")
