"""Notifications: whether the daemon these flags describe would tell anyone, and how to have it
do so. Apprise is the optional `notify` extra: without it the daemon runs as without --notify.

`probe_notifications` asks Apprise (blocking: it loads its plugins, about 0.3 s; the doctor runs
it in the executor); `check_notifications` is pure. URLs hold passwords and tokens: a
destination is named by its number and Apprise's privacy form (`json://user:****@host/...`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from patroller.config import Config
from patroller.doctor.results import FAILED, Result, degraded, failed, ok
from patroller.notify.delivery import EXTRA, BadDestination, NoApprise, apprise_senders, shown
from patroller.notify.terminal import utmp_problem

NAME = "notifications"


@dataclass(frozen=True)
class NotifyFacts:
    destinations: int  # --notify URLs given
    apprise: bool = True  # Apprise is installed
    shown: tuple[str, ...] = ()  # each destination without its secrets
    bad: str | None = None  # why a URL cannot be used
    utmp: str | None = None  # --notify-terminal: why the login records cannot be read


def probe_notifications(config: Config) -> NotifyFacts:
    urls = config.notify
    utmp = utmp_problem(config) if config.notify_terminal else None
    try:
        plugins = apprise_senders(urls, config.notify_timeout)
    except NoApprise:
        return NotifyFacts(len(urls), apprise=False, utmp=utmp)
    except BadDestination as exc:
        return NotifyFacts(len(urls), bad=str(exc), utmp=utmp)
    return NotifyFacts(len(urls), shown=tuple(shown(plugin) for plugin in plugins), utmp=utmp)


def check_notifications(facts: NotifyFacts, config: Config) -> Result:
    """What the flags' notifications would do, the users' terminals said last."""
    found = _check(facts, config)
    if not config.notify_terminal or found.status == FAILED:
        return found
    if facts.utmp is None:
        return replace(
            found,
            detail=f"{found.detail}; terminals: on (trespasses and ending "
            "holds also written where the users concerned are logged in, as "
            f"{config.notify_utmp} says)",
        )
    fix = (
        f"logins are recorded in {config.notify_utmp} where users log in on this host "
        "(sshd, login); without it no terminal is found"
    )
    return degraded(
        NAME,
        f"{found.detail}; terminals: on, but {facts.utmp}: no user's terminal is found",
        f"{found.fix}; {fix}" if found.fix else fix,
    )


def _check(facts: NotifyFacts, config: Config) -> Result:
    if facts.bad is not None:
        return failed(
            NAME, f"{facts.bad}: the daemon would not start", "correct the URL, or leave it out"
        )
    if not facts.apprise:
        if facts.destinations:
            return degraded(
                NAME,
                f"off: {facts.destinations} --notify destination(s) given, "
                "but Apprise is not installed: nobody is told of anything",
                EXTRA,
            )
        return ok(
            NAME,
            f"off (no --notify); to be told of trespasses, granted waits and lost "
            f"GPUs: {EXTRA}, then --notify URL (docs/notifications.md)",
        )
    if not facts.destinations:
        return ok(
            NAME,
            "off (no --notify): give --notify URL to be told of trespasses, "
            "granted waits and lost GPUs (docs/notifications.md)",
        )
    return ok(
        NAME,
        f"{facts.destinations} destination(s), told of "
        f"{', '.join(config.notify_events)}: {'; '.join(facts.shown)}",
    )
