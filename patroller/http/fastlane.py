"""A fast lane in front of the application for the endpoints that are polled hardest.

`GET /status` and `GET /devices` (and `HEAD`, the same without the body) are answered straight
from their cached bodies, without routing or a RequestHandler; every other request goes to the
Tornado application unchanged. The answers are the same either way.
"""
from __future__ import annotations

import logging
from typing import Awaitable, Callable, Dict, Optional, Union

from tornado import httputil
from tornado.web import Application

log = logging.getLogger(__name__)

Body = Callable[[], bytes]
HEADERS = (("Content-Type", "application/json; charset=UTF-8"), ("Cache-Control", "no-store"),
           ("Server", "patroller"))


def _headers(length: int) -> httputil.HTTPHeaders:
    """Fresh response headers (Tornado may add `Connection` to them, so none are shared)."""
    headers = httputil.HTTPHeaders(dict(HEADERS))
    headers["Content-Length"] = str(length)
    return headers


class FastLane(httputil.HTTPServerConnectionDelegate):
    """Routes GET and HEAD requests for `routes` to cached bodies, the rest to `app`."""

    def __init__(self, app: Application, routes: Dict[str, Body],
                 count: Optional[Callable[[str, int], None]] = None) -> None:
        self.app = app
        self.routes = routes
        self.count = count  # told (path, status) of each answer it gives

    def start_request(self, server_conn: object,
                      request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
        return _Lane(self, server_conn, request_conn)

    def on_close(self, server_conn: object) -> None:
        self.app.on_close(server_conn)


class _Lane(httputil.HTTPMessageDelegate):
    def __init__(self, lane: FastLane, server_conn: object,
                 request_conn: httputil.HTTPConnection) -> None:
        self.lane = lane
        self.server_conn = server_conn
        self.connection = request_conn
        self.body: Optional[Body] = None
        self.path = ""
        self.head = False  # a HEAD request: the headers of the GET answer, no body
        self.inner: Optional[httputil.HTTPMessageDelegate] = None

    def headers_received(self, start_line: Union[httputil.RequestStartLine, httputil.ResponseStartLine],
                         headers: httputil.HTTPHeaders) -> Optional[Awaitable[None]]:
        assert isinstance(start_line, httputil.RequestStartLine)
        path = start_line.path.split("?", 1)[0]
        if start_line.method in ("GET", "HEAD") and path in self.lane.routes:
            self.body = self.lane.routes[path]
            self.path = path
            self.head = start_line.method == "HEAD"
            return None
        self.inner = self.lane.app.start_request(self.server_conn, self.connection)
        return self.inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Optional[Awaitable[None]]:
        if self.inner is not None:
            return self.inner.data_received(chunk)
        return None  # a body on a GET is ignored

    def finish(self) -> None:
        if self.inner is not None:
            self.inner.finish()
            return
        assert self.body is not None
        try:
            body, code, reason = self.body(), 200, "OK"
        except Exception:  # answer in JSON like every other error, and keep serving
            log.exception("building a response failed")
            body = b'{"error":"internal error: the daemon\'s log has the details"}'
            code, reason = 500, "Internal Server Error"
        self.connection.write_headers(httputil.ResponseStartLine("HTTP/1.1", code, reason),
                                      _headers(len(body)), None if self.head else body)
        self.connection.finish()
        if self.lane.count is not None:
            self.lane.count(self.path, code)

    def on_connection_close(self) -> None:
        if self.inner is not None:
            self.inner.on_connection_close()
