"""The doctor's notifications check, word for word in each case it tells apart: Apprise there or
not, destinations given or not, a URL it refuses, and the users' terminals (--notify-terminal)
with login records that can be read or not. `probe_notifications` over the real Apprise and real
files; `check_notifications` over the facts it found (pure)."""

import os
import sys
from dataclasses import replace

from patroller.config import Config
from patroller.doctor.notifications import (
    NotifyFacts,
    check_notifications,
    probe_notifications,
)
from patroller.doctor.results import Result
from patroller.notify.delivery import EXTRA

NAME = "notifications"
TOLD = "to be told of trespasses, granted waits and lost GPUs"  # the words of both "off" answers


def test_no_destination_is_off_saying_how_to_be_told_with_apprise_there_or_not():
    assert check_notifications(NotifyFacts(0), Config()) == Result(
        NAME,
        "ok",
        "off (no --notify): give --notify URL to be told of trespasses, granted waits and lost "
        "GPUs (docs/notifications.md)",
    )
    assert check_notifications(NotifyFacts(0, apprise=False), Config()) == Result(
        NAME,
        "ok",
        f"off (no --notify); {TOLD}: {EXTRA}, then --notify URL (docs/notifications.md)",
    )


def test_destinations_without_apprise_tell_nobody_and_say_what_to_install():
    assert check_notifications(NotifyFacts(2, apprise=False), Config()) == Result(
        NAME,
        "degraded",
        "off: 2 --notify destination(s) given, but Apprise is not installed: nobody is told of "
        "anything",
        EXTRA,
    )


def test_the_destinations_are_named_with_the_events_they_are_told_of():
    facts = NotifyFacts(2, shown=("json://localhost/", "mailto://u:****@example.com/"))
    config = Config(notify_events=("trespass", "lost"))
    assert check_notifications(facts, config) == Result(
        NAME,
        "ok",
        "2 destination(s), told of trespass, lost: json://localhost/; "
        "mailto://u:****@example.com/",
    )


def test_terminals_with_login_records_that_can_be_read_are_said_on(tmp_path):
    utmp = tmp_path / "utmp"
    utmp.write_bytes(b"\0" * 384)
    config = Config(notify_terminal=True, notify_utmp=str(utmp))
    facts = probe_notifications(config)
    assert facts == NotifyFacts(0, utmp=None)
    assert check_notifications(facts, config) == Result(
        NAME,
        "ok",
        "off (no --notify): give --notify URL to be told of trespasses, granted waits and lost "
        "GPUs (docs/notifications.md); terminals: on (trespasses and ending holds also written "
        f"where the users concerned are logged in, as {utmp} says)",
    )


def test_terminals_without_login_records_add_their_fix_to_an_ok_answer(tmp_path):
    utmp = tmp_path / "utmp"
    config = Config(notify_terminal=True, notify_utmp=str(utmp))
    facts = probe_notifications(config)
    assert facts == NotifyFacts(0, utmp=f"{utmp} cannot be read ({os.strerror(2)})")
    assert check_notifications(facts, config) == Result(
        NAME,
        "degraded",
        "off (no --notify): give --notify URL to be told of trespasses, granted waits and lost "
        f"GPUs (docs/notifications.md); terminals: on, but {utmp} cannot be read "
        f"({os.strerror(2)}): no user's terminal is found",
        f"logins are recorded in {utmp} where users log in on this host (sshd, login); without "
        "it no terminal is found",
    )


def test_without_apprise_or_login_records_both_fixes_are_given():
    facts = NotifyFacts(1, apprise=False, utmp="/run/utmp cannot be read (Permission denied)")
    config = Config(notify=("json://x/",), notify_terminal=True, notify_utmp="/run/utmp")
    assert check_notifications(facts, config) == Result(
        NAME,
        "degraded",
        "off: 1 --notify destination(s) given, but Apprise is not installed: nobody is told of "
        "anything; terminals: on, but /run/utmp cannot be read (Permission denied): no user's "
        "terminal is found",
        f"{EXTRA}; logins are recorded in /run/utmp where users log in on this host (sshd, "
        "login); without it no terminal is found",
    )


def test_a_refused_url_fails_alone_whatever_the_terminals():
    config = Config(notify=("bogus://x",), notify_terminal=True, notify_utmp="/nonexistent")
    facts = probe_notifications(config)
    assert facts.destinations == 1 and facts.apprise and facts.shown == ()
    assert facts.bad is not None and facts.bad.startswith(
        "--notify: URL 1 (bogus://...) is not one"
    ), facts
    assert facts.utmp == f"/nonexistent cannot be read ({os.strerror(2)})"
    assert check_notifications(facts, config) == Result(
        NAME,
        "failed",
        f"{facts.bad}: the daemon would not start",
        "correct the URL, or leave it out",
    )


def test_the_terminals_are_not_looked_at_unless_asked(tmp_path, monkeypatch):
    config = Config(
        notify=("json://localhost/",), notify_timeout=7.0, notify_utmp=str(tmp_path / "utmp")
    )
    facts = probe_notifications(config)
    [shown] = facts.shown  # Apprise's form, with the timeouts it was given
    assert shown.startswith("json://localhost/?") and "cto=7.0" in shown, shown
    assert facts == NotifyFacts(1, shown=(shown,))  # no word of the terminals
    monkeypatch.setitem(sys.modules, "apprise", None)  # what Python says of a package not there
    assert probe_notifications(config) == NotifyFacts(1, apprise=False)
    asked = replace(config, notify_terminal=True)
    assert probe_notifications(asked) == NotifyFacts(
        1, apprise=False, utmp=f"{tmp_path / 'utmp'} cannot be read ({os.strerror(2)})"
    )
