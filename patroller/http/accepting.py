"""Accepting connections in a way that survives running out of file descriptors.

This replaces Tornado's `tornado.netutil.add_accept_handler` (as of Tornado 6.6) for the daemon's
listening sockets. There, an `accept()` that fails with EMFILE raises out of the handler, the
IOLoop logs the traceback, and since the listening socket stays readable the loop calls the
handler again at once: 100% CPU and about 358 MB of log a minute, for as long as the limit is
reached. Here such a failure stops watching every listening socket for a pause that grows from
0.05 s to 1 s (new connections wait in the kernel's backlog), then watches them again; the
connections already open are served all along. The condition is logged once a minute at most,
with a count, and once more when accepting works again.
"""
from __future__ import annotations

import errno
import logging
import socket
from typing import Any, Callable, Dict, Optional

from tornado.ioloop import IOLoop

from patroller.core.throttle import Throttle

log = logging.getLogger(__name__)

# accept() hands these over for one connection that failed in the queue: skip it, take the next
# (Linux passes a new connection's pending network error to accept(); see accept(2)).
SKIP = {errno.ECONNABORTED, errno.EPROTO, errno.ENOPROTOOPT, errno.EHOSTDOWN, errno.ENONET,
        errno.EHOSTUNREACH, errno.EOPNOTSUPP, errno.ENETDOWN, errno.ENETUNREACH, errno.EPERM}
BATCH = 128  # connections taken per wake-up at most, as Tornado does, so others get their turn
FIRST_PAUSE = 0.05  # seconds without accepting after the first failure; doubles up to MAX_PAUSE
MAX_PAUSE = 1.0
REPORT_EVERY = 60.0  # seconds between two log lines about failing accepts

Accepted = Callable[[socket.socket, Any], None]


class Acceptor:
    """Accepts on listening sockets and pauses them all while accept() fails (EMFILE, ENFILE...)."""

    def __init__(self, callback: Accepted, report: Optional[Throttle] = None) -> None:
        self.callback = callback
        self.sockets: Dict[int, socket.socket] = {}
        self.pause = 0.0  # the current pause; 0 while accepting works
        self.resume: Optional[object] = None  # the timeout that resumes watching, while paused
        self.report = report or Throttle(1, REPORT_EVERY)
        self.reported = False  # a failure was logged and its end not yet
        self.failures = 0  # accept() calls that failed for lack of resources, in all

    def watch(self, sock: socket.socket) -> Callable[[], None]:
        """Accept on `sock`; the callable returned stops that (as add_accept_handler's does)."""
        self.loop = IOLoop.current()
        fd = sock.fileno()
        self.sockets[fd] = sock
        if self.resume is None:
            self.loop.add_handler(sock, self._ready, IOLoop.READ)

        def remove() -> None:
            if self.sockets.pop(fd, None) is not None and self.resume is None:
                self.loop.remove_handler(sock)
            if not self.sockets and self.resume is not None:
                self.loop.remove_timeout(self.resume)
                self.resume = None
        return remove

    def _ready(self, sock: socket.socket, events: int) -> None:
        for _ in range(BATCH):
            if sock.fileno() not in self.sockets or self.resume is not None:
                return  # removed, or paused by a failure on another socket
            try:
                connection, address = sock.accept()
            except BlockingIOError:
                return  # the queue is empty
            except OSError as exc:
                if exc.errno in SKIP:
                    continue
                self._failed(exc)
                return
            if self.pause:
                self._recovered()
            self.callback(connection, address)

    def _failed(self, exc: OSError) -> None:
        """Stop watching every socket for a while: the same failure would come back at once."""
        self.failures += 1
        self.pause = min(MAX_PAUSE, self.pause * 2 or FIRST_PAUSE)
        admitted, held = self.report.admit()
        if admitted:
            more = f"; {held} more since the last report" if held else ""
            log.warning("cannot accept connections: %s; new ones wait in the queue, open ones "
                        "are served, accepting again within %g s%s",
                        exc.strerror or exc, MAX_PAUSE, more)
            self.reported = True
        for sock in self.sockets.values():
            self.loop.remove_handler(sock)
        self.resume = self.loop.call_later(self.pause, self._resume)

    def _resume(self) -> None:
        self.resume = None
        for sock in self.sockets.values():
            self.loop.add_handler(sock, self._ready, IOLoop.READ)

    def _recovered(self) -> None:
        self.pause = 0.0
        if self.reported:
            self.reported = False
            log.info("accepting connections again")
