"""The fast lane: the polls of /status and /devices answered at the connection's door.

Every accepted connection is a `Connection` (an IOStream). Tornado's HTTP/1 server reads each
request's head from it with `read_until_regex`; for a head that asks for /status or /devices in
its simplest form, the connection answers at once from the cached body and reads the next head,
and Tornado never sees that request. Everything else (any other path or method, HTTP/1.0, a
query string, a body, an Expect or Upgrade, a header line that is not plain `name: value`) is
handed to Tornado as it came, to be answered by the application: the fast lane only ever
answers what the application would, and with the same body. A route may also decline a
connection (one whose answer depends on who asks, before the caller is known): its request
goes to Tornado too.

Why: those two endpoints are polled hardest, and Tornado's parsing, routing and handler cost
most of a request's time: answered here, /status is served several times faster (the
benchmark's throughput and ceiling rows). A connection that has been answered here for a while
hands its next head to Tornado anyway, so that Tornado's idle timer, which runs while it waits
for a head, never takes a busy connection for an idle one.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Callable
from typing import Any

from tornado.iostream import StreamClosedError

from patroller.identify.connection import Accepted

Body = Callable[[Any], bytes | None]  # the connection -> its body, or None: Tornado answers
HEAD_END = b"\r?\n\r?\n"  # how Tornado's HTTP/1 server reads a request's head
REQUEST_LINE = re.compile(rb"GET (/[a-z]+) HTTP/1\.1\r?\n")
# Plain header lines: a token, a colon, a value of visible characters and blanks.
HEADER_LINES = re.compile(rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e]*\r?\n)*\r?\n")
# Headers that change how a request is read or answered (If-None-Match: Tornado answers 304
# when the ETag matches): such a request goes to Tornado.
NOT_PLAIN = re.compile(
    rb"\n(?:content-length|transfer-encoding|expect|upgrade|te|if-none-match):", re.I
)
CONNECTION = re.compile(rb"\nconnection:[ \t]*([^\r\n]*)", re.I)
# HTTP/1.1 asks for one Host: a name or address, and a port; anything else goes to Tornado,
# which checks it the way it does.
HOST = re.compile(
    rb"\nhost:[ \t]*([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?[ \t]*\r?\n", re.I
)
HOST_LINE = re.compile(rb"\nhost:", re.I)


class FastLane:
    """Answers for the polled endpoints, from their cached bodies.

    A poller sends the same head every time: what was decided of a head is remembered (up to
    `MEMO` heads), and so is the whole answer for as long as the cached body is the same.
    """

    MEMO = 256  # heads remembered: past that, each is read again (pollers are few)

    def __init__(
        self,
        routes: dict[str, Body],
        count: Callable[[str, int], None],
        hand_back_after: float,
        headers: dict[str, Callable[[], bytes]] | None = None,
    ) -> None:
        self.routes = routes
        self.headers = headers or {}  # by path: the header lines its answer adds, as handlers do
        self.count = count  # told (path, status) of each answer, as the access log counts
        self.hand_back_after = hand_back_after  # seconds a connection is served here in a row
        self._heads: dict[bytes, tuple[str, bool] | None] = {}
        # -> (body, extra header lines, response)
        self._answers: dict[tuple[str, bool], tuple[bytes, bytes, bytes]] = {}

    def answer(self, head: bytes, connection: Any = None) -> tuple[bytes, bool] | None:
        """(the whole response, whether to close after it) for a head the lane answers on
        `connection`; None for one that goes to Tornado."""
        if head in self._heads:
            taken = self._heads[head]
        else:
            taken = self._read(head)
            if len(self._heads) < self.MEMO:
                self._heads[head] = taken
        if taken is None:
            return None
        path, close = taken
        body = self.routes[path](connection)
        if body is None:
            return None
        extra = self.headers[path]() if path in self.headers else b""
        known = self._answers.get(taken)
        if known is None or known[0] is not body or known[1] is not extra:  # built again since
            known = self._answers[taken] = (body, extra, _response(body, close, extra))
        self.count(path, 200)
        return known[2], close

    def _read(self, head: bytes) -> tuple[str, bool] | None:
        """(path, whether to close after) for a head the lane takes, else None."""
        line = REQUEST_LINE.match(head)
        if line is None:
            return None
        path = line.group(1).decode("ascii")
        if path not in self.routes or not HEADER_LINES.fullmatch(head, line.end()):
            return None
        if NOT_PLAIN.search(head) or not HOST.search(head) or len(HOST_LINE.findall(head)) != 1:
            return None
        close = False
        connection = CONNECTION.search(head)
        if connection is not None:
            value = connection.group(1).strip().lower()
            if value not in (b"close", b"keep-alive"):
                return None
            close = value == b"close"
        return path, close


def _response(body: bytes, close: bool, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=UTF-8\r\n"
        b"Cache-Control: no-store\r\nServer: patroller\r\n"
        + extra
        + (b"Connection: close\r\n" if close else b"")
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


class Connection(Accepted):
    """An accepted connection, with its facts (identify/connection.py): TCP_NODELAY set once
    for its whole life, and the fast lane at its door (none for a connection that should not
    have it).

    Every answer is written in one piece, so Nagle's algorithm never helps; Tornado would turn
    it on and off around every response (two setsockopt calls each). The fast lane's answers
    go straight to the socket when the stream has nothing left to write (`_send`).
    """

    def __init__(self, sock: socket.socket, lane: FastLane | None = None, **kwargs: Any) -> None:
        super().__init__(sock, **kwargs)
        super().set_nodelay(True)  # a no-op for a unix socket
        self.lane = lane
        self.on_close: Callable[[], None] | None = None  # told once, as it closes

    def close(self, exc_info: Any = False) -> None:
        """Close, then tell `on_close` (every way a connection ends comes through here)."""
        told, self.on_close = self.on_close, None
        super().close(exc_info)
        if told is not None:
            told()

    def set_nodelay(self, value: bool) -> None:
        """TCP_NODELAY stays on: see the class."""

    def _send(self, response: bytes) -> None:
        """Write an answer: straight to the socket when the stream has nothing waiting to be
        written (nearly always: an answer is some kilobytes, the socket's buffer far more),
        through the stream for whatever the socket did not take, or when it did not take any.
        The stream's own write costs a Future and its write handler for every answer."""
        sent = 0
        if not self.writing():
            try:
                sent = self.socket.send(response)
            except OSError:  # would block, or the peer is gone: the stream finds out and says
                sent = 0
        if sent < len(response):
            self.write(memoryview(response)[sent:])

    def read_until_regex(self, regex: bytes, max_bytes: int | None = None) -> Any:
        if self.lane is None or regex != HEAD_END:
            return super().read_until_regex(regex, max_bytes)
        return self._next_head(regex, max_bytes)

    async def _next_head(self, regex: bytes, max_bytes: int | None) -> bytes:
        """The next head that is not answered here."""
        assert self.lane is not None
        began = time.monotonic()
        while True:
            head = await super().read_until_regex(regex, max_bytes)
            if time.monotonic() - began > self.lane.hand_back_after:
                return head  # Tornado answers this one, and its idle timer starts again
            answer = self.lane.answer(head, self)
            if answer is None:
                return head
            response, close = answer
            if close:
                await self.write(response)
                self.close()
                raise StreamClosedError()  # Tornado's reader ends quietly on it
            self._send(response)
            # Let the other connections have their turn: a client quick to ask again would
            # otherwise be read at once and served again and again (with 32 clients the p99
            # was 45 ms instead of 3).
            await asyncio.sleep(0)
