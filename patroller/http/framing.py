"""Requests that cannot be taken as they are framed: refused in JSON where the daemon can.

Every request passes `Guard` first: the delegate Tornado hands a request's start line and
headers to before it reads any body (and before its own body reader checks Content-Length and
Transfer-Encoding). There the daemon refuses, in JSON with `Connection: close`:

- a malformed Content-Length, or repeated ones that differ (400); one over `max_body` (413);
- both Content-Length and Transfer-Encoding, or a Transfer-Encoding other than chunked (400);
- a request the application cannot take its headers from (a missing or malformed Host; 400);
- a chunked body that grows past `max_body` (413), and a body that has not arrived within
  `body_timeout` (408), both while it is read (Tornado's own limits are set so that they never
  come first).

What Tornado parses before any delegate sees it gets Tornado's own answer: a malformed request
line or header line, or an HTTP version other than 1.x, a bare `400 Bad Request`; so does a
malformed chunk of a chunked body. A header block over `max_header_size` (64 KiB), or a chunk-size
line over 64 bytes, ends the connection without an answer. Tornado logs these at INFO on
`tornado.general`: `TornadoReports` puts those lines through the daemon's throttle, cut.

After a JSON answer the connection is half-closed and what the client still sends is read and
dropped for a moment (a "lingering close"): closing a socket with unread data makes the kernel
send a reset, which can destroy the answer before the client reads it.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import re
import socket
from collections.abc import Awaitable

from tornado import gen, httputil
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream, StreamClosedError

from patroller.config import Config
from patroller.core.throttle import Throttle
from patroller.durations import describe
from patroller.http.encoding import dumps
from patroller.identify.connection import stream_of

log = logging.getLogger("patroller.access")

MESSAGE_CHARS = 200  # a message may quote what the client sent: cut it
DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() takes "²", which int() refuses
REPEATED = re.compile(r",[ \t]*")  # how Tornado splits repeated Content-Lengths (the stricter way)
READ = 65536  # bytes asked for per read while draining

StartLine = httputil.RequestStartLine | httputil.ResponseStartLine


class FramingError(Exception):
    """A request that cannot be taken as framed; answered with `status`, then the connection
    closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def shown(text: str) -> str:
    """Text that may come from the client, cut and printable."""
    cut = "".join(c if c.isprintable() else "?" for c in text[:MESSAGE_CHARS])
    return cut + ("..." if len(text) > MESSAGE_CHARS else "")


def framing_error(headers: httputil.HTTPHeaders, max_body: int) -> FramingError | None:
    """What is wrong with a request's body framing, or None (pure).

    As strict as Tornado's body reader (6.5 and 6.6) or stricter, so that its own bare 400
    never comes for these.
    """
    length = headers.get("Content-Length")
    if "Transfer-Encoding" in headers:
        if length is not None:
            return FramingError(
                400, "a request may not have both Transfer-Encoding and Content-Length"
            )
        coding = headers["Transfer-Encoding"]
        if coding.lower() != "chunked":
            return FramingError(
                400,
                f"Transfer-Encoding {shown(coding)!r} is not taken: "
                "send chunked, or a Content-Length",
            )
        return None
    if length is None:
        return None
    pieces = REPEATED.split(length)
    if not all(DIGITS.fullmatch(p) for p in pieces):
        return FramingError(
            400, f"malformed request: Content-Length {shown(length)!r} is not a whole number"
        )
    if any(p != pieces[0] for p in pieces):
        return FramingError(400, f"malformed request: unequal Content-Lengths {shown(length)!r}")
    size = pieces[0].lstrip("0") or "0"
    if len(size) >= 15:  # int() takes 4,300 digits at most
        return FramingError(
            413, f"the request body is over 10^14 bytes; at most {max_body} are taken"
        )
    if int(size) > max_body:
        return FramingError(413, f"the request body is {size} bytes; at most {max_body} are taken")
    return None


def answer(status: int, message: str, head: bool = False) -> bytes:
    """A complete JSON error response that closes the connection (without its body for HEAD)."""
    body = dumps({"error": message})
    return (
        f"HTTP/1.1 {status} {http.client.responses.get(status, 'Error')}\r\n"
        "Content-Type: application/json; charset=UTF-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nServer: patroller\r\n"
        "\r\n"
    ).encode() + (b"" if head else body)


class Framing(httputil.HTTPServerConnectionDelegate):
    """The server's delegate: each request passes a Guard on its way to `inner`."""

    def __init__(
        self, inner: httputil.HTTPServerConnectionDelegate, config: Config, reports: Throttle
    ) -> None:
        self.inner = inner
        self.max_body = config.max_body
        self.body_timeout = config.body_timeout
        self.linger = config.linger
        self.linger_bytes = config.linger_bytes
        self.reports = reports  # how often refusals are logged: one Throttle per server

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        return Guard(self, request_conn, self.inner.start_request(server_conn, request_conn))

    def on_close(self, server_conn: object) -> None:
        self.inner.on_close(server_conn)

    def report(self, error: FramingError, stream: IOStream | None) -> None:
        admitted, held = self.reports.admit()
        if admitted:
            more = f" ({held} more not logged)" if held else ""
            log.info("%d %s from %s%s", error.status, shown(error.message), _peer(stream), more)


class Guard(httputil.HTTPMessageDelegate):
    """One request on its way to the inner delegate, refused in JSON if its framing is wrong."""

    def __init__(
        self, framing: Framing, conn: httputil.HTTPConnection, inner: httputil.HTTPMessageDelegate
    ) -> None:
        self.framing = framing
        self.conn = conn
        self.inner = inner
        self.head = False
        self.received = 0  # body bytes handed on so far
        self.timer: object | None = None  # the body timeout, while a body is read
        self.refused: Refused | None = None  # answered while its body is read: dropped

    def headers_received(
        self, start_line: StartLine, headers: httputil.HTTPHeaders
    ) -> Awaitable[None] | None:
        assert isinstance(start_line, httputil.RequestStartLine)
        self.head = start_line.method == "HEAD"
        if "Content-Length" in headers or "Transfer-Encoding" in headers:
            error = framing_error(headers, self.framing.max_body)
            if error is not None:
                return self._refuse_now(error)
            length = headers.get("Content-Length")  # None: chunked
            if length is None or length.lstrip("0"):  # a body is coming: it has a deadline
                self.timer = IOLoop.current().call_later(self.framing.body_timeout, self._late)
        try:
            return self.inner.headers_received(start_line, headers)
        except httputil.HTTPInputError as exc:  # the application cannot take these headers
            self._stop_timer()
            return self._refuse_now(FramingError(400, f"malformed request: {shown(str(exc))}"))

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        if self.refused is not None:
            self.refused.dropped(len(chunk))
            return None
        self.received += len(chunk)
        if self.received > self.framing.max_body:  # chunked: Content-Length was checked
            self._refuse_reading(
                FramingError(413, f"the request body is longer than {self.framing.max_body} bytes")
            )
            return None
        return self.inner.data_received(chunk)

    def finish(self) -> None:
        self._stop_timer()
        if self.refused is not None:
            self.refused.end()  # nothing more is coming
            return
        self.inner.finish()

    def on_connection_close(self) -> None:
        self._stop_timer()
        if self.refused is not None:
            self.refused.close()
            return
        self.inner.on_connection_close()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            IOLoop.current().remove_timeout(self.timer)
            self.timer = None

    def _late(self) -> None:
        self.timer = None
        self._refuse_reading(
            FramingError(
                408,
                f"the request body did not arrive within {describe(self.framing.body_timeout)}",
            )
        )

    def _refuse_now(self, error: FramingError) -> Awaitable[None]:
        """Before the body: take the stream from Tornado (nothing more of it is read as HTTP),
        answer, drain for a moment, close; Tornado awaits all of it."""
        # HTTP1Connection has detach; the HTTPConnection interface it is typed as does not
        stream = self.conn.detach()  # type: ignore[attr-defined]
        self.framing.report(error, stream)
        return _answer_and_linger(
            stream,
            answer(error.status, error.message, self.head),
            self.framing.linger,
            self.framing.linger_bytes,
        )

    def _refuse_reading(self, error: FramingError) -> None:
        """While Tornado reads the body: answer, and let its reading drain the rest (dropped)
        until the body ends, the linger runs out, or enough was dropped; then close."""
        self._stop_timer()
        stream = stream_of(self.conn)
        self.framing.report(error, stream)
        self.inner.on_connection_close()  # the application hears no more of this request
        if stream is None or stream.closed():
            return
        self.refused = Refused(
            stream,
            answer(error.status, error.message, self.head),
            self.framing.linger,
            self.framing.linger_bytes,
        )


class Refused:
    """A connection answered while its body is read: closed once the body is in, or after a
    lingering moment, or once enough of it was dropped, whichever comes first."""

    def __init__(self, stream: IOStream, data: bytes, linger: float, budget: int) -> None:
        self.stream = stream
        self.budget = budget
        self.ended = False  # the whole body is in
        self.loop = IOLoop.current()
        self.closer: object | None = self.loop.call_later(linger, self.close)
        self.sent = stream.write(data)
        self.sent.add_done_callback(self._half_close)

    def _half_close(self, sent: asyncio.Future[None]) -> None:
        """The answer is out: the client reads it and sees the end."""
        try:
            if sent.exception() is None and self.stream.socket is not None:
                self.stream.socket.shutdown(socket.SHUT_WR)
        except OSError:
            self.ended = True
        if self.ended:
            self.close()

    def end(self) -> None:
        """The body is all in: close as soon as the answer is out."""
        self.ended = True
        if self.sent.done():
            self.close()

    def dropped(self, size: int) -> None:
        self.budget -= size
        if self.budget <= 0:
            self.close()

    def close(self) -> None:
        if self.closer is not None:
            self.loop.remove_timeout(self.closer)
            self.closer = None
        self.stream.close()


async def _answer(stream: IOStream, data: bytes) -> None:
    """Write the answer, then half-close: the client reads it and sees the end."""
    try:
        await stream.write(data)
        if stream.socket is not None:
            stream.socket.shutdown(socket.SHUT_WR)
    except (StreamClosedError, OSError):
        stream.close()


async def _answer_and_linger(stream: IOStream, data: bytes, linger: float, budget: int) -> None:
    """Answer, half-close, read and drop what the client still sends for a moment, close."""
    deadline = stream.io_loop.time() + linger
    try:
        await _answer(stream, data)
        while budget > 0 and not stream.closed():
            read = stream.read_bytes(READ, partial=True)
            budget -= len(
                await gen.with_timeout(deadline, read, quiet_exceptions=StreamClosedError)
            )
    except (asyncio.TimeoutError, StreamClosedError, OSError):
        pass
    finally:
        stream.close()


def _peer(stream: IOStream | None) -> str:
    """Who sent a refused request, for the log."""
    sock = getattr(stream, "socket", None)
    try:
        address = sock.getpeername() if sock is not None else None
    except OSError:
        return "?"
    if isinstance(address, tuple):
        return str(address[0])
    return "the unix socket"


class TornadoReports(logging.Filter):
    """Tornado's own lines about requests it refuses, through the daemon's throttle, cut.

    Installed on `tornado.general`, where Tornado logs at INFO one line per malformed request
    (which may quote up to 64 KiB of it) and per header block over the limit; its warnings and
    errors pass untouched.
    """

    def __init__(self, reports: Throttle) -> None:
        super().__init__()
        self.reports = reports

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        admitted, held = self.reports.admit()
        if admitted:
            more = f" ({held} more not logged)" if held else ""
            record.msg, record.args = shown(record.getMessage()) + more, ()
        return admitted
