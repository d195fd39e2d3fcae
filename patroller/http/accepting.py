"""Accepting connections in a way that survives running out of file descriptors.

The daemon's listening sockets are watched here instead of by Tornado's `add_accept_handler`,
whose handler, when `accept()` fails with EMFILE, raises to the IOLoop, which logs the traceback
and, the listening socket staying readable, calls it again at once: 100% CPU and about 358 MB
of log a minute, for as long as the limit is reached. Here such a failure stops watching every
listening socket for a pause that grows from `accept_first_pause` to `accept_max_pause` (new
connections wait in the kernel's backlog), then watches them again; the connections already
open are served all along. The condition is logged once per `accept_report_every` at most,
with a count, and once more when accepting works again.

Each accepted connection becomes a `Connection` (fastlane.py), handed to the server's
`handle_stream` (the override point Tornado documents for a TCPServer).
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any, Protocol

from tornado.ioloop import IOLoop
from tornado.iostream import IOStream

from patroller.config import Config
from patroller.core.throttle import Throttle
from patroller.durations import describe
from patroller.http.access import Requests
from patroller.http.fastlane import Connection, FastLane

log = logging.getLogger(__name__)

# accept() hands these over for one connection that failed in the queue: skip it, take the next
# (Linux passes a new connection's pending network error to accept(); see accept(2)).
SKIP = {
    errno.ECONNABORTED,
    errno.EPROTO,
    errno.ENOPROTOOPT,
    errno.EHOSTDOWN,
    errno.ENONET,
    errno.EHOSTUNREACH,
    errno.EOPNOTSUPP,
    errno.ENETDOWN,
    errno.ENETUNREACH,
    errno.EPERM,
}


class Server(Protocol):
    """What the Acceptor hands connections to: a Tornado TCPServer's public face."""

    max_buffer_size: int | None
    read_chunk_size: int | None

    def handle_stream(self, stream: IOStream, address: Any) -> None:
        """Serve one accepted connection."""


class Acceptor:
    """Accepts on listening sockets and pauses them all while accept() fails (EMFILE,
    ENFILE...)."""

    def __init__(
        self, server: Server, config: Config, requests: Requests, lane: FastLane | None = None
    ) -> None:
        self.server = server
        self.lane = lane  # at every connection's door
        self.batch = config.accept_batch
        self.first_pause = config.accept_first_pause
        self.max_pause = config.accept_max_pause
        self.sockets: dict[int, socket.socket] = {}
        self.loop: IOLoop | None = None
        self.pause = 0.0  # the current pause; 0 while accepting works
        self.resume: object | None = None  # the timeout that resumes watching, while paused
        self.report = Throttle(1, config.accept_report_every)
        self.reported = False  # a failure was logged and its end not yet
        self.requests = requests  # where the failures are counted, for /metrics

    def watch(self, sock: socket.socket) -> None:
        """Accept on a listening socket, from now until `stop`."""
        self.loop = IOLoop.current()
        self.sockets[sock.fileno()] = sock
        if self.resume is None:
            self.loop.add_handler(sock, self._ready, IOLoop.READ)

    def stop(self) -> None:
        """Stop accepting and close the listening sockets (open connections stay open)."""
        sockets, self.sockets = list(self.sockets.values()), {}
        if self.loop is not None:
            if self.resume is not None:
                self.loop.remove_timeout(self.resume)
            else:
                for sock in sockets:
                    self.loop.remove_handler(sock)
        self.resume = None
        for sock in sockets:
            sock.close()

    def _ready(self, sock: socket.socket, events: int) -> None:
        for _ in range(self.batch):
            if sock.fileno() not in self.sockets or self.resume is not None:
                return  # stopped, or paused by a failure on another socket
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
            self._serve(connection, address)

    def _serve(self, connection: socket.socket, address: Any) -> None:
        try:
            stream = Connection(
                connection,
                self.lane,
                max_buffer_size=self.server.max_buffer_size,
                read_chunk_size=self.server.read_chunk_size,
            )
            self.server.handle_stream(stream, address)
        except Exception:  # as Tornado's TCPServer does: one connection's failure is not fatal
            log.exception("error in connection callback")
            connection.close()

    def _failed(self, exc: OSError) -> None:
        """Stop watching every socket for a while: the same failure would come back at once."""
        assert self.loop is not None
        self.requests.accept_failures += 1
        self.pause = min(self.max_pause, self.pause * 2 or self.first_pause)
        admitted, held = self.report.admit()
        if admitted:
            more = f"; {held} more since the last report" if held else ""
            log.warning(
                "cannot accept connections: %s; new ones wait in the queue, open ones "
                "are served, accepting again within %s%s",
                exc.strerror or exc,
                describe(self.max_pause),
                more,
            )
            self.reported = True
        for sock in self.sockets.values():
            self.loop.remove_handler(sock)
        self.resume = self.loop.call_later(self.pause, self._resume)

    def _resume(self) -> None:
        assert self.loop is not None
        self.resume = None
        for sock in self.sockets.values():
            self.loop.add_handler(sock, self._ready, IOLoop.READ)

    def _recovered(self) -> None:
        self.pause = 0.0
        if self.reported:
            self.reported = False
            log.info("accepting connections again")
