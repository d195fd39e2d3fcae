"""The one object every handler takes: the daemon's services, with what the HTTP layer adds to
them. Built once by `patroller.http.routes.make_api`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import tornado.web

from patroller.config import Config
from patroller.core.throttle import Throttle
from patroller.doctor import Doctor
from patroller.http.access import Requests
from patroller.http.fleet import Fleet
from patroller.http.hiding import Hiding
from patroller.http.inflight import InFlight
from patroller.http.live import LiveFeed
from patroller.http.metrics import Registries
from patroller.http.statusview import StatusView
from patroller.http.views import DevicesView
from patroller.services import Services


@dataclass
class Api:
    """The services, and the HTTP layer's own parts: the cached bodies of /status and /devices,
    the web page's live feed, the Prometheus registries, the answers counted, the page's files,
    the API document, the fleet view's hosts (with --fleet), what each caller may see of
    names (None: every name, to everyone), the doctor's examinations (GET /doctor), the
    requests being handled (which a stop waits for), and how often a traceback is logged."""

    services: Services
    status: StatusView
    devices: DevicesView
    feed: LiveFeed
    registries: Registries
    requests: Requests
    web: Mapping[str, bytes]  # the page's files by name (patroller/http/web)
    document: bytes  # the OpenAPI document, compact
    fleet: Fleet | None = None  # the other hosts, asked for /fleet; None without --fleet
    endpoints: list[str] = field(default_factory=list)  # every route, for the 404's hint
    app: tornado.web.Application | None = None  # the routes (routes.make_app)
    hiding: Hiding | None = None  # --hide-users
    doctor: Doctor | None = None  # GET /doctor's examinations, one at a time
    inflight: InFlight = field(default_factory=InFlight)  # the requests not yet answered
    # the requests that failed (500) whose traceback is logged: one a repeat_log_every
    tracebacks: Throttle = field(default_factory=lambda: Throttle(1, Config.repeat_log_every))
