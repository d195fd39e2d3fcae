"""The JSON API's handlers: each parses its query, makes one call on the services, and writes
what it answers. Every error, domain or HTTP, is answered in JSON by one `write_error`. The
routes are in routes.py; the web page's handlers in page.py."""

from __future__ import annotations

import asyncio
import http.client
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import tornado.web
from tornado.ioloop import IOLoop
from tornado.iostream import StreamClosedError

from patroller import durations
from patroller.core.devices import Device
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
from patroller.core.identity import Identity, ProcessRef, Viewer
from patroller.core.leases import Waiter
from patroller.http import hiding, query
from patroller.http.access import SHOWN_METHOD_CHARS, shown
from patroller.http.api import Api
from patroller.http.encoding import dumps
from patroller.http.hiding import viewer_of
from patroller.http.inflight import answered_on_stop
from patroller.http.views import device_json, grant_json, queue_view, users_view
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

    def check_duration(self, duration: float | None) -> None:
        """Refuse a reservation longer than the host's policy allows."""
        longest = self.leases.policy.max_hold
        if duration is not None and duration > longest:
            raise BadRequest(
                f"hold: {durations.describe(duration)} is longer than the "
                f"{durations.describe(longest)} one may ask for on this host",
                max_hold=longest,
            )

    async def held_for(self, hold: str) -> ProcessRef | None:
        """The process a hold=process grant is held for (after `caller`); None for a lease."""
        if hold != "process":
            return None
        return await self.services.callers.process(self.request)

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

    async def grant(self, caller: Identity, devices: list[Device]) -> None:
        """Answer with a grant; if the answer could not be written (the client left after it
        was last asked: a unix caller's closed socket refuses the write), give it back."""
        kept = self.kept(caller, devices)
        stream = stream_of(self.request.connection)
        try:
            await self.send(grant_json(kept, self.leases))
            lost = stream is None or (stream.closed() and stream.error is not None)
        except StreamClosedError:  # closed before the write
            lost = True
        if lost:
            log.debug(
                "%s %s: the answer could not be written; the grant is given back",
                self.request.method,
                self.request.path,
            )
            for device in kept:
                self.leases.release(caller, device.uuid, "the client left before the answer")

    def kept(self, caller: Identity, devices: list[Device]) -> list[Device]:
        """The devices just granted, if the lease book could keep the grant; else they are
        given back and the request is refused (503): a grant the book does not hold would not
        survive a restart."""
        book = self.services.book
        refusal = book.refusal() if book is not None else None
        if refusal is None:
            return devices
        for device in devices:
            self.leases.release(caller, device.uuid, "the lease book could not be written")
        raise Unavailable(refusal)

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


class RequestHandler(Handler):
    async def get(self) -> None:
        ask = query.parse_ask(self.args(), wait=False)
        caller = await self.caller(ask.user)
        held_for = await self.held_for(ask.hold)
        self.check_duration(ask.duration)
        if self.unanswerable():
            return
        await self.grant(
            caller, self.leases.request(caller, ask.wants, held_for, ask.duration, ask.link)
        )

    post = get  # so that a client need not change state with a GET; the form joins the query


class WaitHandler(Handler):
    """Long-poll: answered when the lease manager grants, on timeout, or never if the client
    leaves.

    A waiter exists only while its client is connected: one that leaves while it is being
    identified is never queued, and a grant that finds it gone is given straight back.
    """

    waiter: Waiter | None = None
    outcome: asyncio.Future[list[Device] | None] | None = None  # None: the client left

    async def get(self) -> None:
        ask = query.parse_ask(self.args(), wait=True)
        caller = await self.caller(ask.user)
        held_for = await self.held_for(ask.hold)
        self.check_duration(ask.duration)
        if self.unanswerable():  # it left while we looked it up: queue nothing for nobody
            return
        self.outcome = asyncio.get_running_loop().create_future()
        self.waiter = self.leases.wait(
            caller, ask.wants, self._end_wait, self._fail, held_for, ask.duration, ask.link
        )
        timer = None
        if ask.timeout is not None and not self.outcome.done():
            timer = IOLoop.current().call_later(ask.timeout, self._timed_out, ask.wants)
        try:
            devices = await self.outcome
        finally:
            if timer is not None:
                IOLoop.current().remove_timeout(timer)
        if devices is None:
            return
        if self.unanswerable():
            for device in devices:  # nobody to tell: give them straight back
                self.leases.release(caller, device.uuid)
            return
        await self.grant(caller, devices)

    post = get  # as /request: GET, the seed's contract, or POST

    def _end_wait(self, devices: list[Device] | None) -> None:
        if self.outcome is not None and not self.outcome.done():
            self.outcome.set_result(devices)

    def _fail(self, error: Exception) -> None:
        if self.outcome is not None and not self.outcome.done():
            self.outcome.set_exception(error)

    def _timed_out(self, wants: dict[str, int]) -> None:
        if self.waiter is not None and self.leases.cancel(self.waiter):
            self._fail(self.leases.busy(wants))

    def on_connection_close(self) -> None:
        if self.waiter is not None and self.leases.cancel(self.waiter):
            log.debug("a waiting client left")
            self._end_wait(None)


class ReleaseHandler(Handler):
    """Give back one device (uuid=), or all the caller's but those held for another process
    that lives (`kept`, saying why: that process's job runs on them)."""

    async def _release(self) -> None:
        ask = query.parse_release(self.args())
        caller = await self.caller(ask.user)
        process = await self.calling_process() if ask.uuid is None else None
        if self.unanswerable():
            return
        if ask.healthy and ask.uuid is not None:
            self.send(self.healthy(caller, ask.uuid))
            return
        holder = self.leases.holder(ask.uuid) if ask.uuid is not None else None
        now, later = self.leases.release(caller, ask.uuid, ask.reason, process)
        kept = (
            []
            if ask.uuid is not None
            else [
                d
                for d in self.leases.held_by(caller.user)
                if self.leases.holds[d.uuid].held_for not in (None, process)
            ]
        )
        why = "held while its process runs: released by that process, by uuid, or when it ends"
        self.send(
            {
                "released": device_json(now),
                "after_exit": device_json(later),
                "kept": [{**g, "why": why} for g in grant_json(kept, self.leases)],
                # whose reservation it was, when the host's root released another user's
                "holder": self.named(holder.user, caller)
                if holder and not holder.same_user(caller) and (now or later)
                else None,
            }
        )

    def healthy(self, caller: Identity, uuid: str) -> dict[str, Any]:
        """The host's root says the device is healthy: its Xids end, what -q -x shows now is
        excused (core/health.py); it is granted again unless something else withholds it."""
        self.leases.check_admin(caller, uuid, "say a GPU is healthy")
        watch = self.services.health
        health = watch.declare_healthy(uuid, caller.user) if watch is not None else None
        return {
            "healthy": uuid,
            "health": health.to_json() if health else None,
            "withheld": self.leases.holds[uuid].withheld,
        }

    def named(self, user: str, caller: Identity) -> str | None:
        """`user` as the caller may see them (--hide-users)."""
        hidden = self.api.hiding
        return hidden.name(user, viewer_of(caller)) if hidden is not None else user

    async def calling_process(self) -> ProcessRef | None:
        """The process asking, when the kernel can say (a unix or loopback caller), else None."""
        try:
            return await self.services.callers.process(self.request)
        except NoCallerProcess:
            return None

    get = post = _release


class RenewHandler(Handler):
    """Restart the lease of the caller's reservations: a client that keeps a lease alive."""

    async def _renew(self) -> None:
        ask = query.parse_release(self.args(), endpoint="/renew")
        caller = await self.caller(ask.user)
        if self.unanswerable():
            return
        self.send({"renewed": grant_json(self.leases.renew(caller, ask.uuid), self.leases)})

    get = post = _renew


class QueueHandler(View):
    def get(self) -> Awaitable[None] | None:
        return self.shown(lambda: queue_view(self.leases), hiding.queue)


class UsersHandler(View):
    def get(self) -> Awaitable[None] | None:
        return self.shown(lambda: users_view(self.leases, self.services.idle), hiding.users)


class HistoryHandler(View):
    """The recent events of the audit record, oldest first: ?since=<epoch seconds or ISO time>
    (default: all kept) and ?limit=N (default and most: 1000)."""

    def get(self) -> Awaitable[None] | None:
        ask = query.parse_history(self.args())
        return self.shown(lambda: self.services.audit.since(ask.since, ask.limit), hiding.events)


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
