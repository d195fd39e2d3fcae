"""Each user's own notification destinations as the API serves them (destinations.py keeps
them on disk), the host's default for a user with none (--notify-user-default), and what became
of the last notice at each. A user is always the caller the API identified: nothing here takes
a name a caller gives."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from patroller.config import Config
from patroller.notify.delivery import NoApprise, Sender, apprise_plugin, shown
from patroller.notify.destinations import DestinationError, UserDestinations
from patroller.notify.messages import Notice
from patroller.notify.terminal import KINDS as ON_TERMINAL
from patroller.notify.terminal import TERMINAL

ON, NO_APPRISE = "on", "no_apprise"
TEST = "test"  # the kind of a user's own test notice


class People:
    """The users' side of notifications."""

    def __init__(
        self,
        config: Config,
        host: str,
        directory: str | None,
        plugin_of: Callable[[str], Sender | None],
        send: Callable[[Notice, str, Sequence[str]], None],
        forget: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.host = host
        self.plugin_of = plugin_of  # blocking: Apprise's sender for a URL, or None
        self.send = send  # a notice to a user's destinations, at her rate
        self.forget = forget  # a URL nobody uses now
        self.clock = clock
        self.available = False  # Apprise is there: set by the notifier at start
        self.terminal = False  # --notify-terminal: set by the notifier at start
        self.users = UserDestinations(
            directory, config.notify_user_most, config.notify_url_longest
        )
        self.last: dict[tuple[str, str], tuple[str, float]] = {}  # (user, url): result, when

    def urls_for(self, user: str, kind: str) -> tuple[str, ...]:
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

    def may_tell(self, kind: str, routed: bool) -> bool:
        """Whether any user may be told of `kind`, by what the settings say, before asking of
        each (in a storm, a thousand users a second have no destination): some user has
        settings of her own, or there is a default for those with none (`routed`: the users'
        destinations are served), or the host writes `kind` on terminals."""
        if routed and (self.users.anyone() or self.config.notify_user_default is not None):
            return True
        return self.terminal and kind in ON_TERMINAL

    def on_terminal(self, user: str, kind: str) -> bool:
        """Whether a notice of `kind` is written on `user`'s terminals: the host writes on
        terminals, that kind is one written there, and she muted neither it nor `terminal`."""
        if not self.terminal or kind not in ON_TERMINAL:
            return False
        muted = self.users.of(user).muted
        return kind not in muted and TERMINAL not in muted

    async def add(self, user: str, url: str) -> int:
        """Add a destination for `user` (checked with Apprise off the loop); its number."""
        self._check_available()
        url = url.strip()
        scheme = url.partition("://")[0].lower()
        if "://" not in url or scheme not in self.config.notify_user_schemes:
            raise DestinationError(
                f"url: {scheme[:20] + '://...' if '://' in url else 'not a URL'}"
                " is not a service users may name here; these are: "
                f"{', '.join(self.config.notify_user_schemes)}"
            )
        made = await asyncio.get_running_loop().run_in_executor(None, self.plugin_of, url)
        if made is None:
            raise DestinationError(
                f"url: Apprise does not take this {scheme}:// URL (a part "
                "its service needs is missing or wrong)"
            )
        return self.users.add(user, url)

    def remove(self, user: str, number: int) -> None:
        url = self.users.remove(user, number)
        self.last.pop((user, url), None)
        if not any(url in self.users.of(u).urls for u in self.users.users()):
            self.forget(url)

    def mute(self, user: str, kind: str, muted: bool) -> tuple[str, ...]:
        return self.users.mute(user, kind, muted)

    async def listing(self, user: str) -> dict[str, Any]:
        """`user`'s destinations as she may see them (each in Apprise's privacy form, its
        secrets starred) with the last result at each, her muted kinds, the default, and her
        terminals when the host writes on them."""
        own = self.users.of(user)
        shown_urls = (
            await asyncio.get_running_loop().run_in_executor(None, self._privately, own.urls)
            if self.available
            else ["(Apprise is not installed)"] * len(own.urls)
        )
        listed = []
        for number, (url, words) in enumerate(zip(own.urls, shown_urls, strict=True), 1):
            result, at = self.last.get((user, url), (None, None))
            listed.append({"n": number, "url": words, "last": result, "at": at})
        default = not own.urls and bool(
            self.urls_for(user, "trespass") or self.config.notify_user_default
        )
        found = {
            "user": user,
            "destinations": listed,
            "muted": list(own.muted),
            "default": default,
            "state": ON if self.available else NO_APPRISE,
        }
        if self.terminal:  # the host writes on terminals: whether on hers, and how it went
            result, at = self.last.get((user, TERMINAL), (None, None))
            found["terminal"] = {"on": TERMINAL not in own.muted, "last": result, "at": at}
        return found

    def _privately(self, urls: Sequence[str]) -> list[str]:
        found = []
        for url in urls:
            try:
                plugin = apprise_plugin(url, self.config.notify_timeout)
            except NoApprise:
                plugin = None
            found.append(
                shown(plugin)
                if plugin is not None
                else url.partition("://")[0] + "://(not taken by Apprise)"
            )
        return found

    def test(self, user: str) -> int:
        """A test notice to `user`'s destinations (or the default); how many it went to."""
        self._check_available()
        urls = self.urls_for(user, TEST)
        if TEST in self.users.of(user).muted:
            raise DestinationError("you muted test notices: patroller notify unmute test")
        if not urls:
            raise DestinationError("you have no destination: patroller notify add URL")
        notice = Notice(
            TEST,
            (TEST, user, str(self.clock())),
            user,
            (),
            f"{self.host}: a test from Patroller",
            f"This is a test notice for {user} from Patroller on {self.host}. "
            "Notices of trespasses, granted waits and lost GPUs that concern you "
            "come here.",
            concerns=(user,),
        )
        self.send(notice, user, urls)
        return len(urls)

    def _check_available(self) -> None:
        if not self.available:
            raise DestinationError(
                "notifications are off on this host (Apprise is not "
                "installed: pip install 'patroller[notify]')"
            )
