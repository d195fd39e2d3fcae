"""One run of one command, the core of the supervisor: started on the event loop's thread, in a
process group of its own (a stop or a timeout kills the whole group), with the parent-death
signal armed (the kernel kills it if the daemon dies, even by SIGKILL); its output read on the
event loop, the tail of its stderr kept for the log, its exit awaited, never polled.

Built on asyncio's subprocess support rather than `tornado.process.Subprocess`: Tornado hears
of exits through a SIGCHLD handler it installs once per process, on the first event loop that
asks; once that loop is closed (each test runs its own), no later child's exit is heard.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import time
from collections.abc import Callable, Mapping

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PIPE, DEVNULL = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL


def parent_death_kill() -> Callable[[], None] | None:
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


def one_line(text: str, limit: int = 300) -> str:
    """What a child said, on one line for the log."""
    words = " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return words if len(words) <= limit else words[:limit] + "..."


def status_text(code: int) -> str:
    """`status 3`, or `signal 9` for a child a signal ended."""
    return f"signal {-code}" if code < 0 else f"status {code}"


class Child:
    """One run of one command. Made by `start`, on the event loop's thread."""

    def __init__(self, process: asyncio.subprocess.Process, stderr_tail: int) -> None:
        self.process = process
        self.pid = process.pid
        self.started = time.monotonic()
        self._tail = stderr_tail
        self._stderr = bytearray()
        self._draining = asyncio.ensure_future(self._drain())

    @classmethod
    async def start(
        cls, argv: list[str], env: Mapping[str, str] | None, stderr_tail: int
    ) -> Child:
        """Start `argv`; OSError if it cannot be (not found, not executable)."""
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=DEVNULL,
            stdout=PIPE,
            stderr=PIPE,
            env=None if env is None else dict(env),
            start_new_session=True,  # its own group: a stop or a timeout ends all of it
            preexec_fn=parent_death_kill(),
        )
        return cls(process, stderr_tail)

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    @property
    def stdout(self) -> asyncio.StreamReader:
        assert self.process.stdout is not None
        return self.process.stdout

    def said(self) -> str:
        """The tail of its stderr."""
        return self._stderr.decode("utf-8", "replace").strip()

    def signal(self, signum: int) -> None:
        """Send `signum` to its whole group, while it has not exited."""
        if self.process.returncode is not None:
            return
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    async def exited(self, grace: float) -> int:
        """Its exit status, once it has exited; after `grace` s its group is killed. Its stderr
        is read to the end as well."""
        try:
            await asyncio.wait_for(asyncio.shield(self.process.wait()), grace)
        except asyncio.TimeoutError:
            self.signal(signal.SIGKILL)  # once: one stuck in the kernel dies when it returns
        code = await self.process.wait()
        await self._draining
        return code

    async def end(self, grace: float) -> int:
        """Terminate its group, and kill it if it is still there after `grace` s."""
        self.signal(signal.SIGTERM)
        return await self.exited(grace)

    async def _drain(self) -> None:
        assert self.process.stderr is not None
        while True:
            chunk = await self.process.stderr.read(4096)
            if not chunk:
                return
            self._stderr += chunk
            del self._stderr[: -self._tail]
