"""The live feed of the web page: one snapshot of everything the page shows, sent as a
Server-Sent Event to every open page after each change, at most once a second.

The feed follows the same change notifications as the waiters and /status (the lease manager's
and the statistics' on_change callbacks): a change schedules one flush; the snapshot is built and
serialized once per flush, whatever the number of pages; with no change nothing is sent but a
keep-alive comment every KEEPALIVE seconds (so that proxies keep the stream open), and with no
page open a change costs one call that returns.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Dict, Optional, Set

from tornado.ioloop import IOLoop

log = logging.getLogger(__name__)

EVERY = 1.0  # seconds at least between two snapshots
KEEPALIVE = 15.0  # seconds between keep-alive comments
MAX_STREAMS = 200  # open pages at once
RETRY_MS = 1000  # how soon a browser reconnects after the stream ends


class Stream:
    """One open page: writes the feed's messages to its connection."""

    def write(self, message: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class LiveFeed:
    """Sends `snapshot()` (JSON data) to every stream after changes, coalesced."""

    def __init__(self, snapshot: Callable[[], Dict[str, Any]], every: float = EVERY,
                 keepalive: float = KEEPALIVE, max_streams: int = MAX_STREAMS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.snapshot = snapshot
        self.every = every
        self.keepalive = keepalive
        self.max_streams = max_streams
        self.clock = clock
        self.streams: Set[Stream] = set()
        self.sent = 0  # snapshots built and sent
        self._last = -every  # when the last snapshot was built
        self._flush: Optional[object] = None
        self._ping: Optional[object] = None
        self._loop: Optional[IOLoop] = None

    def start(self) -> None:
        self._loop = IOLoop.current()

    def stop(self) -> None:
        """End every stream (browsers reconnect by themselves) and stop sending."""
        for timer in (self._flush, self._ping):
            if timer is not None and self._loop is not None:
                self._loop.remove_timeout(timer)
        self._flush = self._ping = None
        for stream in list(self.streams):
            stream.close()
        self.streams.clear()
        self._loop = None

    def full(self) -> bool:
        return len(self.streams) >= self.max_streams

    def add(self, stream: Stream) -> None:
        """A new page: the retry delay and the current snapshot at once."""
        self.streams.add(stream)
        stream.write(f"retry: {RETRY_MS}\n\n".encode() + self._message(self._build()))
        self._arm_ping()

    def remove(self, stream: Stream) -> None:
        self.streams.discard(stream)

    def changed(self) -> None:
        """Something the page shows changed: send within `every` seconds."""
        if not self.streams or self._flush is not None or self._loop is None:
            return
        delay = max(0.0, self._last + self.every - self.clock())
        self._flush = self._loop.call_later(delay, self._send)

    def _send(self) -> None:
        self._flush = None
        if not self.streams:
            return
        message = self._message(self._build())
        for stream in list(self.streams):
            stream.write(message)
        self.sent += 1

    def _build(self) -> bytes:
        self._last = self.clock()
        return json.dumps(self.snapshot(), separators=(",", ":")).encode()

    @staticmethod
    def _message(data: bytes) -> bytes:
        return b"event: snapshot\ndata: " + data + b"\n\n"

    def _arm_ping(self) -> None:
        if self._ping is None and self._loop is not None:
            self._ping = self._loop.call_later(self.keepalive, self._keepalive)

    def _keepalive(self) -> None:
        self._ping = None
        if not self.streams:
            return
        for stream in list(self.streams):
            stream.write(b": keep-alive\n\n")
        self._arm_ping()
