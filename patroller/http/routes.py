"""The whole API in one place: the HTTP layer built over the services, and every route with the
handler that answers it."""

from __future__ import annotations

import json
import pkgutil
from collections.abc import Callable
from typing import Any

import tornado.web

from patroller.core.throttle import Throttle
from patroller.doctor import Doctor
from patroller.http.access import AccessLog, Requests
from patroller.http.api import Api
from patroller.http.doctor import DoctorHandler
from patroller.http.encoding import dumps
from patroller.http.exposition import MetricsHandler, MetricsJsonHandler, OpenApiHandler
from patroller.http.fastlane import Body
from patroller.http.fleet import Fleet
from patroller.http.handlers import NotFoundHandler
from patroller.http.hiding import Hiding
from patroller.http.listings import HistoryHandler, QueueHandler, UsersHandler
from patroller.http.live import LiveFeed
from patroller.http.metrics import Registries
from patroller.http.notifyapi import CHANGES, NotifyHandler
from patroller.http.page import (
    EventsHandler,
    FleetHandler,
    FleetJsonHandler,
    IndexHandler,
    ReportHandler,
    WebHandler,
    web_files,
)
from patroller.http.polled import DevicesHandler, StatusHandler
from patroller.http.reserving import ReleaseHandler, RenewHandler, RequestHandler, WaitHandler
from patroller.http.statusview import StatusView
from patroller.http.usage import UsageHandler
from patroller.http.views import DevicesView, page_snapshot
from patroller.http.whoami import WhoAmIHandler
from patroller.services import Services


def make_api(services: Services) -> Api:
    """The HTTP layer over `services`: its views, feed, counters, files, fleet view and routes.
    Reads the page's files and the API document from the package."""
    config = services.config
    status = StatusView(
        services.inventory,
        services.leases,
        services.stats,
        services.idle,
        config.status_max_age,
        slice_=config.loop_slice,
    )
    devices = DevicesView(services.inventory, services.leases)
    hiding = Hiding(services.pseudonyms, status) if services.pseudonyms is not None else None
    feed = LiveFeed(
        lambda: page_snapshot(services, status, devices),
        config,
        views=hiding.feed if hiding is not None else None,
    )
    requests = Requests()
    api = Api(
        services=services,
        status=status,
        devices=devices,
        feed=feed,
        registries=Registries(services, requests, hiding, config.loop_slice),
        requests=requests,
        web=web_files(),
        document=openapi_document(),
        fleet=Fleet(config) if config.fleet else None,
        hiding=hiding,
        doctor=Doctor(config),
        tracebacks=Throttle(1, config.repeat_log_every),
    )
    # The views and the feed follow every change; the inventory's too.
    services.leases.on_change(feed.changed)
    services.stats.on_change(feed.changed)
    services.signals.inventory_changed.connect(_inventory_changed(api), weak=False)
    services.signals.topology_read.connect(_topology_read(api), weak=False)
    api.app = make_app(api)
    return api


def _inventory_changed(api: Api) -> Any:
    def receive(sender: Any, record: Any) -> None:
        api.devices.invalidate()
        api.status.invalidate(record.added + record.lost + record.renumbered + record.updated)

    return receive


def _topology_read(api: Api) -> Any:
    def receive(sender: Any, record: Any) -> None:
        api.devices.invalidate()
        api.status.invalidate([d.uuid for d in api.services.inventory])

    return receive


def lane_routes(api: Api) -> dict[str, Body]:
    """What the fast lane answers: /status and /devices from their cached bodies; with
    --hide-users, /status only on a connection whose caller a handler has identified."""
    status, devices = api.status, api.devices
    return {
        "/status": api.hiding.lane_status
        if api.hiding is not None
        else lambda connection: status.body(),
        "/devices": lambda connection: devices.body(),
    }


def lane_headers(api: Api) -> dict[str, Callable[[], bytes]]:
    """The header lines the fast lane adds, as the handlers do: /devices' ETag, on /status
    answers too (X-Devices-ETag)."""
    devices = api.devices
    return {"/status": lambda: devices.tag_line, "/devices": lambda: devices.etag_line}


def openapi_document() -> bytes:
    """patroller/http/openapi.json, compact like every answer; tests check it against the
    handlers."""
    data = pkgutil.get_data("patroller.http", "openapi.json")
    if data is None:
        raise FileNotFoundError("patroller/http/openapi.json is not installed")
    return dumps(json.loads(data))


def make_app(api: Api) -> tornado.web.Application:
    """Every route and its handler. (GET /status and /devices also have a fast lane in front.)"""
    routes: list[Any] = [
        (r"/", IndexHandler),
        (r"/devices", DevicesHandler),
        (r"/status", StatusHandler),
        (r"/request", RequestHandler),
        (r"/wait", WaitHandler),
        (r"/release", ReleaseHandler),
        (r"/renew", RenewHandler),
        (r"/queue", QueueHandler),
        (r"/users", UsersHandler),
        (r"/history", HistoryHandler),
        (r"/usage", UsageHandler),
        (r"/report", ReportHandler),
        (r"/whoami", WhoAmIHandler),
        (r"/notify", NotifyHandler),
        *((f"/notify/{action}", handler) for action, handler in CHANGES.items()),
        (r"/events", EventsHandler),
        (r"/web/([A-Za-z0-9_.-]{1,64})", WebHandler),
        (r"/fleet", FleetHandler),
        (r"/fleet\.json", FleetJsonHandler),
        (r"/metrics", MetricsHandler),
        (r"/metrics\.json", MetricsJsonHandler),
        (r"/doctor", DoctorHandler),
        (r"/openapi\.json", OpenApiHandler),
    ]
    api.endpoints = [
        path.split("(")[0] + "<file>" if "(" in path else path.replace("\\", "")
        for path, _ in routes
        if path != "/"
    ]  # the 404 hint lists them all
    api.requests.endpoints = {"/", "/web", *api.endpoints}
    config = api.services.config
    return tornado.web.Application(
        [(path, handler, dict(api=api)) for path, handler in routes],
        default_handler_class=NotFoundHandler,
        default_handler_args=dict(api=api),
        log_function=AccessLog(
            Throttle(config.client_errors_logged, config.client_errors_window), api.requests
        ),
        compress_response=False,
    )
