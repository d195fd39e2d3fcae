"""The lease rules' events taken a few at each turn of the loop.

The lease rules hand the notifier their events as they happen, on the loop, and a reading can
bring many at once: a thousand trespasses, each of which costs the loop tens of microseconds
(its episode, its rate, its line in the outbox). Handled together, they hold the loop for
milliseconds, and every request that came meanwhile waits for all of them. So an event is
handled at once while fewer than `each` were handled in this turn of the loop; past that, it
waits in a backlog, and `each` of those are handled at each following turn, in the order they
came, the sockets that became ready served between two turns. Beside a storm of 1,000 events
a second handed in bursts of ten (bench/notify.py, the default rate, both in one run of wrk),
`/status`'s p99 read 1.14x of the same daemon's without the storm when each burst was handled
whole, and 1.06x when one event was handled a turn (docs/performance.md).

The backlog is bounded: past `most` events waiting, an event is dropped, counted and logged
(once a `repeat_log_every`). At the stop what waits is handled at once (`finish`). A bug in
one event's handling is logged (its traceback once a `repeat_log_every`), and the events
after it are handled still.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from patroller.config import Config
from patroller.core.leases import Event
from patroller.core.throttle import Throttle

log = logging.getLogger(__name__)


class Turns:
    """Hands each event to `handle`, at most `each` (Config.notify_per_turn) in a turn of the
    loop running at `start`, `most` (notify_backlog) waiting."""

    def __init__(self, handle: Callable[[Event], None], config: Config) -> None:
        self.handle = handle
        self.each = max(1, config.notify_per_turn)
        self.most = config.notify_backlog
        self.dropped = 0  # events not handled: the backlog was full
        self._backlog: deque[Event] = deque()
        self._handled = 0  # events handled in this turn
        self._turning = False  # the next turn is asked for
        self._call_soon: Callable[[Callable[[], None]], Any] | None = None
        self._failing = Throttle(1, config.repeat_log_every)  # the warning of a drop
        self._broken = Throttle(1, config.repeat_log_every)  # a bug's traceback

    def start(self) -> None:
        """On the running loop: its call_soon runs a callback at the loop's next turn (after
        it has looked at its sockets). Without one, each event is handled as it comes."""
        try:
            self._call_soon = asyncio.get_running_loop().call_soon
        except RuntimeError:
            self._call_soon = None

    def counts(self) -> dict[str, int]:
        """For /metrics: the events waiting now and those dropped."""
        return {"events_waiting": self.waiting, "events_dropped": self.dropped}

    @property
    def waiting(self) -> int:
        return len(self._backlog)

    def put(self, event: Event) -> None:
        """An event of the lease rules (on the loop): handled now, or at a later turn."""
        if self._call_soon is None:  # not started (or stopped): as it comes
            self._handle(event)
            return
        if self._backlog or self._handled >= self.each:
            if len(self._backlog) >= self.most:
                self._drop()
                return
            self._backlog.append(event)  # a turn is asked for: one was, for those before it
        else:
            self._handled += 1
            self._next()  # the next turn counts afresh
            self._handle(event)

    def finish(self) -> None:
        """Handle every event waiting, now (at the stop, on the loop); later ones as they come."""
        self._call_soon = None
        backlog = self._backlog
        while backlog:
            self._handle(backlog.popleft())

    def _next(self) -> None:
        if not self._turning and self._call_soon is not None:
            self._turning = True
            self._call_soon(self._turn)

    def _turn(self) -> None:
        """A new turn of the loop: up to `each` of the events waiting."""
        self._turning = False
        self._handled = 0
        backlog = self._backlog
        if backlog:  # this turn counts what comes later in it; the next one is asked
            self._next()
        while backlog and self._handled < self.each:
            self._handled += 1
            self._handle(backlog.popleft())

    def _handle(self, event: Event) -> None:
        """One event handled; a bug in its handling is logged (once a repeat_log_every) and
        the next events are handled still (the stop too)."""
        try:
            self.handle(event)
        except Exception:
            if self._broken.admit()[0]:
                log.exception(
                    "notifications: an event of kind %s could not be handled", event.kind
                )

    def _drop(self) -> None:
        self.dropped += 1
        admitted, before = self._failing.admit()
        if admitted:
            log.warning(
                "notifications: %d events wait to be handled: an event is dropped%s",
                len(self._backlog),
                f" ({before} more since the last warning)" if before else "",
            )
