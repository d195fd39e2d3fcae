"""One fleet host's connection, kept open from one asking to the next (--fleet).

Tornado's AsyncHTTPClient opens a connection for every request and closes it after (it asks
with `Connection: close`): at 1,000 hosts, two connections a host every round. A `Link` keeps
one connection a host and sends each request on it (HTTP/1.1 keep-alive), with Tornado's own
HTTP/1 reader (`HTTP1Connection`, client side) reading each answer, bounded to --fleet-max-bytes
of body. A connection the host closed while it was idle (its own idle timeout) is opened again
once, at the next request; an answer that ends the connection (HTTP/1.0, `Connection: close`, a
body that ends when the connection does) is read, and the connection opened again next time.

Two timeouts, as the flags say: --fleet-connect-timeout for the connection (a host switched
off answers no SYN, and would hold an asking for the whole answer timeout), and --fleet-timeout
for the answers of one asking, from the first request to the last byte. The answer's deadline
is one timer of the loop that closes the connection when it passes (Tornado's reader then stops
where it is, and the request is Silent); a connection being made is bounded by both. It costs a
request no task of its own: at 1,000 hosts every 5 s, `asyncio.wait_for`'s task and futures
were over a quarter of the event loop's time for a request (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.parse
from typing import NamedTuple

from tornado import httputil
from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters
from tornado.iostream import IOStream, StreamClosedError
from tornado.tcpclient import TCPClient

from patroller import durations

HEAD_MAX_BYTES = 64 * 1024  # an answer's head, at most


class Silent(Exception):
    """The host did not connect, or did not answer, in time; the message says which."""


class Cut(Exception):
    """The connection ended before the answer did; `head` is the answer's head as far as it
    came (its lines, the blank one last when it ended), to say why (fleet.cut)."""

    def __init__(self, head: list[str]) -> None:
        super().__init__("the connection closed before the answer ended")
        self.head = head


class Reply(NamedTuple):
    code: int
    headers: httputil.HTTPHeaders
    body: bytes


class _Reading(httputil.HTTPMessageDelegate):
    """One answer, as Tornado's reader hands it over."""

    def __init__(self) -> None:
        self.start: httputil.ResponseStartLine | None = None
        self.headers = httputil.HTTPHeaders()
        self.chunks: list[bytes] = []
        self.done = False

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> None:
        assert isinstance(start_line, httputil.ResponseStartLine)
        self.start, self.headers = start_line, headers

    def data_received(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    def finish(self) -> None:
        self.done = True

    def head(self) -> list[str]:
        if self.start is None:
            return []
        return (
            [f"{self.start.version} {self.start.code} {self.start.reason}\r\n"]
            + [f"{name}: {value}\r\n" for name, value in self.headers.get_all()]
            + ["\r\n"]
        )

    def keeps_open(self) -> bool:
        """Whether the connection may carry the next request."""
        assert self.start is not None
        return (
            self.start.version == "HTTP/1.1"
            and self.headers.get("Connection", "").lower() != "close"
            and (
                "Content-Length" in self.headers
                or "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            )
        )


class Link:
    """Requests to one host's API on one connection, kept open between them."""

    def __init__(
        self,
        url: str,
        tcp: TCPClient,
        connect_timeout: float,
        timeout: float,
        max_bytes: int,
        user_agent: str,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        assert parts.hostname is not None and parts.port is not None  # hosts.base_url's
        self.host, self.port = parts.hostname, parts.port
        self.tls = parts.scheme == "https"
        self.netloc = parts.netloc
        self.tcp = tcp
        self.connect_timeout = connect_timeout
        self.timeout = timeout  # what the caller's deadlines allow, for the message
        self.max_bytes = max_bytes
        self.user_agent = user_agent
        self.stream: IOStream | None = None
        self.opened = 0  # connections opened so far
        self.expired = False  # the deadline of the request under way passed
        # The request's head but for the caller's own fields: built once, not per request.
        self.head = httputil.HTTPHeaders(
            {"Host": self.netloc, "Accept": "application/json", "User-Agent": self.user_agent}
        )

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    async def get(
        self, path: str, deadline: float, headers: dict[str, str] | None = None
    ) -> Reply:
        """GET `path`, answered before `deadline` (the loop's time); Silent if not."""
        loop = asyncio.get_running_loop()
        kept = self.stream is not None and not self.stream.closed()
        self.expired = False
        timer = loop.call_at(deadline, self._expire)
        try:
            try:
                return await self._get(path, headers, deadline)
            except StreamClosedError:
                if not kept or self.expired:
                    raise
            # A kept connection that the host closed while it was idle: once more, on a new one.
            return await self._get(path, headers, deadline)
        except Exception:
            self.close()
            if self.expired:  # whatever the closing made the reader raise
                raise Silent(f"no answer within {durations.describe(self.timeout)}") from None
            raise
        except BaseException:  # cancelled (the fleet stops): never taken for a timeout
            self.close()
            raise
        finally:
            timer.cancel()

    def _expire(self) -> None:
        """The deadline passed: the connection is closed under the request (the reader raises)."""
        self.expired = True
        self.close()

    async def _connect(self, deadline: float) -> IOStream:
        if self.stream is not None and not self.stream.closed():
            return self.stream
        self.stream = None
        left = deadline - asyncio.get_running_loop().time()
        try:
            tls = ssl.create_default_context() if self.tls else None
            # The stream's buffer is bounded too: older Tornado (6.5 among them) reads a body
            # without a length whole into it, up to 100 MB by default, before the body's own
            # bound is checked (.ci/tornado-range's oldest caught it).
            self.stream = await self.tcp.connect(
                self.host,
                self.port,
                ssl_options=tls,
                timeout=min(self.connect_timeout, max(0.0, left)),
                max_buffer_size=self.max_bytes + HEAD_MAX_BYTES + 1,
            )
        except asyncio.TimeoutError:
            if left < self.connect_timeout:  # the answer's deadline came first
                raise Silent(f"no answer within {durations.describe(self.timeout)}") from None
            raise Silent(
                f"no connection within {durations.describe(self.connect_timeout)}"
            ) from None
        except StreamClosedError as exc:  # how Tornado says that connecting failed, and why
            if isinstance(exc.real_error, OSError):
                raise exc.real_error from None
            raise
        self.opened += 1
        return self.stream

    async def _get(self, path: str, headers: dict[str, str] | None, deadline: float) -> Reply:
        stream = await self._connect(deadline)
        if self.expired:  # connected as the deadline passed: its timer closed nothing, then
            raise StreamClosedError()
        connection = HTTP1Connection(
            stream,
            True,
            HTTP1ConnectionParameters(
                max_header_size=HEAD_MAX_BYTES, max_body_size=self.max_bytes, decompress=False
            ),
        )
        request = self.head
        if headers:
            request = self.head.copy()
            request.update(headers)
        reading = _Reading()
        connection.write_headers(httputil.RequestStartLine("GET", path, "HTTP/1.1"), request)
        connection.finish()
        try:
            await connection.read_response(reading)
        except StreamClosedError:
            if reading.start is None:
                raise  # no answer at all: on a kept connection, the caller asks again
        if not reading.done:  # the host closed, or the answer broke a bound (the reader closed)
            self.close()
            if reading.start is None:
                raise StreamClosedError()
            raise Cut(reading.head())
        if sum(len(chunk) for chunk in reading.chunks) > self.max_bytes:
            self.close()  # a body read to the close, past its bound (the buffer's, above)
            raise Cut(reading.head())
        if not reading.keeps_open():
            self.close()
        assert reading.start is not None
        return Reply(reading.start.code, reading.headers, b"".join(reading.chunks))
