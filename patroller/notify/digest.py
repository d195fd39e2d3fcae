"""The weekly digest: when it is due, whose week it tells, and its words. Pure: the time and
the usage store's totals are given.

It is due each week at --notify-digest's weekday and time, in UTC or the zone given with it,
as the usage reports read a zone (tz=). A time that the change to summer time skips comes at
the moment it would have been under the offset before (an hour later on the clock); a time the
change back repeats comes the first time.

Each user with at least Config.notify_digest_least GPU-seconds in the week gets her own week;
the admin gets the lab's table, a line per user (the most GPU-hours first, at most
Config.notify_digest_lines of them). The usage categories (core/usage.py) are named so:

    computing         active and unreserved (a process of hers computing, reserved or not)
    held idle         idle_held (a process of hers on the GPU, computing nothing)
    reserved unused   reserved_unused (held for her, no process of hers on it)
    trespass          trespass (only when there is some)
    held lost         lost, of a GPU she held (only when there is some)

A user's digest is her own figures alone, so it names nobody else, with or without
--hide-users; every name is made printable and cut (core/text.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from datetime import time as clock_time

from patroller.config.settings import Weekly
from patroller.core.text import printable
from patroller.notify.messages import Notice

KIND = "digest"
WEEK = 7 * 86400.0
HOUR = 3600.0
NAME = 80  # characters of a user's name in a digest at most
POINTER = "`patroller report --since 7d` shows the week by user, and `--by day` by day."
# What the digest names (in the admin's table; in a user's own), and the categories each sums.
PARTS = (
    ("computing", "computing", ("active", "unreserved")),
    ("held idle", "held idle (a process of yours on the GPU, computing nothing)", ("idle_held",)),
    (
        "reserved unused",
        "reserved unused (held for you, no process of yours on it)",
        ("reserved_unused",),
    ),
    ("trespass", "on GPUs others held (trespass)", ("trespass",)),
    ("held lost", "held while the GPU was lost", ("lost",)),
)
ALWAYS = 3  # the first PARTS are said even when zero; the others only when there is some

Row = tuple[str | None, str | None, str, float]  # (key, user, category, seconds)


def next_due(after: float, when: Weekly, zone: tzinfo) -> float:
    """The first moment strictly after `after` (epoch seconds) at `when`'s weekday and time
    in `zone`."""
    weekday, hour, minute, _ = when
    local = datetime.fromtimestamp(after, zone)
    day = local.date() + timedelta(days=(weekday - local.weekday()) % 7)
    while True:
        # fold 0: a repeated time's first moment, a skipped one's under the earlier offset
        due = datetime.combine(day, clock_time(hour, minute), tzinfo=zone).timestamp()
        if due > after:
            return due
        day += timedelta(days=7)


def week_of(due: float) -> str:
    """The week a digest due at `due` is of, as its episode's key names it."""
    return time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(due))


def since_for(due: float) -> float:
    """Where the week before `due` begins, as the usage store counts it: at the hour a week
    before is in (the store keeps whole hours)."""
    return (due - WEEK) // HOUR * HOUR


@dataclass(frozen=True)
class Week:
    """One user's GPU-seconds of the week, by the digest's PARTS."""

    user: str
    seconds: tuple[float, ...]  # one per PARTS

    @property
    def total(self) -> float:
        return sum(self.seconds)


@dataclass(frozen=True)
class Lab:
    """The week of every user with some GPU-time, the most first, and the host's GPUs'."""

    users: tuple[Week, ...]
    gpu_seconds: float  # every GPU's, whoever held it
    free: float
    lost: float  # of every GPU lost or silent, held or not


def lab_of(rows: Iterable[Row], least: float) -> Lab:
    """The week from a usage report by user (the reader's rows): each user with at least
    `least` GPU-seconds, the most first (then by name)."""
    found: dict[str, dict[str, float]] = {}
    whole: dict[str, float] = {}
    for key, _, category, seconds in rows:
        whole[category] = whole.get(category, 0.0) + seconds
        if key:
            mine = found.setdefault(key, {})
            mine[category] = mine.get(category, 0.0) + seconds
    weeks = [
        Week(user, tuple(sum(mine.get(c, 0.0) for c in categories) for _, _, categories in PARTS))
        for user, mine in found.items()
    ]
    weeks = sorted((w for w in weeks if w.total >= least), key=lambda w: (-w.total, w.user))
    return Lab(tuple(weeks), sum(whole.values()), whole.get("free", 0.0), whole.get("lost", 0.0))


def span(since: float, until: float, zone: tzinfo, label: str) -> str:
    """'from 2026-11-30 09:00 to 2026-12-07 09:00 UTC', in the schedule's zone."""

    def at(moment: float) -> str:
        return datetime.fromtimestamp(moment, zone).strftime("%Y-%m-%d %H:%M")

    return f"from {at(since)} to {at(until)} {label}"


def user_notice(host: str, week: Week, when: str, due: float) -> Notice:
    """`week.user`'s own digest (`when`: its span's words)."""
    name = printable(week.user, NAME)
    lines = [f"{name}'s GPU-hours on {host} {when}:"]
    for n, ((_, part, _), seconds) in enumerate(zip(PARTS, week.seconds, strict=True)):
        if n < ALWAYS or seconds > 0:
            lines.append(f"{part}: {_hours(seconds)}")
    lines.append(f"in all: {_hours(week.total)}")
    lines.append(
        "Hours held idle or reserved unused are hours others could have computed in: "
        "release a GPU you are not using (`patroller release`). " + POINTER
    )
    return Notice(
        KIND,
        (KIND, week_of(due), week.user),
        week.user,
        (),
        f"{host}: your week on the GPUs, {_hours(week.total)} GPU-hours",
        "\n".join(lines),
        concerns=(week.user,),
    )


def lab_notice(host: str, lab: Lab, when: str, due: float, most: int) -> Notice:
    """The admin's digest: a line per user (at most `most`), the users' sum, the host's."""
    users = lab.users
    if not users:
        body = [f"Nobody held or used a GPU of {host} {when}."]
    else:
        body = [f"GPU-hours by user on {host} {when}, the most first:"]
        body += [f"{printable(w.user, NAME)}: {_line(w.seconds)}" for w in users[:most]]
        rest = users[most:]
        if rest:
            body.append(f"and {len(rest)} more user(s): {_hours(sum(w.total for w in rest))}")
        body.append(
            f"all users: {_line(tuple(map(sum, zip(*(w.seconds for w in users), strict=True))))}"
        )
    body.append(
        f"The host's GPUs: {_hours(lab.gpu_seconds)} GPU-hours, of which "
        f"{_hours(lab.free)} free and {_hours(lab.lost)} lost. {POINTER}"
    )
    total = sum(w.total for w in users)
    return Notice(
        KIND,
        (KIND, week_of(due), ""),
        None,
        (),
        f"{host}: the week on the GPUs, {len(users)} user(s), {_hours(total)} GPU-hours",
        "\n".join(body),
    )


def _line(seconds: Sequence[float]) -> str:
    parts = ", ".join(
        f"{part} {_hours(s)}"
        for n, ((part, _, _), s) in enumerate(zip(PARTS, seconds, strict=True))
        if n < ALWAYS or s > 0
    )
    return f"{_hours(sum(seconds))} ({parts})"


def _hours(seconds: float) -> str:
    return f"{seconds / HOUR:.2f}"
