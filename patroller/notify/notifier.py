"""The follower of the lease rules' events that tells people: each event's notices
(messages.py), each told once per episode and at each destination's rate (episodes.py), queued
for delivery off the loop (delivery.py), and one line in the audit record for each notice at
each destination: its kind, its recipient and what became of it, never the URL.

Who is told: the admin's destinations (--notify) of the kinds --notify-events names, with every
name; and each user the notice concerns (a trespass: the trespasser and the holder; a wait
granted: the waiter; a GPU lost or back: its holder) at her own destinations
(destinations.py), or at --notify-user-default's, unless she muted that kind. With
--hide-users a user's notice names nobody else (messages.Reader), as the API would not.

What is queued and each episode told are kept in the outbox (outbox.py): after a restart a
notice still pending is sent, once, and an episode told before is not told again within
--notify-repeat (a trespass still going on still reaches the admin after --notify-escalate,
counted from when it was first told).

With --notify-digest, each week's digest (weekly.py, digest.py): each user's own week to her,
the lab's table to the admin (if --notify-events names `digest`), once per week each, and not
held back by a destination's rate (one a week is no flood)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from tornado.ioloop import IOLoop, PeriodicCallback

from patroller.config import Config
from patroller.core.leases import Event, LeaseManager
from patroller.core.throttle import Throttle
from patroller.notify.admins import NotifyError as NotifyError  # app.py's
from patroller.notify.admins import admins, apprise_sender
from patroller.notify.delivery import Delivery, NoApprise, Router, Sender
from patroller.notify.digest import KIND as DIGEST
from patroller.notify.digest import WEEK
from patroller.notify.episodes import Episodes, Rates
from patroller.notify.messages import Notice, Words, tolds_of
from patroller.notify.outbox import Outbox, tag_of
from patroller.notify.outcomes import Outcomes
from patroller.notify.people import NO_APPRISE, ON, People
from patroller.notify.resume import resume
from patroller.notify.terminal import Terminals
from patroller.notify.turns import Turns
from patroller.notify.watch import Escalations, Troubles, look
from patroller.notify.weekly import Digests
from patroller.state.audit import AuditLog
from patroller.state.usage.store import UsageStore

log = logging.getLogger(__name__)

OFF = "off"  # nobody is told (ON: sending; NO_APPRISE: Apprise is missing)


PluginOf = Callable[[str], Sender | None]


class Notifier:
    """Tells the admin's and the users' destinations what the lease rules' events say, and
    what the watch finds (watch.py) every `notify_check_every` seconds."""

    def __init__(
        self,
        config: Config,
        host: str,
        audit: AuditLog | None,
        directory: str | None = None,
        leases: LeaseManager | None = None,
        quiet_for: Callable[[str], float | None] = lambda uuid: None,
        clock: Callable[[], float] = time.time,
        senders: Sequence[Sender] | None = None,
        plugin_of: PluginOf | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.host = host
        self.audit = audit
        self.leases = leases  # what the watch looks at (None: no watch)
        self.quiet_for = quiet_for  # seconds a held GPU has computed nothing (observe/idle.py)
        # the daemon's own trouble now: (key, what, what to do) each (services.troubles)
        self.troubles: Callable[[], Sequence[tuple[str, str, str]]] = lambda: ()
        self._troubles = Troubles(config.notify_trouble_after)
        self.usage: UsageStore | None = None  # the weekly digest's figures (app.connect)
        self.digests: Digests | None = None  # with --notify-digest, once started
        self.clock = clock
        self.state = OFF
        self.repeats = 0  # notices not sent: their episode was told within --notify-repeat
        self.held = 0  # notices held back by a destination's rate
        self._senders = senders  # tests give their own; else Apprise's, made at start
        self.people = People(
            config,
            host,
            directory,
            plugin_of or (lambda url: apprise_sender(url, config.notify_timeout)),
            lambda notice, user, urls: self._to_user(notice.kind, lambda: notice, user, urls),
            lambda url: None if self._router is None else self._router.forget(url),
            clock,
        )
        self._delivery: Delivery | None = None
        self._router: Router | None = None
        # episodes and rates count in `monotonic` seconds
        self._episodes = Episodes(config.notify_repeat, config.notify_episodes, monotonic)
        self._rates = Rates(config.notify_rate, config.notify_rate_window, monotonic)
        self._terminal_rates = Rates(
            config.notify_terminal_rate, config.notify_terminal_rate_window, monotonic
        )
        self._terminals: Terminals | None = None  # the users' terminals (--notify-terminal)
        # the trespasses to tell the admin of, once they have lasted
        self._escalations = Escalations(config.notify_escalate, config.notify_episodes)
        self.outbox = Outbox(directory, config)
        self._checks: PeriodicCallback | None = None
        self._failing = Throttle(1, config.repeat_log_every)
        self._outcomes = Outcomes(config, audit, self.people.last, monotonic)
        self._told = self._outcomes.told
        self._loop: IOLoop | None = None
        self.turns = Turns(self.on_event, config)  # the lease rules' events, a few a turn

    def start(self) -> None:
        """Read the users' destinations and ready the admin's, the threads and the watch.
        NotifyError for an admin's URL that cannot be used; without Apprise, one warning when
        destinations were given, and nothing is sent but on the users' terminals."""
        self._loop = IOLoop.current()
        self.turns.start()
        self._outcomes.start()
        self.people.users.open()
        terminal = self.config.notify_terminal
        try:
            senders, names = admins(self.config, self._senders)
        except NoApprise as exc:
            self.state = NO_APPRISE
            if self.config.notify or self.config.notify_user_default or self.people.users.users():
                log.warning(
                    "notifications %s: %s",
                    "are off but on the users' terminals" if terminal else "are off",
                    exc,
                )
            if not terminal:
                return
            senders, names = [], []
        restored = self.outbox.open(self.clock())
        for key, at in restored.episodes.items():
            self._episodes.restore(key, self.clock() - at)
        tags = [tag_of(url) for url in self.config.notify] if self._senders is None else ()
        self._delivery = Delivery(senders, names, self.config, self._told, tags, self.outbox)
        self._delivery.start()
        if self.state != NO_APPRISE:
            self._router = Router(
                self.config, self._told, self._delivery.counts, self.people.plugin_of, self.outbox
            )
            self._router.start()
            resume(
                restored,
                self._delivery.destinations,
                self._router,
                self.people.urls_for,
                self.outbox,
                self.audit,
            )
            self.state = ON
            self.people.available = True
        if terminal:
            self._terminals = Terminals(self.config, self.host, self._told, self._delivery.counts)
            self._terminals.start()
            self.people.terminal = True
        if self.leases is not None:
            self._checks = PeriodicCallback(self.check, self.config.notify_check_every * 1000)
            self._checks.start()
        if self.config.notify_digest is not None:
            # the notifier's clock read at each look, not kept: the tests move it past the
            # time a digest is due
            self.digests = Digests(
                self.config, self.host, self.usage, lambda: self.clock(), self._tell_digest
            )
            self.digests.start()
        if names:
            log.info(
                "notifications: %d destination(s) of the admin (%s), told of %s",
                len(names),
                "; ".join(names),
                ", ".join(self.config.notify_events),
            )
        if terminal:
            log.info(
                "notifications: trespasses and ending holds are also written on the "
                "terminals of the users concerned (login records: %s)",
                self.config.notify_utmp,
            )

    # -- the lease rules' events, and the watch's (on the loop: quick, never blocks) ----------

    def on_event(self, event: Event) -> None:
        if self._delivery is None:
            return
        now = self.clock()
        for told in tolds_of(event, self.host, now):
            if told.ends and not self._episodes.end(told.ends):
                continue  # the end of an episode nobody was told of
            if told.ends:
                self.outbox.ended(told.ends)
            kind = told.kind
            admitted, told_before = self._episodes.look(
                told.key, self.config.notify_unreserved_repeat if kind == "unreserved" else None
            )
            if not admitted:
                self.repeats += 1
                if event.kind == "trespass":  # told before a restart, perhaps: still escalated
                    self._escalations.add(event, told.key, now - (told_before or 0.0))
                continue
            self.outbox.told(told.key, now)
            words: Words | None = None  # made once, and only for a notice that is sent
            if event.kind == "trespass" and self.config.notify_escalate > 0:
                self._escalations.add(event, told.key, now)
            elif kind in self.config.notify_events:
                for destination in self._delivery.destinations:
                    if destination.full():  # dropped before its words are made or it is rated
                        destination.drop(told.unworded())
                    else:
                        words = words or Words(told)
                        self._send(destination.number, kind, words.everyone, destination.put)
            if not told.concerns or not self.people.may_tell(kind, self._router is not None):
                continue  # no user has a destination or a terminal for it (a look, not a user's)
            for user in told.concerns:
                urls = self.people.urls_for(user, kind) if self._router is not None else ()
                terminal = self.people.on_terminal(user, kind)
                if not urls and not terminal:
                    continue
                words = words or Words(told)
                hers = words.everyone if not self.config.hide_users else partial(words.of, user)
                if urls:
                    self._to_user(kind, hers, user, urls)
                if terminal:
                    self._to_terminal(kind, hers, user)

    def check(self) -> None:
        """The watch: holds idle or ending, and trespasses to escalate to the admin (a bug of
        its own is logged once a `repeat_log_every`, never every time)."""
        try:
            self._check()
        except Exception:
            if self._failing.admit()[0]:
                log.exception("notifications: the watch failed")

    def _check(self) -> None:
        if self.leases is None or self._delivery is None:
            return
        ended, events = look(
            self.leases,
            self.quiet_for,
            self._troubles,
            self.troubles(),
            self._escalations,
            self.config,
            self.clock(),
        )
        for key in ended:  # the daemon's trouble over: told again if it comes back
            self._episodes.end(key)
        for event in events:
            self.on_event(event)
        self._outcomes.flush()  # the notices dropped and counted, not written one by one

    def _tell_digest(self, notice: Notice) -> None:
        """A digest to its recipient (the admin: user None), once: its key names its week."""
        if self._delivery is None:
            return
        if not self._episodes.admit(notice.key, WEEK):
            self.repeats += 1
            return
        if notice.user is None:
            if DIGEST in self.config.notify_events:
                for destination in self._delivery.destinations:
                    destination.put(notice)
            return
        urls = self.people.urls_for(notice.user, DIGEST)
        if urls:
            self._route(notice, notice.user, urls)

    def _to_user(
        self, kind: str, words: Callable[[], Notice], user: str, urls: Sequence[str]
    ) -> None:
        self._send(("user", user), kind, words, lambda sent: self._route(sent, user, urls))

    def _to_terminal(self, kind: str, words: Callable[[], Notice], user: str) -> None:
        terminals = self._terminals
        if terminals is not None:  # at its own rate, apart from her other destinations'
            put = lambda sent: terminals.put(sent, user)  # noqa: E731
            self._send(user, kind, words, put, self._terminal_rates)

    def _send(
        self,
        rate_key: Any,
        kind: str,
        words: Callable[[], Notice],
        put: Callable[[Notice], None],
        rates: Rates | None = None,
    ) -> None:
        sent = (rates or self._rates).admit(rate_key, kind, words)
        if sent is None:
            self.held += 1
        else:
            put(sent)

    def _route(self, notice: Notice, user: str, urls: Sequence[str]) -> None:
        if self._router is not None:
            self._router.put(notice, user, urls)

    # -- the end, and what is counted --------------------------------------------------------

    def stop(self, timeout: float) -> None:
        """Blocking: end the destinations' threads within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        hung = 0
        if self._delivery is not None:
            hung += self._delivery.stop(timeout)
            self._delivery = None
        if self._router is not None:
            hung += self._router.stop(max(0.0, deadline - time.monotonic()))
            self._router = None
        if self._terminals is not None:
            self._terminals.stop()
            hung += not self._terminals.join(max(0.0, deadline - time.monotonic()))
            self._terminals = None
        checks, self._checks = self._checks, None
        if checks is not None:  # a PeriodicCallback is stopped on its loop (stop is called
            if self._loop is not None:  # from a thread of the executor's)
                self._loop.add_callback(checks.stop)
            else:
                checks.stop()
        self.outbox.stop(max(0.0, deadline - time.monotonic()))
        self._outcomes.flush_soon()  # the dropped notices counted, into the audit record
        if self.digests is not None:
            self.digests.stop()
        if hung:
            log.warning(
                "notifications: %d destination(s) still sending at stop; what they "
                "had queued is %s",
                hung,
                "sent at the next start" if self.outbox.on else "not sent",
            )

    def metrics(self) -> dict[str, Any]:
        """For /metrics: the state, and the notices by kind and result."""
        delivery, router, terminals = self._delivery, self._router, self._terminals
        return {
            "state": self.state,
            "destinations": len(delivery.destinations) if delivery else 0,
            "users": len(self.people.users.users()),
            "terminal": "on" if terminals else "off",
            "pending": (sum(d.pending() for d in delivery.destinations) if delivery else 0)
            + (router.pending() if router else 0)
            + (terminals.pending() if terminals else 0),
            "repeats": self.repeats,
            "held": self.held,
            **self.turns.counts(),
            "digest_next": self.digests.due if self.digests else None,
            "by_kind": delivery.counts.snapshot() if delivery else {},
        }
