"""The follower of the lease rules' events that tells people: each event's notices
(messages.py), each told once per episode and at each destination's rate (episodes.py), queued
for delivery off the loop (delivery.py), and one line in the audit record for each notice at
each destination: its kind, its recipient and what became of it, never the URL.

This step tells the admin's destinations (--notify), of the kinds --notify-events names. The
admin is the host's root, who sees every name: the notices name every user."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from tornado.ioloop import IOLoop

from patroller.config import Config
from patroller.core.leases import Event
from patroller.notify.delivery import (BadDestination, Delivery, NoApprise, Outcome, Sender,
                                       apprise_senders, shown)
from patroller.notify.episodes import Episodes, Rates
from patroller.notify.messages import notices_of
from patroller.state.audit import AuditLog

log = logging.getLogger(__name__)

OFF, ON, NO_APPRISE = "off", "on", "no_apprise"  # no destination; sending; Apprise missing
ADMIN = "admin"


class NotifyError(Exception):
    """A destination that cannot be used: the daemon does not start (the message says which,
    by number, never the URL)."""


class Notifier:
    """Tells the admin's destinations what the lease rules' events say."""

    def __init__(self, config: Config, host: str, audit: Optional[AuditLog],
                 clock: Callable[[], float] = time.time,
                 senders: Optional[Sequence[Sender]] = None) -> None:
        self.config = config
        self.host = host
        self.audit = audit
        self.clock = clock
        self.state = OFF
        self.repeats = 0  # notices not sent: their episode was told within --notify-repeat
        self.held = 0  # notices held back by a destination's rate
        self._senders = senders  # tests give their own; else Apprise's, made at start
        self._delivery: Optional[Delivery] = None
        self._episodes = Episodes(config.notify_repeat, config.notify_episodes, time.monotonic)
        self._rates = Rates(config.notify_rate, config.notify_rate_window, time.monotonic)
        self._loop: Optional[IOLoop] = None

    def start(self) -> None:
        """Ready the destinations and their threads. NotifyError for a URL that cannot be used;
        without Apprise, one warning and nothing is sent (the daemon runs as without
        --notify)."""
        urls = self.config.notify
        if not urls:
            return
        if self._senders is not None:
            senders, names = list(self._senders), [f"destination {n}" for n in
                                                   range(1, len(self._senders) + 1)]
        else:
            try:
                plugins = apprise_senders(urls, self.config.notify_timeout)
            except NoApprise as exc:
                self.state = NO_APPRISE
                log.warning("notifications are off: %s", exc)
                return
            except BadDestination as exc:
                raise NotifyError(str(exc)) from None
            senders = [self._sender(plugin) for plugin in plugins]
            names = [shown(plugin) for plugin in plugins]
        self._loop = IOLoop.current()
        self._delivery = Delivery(senders, names, self.config, self._told)
        self._delivery.start()
        self.state = ON
        log.info("notifications: %d destination(s) (%s), told of %s", len(names),
                 "; ".join(names), ", ".join(self.config.notify_events))

    @staticmethod
    def _sender(plugin: Any) -> Sender:
        return lambda title, body: bool(plugin.notify(body=body, title=title))

    def on_event(self, event: Event) -> None:
        """An event of the lease rules (on the loop: quick, never blocks)."""
        if self._delivery is None:
            return
        for notice in notices_of(event, self.host, self.clock()):
            if notice.ends and not self._episodes.end(notice.ends):
                continue  # the end of an episode nobody was told of
            if notice.kind not in self.config.notify_events:
                continue
            if not self._episodes.admit(notice.key):
                self.repeats += 1
                continue
            for destination in self._delivery.destinations:
                sent = self._rates.admit(destination.number, notice)
                if sent is None:
                    self.held += 1
                else:
                    destination.put(sent)

    def stop(self, timeout: float) -> None:
        """Blocking: end the destinations' threads within `timeout` seconds."""
        if self._delivery is not None:
            hung = self._delivery.stop(timeout)
            if hung:
                log.warning("notifications: %d destination(s) still sending at stop; what they "
                            "had queued is not sent", hung)
            self._delivery = None

    def metrics(self) -> Dict[str, Any]:
        """For /metrics: the state, and the notices by kind and result."""
        delivery = self._delivery
        return {"state": self.state,
                "destinations": len(delivery.destinations) if delivery else 0,
                "pending": sum(d.pending() for d in delivery.destinations) if delivery else 0,
                "repeats": self.repeats, "held": self.held,
                "by_kind": delivery.counts.snapshot() if delivery else {}}

    # -- from the destinations' threads -----------------------------------------------------

    def _told(self, outcome: Outcome) -> None:
        loop = self._loop
        if loop is not None:
            loop.add_callback(self._record, outcome)

    def _record(self, outcome: Outcome) -> None:
        notice = outcome.notice
        if outcome.result != "sent":
            log.warning("notifications: a %s notice %s at destination %d (%s)", notice.kind,
                        "was dropped: its queue was full" if outcome.result == "dropped" else
                        f"could not be sent in {outcome.tries} tries", outcome.destination,
                        self._name(outcome.destination))
        if self.audit is not None:
            self.audit.record(Event("notify", notice.user, notice.devices, {
                "kind": notice.kind, "recipient": ADMIN, "destination": outcome.destination,
                "result": outcome.result, "tries": outcome.tries}))

    def _name(self, number: int) -> str:
        delivery = self._delivery
        return delivery.destinations[number - 1].name if delivery else str(number)

    def names(self) -> List[str]:
        """The destinations in words, without their secrets."""
        delivery = self._delivery
        return [d.name for d in delivery.destinations] if delivery else []
