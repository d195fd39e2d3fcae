"""What every JSON handler is: it parses its query, makes one call on the services, and writes
what it answers; every error, domain or HTTP, is answered in JSON by one `write_error`, with
the one status each domain error has. Each family of endpoints subclasses `Handler` (or `View`,
read-only) in a module of its own: the lease commands in reserving.py, the lease rules' and the
audit record's read views in listings.py, the web page's in page.py, and so on; the routes are
in routes.py."""

from __future__ import annotations

import asyncio
import http.client
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import tornado.web

from patroller.core.errors import (
    BadRequest,
    Busy,
    NoCallerProcess,
    NotHeld,
    NotYours,
    OverLimit,
    PatrollerError,
    TooManyReports,
    TooManyWaiting,
    Unavailable,
    Unidentified,
    Unsatisfiable,
)
from patroller.core.identity import Identity, Viewer
from patroller.http import hiding, query
from patroller.http.access import SHOWN_METHOD_CHARS, shown
from patroller.http.api import Api
from patroller.http.encoding import dumps
from patroller.http.hiding import viewer_of
from patroller.http.inflight import answered_on_stop
from patroller.identify.connection import facts_of, stream_of
from patroller.identify.peers import left

log = logging.getLogger(__name__)

SHOWN_MESSAGE_CHARS = 300  # of an error message from Tornado
CLIENT_LEFT = 499  # counted, never sent: the client left before its answer; nothing was done

# Every domain error has one HTTP status, here and nowhere else.
STATUS = {
    BadRequest: 400,
    Unidentified: 403,
    NotYours: 403,
    OverLimit: 403,
    Busy: 409,
    NotHeld: 409,
    Unsatisfiable: 422,
    NoCallerProcess: 422,
    TooManyWaiting: 429,
    TooManyReports: 429,
    Unavailable: 503,
}


class Handler(tornado.web.RequestHandler):
    """JSON in every answer, errors included. Its one dependency, the Api (the services and
    the HTTP layer's views), arrives through initialize()."""

    identity: Identity | None = None  # the caller, once identified

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in map(str.lower, cls.SUPPORTED_METHODS):  # each answers a stop cutting it short
            method = cls.__dict__.get(name)
            if asyncio.iscoroutinefunction(method):
                setattr(cls, name, answered_on_stop(method))

    def initialize(self, api: Api) -> None:
        self.api = api
        self.inflight = api.inflight
        self.services = api.services
        self.leases = api.services.leases

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Server", "patroller")  # not Tornado's name and version

    def prepare(self) -> None:
        self.inflight.add()  # a stop waits for the answer
        query.check_length(self.request.query)

    def args(self) -> dict[str, list[bytes]]:
        """Query arguments, plus form arguments of a POST."""
        merged = {name: list(values) for name, values in self.request.query_arguments.items()}
        for name, values in self.request.body_arguments.items():
            merged.setdefault(name, []).extend(values)
        return merged

    async def caller(self, claimed: str | None) -> Identity:
        """Who is asking (remembered: a refusal shows them what they may see of names)."""
        self.identity = await self.services.callers.identify(self.request, claimed)
        return self.identity

    async def viewer(self, claimed: str | None) -> Viewer:
        """Who is asking, for the names they may see (--hide-users): a caller who cannot be
        identified sees no name. The caller of a plain request (no user=) is remembered for
        its connection, where the fast lane answers it next."""
        try:
            identity: Identity | None = await self.caller(claimed)
        except Unidentified:
            identity = None
        viewer = hiding.NOBODY if hiding.fleet_poll(self.request.headers) else viewer_of(identity)
        if claimed is None and self.api.hiding is not None:
            self.api.hiding.remember(facts_of(self.request.connection), viewer)
        return viewer

    def client_gone(self) -> bool:
        """Whether the client has left: then it can read no answer, and nothing is done for it.
        The kernel is asked (peers.left), not only the stream: Tornado calls
        on_connection_close only for a close seen once the handler runs, and a unix caller,
        identified as it connected, is handled before the loop reads a close sent with the
        request. A client that half-closes (sends its request, then shuts its side, as `nc -N`
        does) is taken as gone: Tornado ends the connection at the end of its input."""
        return left(stream_of(self.request.connection))

    def unanswerable(self) -> bool:
        """Before a change made for the client: true if it can no longer be told; its
        connection is then closed with no answer (none would say what was done), which the
        access log and /metrics count as status 499."""
        if not self.client_gone():
            return False
        self.set_status(CLIENT_LEFT, "Client Closed Request")
        stream = stream_of(self.request.connection)
        if stream is not None:
            stream.close()
        return True

    def send(self, body: Any, status: int = 200) -> asyncio.Future[None]:
        """Answer with a JSON body (bytes are already JSON); done once it is written, or once
        the connection is closed (the stream's `error` then says why)."""
        self.set_status(status)
        return self.finish(body if isinstance(body, bytes) else dumps(body))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, Unidentified):
            self.api.requests.identity_failures += 1
        if isinstance(exc, PatrollerError):
            self.set_status(STATUS.get(type(exc), 500))
            if "retry_after" in exc.data:  # when to ask again (a 429 of the usage reports)
                self.set_header("Retry-After", str(exc.data["retry_after"]))
            body = hiding.refusal(
                exc, viewer_of(self.identity) if self.api.hiding else hiding.EVERYTHING
            )
        elif status_code == 405:
            method = shown(self.request.method or "", SHOWN_METHOD_CHARS)
            body = {
                "error": f"{method} is not allowed on {shown(self.request.path)}",
                "allowed": self.allowed(),
            }
            self.set_header("Allow", ", ".join(self.allowed()))
        elif isinstance(exc, tornado.web.HTTPError) and status_code < 500:
            # Tornado's messages may quote the request (a 60 kB Content-Encoding): cut them
            reason = exc.reason or http.client.responses.get(status_code, "Unknown")
            body = {"error": shown(exc.log_message or reason, SHOWN_MESSAGE_CHARS)}
        else:
            body = {"error": "internal error: the daemon's log has the details"}
        self.finish(dumps(body))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, (PatrollerError, tornado.web.HTTPError)):
            status = (
                value.status_code
                if isinstance(value, tornado.web.HTTPError)
                else STATUS.get(type(value), 500)
            )
            if status < 500 or status == 503:
                return  # an answer to the client (503: stopping, or a part down), not our fault
        else:
            status = 500
        # One traceback a `repeat_log_every` at most: a request that fails each time it is
        # sent must not let a caller fill the log (200 of them made 4,500 lines in 8 s).
        admitted, untold = self.api.tracebacks.admit()
        if admitted:
            also = f" ({untold} more failed meanwhile, not logged)" if untold else ""
            log.error(
                "%s %s answered %d%s",
                self.request.method,
                shown(self.request.path),
                status,
                also,
                exc_info=(typ, value, tb),
            )

    def allowed(self) -> list[str]:
        """The methods this handler answers."""
        base = tornado.web.RequestHandler
        return [
            m
            for m in ("GET", "HEAD", "POST")
            if getattr(type(self), m.lower()) is not getattr(base, m.lower())
        ]


class View(Handler):
    """A read-only endpoint: HEAD is answered like GET, without the body (Tornado drops it)."""

    def head(self) -> Any:
        return self.get()

    def shown(self, data: Callable[[], Any], render: hiding.Render) -> Awaitable[None] | None:
        """Send `data()`; with --hide-users, once the caller is known, as they may see it."""
        hidden = self.api.hiding
        if hidden is None:
            self.send(data())
            return None
        return self.shown_to_caller(lambda viewer: hidden.show(render, data(), viewer))

    async def shown_to_caller(self, body: Callable[[Viewer], Any]) -> None:
        self.send(body(await self.viewer(query.parse_user(self.args()))))


class NotFoundHandler(Handler):
    def prepare(self) -> None:  # its own words, whole: the path in them is cut already
        self.set_status(404)
        self.finish(
            dumps(
                {
                    "error": f"no such endpoint: {shown(self.request.path)}; try "
                    f"{', '.join(self.api.endpoints)}"
                }
            )
        )
