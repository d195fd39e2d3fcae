"""A supervised child process whose output lines are read on the event loop, without threads.

Lifecycle: start, read lines, exit detected (end of its stdout), exit status and stderr logged,
restarted after a growing delay (1 s doubling to 30 s, back to 1 s after a run that went well),
terminated and then killed on stop. A closed pipe ends the read loop: it never spins. A child
that prints nothing for too long is hung: its group is killed and it is restarted as if it had
exited. The kernel kills the child if the daemon dies (parent-death signal), even by SIGKILL.
"""
from __future__ import annotations

import asyncio
import collections
import ctypes
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
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def parent_death_kill() -> Optional[Callable[[], None]]:
    """A preexec_fn that has the kernel SIGKILL the child when this process dies; None off Linux.

    Resolved here, before the fork, so that the child only makes three system calls between
    fork and exec: no import, no lock, no logging. That is what makes preexec_fn acceptable in
    a daemon with executor threads (its documented risk is a child deadlocking on a lock held
    by another thread at fork time). The signal fires when the *thread* that forked exits:
    children are started from the event loop's thread, which lives as long as the daemon.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent, kill = os.getpid(), int(signal.SIGKILL)

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # the daemon died before the signal was armed
            os.kill(os.getpid(), kill)
    return arm


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
    """Runs `argv`, hands each stdout line to `on_line`, and restarts it whenever it exits.

    With `silence`, a child that prints nothing for that many seconds is taken as hung (a hung
    nvidia-smi stays alive and silent, so its end of output never comes): one warning, its
    group killed, restarted with the usual backoff. Its first output may take `startup` s.
    """

    def __init__(self, name: str, argv: List[str], on_line: Callable[[str], None],
                 on_start: Optional[Callable[[], None]] = None,
                 env: Optional[Mapping[str, str]] = None,
                 backoff: Optional[Backoff] = None,
                 silence: Optional[float] = None, startup: Optional[float] = None,
                 on_exit: Optional[Callable[[int, str], None]] = None) -> None:
        self.name = name
        self.argv = argv  # may be changed between runs: the next start uses it
        self.on_line = on_line
        self.on_start = on_start
        self.on_exit = on_exit  # (status, what it said) after an exit that was not a stop
        self.env = dict(env) if env is not None else None
        self.backoff = backoff or Backoff()
        self.silence = silence  # None: never taken as hung
        self.startup = max(startup or 0.0, silence or 0.0)
        self.process: Optional[subprocess.Popen] = None
        self.starts = 0  # how many times the child was started
        self.hangs = 0  # how many times it was killed for printing nothing
        self.last_exit: Optional[int] = None
        self._heard: Optional[float] = None  # monotonic time of its last output in this run
        self._hung = False
        self._stopping = False
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional["asyncio.Future[None]"] = None
        self._recent: Deque[str] = collections.deque(maxlen=3)
        self._failed_at = -60.0
        self._again = False  # restart at once, not after the backoff delay

    def metrics(self) -> Dict[str, object]:
        """Counters for /metrics."""
        running = self.process is not None and self.process.poll() is None
        return {"starts": self.starts, "running": running, "hangs": self.hangs,
                "last_exit": self.last_exit}

    def start(self) -> None:
        """Begin supervising on the running loop."""
        self._wake = asyncio.Event()  # made here: on Python 3.9 an Event binds to a loop
        self._task = asyncio.ensure_future(self._supervise())

    async def stop(self, grace: float = 0.5) -> None:
        """Terminate the child (kill its group after `grace` s) and stop restarting it."""
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

    def restart(self) -> None:
        """End the running child and start it again at once (with `argv` as it is now)."""
        self._again = True
        if self._wake is not None:
            self._wake.set()
        self._signal(signal.SIGTERM)

    async def _supervise(self) -> None:
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._run_once()
            except Exception:  # a bug in a line handler must not end the supervision
                log.exception("%s: reader failed", self.name)
            if self._stopping:
                break
            if self._again:
                self._again = False
                assert self._wake is not None
                self._wake.clear()
                log.info("%s: restarting with %s", self.name, " ".join(self.argv[-4:]))
                continue
            delay = self.backoff.delay(time.monotonic() - started)
            log.warning("%s: restarting in %.0f s", self.name, delay)
            assert self._wake is not None
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                pass
            if not self._stopping:  # woken by restart(): it starts now, with the new argv
                self._again = False
                self._wake.clear()

    async def _run_once(self) -> None:
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out_write, stderr=err_write,
                env=self.env, start_new_session=True,  # its own group: we stop all of it
                preexec_fn=parent_death_kill())
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
        self._heard, self._hung = None, False
        log.info("%s: started pid %d", self.name, self.process.pid)
        if self.on_start is not None:
            self.on_start()
        stderr = bytearray()
        errors = asyncio.ensure_future(self._drain(err_read, stderr))
        started = time.monotonic()
        watch = asyncio.ensure_future(self._watch(started)) if self.silence else None
        finished = False
        try:
            await self._read_lines(out_read)
            finished = True
        finally:
            if watch is not None:
                watch.cancel()
            if not finished:
                self._signal(signal.SIGTERM)  # cancelled: never leave it behind
            code = await self._reap(self.process)
            await errors
        self.last_exit = code
        self._log_exit(code, time.monotonic() - started, bytes(stderr))

    async def _watch(self, started: float) -> None:
        """Kill the child's group once it has printed nothing for too long."""
        assert self.silence is not None
        while True:
            limit = self.startup if self._heard is None else self.silence
            quiet = time.monotonic() - (started if self._heard is None else self._heard)
            if quiet >= limit:
                break
            await asyncio.sleep(min(limit - quiet, self.silence))  # the first output shortens it
        if self._stopping:
            return  # being stopped already: not a hang
        self._hung = True
        self.hangs += 1
        said = "nothing since it started" if self._heard is None else "nothing more"
        log.warning("%s: printed %s for %.1f s: hung, killing it", self.name, said, quiet)
        self._signal(signal.SIGKILL)  # a hung nvidia-smi need not answer SIGTERM

    async def _read_lines(self, fd: int) -> None:
        stream = PipeIOStream(fd)
        pending = b""
        discarding = False  # inside a line that grew too long: drop it up to its end
        try:
            while True:
                pending += await stream.read_bytes(65536, partial=True)
                self._heard = time.monotonic()
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
        deadline: Optional[float] = time.monotonic() + grace
        while process.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                self._signal(signal.SIGKILL)
                deadline = None  # once: a process stuck in the kernel dies when it returns
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
        if self._hung:  # the warning was given when it was killed
            log.info("%s: hung child ended (status %s) after %.1f s", self.name, code, ran)
            return
        if self._again:  # restarted on purpose
            return
        said = stderr.decode("utf-8", "replace").strip() or " / ".join(self._recent).strip()
        if self.on_exit is not None:
            try:
                self.on_exit(code, said)
            except Exception:
                log.exception("%s: exit handler failed", self.name)
        status = f"signal {-code}" if code < 0 else f"status {code}"
        log.warning("%s: exited with %s after %.1f s%s", self.name, status, ran,
                    f": {said[-500:]}" if said else "")
