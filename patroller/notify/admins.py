"""The admin's destinations (--notify): one sender for each URL, and its name in words (never
the URL: Apprise's privacy form). Apprise is loaded here, at start, or when a user's
destination is first used."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from patroller.config import Config
from patroller.notify.delivery import (
    BadDestination,
    NoApprise,
    Sender,
    apprise_plugin,
    apprise_senders,
    sender_of,
    shown,
)


class NotifyError(Exception):
    """A destination that cannot be used: the daemon does not start (the message says which,
    by number, never the URL)."""


def admins(config: Config, given: Sequence[Sender] | None) -> tuple[list[Sender], list[str]]:
    """The admin's senders and their names (`given`: the tests' own). NoApprise without
    Apprise; NotifyError for a URL it does not take."""
    if given is not None:
        senders = list(given)
        return senders, [f"destination {n}" for n in range(1, len(senders) + 1)]
    urls = config.notify
    try:  # without URLs of the admin's, Apprise is loaded when a user's is first used
        plugins = apprise_senders(urls, config.notify_timeout) if urls else _apprise_there()
    except BadDestination as exc:
        raise NotifyError(str(exc)) from None
    return [sender_of(plugin) for plugin in plugins], [shown(plugin) for plugin in plugins]


def apprise_sender(url: str, timeout: float) -> Sender | None:
    """The sender for one URL, or None if Apprise takes no such URL (a user's: blocking)."""
    plugin = apprise_plugin(url, timeout)
    return sender_of(plugin) if plugin is not None else None


def _apprise_there() -> list[Any]:
    """No plugin; NoApprise if Apprise is not installed (found, not loaded: it takes 0.3 s)."""
    if importlib.util.find_spec("apprise") is None:
        raise NoApprise("Apprise is not installed: pip install 'patroller[notify]'")
    return []
