"""The JSON HTTP API: thin handlers over the lease manager, the statistics and the callers."""
from __future__ import annotations

import asyncio
import json
import logging
import pkgutil
from typing import Any, Callable, Dict, List, Optional

import tornado.web
from tornado import httputil
from tornado.ioloop import IOLoop

from patroller import __version__
from patroller.http import query
from patroller.http.metrics import Registries, Requests
from patroller.identify.callers import CallerIdentifier
from patroller.core.devices import Device, Inventory
from patroller.core.errors import (BadRequest, Busy, NoCallerProcess, NotHeld, NotYours, OverLimit,
                     PatrollerError, TooManyWaiting, Unavailable, Unidentified, Unsatisfiable)
from patroller.core.identity import Identity, ProcessRef
from patroller.core.leases.manager import LeaseManager, Waiter
from patroller.core.throttle import Throttle
from patroller.state.audit import AuditLog
from patroller.observe.idle import IdleWatch
from patroller.http.live import LiveFeed, Stream
from patroller.http.views import DevicesView, StatusView, dumps, users_view

log = logging.getLogger(__name__)
access_log = logging.getLogger("patroller.access")

CLIENT_ERRORS_LOGGED = 20  # 4xx access-log lines per window at most; the rest are counted
CLIENT_ERRORS_WINDOW = 10.0  # seconds
SHOWN_CHARS = 100  # of a path in a log line or an error message
SHOWN_METHOD_CHARS = 20
SHOWN_MESSAGE_CHARS = 300  # of an error message from Tornado

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
    Unavailable: 503,
}


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """What a client sent, cut to `limit` characters and printable, for a log line or a message."""
    cut = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return cut + "..." if len(text) > limit else cut


def device_json(devices: List[Device]) -> List[Dict[str, Any]]:
    """Devices as /release lists them."""
    return [{"uuid": d.uuid, "group": d.group, "info": d.info()} for d in devices]


def grant_json(devices: List[Device], leases: LeaseManager) -> List[Dict[str, Any]]:
    """Devices as /request, /wait and /renew list them: with how each is held (`hold`,
    `expires`, `held_for_pid`)."""
    return [{"uuid": d.uuid, "group": d.group, "info": d.info(), **leases.hold_of(d.uuid)}
            for d in devices]


class Handler(tornado.web.RequestHandler):
    """JSON in every answer, errors included; dependencies arrive through initialize()."""

    def initialize(self, inventory: Inventory, leases: LeaseManager, status: StatusView,
                   devices: DevicesView, callers: CallerIdentifier, mode: str,
                   metrics: Callable[[], Dict[str, Any]], requests: Requests) -> None:
        self.inventory = inventory
        self.leases = leases
        self.status = status
        self.devices = devices
        self.callers = callers
        self.mode = mode
        self.metrics = metrics
        self.requests = requests

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Server", "patroller")  # not Tornado's name and version

    def prepare(self) -> None:
        query.check_length(self.request.query)

    def args(self) -> Dict[str, List[bytes]]:
        """Query arguments, plus form arguments of a POST."""
        merged = {name: list(values) for name, values in self.request.query_arguments.items()}
        for name, values in self.request.body_arguments.items():
            merged.setdefault(name, []).extend(values)
        return merged

    async def caller(self, claimed: Optional[str]) -> Identity:
        """Who is asking."""
        return await self.callers.identify(self.request, claimed)

    def check_duration(self, duration: Optional[float]) -> None:
        """Refuse a reservation longer than the host's policy allows."""
        longest = self.leases.policy.max_hold
        if duration is not None and duration > longest:
            raise BadRequest(f"hold: {duration:.0f} s is longer than the {longest:.0f} s one may "
                             "ask for on this host", max_hold=longest)

    async def bound(self, hold: str) -> Optional[ProcessRef]:
        """The process a hold=process grant is held for (after `caller`); None for a lease."""
        return await self.callers.process(self.request) if hold == "process" else None

    def send(self, body: Any, status: int = 200) -> None:
        """Answer with a JSON body (bytes are already JSON)."""
        self.set_status(status)
        self.finish(body if isinstance(body, bytes) else dumps(body))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, Unidentified):
            self.requests.identity_failures += 1
        if isinstance(exc, PatrollerError):
            self.set_status(STATUS.get(type(exc), 500))
            body = {"error": exc.message, **exc.data}
        elif status_code == 405:
            method = shown(self.request.method or "", SHOWN_METHOD_CHARS)
            body = {"error": f"{method} is not allowed on {shown(self.request.path)}",
                    "allowed": self.allowed()}
            self.set_header("Allow", ", ".join(self.allowed()))
        elif isinstance(exc, tornado.web.HTTPError) and status_code < 500:
            # Tornado's messages may quote the request (a 60 kB Content-Encoding): cut them
            reason = exc.reason or httputil.responses.get(status_code, "Unknown")
            body = {"error": shown(exc.log_message or reason, SHOWN_MESSAGE_CHARS)}
        else:
            body = {"error": "internal error: the daemon's log has the details"}
        self.finish(dumps(body))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, (PatrollerError, tornado.web.HTTPError)):
            return  # an answer to the client, not a fault of ours
        super().log_exception(typ, value, tb)

    def allowed(self) -> List[str]:
        """The methods this handler answers."""
        base = tornado.web.RequestHandler
        return [m for m in ("GET", "HEAD", "POST")
                if getattr(type(self), m.lower()) is not getattr(base, m.lower())]


class View(Handler):
    """A read-only endpoint: HEAD is answered like GET, without the body (Tornado drops it)."""

    def head(self) -> Any:
        return self.get()


PAGE_POLICY = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
WEB_TYPES = {".html": "text/html; charset=UTF-8", ".js": "text/javascript; charset=UTF-8",
             ".css": "text/css; charset=UTF-8", ".svg": "image/svg+xml", ".png": "image/png",
             ".ico": "image/x-icon"}


def wants_html(accept: Optional[str]) -> bool:
    """Whether the client is a browser asking for a page (curl and programs ask for */* or JSON)."""
    return accept is not None and "text/html" in accept.lower()


def web_files() -> Dict[str, bytes]:
    """The page's files, shipped in the package (patroller/web), by name."""
    import importlib.resources
    folder = importlib.resources.files("patroller.http") / "web"
    if not folder.is_dir():
        return {}
    return {entry.name: entry.read_bytes() for entry in folder.iterdir()
            if entry.is_file() and not entry.name.startswith(".")}


class IndexHandler(View):
    """The endpoints as JSON, or, for a browser, the page."""

    def initialize(self, web: Dict[str, bytes], **deps: Any) -> None:  # type: ignore[override]
        super().initialize(**deps)
        self.web = web

    def get(self) -> None:
        self.set_header("Vary", "Accept")
        if wants_html(self.request.headers.get("Accept")) and "index.html" in self.web:
            self.set_header("Content-Type", WEB_TYPES[".html"])
            self.set_header("Content-Security-Policy", PAGE_POLICY)
            self.set_header("X-Content-Type-Options", "nosniff")
            self.finish(self.web["index.html"])
            return
        self.send({
            "name": "patroller",
            "version": __version__,
            "mode": self.mode,
            "devices": len(self.inventory),
            "endpoints": {
                "/devices": "inventory",
                "/status": "live statistics and who holds what",
                "/request?gpu=N": "reserve N devices now",
                "/wait?gpu=N[&timeout=S]": "wait until N devices can be reserved",
                "/release[?uuid=U]": "give back your reservations",
                "/renew[?uuid=U]": "restart the lease of your reservations",
                "/queue": "the requests waiting, in order",
                "/users": "per user: GPUs held, unused, used without asking, idle; limits",
                "/history[?since=T]": "the recent events of the audit record",
                "/events": "the page's live feed (Server-Sent Events)",
                "/web/{name}": "the page's scripts and style (a browser at / gets the page)",
                "/metrics": "Prometheus metrics: GPUs, who holds and uses them, the daemon",
                "/metrics.json": "the daemon's own counters, as JSON",
                "/openapi.json": "this API, described for programs (OpenAPI 3.1)",
            },
        })


class DevicesHandler(View):
    def get(self) -> None:
        self.send(self.devices.body())


class StatusHandler(View):
    def get(self) -> None:
        self.send(self.status.body())


class MetricsJsonHandler(View):
    def get(self) -> None:
        self.send(self.metrics())


class MetricsHandler(View):
    """The Prometheus exposition (OpenMetrics when the scraper asks for it), built at scrape
    time from the daemon's state."""

    def initialize(self, registries: Registries, **deps: Any) -> None:  # type: ignore[override]
        super().initialize(**deps)
        self.registries = registries

    async def get(self) -> None:
        accept = self.request.headers.get("Accept")
        body, content_type = await self.registries.exposition(accept)
        self.set_header("Content-Type", content_type)
        self.finish(body)

    async def head(self) -> None:
        await self.get()


def openapi_document() -> bytes:
    """patroller/openapi.json, compact like every answer; tests check it against the handlers."""
    data = pkgutil.get_data("patroller.http", "openapi.json")
    if data is None:
        raise FileNotFoundError("patroller/openapi.json is not installed")
    return dumps(json.loads(data))


class WebHandler(View):
    """The page's other files (/web/app.js, /web/style.css): only those the package ships."""

    def initialize(self, web: Dict[str, bytes], **deps: Any) -> None:  # type: ignore[override]
        super().initialize(**deps)
        self.web = web

    def get(self, name: str) -> None:
        body = self.web.get(name)
        if body is None:
            raise tornado.web.HTTPError(404, f"no such file: /web/{shown(name, 60)}")
        extension = name[name.rfind("."):] if "." in name else ""
        self.set_header("Content-Type", WEB_TYPES.get(extension, "application/octet-stream"))
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(body)

    def head(self, name: str) -> None:  # type: ignore[override]
        self.get(name)


class _EventStream(Stream):
    """The feed's end of one /events connection."""

    def __init__(self, handler: "EventsHandler") -> None:
        self.handler = handler

    def write(self, message: bytes) -> None:
        connection = getattr(self.handler.request.connection, "stream", None)
        if connection is None or connection.closed():
            self.close()
            return
        if connection.writing() and not message.startswith(b"retry:"):
            return  # the last one has not gone out yet: this one supersedes it, skip it
        self.handler.write(message)
        self.handler.flush()

    def close(self) -> None:
        self.handler.ended()


class EventsHandler(Handler):
    """Server-Sent Events: a snapshot of everything the page shows after each change."""

    def initialize(self, feed: LiveFeed, **deps: Any) -> None:  # type: ignore[override]
        super().initialize(**deps)
        self.feed = feed
        self.stream: Optional[_EventStream] = None
        self.done: Optional["asyncio.Future[None]"] = None
        self.answered = False  # finish() was called (by us, or by Tornado on an error)

    async def get(self) -> None:
        if self.args():
            raise BadRequest("/events takes no arguments")
        if self.feed.full():
            raise Unavailable(f"too many open pages ({len(self.feed.streams)})")
        self.set_header("Content-Type", "text/event-stream; charset=UTF-8")
        self.set_header("X-Accel-Buffering", "no")  # a proxy in front must not hold it back
        self.done = asyncio.get_running_loop().create_future()
        self.stream = _EventStream(self)
        self.feed.add(self.stream)
        await self.done
        if not self.answered:
            self.finish()

    def on_finish(self) -> None:
        self.answered = True

    def ended(self) -> None:
        if self.stream is not None:
            self.feed.remove(self.stream)
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def on_connection_close(self) -> None:
        self.ended()


class OpenApiHandler(View):
    """The API described for machines (OpenAPI 3.1)."""

    def initialize(self, document: bytes, **deps: Any) -> None:  # type: ignore[override]
        super().initialize(**deps)
        self.document = document

    def get(self) -> None:
        self.send(self.document)


class RequestHandler(Handler):
    async def get(self) -> None:
        ask = query.parse_ask(self.args(), wait=False)
        caller = await self.caller(ask.user)
        bound = await self.bound(ask.hold)
        self.check_duration(ask.duration)
        self.send(grant_json(self.leases.request(caller, ask.wants, bound, ask.duration),
                             self.leases))

    post = get  # so that a client need not change state with a GET; the form joins the query


class WaitHandler(Handler):
    """Long-poll: answered when the lease manager grants, on timeout, or never if the client leaves.

    A waiter exists only while its client is connected: one that leaves while it is being
    identified is never queued, and a grant that finds it gone is given straight back.
    """

    waiter: Optional[Waiter] = None
    outcome: Optional["asyncio.Future[Optional[List[Device]]]"] = None  # None: the client left

    async def get(self) -> None:
        ask = query.parse_ask(self.args(), wait=True)
        caller = await self.caller(ask.user)
        bound = await self.bound(ask.hold)
        self.check_duration(ask.duration)
        if self._gone():  # it left while we looked it up: queue nothing for nobody
            log.debug("a waiting client left before it was queued")
            return
        self.outcome = asyncio.get_running_loop().create_future()
        self.waiter = self.leases.wait(caller, ask.wants, self._settle, self._fail, bound,
                                       ask.duration)
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
        if self._gone():
            for device in devices:  # nobody to tell: give them straight back
                self.leases.release(caller, device.uuid)
            return
        self.send(grant_json(devices, self.leases))

    post = get  # as /request: GET, the seed's contract, or POST

    def _settle(self, devices: Optional[List[Device]]) -> None:
        if self.outcome is not None and not self.outcome.done():
            self.outcome.set_result(devices)

    def _fail(self, error: Exception) -> None:
        if self.outcome is not None and not self.outcome.done():
            self.outcome.set_exception(error)

    def _timed_out(self, wants: Dict[str, int]) -> None:
        if self.waiter is not None and self.leases.cancel(self.waiter):
            self._fail(self.leases.busy(wants))

    def _gone(self) -> bool:
        """Whether the client has closed. The stream is asked: Tornado calls on_connection_close
        only for a close seen once the handler runs, not for one seen with the request."""
        stream = getattr(self.request.connection, "stream", None)
        return stream is None or stream.closed()

    def on_connection_close(self) -> None:
        if self.waiter is not None and self.leases.cancel(self.waiter):
            log.debug("a waiting client left")
            self._settle(None)


class ReleaseHandler(Handler):
    async def _release(self) -> None:
        ask = query.parse_release(self.args())
        caller = await self.caller(ask.user)
        now, later = self.leases.release(caller, ask.uuid, ask.reason)
        self.send({"released": device_json(now), "after_exit": device_json(later)})

    get = post = _release


class RenewHandler(Handler):
    """Restart the lease of the caller's reservations: a client that keeps a lease alive."""

    async def _renew(self) -> None:
        ask = query.parse_release(self.args(), endpoint="/renew")
        caller = await self.caller(ask.user)
        self.send({"renewed": grant_json(self.leases.renew(caller, ask.uuid), self.leases)})

    get = post = _renew


class QueueHandler(View):
    def get(self) -> None:
        self.send(self.leases.queue())


class UsersHandler(View):
    def initialize(self, idle: IdleWatch, **deps: Any) -> None:  # type: ignore[override]
        super().initialize(**deps)
        self.idle = idle

    def get(self) -> None:
        self.send(users_view(self.leases, self.idle))


class HistoryHandler(View):
    """The recent events of the audit record, oldest first: ?since=<epoch seconds or ISO time>
    (default: all kept) and ?limit=N (default and most: 1000)."""

    def initialize(self, audit: AuditLog, **deps: Any) -> None:  # type: ignore[override]
        super().initialize(**deps)
        self.audit = audit

    def get(self) -> None:
        ask = query.parse_history(self.args())
        self.send(self.audit.since(ask.since, ask.limit))


class NotFoundHandler(Handler):
    def initialize(self, endpoints: List[str], **deps: Any) -> None:  # type: ignore[override]
        super().initialize(**deps)
        self.endpoints = endpoints

    def prepare(self) -> None:
        raise tornado.web.HTTPError(404, f"no such endpoint: {shown(self.request.path)}; "
                                         f"try {', '.join(self.endpoints)}")


class AccessLog:
    """Tornado's log_function: successes at debug, errors at info and above, each line bounded.

    A line names the method and the path, cut, never the query (a 60 kB query once made 40 MB/s
    of log). Client errors (4xx) are rate-limited: past the limit they are counted, and the
    count is logged with the next line let through.
    """

    def __init__(self, throttle: Throttle, requests: Optional[Requests] = None) -> None:
        self.throttle = throttle
        self.requests = requests

    def __call__(self, handler: tornado.web.RequestHandler) -> None:
        status = handler.get_status()
        if self.requests is not None:
            self.requests.count(handler.request.path, status)
        if status < 400:
            level = logging.DEBUG
        elif status < 500:
            level = logging.INFO
        else:
            level = logging.WARNING if status == 503 else logging.ERROR
        if not access_log.isEnabledFor(level):
            return
        if 400 <= status < 500:
            admitted, held = self.throttle.admit()
            if not admitted:
                return
            if held:
                access_log.info("%d client errors were not logged (at most %d per %g s)", held,
                                self.throttle.limit, self.throttle.window)
        request = handler.request
        access_log.log(level, "%d %s %s%s (%s) %.1fms", status,
                       shown(request.method or "", SHOWN_METHOD_CHARS), shown(request.path),
                       "?..." if request.query else "", request.remote_ip,
                       1000.0 * request.request_time())


def make_app(inventory: Inventory, leases: LeaseManager, status: StatusView,
             devices: DevicesView, callers: CallerIdentifier, mode: str,
             metrics: Callable[[], Dict[str, Any]], requests: Requests,
             registries: Registries, audit: AuditLog,
             idle: IdleWatch, feed: LiveFeed) -> tornado.web.Application:
    """The whole API in one place. (GET /status and /devices also have a fast lane.)"""
    deps = dict(inventory=inventory, leases=leases, status=status, devices=devices,
                callers=callers, mode=mode, metrics=metrics, requests=requests)
    web = web_files()
    routes: List[Any] = [
        (r"/", IndexHandler, dict(deps, web=web)),
        (r"/devices", DevicesHandler, deps),
        (r"/status", StatusHandler, deps),
        (r"/request", RequestHandler, deps),
        (r"/wait", WaitHandler, deps),
        (r"/release", ReleaseHandler, deps),
        (r"/renew", RenewHandler, deps),
        (r"/queue", QueueHandler, deps),
        (r"/users", UsersHandler, dict(deps, idle=idle)),
        (r"/history", HistoryHandler, dict(deps, audit=audit)),
        (r"/events", EventsHandler, dict(deps, feed=feed)),
        (r"/web/([A-Za-z0-9_.-]{1,64})", WebHandler, dict(deps, web=web)),
        (r"/metrics", MetricsHandler, dict(deps, registries=registries)),
        (r"/metrics\.json", MetricsJsonHandler, deps),
        (r"/openapi.json", OpenApiHandler, dict(deps, document=openapi_document())),
    ]
    endpoints = [path.split("(")[0] + "<file>" if "(" in path else path.replace("\\", "")
                 for path, *_ in routes if path != "/"]  # the 404 hint lists them all
    requests.endpoints = {"/", "/web", *endpoints}
    return tornado.web.Application(
        routes,
        default_handler_class=NotFoundHandler,
        default_handler_args=dict(deps, endpoints=endpoints),
        log_function=AccessLog(Throttle(CLIENT_ERRORS_LOGGED, CLIENT_ERRORS_WINDOW), requests),
        compress_response=False,
    )
