"""Watches the processes that devices are held for (hold=process), and tells the lease manager
when one ends.

Each process is watched through a pidfd (Linux 5.3 and later): it turns readable when the
process exits, so the event loop learns of the end at once and nothing polls. Opening one names
a pid, which may have been handed to another process since the caller connected: the start time
is read after the open, and a mismatch means that the process had already ended (a pidfd names
the process it was opened on for ever, so one check after the open is enough). Where pidfds
cannot be had, the processes are checked every `lifeline_poll` seconds (Config) instead. /proc is
read in the
executor, never on the loop.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os

from patroller.config import Config
from patroller.core.identity import ProcessRef
from patroller.core.leases import LeaseManager
from patroller.identify.procfs import is_alive

log = logging.getLogger(__name__)


def open_pidfd(ref: ProcessRef, proc: str = "/proc") -> int | None:
    """Blocking: a pidfd on this very process, or None if it has ended. Raises OSError when
    pidfds cannot be had here (then the caller polls)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        raise OSError(errno.ENOSYS, "os.pidfd_open is not available")
    try:
        fd: int = pidfd_open(ref.pid)
    except ProcessLookupError:
        return None
    if is_alive(ref, proc):
        return fd
    os.close(fd)  # the pid is another process's now, or a zombie's
    return None


class Lifelines:
    """Keeps a watch on every process the lease manager holds devices for."""

    def __init__(self, leases: LeaseManager, config: Config, pidfds: bool = True) -> None:
        self.leases = leases
        self.proc = config.proc_root
        self.pidfds = pidfds  # False: poll, as where pidfds cannot be had
        self.poll = config.lifeline_poll
        self.ended = 0  # processes seen to end
        self._fds: dict[ProcessRef, int] = {}
        self._polled: set[ProcessRef] = set()
        self._opening: set[ProcessRef] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Follow the manager's changes on the running loop."""
        self._loop = asyncio.get_running_loop()
        self.leases.on_change(self.sync)
        self.sync()

    def stop(self) -> None:
        """Stop watching; close every pidfd."""
        loop, self._loop = self._loop, None
        for ref in list(self._fds):
            self._close(ref, loop)
        self._polled.clear()
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None

    def metrics(self) -> dict[str, int]:
        """Counters for /metrics."""
        return {"watched": len(self._fds), "polled": len(self._polled), "ended": self.ended}

    def sync(self) -> None:
        """Watch the processes the manager holds devices for, and only those."""
        if self._loop is None:
            return
        wanted = self.leases.processes_held_for()
        if not wanted and not self._fds and not self._polled:
            return
        for ref in wanted - self._fds.keys() - self._polled - self._opening:
            self._opening.add(ref)
            asyncio.ensure_future(self._watch(ref))
        for ref in self._fds.keys() - wanted:
            self._close(ref, self._loop)
        self._polled &= wanted

    async def _watch(self, ref: ProcessRef) -> None:
        loop = asyncio.get_running_loop()
        fd: int | None = None
        polled, alive = False, True
        try:
            if self.pidfds:
                try:
                    fd = await loop.run_in_executor(None, open_pidfd, ref, self.proc)
                except OSError as exc:  # no pidfds here, or no descriptor left: poll this one
                    log.debug("watching pid %d by polling: %s", ref.pid, exc)
                    polled = True
            else:
                polled = True
            if polled:
                alive = await loop.run_in_executor(None, is_alive, ref, self.proc)
        finally:
            self._opening.discard(ref)
        if self._loop is None or ref not in self.leases.processes_held_for():
            if fd is not None:  # no longer wanted while it was opened
                os.close(fd)
            return
        if polled:
            if not alive:
                self._ended(ref)
                return
            self._polled.add(ref)
            if self._poller is None:
                self._poller = asyncio.ensure_future(self._poll())
        elif fd is None:
            self._ended(ref)
        else:
            self._fds[ref] = fd
            loop.add_reader(fd, self._exited, ref)

    def _exited(self, ref: ProcessRef) -> None:
        """A pidfd turned readable: its process has exited."""
        if self._loop is not None:
            self._close(ref, self._loop)
        self._ended(ref)

    def _ended(self, ref: ProcessRef) -> None:
        self.ended += 1
        self._polled.discard(ref)
        self.leases.process_exited(ref)

    def _close(self, ref: ProcessRef, loop: asyncio.AbstractEventLoop | None) -> None:
        fd = self._fds.pop(ref, None)
        if fd is None:
            return
        if loop is not None:
            loop.remove_reader(fd)
        os.close(fd)

    async def _poll(self) -> None:
        """Check the polled processes every `poll` seconds while there are any."""
        loop = asyncio.get_running_loop()
        try:
            while self._polled and self._loop is not None:
                await asyncio.sleep(self.poll)
                refs = list(self._polled)
                alive = await loop.run_in_executor(None, _alive, refs, self.proc)
                for ref, lives in zip(refs, alive, strict=True):
                    if not lives and ref in self._polled:
                        self._ended(ref)
        finally:
            if self._poller is asyncio.current_task():
                self._poller = None


def _alive(refs: list[ProcessRef], proc: str) -> list[bool]:
    """Whether each process is still the one it was (in the executor: /proc reads)."""
    return [is_alive(ref, proc) for ref in refs]
