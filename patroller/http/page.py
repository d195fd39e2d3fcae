"""The web page's handlers: / (the page for a browser, the endpoints as JSON for a program),
/web/<file> (its script and style, only what the package ships), /events (its live feed,
Server-Sent Events), the usage report's page, /report, and with --fleet the fleet's page,
/fleet, and its data, /fleet.json."""

from __future__ import annotations

import asyncio
import importlib.resources

import tornado.template
import tornado.web

from patroller import __version__
from patroller.core.errors import BadRequest, Unavailable, Unidentified
from patroller.core.identity import Identity
from patroller.http import hiding, query
from patroller.http.access import shown
from patroller.http.handlers import Handler, View
from patroller.http.hiding import viewer_of
from patroller.http.live import Page
from patroller.identify.connection import stream_of

PAGE_POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
BASE_PAGE = "base.html"  # the head the pages share: each page extends it
WEB_TYPES = {
    ".html": "text/html; charset=UTF-8",
    ".js": "text/javascript; charset=UTF-8",
    ".css": "text/css; charset=UTF-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
ENDPOINTS = {
    "/devices": "inventory",
    "/status": "live statistics and who holds what",
    "/request?gpu=N": "reserve N devices now",
    "/wait?gpu=N[&timeout=S]": "wait until N devices can be reserved",
    "/release[?uuid=U]": "give back your reservations",
    "/renew[?uuid=U]": "restart the lease of your reservations",
    "/queue": "the requests waiting, in order",
    "/users": "per user: GPUs held, unused, used without asking, idle; limits",
    "/history[?since=T]": "the recent events of the audit record",
    "/usage[?since=T][&until=T][&by=K[,K]][&tz=Z]": "GPU-hours per category (active, "
    "idle-held, reserved-unused, ...) by user, "
    "account, job, GPU, day, weekday, hour",
    "/report": "the usage report's page: GPU-hours per day and user, when, idle and unused",
    "/whoami": "who the daemon takes the caller for (whom /request would hold devices for)",
    "/notify": "your own notification destinations, their secrets starred",
    "/notify/add": "POST url=...: add a destination of yours (an Apprise URL)",
    "/notify/remove": "POST n=N: remove your destination N",
    "/notify/mute": "POST kind=K: stop telling you of a kind (trespass, idle, ...)",
    "/notify/unmute": "POST kind=K: tell you of that kind again",
    "/notify/test": "POST: send yourself a test notice",
    "/events": "the page's live feed (Server-Sent Events)",
    "/web/{name}": "the page's scripts and style (a browser at / gets the page)",
    "/fleet": "with --fleet: one live page of every host's GPUs",
    "/fleet.json": "with --fleet: every host's GPUs, as this daemon last heard them",
    "/metrics": "Prometheus metrics: GPUs, who holds and uses them, the daemon",
    "/metrics.json": "the daemon's own counters, as JSON",
    "/doctor": "the host's root only: what this daemon meets on its host, checked",
    "/openapi.json": "this API, described for programs (OpenAPI 3.1)",
}


def wants_html(accept: str | None) -> bool:
    """Whether the client is a browser asking for a page (curl and programs ask for */* or
    JSON)."""
    return accept is not None and "text/html" in accept.lower()


def web_files() -> dict[str, bytes]:
    """Blocking: the page's files, shipped in the package (patroller/http/web), by name, each
    page rendered (`pages`)."""
    folder = importlib.resources.files("patroller.http") / "web"
    if not folder.is_dir():
        return {}
    return pages(
        {
            entry.name: entry.read_bytes()
            for entry in folder.iterdir()
            if entry.is_file() and not entry.name.startswith(".")
        }
    )


def pages(files: dict[str, bytes]) -> dict[str, bytes]:
    """`files` with each page (index.html, fleet.html, report.html) rendered on BASE_PAGE, the
    head they share, which is itself no file of the page's. Rendered once, when the files are
    read: a page says nothing that changes from one answer to the next."""
    texts = {name: body.decode("utf-8") for name, body in files.items() if name.endswith(".html")}
    loader = tornado.template.DictLoader(texts, whitespace="all")
    rendered = {name: loader.load(name).generate() for name in texts if name != BASE_PAGE}
    return {name: rendered.get(name, body) for name, body in files.items() if name != BASE_PAGE}


class PageView(View):
    """A handler that may answer one of the package's pages."""

    def send_page(self, page: bytes) -> None:
        """The page, under the strict policy: its scripts and style from this daemon only."""
        self.set_header("Content-Type", WEB_TYPES[".html"])
        self.set_header("Content-Security-Policy", PAGE_POLICY)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(page)


class IndexHandler(PageView):
    """The endpoints as JSON, or, for a browser, the page."""

    def get(self) -> None:
        self.set_header("Vary", "Accept")
        page = self.api.web.get("index.html")
        if page is not None and wants_html(self.request.headers.get("Accept")):
            self.send_page(page)
            return
        self.send(
            {
                "name": "patroller",
                "version": __version__,
                "mode": self.services.mode,
                "devices": len(self.services.inventory),
                "endpoints": ENDPOINTS,
            }
        )


class ReportHandler(PageView):
    """The usage report's page (/report): it asks /usage for what it draws, and says why when
    there is no store."""

    def get(self) -> None:
        page = self.api.web.get("report.html")
        if page is None:
            raise tornado.web.HTTPError(404, "the report page is not installed")
        self.send_page(page)


def no_fleet() -> tornado.web.HTTPError:
    return tornado.web.HTTPError(
        404,
        "no fleet view here: start the daemon with --fleet "
        "host:port,host:port,... (or --fleet-file) to serve "
        "/fleet and /fleet.json",
    )


class FleetHandler(PageView):
    """With --fleet, the fleet's page (it follows /fleet.json)."""

    def get(self) -> None:
        page = self.api.web.get("fleet.html")
        if self.api.fleet is None or page is None:
            raise no_fleet()
        self.send_page(page)


class FleetJsonHandler(View):
    """With --fleet, every host's GPUs as this daemon last heard them; it never waits for a
    host. Packed once per body (fleetbody): gzipped for a client that accepts it, each
    encoding with its own ETag (If-None-Match: 304). With --hide-users, the names in it as the
    caller may see them (hiding.fleet)."""

    tag: str | None = None  # the ETag of the bytes sent

    async def get(self) -> None:
        fleet = self.api.fleet
        if fleet is None:
            raise no_fleet()
        if self.api.hiding is not None:
            shown = self.shown(fleet.data, hiding.fleet)
            if shown is not None:
                await shown
            return
        packed = await fleet.packed()
        body, encoding, self.tag = packed.answer(self.request.headers.get("Accept-Encoding", ""))
        self.set_header("Vary", "Accept-Encoding")
        if encoding is not None:
            self.set_header("Content-Encoding", encoding)
        self.send(body)

    def compute_etag(self) -> str | None:
        """The packed body's own tag (nothing hashed per answer); Tornado sends it, and answers
        a matching If-None-Match with 304."""
        return self.tag if self.tag is not None else super().compute_etag()


class WebHandler(View):
    """The page's other files (/web/app.js, /web/style.css): only those the package ships."""

    def get(self, name: str) -> None:
        body = self.api.web.get(name)
        if body is None:
            raise tornado.web.HTTPError(404, f"no such file: /web/{shown(name, 60)}")
        extension = name[name.rfind(".") :] if "." in name else ""
        self.set_header("Content-Type", WEB_TYPES.get(extension, "application/octet-stream"))
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(body)

    # Tornado types head() without path arguments; its routes hand it the page's name
    def head(self, name: str) -> None:  # type: ignore[override]
        self.get(name)


class _PageConnection(Page):
    """The feed's end of one /events connection."""

    def __init__(self, handler: EventsHandler) -> None:
        self.handler = handler

    def write(self, message: bytes) -> None:
        stream = stream_of(self.handler.request.connection)
        if stream is None or stream.closed():
            self.close()
            return
        if stream.writing() and not message.startswith(b"retry:"):
            return  # the last one has not gone out yet: this one supersedes it, skip it
        self.handler.write(message)
        self.handler.flush()

    def close(self) -> None:
        self.handler.ended()


class EventsHandler(Handler):
    """Server-Sent Events: a snapshot of everything the page shows after each change."""

    page: _PageConnection | None = None
    done: asyncio.Future[None] | None = None
    answered = False  # finish() was called (by us, or by Tornado on an error)

    async def get(self) -> None:
        if set(self.args()) - {"user"}:
            raise BadRequest("/events takes no arguments (but user= in test mode)")
        feed = self.api.feed
        identity = await self.page_caller(query.parse_user(self.args()))
        caller = identity.user if identity is not None else None
        refused = feed.full(caller)
        if refused is not None:
            raise Unavailable(refused)
        self.set_header("Content-Type", "text/event-stream; charset=UTF-8")
        self.set_header("X-Accel-Buffering", "no")  # a proxy in front must not hold it back
        self.done = asyncio.get_running_loop().create_future()
        self.page = _PageConnection(self)
        feed.add(self.page, caller, viewer_of(identity))
        await self.done
        if not self.answered:
            self.finish()

    async def page_caller(self, claimed: str | None) -> Identity | None:
        """Whose page this is, to count it against that user's slots, and for the names it
        may show (--hide-users); None for a caller who cannot be identified (they share a small
        pool, and see no name). The page itself needs no identity."""
        try:
            return await self.caller(claimed)
        except Unidentified:
            return None

    def on_finish(self) -> None:
        self.answered = True

    def ended(self) -> None:
        if self.page is not None:
            self.api.feed.remove(self.page)
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def on_connection_close(self) -> None:
        self.ended()
