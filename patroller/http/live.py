"""The live feed of the web page: one snapshot of everything the page shows, sent as a
Server-Sent Event to every open page after each change, at most once a second.

The feed follows the same change notifications as the waiters and /status (the lease manager's
and the statistics' on_change callbacks): a change schedules one flush; the snapshot is built and
serialized once per flush, whatever the number of pages; with no change nothing is sent but a
keep-alive comment every `feed_keepalive` seconds (so that proxies keep the stream open), and
with no page open a change costs one call that returns. With --hide-users each page is sent the
snapshot as its caller may see it (hiding.py): serialized once per way of seeing it, not per
page.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from tornado.ioloop import IOLoop

from patroller.config import Config
from patroller.core.identity import Viewer
from patroller.http.encoding import dumps
from patroller.http.hiding import NOBODY, Shown


class Page(Protocol):
    """One open page: writes the feed's messages to its connection."""

    def write(self, message: bytes) -> None: ...

    def close(self) -> None: ...


class LiveFeed:
    """Sends `snapshot()` (JSON data) to every open page after changes, coalesced; as each
    page's caller sees it when `views` is given (--hide-users)."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        config: Config,
        clock: Callable[[], float] = time.monotonic,
        views: Callable[[dict[str, Any]], Shown] | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.views = views
        self.every = config.feed_every
        self.keepalive = config.feed_keepalive
        self.max_pages = config.max_pages
        self.max_pages_per_user = config.max_pages_per_user
        self.max_pages_unidentified = config.max_pages_unidentified
        self.retry_ms = config.feed_retry_ms
        self.clock = clock
        self.pages: set[Page] = set()
        self._of: dict[Page, str | None] = {}  # page -> its caller (None: unidentified)
        self._per: dict[str | None, int] = {}  # caller -> pages open
        self._viewer: dict[Page, Viewer] = {}  # page -> the names its caller may see
        self._last = -self.every  # when the last snapshot was built
        self._flush: object | None = None
        self._ping: object | None = None
        self._loop: IOLoop | None = None

    def start(self) -> None:
        self._loop = IOLoop.current()

    def stop(self) -> None:
        """End every page's stream (browsers reconnect by themselves) and stop sending."""
        for timer in (self._flush, self._ping):
            if timer is not None and self._loop is not None:
                self._loop.remove_timeout(timer)
        self._flush = self._ping = None
        for page in list(self.pages):
            page.close()
        self.pages.clear()
        self._of.clear()
        self._per.clear()
        self._viewer.clear()
        self._loop = None

    def full(self, caller: str | None) -> str | None:
        """Why one more page of `caller` (None: unidentified callers, who share a small pool)
        is refused, or None: the pages in all, or the caller's own, are at their limit."""
        if len(self.pages) >= self.max_pages:
            return f"too many open pages ({len(self.pages)})"
        mine = self._per.get(caller, 0)
        limit = self.max_pages_unidentified if caller is None else self.max_pages_per_user
        if mine >= limit:
            who = "unidentified callers" if caller is None else caller
            return (
                f"{who} {'have' if caller is None else 'has'} {mine} pages open, the most "
                "allowed: close one"
            )
        return None

    def add(self, page: Page, caller: str | None = None, viewer: Viewer = NOBODY) -> None:
        """A new page of `caller`, who sees names as `viewer` may: the retry delay and the
        current snapshot at once."""
        self.pages.add(page)
        self._of[page] = caller
        self._per[caller] = self._per.get(caller, 0) + 1
        self._viewer[page] = viewer
        body = self._build()(viewer)
        page.write(f"retry: {self.retry_ms}\n\n".encode() + self._message(body))
        self._arm_ping()

    def remove(self, page: Page) -> None:
        self.pages.discard(page)
        self._viewer.pop(page, None)
        if page in self._of:
            caller = self._of.pop(page)
            left = self._per[caller] - 1
            if left:
                self._per[caller] = left
            else:
                del self._per[caller]

    def changed(self) -> None:
        """Something the page shows changed: send within `every` seconds."""
        if not self.pages or self._flush is not None or self._loop is None:
            return
        delay = max(0.0, self._last + self.every - self.clock())
        self._flush = self._loop.call_later(delay, self._send)

    def _send(self) -> None:
        self._flush = None
        if not self.pages:
            return
        body_for = self._build()
        messages: dict[int, bytes] = {}  # id(body) -> its message: one per way of seeing it
        for page in list(self.pages):
            body = body_for(self._viewer.get(page, NOBODY))
            message = messages.get(id(body))
            if message is None:
                message = messages[id(body)] = self._message(body)
            page.write(message)

    def _build(self) -> Callable[[Viewer], bytes]:
        """The snapshot now, serialized: the same for every viewer, unless names are hidden."""
        self._last = self.clock()
        data = self.snapshot()
        if self.views is None:
            body = dumps(data)
            return lambda viewer: body
        return self.views(data).body

    @staticmethod
    def _message(data: bytes) -> bytes:
        return b"event: snapshot\ndata: " + data + b"\n\n"

    def _arm_ping(self) -> None:
        if self._ping is None and self._loop is not None:
            self._ping = self._loop.call_later(self.keepalive, self._keepalive)

    def _keepalive(self) -> None:
        self._ping = None
        if not self.pages:
            return
        for page in list(self.pages):
            page.write(b": keep-alive\n\n")
        self._arm_ping()
