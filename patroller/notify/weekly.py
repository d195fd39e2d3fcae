"""The weekly digest's timer and its reading: on the event loop, a timer that wakes at the
next due time (digest.py computes it), or every Config.notify_digest_recheck seconds before,
so that a wall clock set meanwhile, or a host that slept, is followed; at the due time the
week's usage is read off the loop through the usage store's reader, and each notice handed to
the notifier, which tells each user hers and the admin the lab's.

No usage store (--usage none, no state directory, a read-only one): no digest, said once at
start. A store failing to write when a digest is due (its week is not whole), or one that
cannot be read: that week's digest is not sent, said in one log line; the timer goes on."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from tornado.ioloop import IOLoop

from patroller.config import Config
from patroller.config.values import time_zone
from patroller.notify.digest import lab_notice, lab_of, next_due, since_for, span, user_notice
from patroller.notify.messages import Notice
from patroller.state.usage.store import UsageStore

log = logging.getLogger(__name__)

UNREADABLE = ("failing", "read_only", "stopped")  # the store's states that give no digest


class Digests:
    """Each week's digest of the usage store's figures, due at Config.notify_digest."""

    def __init__(
        self,
        config: Config,
        host: str,
        usage: UsageStore | None,
        clock: Callable[[], float],
        tell: Callable[[Notice], None],
    ) -> None:
        assert config.notify_digest is not None
        self.config = config
        self.when = config.notify_digest
        self.zone = time_zone(self.when[3])
        self.host = host
        self.usage = usage
        self.clock = clock  # wall clock, epoch seconds
        self.tell = tell  # a notice to its recipient: the admin (user None) or its user
        self.due: float | None = None  # the next digest's time; None: none will come
        self.weeks = 0  # digests read and told
        self._timer: Any | None = None  # IOLoop.call_later's handle
        self._loop: IOLoop | None = None
        self._sending: asyncio.Future[int] | None = None

    def start(self) -> None:
        """Arm the timer, unless there is no usage store to read (said once). Its first look
        comes once the daemon's start is over: whether the store's filesystem is read-only is
        known only once the store is opened, after the notifier starts."""
        if self.usage is None:
            self._none()
            return
        self._loop = IOLoop.current()
        self.due = next_due(self.clock(), self.when, self.zone)
        weekday, hour, minute, zone = self.when
        log.info(
            "notifications: the weekly digest %s %02d:%02d %s, next at %s UTC",
            ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[weekday],
            hour,
            minute,
            zone,
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.due)),
        )
        self._timer = self._loop.call_later(0, self._wake)

    def _none(self) -> None:
        self.due = None
        log.warning(
            "notifications: no weekly digest (--notify-digest): there is no usage "
            "store to read (--usage none, no state directory, or a read-only one)"
        )

    def stop(self) -> None:
        """No more digests; callable from any thread (the notifier stops in one of its own):
        the timer and a digest being read are let go on the loop."""
        self.due = None
        if self._loop is not None:
            self._loop.add_callback(self._halt)

    def _halt(self) -> None:
        if self._timer is not None and self._loop is not None:
            self._loop.remove_timeout(self._timer)
        self._timer = None
        if self._sending is not None:
            self._sending.cancel()

    def _arm(self) -> None:
        assert self._loop is not None and self.due is not None
        wait = min(max(0.0, self.due - self.clock()), self.config.notify_digest_recheck)
        self._timer = self._loop.call_later(wait, self._wake)

    def _wake(self) -> None:
        self._timer = None
        if self.due is None:
            return
        if self.usage is not None and self.usage.state == "read_only":
            self._none()
            return
        now = self.clock()
        if now >= self.due:
            due, self.due = self.due, next_due(now, self.when, self.zone)
            self._sending = asyncio.ensure_future(self.send(due))
            self._sending.add_done_callback(self._sent)
        self._arm()

    def _sent(self, done: asyncio.Future[int]) -> None:
        """A bug of the digest's own is logged, never left in an unread future."""
        if not done.cancelled() and done.exception() is not None:
            log.error("notifications: the weekly digest failed", exc_info=done.exception())

    async def send(self, due: float) -> int:
        """The week before `due` read (off the loop) and told; how many notices were handed
        on (0: none, said in the log). The timer's work, and the tests' way to a digest now."""
        usage = self.usage
        if usage is None or usage.state in UNREADABLE:
            log.warning(
                "notifications: no weekly digest this time: the usage store is %s",
                usage.state if usage is not None else "off",
            )
            return 0
        since = since_for(due)
        try:
            totals = await usage.report(since, due, "user")
        except Exception as exc:  # Unavailable, or the reader's own bug: no digest, no crash
            log.warning(
                "notifications: no weekly digest this time: the usage store could not "
                "be read (%s)",
                str(exc)[:200],
            )
            return 0
        lab = lab_of(totals.rows, self.config.notify_digest_least)
        when = span(since, due, self.zone, self.when[3])
        notices = [lab_notice(self.host, lab, when, due, self.config.notify_digest_lines)]
        notices += [user_notice(self.host, week, when, due) for week in lab.users]
        for notice in notices:
            self.tell(notice)
        self.weeks += 1
        return len(notices)
