"""The answers, accounted for: counted by endpoint and status for /metrics, and logged in
bounded lines, client errors rate-limited."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

import tornado.web

from patroller.core.throttle import Throttle
from patroller.durations import describe

access_log = logging.getLogger("patroller.access")

SHOWN_CHARS = 100  # of a path in a log line or an error message
SHOWN_METHOD_CHARS = 20


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """What a client sent, cut to `limit` characters and printable, for a log line or a message."""
    cut = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return cut + "..." if len(text) > limit else cut


class Requests:
    """HTTP answers by endpoint and status, callers refused because they could not be
    identified, and accept() calls that failed for want of descriptors: counted as they happen
    (an increment each)."""

    def __init__(self, endpoints: Iterable[str] = ()) -> None:
        self.endpoints = set(endpoints)
        self.answers: Counter[tuple[str, int]] = Counter()
        self.identity_failures = 0
        self.accept_failures = 0  # EMFILE, ENFILE...: each one followed by a pause (accepting.py)

    def count(self, path: str, status: int) -> None:
        if path.startswith("/web/"):
            path = "/web"
        self.answers[(path if path in self.endpoints else "other", status)] += 1


class AccessLog:
    """Tornado's log_function: successes at debug, errors at info and above, each line bounded.

    A line names the method and the path, cut, never the query (a 60 kB query once made 40 MB/s
    of log). Client errors (4xx) are rate-limited: past the limit they are counted, and the
    count is logged with the next line let through.
    """

    def __init__(self, throttle: Throttle, requests: Requests) -> None:
        self.throttle = throttle
        self.requests = requests

    def __call__(self, handler: tornado.web.RequestHandler) -> None:
        status = handler.get_status()
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
                access_log.info(
                    "%d client errors were not logged (at most %d per %s)",
                    held,
                    self.throttle.limit,
                    describe(self.throttle.window),
                )
        request = handler.request
        access_log.log(
            level,
            "%d %s %s%s (%s) %.1fms",
            status,
            shown(request.method or "", SHOWN_METHOD_CHARS),
            shown(request.path),
            "?..." if request.query else "",
            request.remote_ip,
            1000.0 * request.request_time(),
        )
