"""The follower of the lease rules' events that tells people: each event's notices
(messages.py), each told once per episode and at each destination's rate (episodes.py), queued
for delivery off the loop (delivery.py), and one line in the audit record for each notice at
each destination: its kind, its recipient and what became of it, never the URL.

Who is told: the admin's destinations (--notify) of the kinds --notify-events names, with every
name; and each user the notice concerns (a trespass: the trespasser and the holder; a wait
granted: the waiter; a GPU lost or back: its holder) at her own destinations
(destinations.py), or at --notify-user-default's, unless she muted that kind. With
--hide-users a user's notice names nobody else (messages.Reader), as the API would not."""
from __future__ import annotations

import importlib.util
import logging
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tornado.ioloop import IOLoop

from patroller.config import Config
from patroller.core.leases import Event
from patroller.notify.delivery import (BadDestination, Delivery, NoApprise, Outcome, Router,
                                       Sender, apprise_plugin, apprise_senders, sender_of,
                                       shown)
from patroller.notify.destinations import DestinationError, UserDestinations
from patroller.notify.episodes import Episodes, Rates
from patroller.notify.messages import Notice, Reader, notices_of
from patroller.state.audit import AuditLog

log = logging.getLogger(__name__)

OFF, ON, NO_APPRISE = "off", "on", "no_apprise"  # nobody told; sending; Apprise missing
ADMIN = "admin"
TEST = "test"  # the kind of a user's own test notice


class NotifyError(Exception):
    """A destination that cannot be used: the daemon does not start (the message says which,
    by number, never the URL)."""


PluginOf = Callable[[str], Optional[Sender]]


class Notifier:
    """Tells the admin's and the users' destinations what the lease rules' events say."""

    def __init__(self, config: Config, host: str, audit: Optional[AuditLog],
                 directory: Optional[str] = None, clock: Callable[[], float] = time.time,
                 senders: Optional[Sequence[Sender]] = None,
                 plugin_of: Optional[PluginOf] = None) -> None:
        self.config = config
        self.host = host
        self.audit = audit
        self.clock = clock
        self.state = OFF
        self.repeats = 0  # notices not sent: their episode was told within --notify-repeat
        self.held = 0  # notices held back by a destination's rate
        self.users = UserDestinations(directory, config.notify_user_most,
                                      config.notify_url_longest)
        self.last: Dict[Tuple[str, str], Tuple[str, float]] = {}  # (user, url): result, when
        self._senders = senders  # tests give their own; else Apprise's, made at start
        self._plugin_of = plugin_of or self._apprise_sender
        self._delivery: Optional[Delivery] = None
        self._router: Optional[Router] = None
        self._episodes = Episodes(config.notify_repeat, config.notify_episodes, time.monotonic)
        self._rates = Rates(config.notify_rate, config.notify_rate_window, time.monotonic)
        self._loop: Optional[IOLoop] = None

    def _apprise_sender(self, url: str) -> Optional[Sender]:
        plugin = apprise_plugin(url, self.config.notify_timeout)
        return sender_of(plugin) if plugin is not None else None

    def start(self) -> None:
        """Read the users' destinations and ready the admin's and the threads. NotifyError for
        an admin's URL that cannot be used; without Apprise, one warning when destinations were
        given, and nothing is sent."""
        self._loop = IOLoop.current()
        self.users.open()
        urls = self.config.notify
        if self._senders is not None:
            senders = list(self._senders)
            names = [f"destination {n}" for n in range(1, len(senders) + 1)]
        else:
            try:  # without URLs of the admin's, Apprise is loaded when a user's is first used
                plugins = apprise_senders(urls, self.config.notify_timeout) if urls else \
                    _apprise_there()
            except NoApprise as exc:
                self.state = NO_APPRISE
                if urls or self.config.notify_user_default or self.users.users():
                    log.warning("notifications are off: %s", exc)
                return
            except BadDestination as exc:
                raise NotifyError(str(exc)) from None
            senders = [sender_of(plugin) for plugin in plugins]
            names = [shown(plugin) for plugin in plugins]
        self._delivery = Delivery(senders, names, self.config, self._told)
        self._delivery.start()
        self._router = Router(self.config, self._told, self._delivery.counts, self._plugin_of)
        self._router.start()
        self.state = ON
        if names:
            log.info("notifications: %d destination(s) of the admin (%s), told of %s",
                     len(names), "; ".join(names), ", ".join(self.config.notify_events))

    # -- the lease rules' events (on the loop: quick, never blocks) ---------------------------

    def on_event(self, event: Event) -> None:
        if self._delivery is None:
            return
        now = self.clock()
        for index, notice in enumerate(notices_of(event, self.host, now)):
            if notice.ends and not self._episodes.end(notice.ends):
                continue  # the end of an episode nobody was told of
            if not self._episodes.admit(notice.key):
                self.repeats += 1
                continue
            if notice.kind in self.config.notify_events:
                for destination in self._delivery.destinations:
                    self._send(destination.number, notice,
                               lambda sent, d=destination: d.put(sent))
            for user in notice.concerns:
                urls = self.urls_for(user, notice.kind)
                if not urls:
                    continue
                words = notice if not self.config.hide_users else \
                    notices_of(event, self.host, now, Reader(user))[index]
                self._send(("user", user), words,
                           lambda sent, u=user, to=urls: self._route(sent, u, to))

    def _send(self, rate_key: Any, notice: Notice, put: Callable[[Notice], None]) -> None:
        sent = self._rates.admit(rate_key, notice)
        if sent is None:
            self.held += 1
        else:
            put(sent)

    def _route(self, notice: Notice, user: str, urls: Sequence[str]) -> None:
        if self._router is not None:
            self._router.put(notice, user, urls)

    def urls_for(self, user: str, kind: str) -> Tuple[str, ...]:
        """Where `user` is told of `kind`: her own destinations, or the default's; none if she
        muted the kind."""
        own = self.users.of(user)
        if kind in own.muted:
            return ()
        if own.urls:
            return own.urls
        template = self.config.notify_user_default
        if template is None or ("{email}" in template and "@" not in user):
            return ()
        quoted = urllib.parse.quote(user, safe="@")  # a name is one part of the URL, never more
        return (template.replace("{user}", quoted).replace("{email}", quoted),)

    # -- a user's own destinations (the API; on the loop) -------------------------------------

    async def add(self, user: str, url: str) -> int:
        """Add a destination for `user` (checked with Apprise off the loop); its number."""
        self._check_available()
        url = url.strip()
        scheme = url.partition("://")[0].lower()
        if "://" not in url or scheme not in self.config.notify_user_schemes:
            raise DestinationError(f"url: {scheme[:20] + '://...' if '://' in url else 'not a URL'}"
                                   " is not a service users may name here; these are: "
                                   f"{', '.join(self.config.notify_user_schemes)}")
        assert self._loop is not None
        made = await self._loop.run_in_executor(None, self._plugin_of, url)
        if made is None:
            raise DestinationError(f"url: Apprise does not take this {scheme}:// URL (a part "
                                   "its service needs is missing or wrong)")
        return self.users.add(user, url)

    def remove(self, user: str, number: int) -> None:
        url = self.users.remove(user, number)
        self.last.pop((user, url), None)
        if self._router is not None and not any(url in self.users.of(u).urls
                                                for u in self.users.users()):
            self._router.forget(url)

    def mute(self, user: str, kind: str, muted: bool) -> Tuple[str, ...]:
        return self.users.mute(user, kind, muted)

    async def listing(self, user: str) -> Dict[str, Any]:
        """`user`'s destinations as she may see them (each in Apprise's privacy form, its
        secrets starred) with the last result at each, her muted kinds, and the default."""
        own = self.users.of(user)
        loop = self._loop
        shown_urls = await loop.run_in_executor(None, self._privately, own.urls) \
            if loop is not None and self.state == ON else ["(Apprise is not installed)"] * \
            len(own.urls)
        listed = []
        for number, (url, words) in enumerate(zip(own.urls, shown_urls), 1):
            result, at = self.last.get((user, url), (None, None))
            listed.append({"n": number, "url": words, "last": result, "at": at})
        default = not own.urls and bool(self.urls_for(user, "trespass") or
                                        self.config.notify_user_default)
        return {"user": user, "destinations": listed, "muted": list(own.muted),
                "default": default, "state": self.state}

    def _privately(self, urls: Sequence[str]) -> List[str]:
        found = []
        for url in urls:
            try:
                plugin = apprise_plugin(url, self.config.notify_timeout)
            except NoApprise:
                plugin = None
            found.append(shown(plugin) if plugin is not None else
                         url.partition("://")[0] + "://(not taken by Apprise)")
        return found

    def test(self, user: str) -> int:
        """A test notice to `user`'s destinations (or the default); how many it went to."""
        self._check_available()
        urls = self.urls_for(user, TEST)
        if TEST in self.users.of(user).muted:
            raise DestinationError("you muted test notices: patroller notify unmute test")
        if not urls:
            raise DestinationError("you have no destination: patroller notify add URL")
        notice = Notice(TEST, (TEST, user, str(self.clock())), user, (),
                        f"{self.host}: a test from Patroller",
                        f"This is a test notice for {user} from Patroller on {self.host}. "
                        "Notices of trespasses, granted waits and lost GPUs that concern you "
                        "come here.", concerns=(user,))
        self._send(("user", user), notice, lambda sent: self._route(sent, user, urls))
        return len(urls)

    def _check_available(self) -> None:
        if self.state != ON:
            raise DestinationError("notifications are off on this host (Apprise is not "
                                   "installed: pip install 'patroller[notify]')")

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
        if hung:
            log.warning("notifications: %d destination(s) still sending at stop; what they "
                        "had queued is not sent", hung)

    def metrics(self) -> Dict[str, Any]:
        """For /metrics: the state, and the notices by kind and result."""
        delivery, router = self._delivery, self._router
        return {"state": self.state,
                "destinations": len(delivery.destinations) if delivery else 0,
                "users": len(self.users.users()),
                "pending": (sum(d.pending() for d in delivery.destinations) if delivery else 0)
                + (router.pending() if router else 0),
                "repeats": self.repeats, "held": self.held,
                "by_kind": delivery.counts.snapshot() if delivery else {}}

    # -- from the destinations' threads -----------------------------------------------------

    def _told(self, outcome: Outcome) -> None:
        loop = self._loop
        if loop is not None:
            loop.add_callback(self._record, outcome)

    def _record(self, outcome: Outcome) -> None:
        notice = outcome.notice
        if outcome.recipient != ADMIN:
            self.last[(outcome.recipient, outcome.key)] = (outcome.result, round(time.time(), 3))
        if outcome.result != "sent":
            log.warning("notifications: a %s notice %s at %s's destination %d", notice.kind,
                        "was dropped: its queue was full" if outcome.result == "dropped" else
                        f"could not be sent in {outcome.tries} tries", outcome.recipient,
                        outcome.destination)
        if self.audit is not None:
            self.audit.record(Event("notify", notice.user, notice.devices, {
                "kind": notice.kind, "recipient": outcome.recipient,
                "destination": outcome.destination, "result": outcome.result,
                "tries": outcome.tries}))


def _apprise_there() -> List[Any]:
    """No plugin; NoApprise if Apprise is not installed (found, not loaded: it takes 0.3 s)."""
    if importlib.util.find_spec("apprise") is None:
        raise NoApprise("Apprise is not installed: pip install 'patroller[notify]'")
    return []
