"""HTTP framing errors answered in JSON, like every other error of the API.

This replaces three behaviours of Tornado's HTTP/1 server (6.5 and 6.6) (tornado.http1connection and
tornado.iostream), all pinned by tests/test_http_hardening.py:

- A malformed request (request line, header line, Content-Length, chunked framing) is answered
  with a bare `HTTP/1.1 400 Bad Request` and no body (`HTTP1Connection._read_message`). Here it
  is a JSON 400, or 413 for a body over the limit, with `Connection: close`.
- A header block over `max_header_size` (64 KiB), a URL of 64 KiB included, is not answered at
  all: the stream closes itself on the unsatisfiable read (`IOStream._find_read_pos`). Here
  `HeadStream` hands the oversized block over instead and it is answered 414 (the request line
  alone is too long) or 431.
- A body that trickles in past `body_timeout` is closed without an answer. Here it is a JSON
  408, then the connection is closed.

After an answer the connection is half-closed and what the client still sends is read and
dropped for a moment (a "lingering close"): closing a socket with unread data makes the kernel
send a reset, which can destroy the answer before the client reads it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from typing import Awaitable, Optional, Tuple

from tornado import gen, httputil
from tornado.http1connection import (HTTP1Connection, HTTP1ConnectionParameters,
                                     HTTP1ServerConnection, _QuietException)
from tornado.iostream import IOStream, StreamClosedError, UnsatisfiableReadError

from patroller.core.throttle import Throttle

log = logging.getLogger("patroller.access")

HEADER_END = b"\r?\n\r?\n"  # the regex Tornado reads a header block with (CR, LF)
LINGER = 1.0  # seconds an answered connection is drained before it is closed
LINGER_BYTES = 1 << 20  # bytes drained at most
MESSAGE_CHARS = 200  # Tornado's messages may quote what the client sent: cut them
DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() takes "²", which int() refuses


class FramingError(Exception):
    """A request that cannot be read as HTTP; answered with `status`, then the connection closes.

    Not an HTTPInputError on purpose: Tornado's handler for those writes its bare 400.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def answer(status: int, message: str) -> bytes:
    """A complete JSON error response that closes the connection."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    return (f"HTTP/1.1 {status} {httputil.responses.get(status, 'Error')}\r\n"
            "Content-Type: application/json; charset=UTF-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\nServer: patroller\r\n"
            "\r\n").encode() + body


def _said(exc: Exception) -> str:
    """Tornado's message for a malformed request, cut and printable."""
    text = str(exc)
    text = "".join(c if c.isprintable() else "?" for c in text[:MESSAGE_CHARS])
    return text + ("..." if len(str(exc)) > MESSAGE_CHARS else "")


class HeadStream(IOStream):
    """An IOStream that hands an over-long header block to the reader instead of closing."""

    oversized = False  # the last header read stopped at the limit, not at the blank line

    def _find_read_pos(self) -> Optional[int]:
        try:
            return super()._find_read_pos()
        except UnsatisfiableReadError:
            regex = self._read_regex
            if regex is None or regex.pattern != HEADER_END:
                raise
            self.oversized = True
            return self._read_buffer_size


class FramedConnection(HTTP1Connection):
    """One request of a connection, whose framing errors are answered in JSON."""

    def __init__(self, stream: IOStream, params: HTTP1ConnectionParameters,
                 context: Optional[object], reports: Throttle) -> None:
        super().__init__(stream, False, params, context)
        self.reports = reports
        # The body timeout is enforced below, with an answer, instead of by Tornado's silent close.
        self.body_timeout, self._body_timeout = self._body_timeout, None

    async def _read_message(self, delegate: httputil.HTTPMessageDelegate) -> bool:
        try:
            return await super()._read_message(delegate)
        except FramingError as error:
            await self._refuse(error)
            return False

    def _parse_headers(self, data: bytes) -> Tuple[str, httputil.HTTPHeaders]:
        if getattr(self.stream, "oversized", False):
            self.stream.oversized = False  # type: ignore[attr-defined]
            limit = self.params.max_header_size
            if b"\n" not in data.lstrip(b"\r\n")[:limit]:
                raise FramingError(414, f"the request line is longer than {limit} bytes")
            raise FramingError(431, f"the request's header block is longer than {limit} bytes")
        try:
            start_line, headers = super()._parse_headers(data)
            httputil.parse_request_start_line(start_line)  # Tornado parses it again, after us
        except httputil.HTTPInputError as exc:
            raise FramingError(400, f"malformed request: {_said(exc)}") from None
        return start_line, headers

    def _read_body(self, code: int, headers: httputil.HTTPHeaders,
                   delegate: httputil.HTTPMessageDelegate) -> Optional[Awaitable[None]]:
        length = headers.get("Content-Length", "").split(",")[0].strip()
        if DIGITS.fullmatch(length) and int(length[:15]) > self._max_body_size:
            size = length if len(length) < 15 else "over 10^14"  # int() takes 4,300 digits at most
            raise FramingError(413, f"the request body is {size} bytes; "
                                    f"at most {self._max_body_size} are taken")
        try:
            body = super()._read_body(code, headers, delegate)
        except httputil.HTTPInputError as exc:
            raise FramingError(400, f"malformed request: {_said(exc)}") from None
        return None if body is None else self._read_framed(body)

    async def _read_framed(self, body: Awaitable[None]) -> None:
        try:
            if self.body_timeout is None:
                await body
            else:
                await gen.with_timeout(self.stream.io_loop.time() + self.body_timeout, body,
                                       quiet_exceptions=StreamClosedError)
        except httputil.HTTPInputError as exc:
            if "too large" in str(exc):  # Tornado's "chunked body too large"
                raise FramingError(413, f"the request body is longer than {self._max_body_size} "
                                        "bytes") from None
            raise FramingError(400, f"malformed request: {_said(exc)}") from None
        except gen.TimeoutError:
            raise FramingError(408, f"the request body did not arrive within "
                                    f"{self.body_timeout:g} s") from None

    async def _refuse(self, error: FramingError) -> None:
        """Answer, half-close, drain what the client still sends for a moment, close."""
        stream = self.stream
        admitted, held = self.reports.admit()
        if admitted:
            more = f" ({held} more not logged)" if held else ""
            log.info("%d %s from %s%s", error.status, error.message[:MESSAGE_CHARS],
                     getattr(self.context, "remote_ip", "?"), more)
        try:
            if stream is None or stream.closed():
                return
            await stream.write(answer(error.status, error.message))
            if error.status == 408:
                return  # the body read is still pending: nothing else may read the stream
            if stream.socket is not None:
                stream.socket.shutdown(socket.SHUT_WR)
            await self._linger(stream)
        except (StreamClosedError, OSError):
            pass
        finally:
            self.close()

    @staticmethod
    async def _linger(stream: IOStream) -> None:
        deadline = stream.io_loop.time() + LINGER
        drained = 0
        try:
            while drained < LINGER_BYTES:
                read = stream.read_bytes(65536, partial=True)
                drained += len(await gen.with_timeout(deadline, read,
                                                      quiet_exceptions=StreamClosedError))
        except gen.TimeoutError:
            pass


class FramedServerConnection(HTTP1ServerConnection):
    """An HTTP/1 server connection whose requests are FramedConnections."""

    def __init__(self, stream: IOStream, params: HTTP1ConnectionParameters,
                 context: Optional[object], reports: Throttle) -> None:
        super().__init__(stream, params, context)
        self.reports = reports  # how often framing errors are logged: one Throttle per server

    async def _server_request_loop(self, delegate: httputil.HTTPServerConnectionDelegate) -> None:
        # Tornado's loop, with FramedConnection for HTTP1Connection (a test pins its source). 6.5
        # lets _QuietException (a delegate's error, already logged) reach this loop; 6.6 does not.
        try:
            while True:
                conn = FramedConnection(self.stream, self.params, self.context, self.reports)
                request_delegate = delegate.start_request(self, conn)
                try:
                    ret = await conn.read_response(request_delegate)
                except (StreamClosedError, UnsatisfiableReadError, asyncio.CancelledError):
                    return
                except _QuietException:
                    conn.close()
                    return
                except Exception:
                    logging.getLogger("tornado.general").error("Uncaught exception", exc_info=True)
                    conn.close()
                    return
                if not ret:
                    return
                await asyncio.sleep(0)
        finally:
            delegate.on_close(self)
