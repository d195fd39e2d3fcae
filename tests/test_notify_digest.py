"""The weekly digest's pure parts: when it is next due (week and year boundaries, a zone's
changes to and from summer time, a clock exactly at the due time), the flag's value, whose week
it tells and its words, checked word for word once (the admin's table and a user's own); a
name's control characters made printable and its length bounded."""

from datetime import datetime, timezone

import pytest

from patroller.config import Config, ConfigError, load
from patroller.config.values import time_zone, weekly
from patroller.notify.digest import (
    Week,
    lab_notice,
    lab_of,
    next_due,
    since_for,
    span,
    user_notice,
    week_of,
)

HOUR = 3600.0
UTC = timezone.utc
PARIS = time_zone("Europe/Paris")


def at(*when, zone=UTC):
    return datetime(*when, tzinfo=zone).timestamp()


MONDAY_9 = (0, 9, 0, "UTC")


@pytest.mark.parametrize(
    "after,due",
    [
        (at(2026, 12, 6, 9, 17), at(2026, 12, 7, 9, 0)),  # a Sunday: the next day
        (at(2026, 12, 7, 8, 59, 59), at(2026, 12, 7, 9, 0)),  # the same Monday, a second before
        (at(2026, 12, 7, 9, 0), at(2026, 12, 14, 9, 0)),  # exactly at it: the next week's
        (at(2026, 12, 7, 9, 0, 1), at(2026, 12, 14, 9, 0)),
        (at(2026, 12, 8, 0, 0), at(2026, 12, 14, 9, 0)),  # a Tuesday: six days on
        (at(2026, 12, 31, 23, 0), at(2027, 1, 4, 9, 0)),  # across the year
        (at(2028, 2, 28, 10, 0), at(2028, 3, 6, 9, 0)),  # across a leap day
    ],
)
def test_the_next_due_time_in_utc(after, due):
    assert next_due(after, MONDAY_9, UTC) == due


def test_the_next_due_time_in_a_zone_follows_summer_time():
    monday = (0, 9, 0, "Europe/Paris")
    # 09:00 in Paris is 07:00 UTC in summer time, 08:00 after it ends (2026-10-25)
    assert next_due(at(2026, 10, 12, 12, 0), monday, PARIS) == at(2026, 10, 19, 7, 0)
    assert next_due(at(2026, 10, 19, 7, 0), monday, PARIS) == at(2026, 10, 26, 8, 0)
    assert at(2026, 10, 26, 8, 0) - at(2026, 10, 19, 7, 0) == 7 * 86400 + HOUR
    # and back to 07:00 UTC when it begins again (2027-03-28)
    assert next_due(at(2027, 3, 22, 8, 0), monday, PARIS) == at(2027, 3, 29, 7, 0)
    # 02:30 on the Sunday summer time begins does not exist: it comes at 03:30 summer time,
    # the moment it would have been under the winter offset
    sunday = (6, 2, 30, "Europe/Paris")
    due = next_due(at(2027, 3, 27, 12, 0), sunday, PARIS)
    assert due == at(2027, 3, 28, 1, 30)
    assert datetime.fromtimestamp(due, PARIS).strftime("%H:%M %Z") == "03:30 CEST"
    # 02:30 on the Sunday it ends comes twice: the first one
    assert next_due(at(2026, 10, 24, 12, 0), sunday, PARIS) == at(2026, 10, 25, 0, 30)
    # the second 02:30 is not a second digest: the next is a week on
    assert next_due(at(2026, 10, 25, 0, 30), sunday, PARIS) == at(2026, 11, 1, 1, 30)


def test_an_offset_zone():
    plus = (4, 17, 30, "+05:30")  # Friday 17:30 at +05:30 is 12:00 UTC
    assert next_due(at(2026, 12, 6, 0, 0), plus, time_zone("+05:30")) == at(2026, 12, 11, 12, 0)
    assert next_due(at(2026, 12, 6, 0, 0), (4, 17, 30, "-0800"), time_zone("-0800")) == at(
        2026, 12, 12, 1, 30
    )


def test_the_week_and_where_it_begins():
    due = at(2026, 12, 7, 9, 30)
    assert week_of(due) == "2026-12-07T09:30Z"
    assert since_for(due) == at(2026, 11, 30, 9, 0)  # the store counts whole hours
    assert since_for(at(2026, 12, 7, 9, 0)) == at(2026, 11, 30, 9, 0)


@pytest.mark.parametrize(
    "text,value",
    [
        ("mon 09:00", (0, 9, 0, "UTC")),
        ("Monday 9:00", (0, 9, 0, "UTC")),
        ("  fri   17:30  Europe/Paris ", (4, 17, 30, "Europe/Paris")),
        ("SUN 00:00 +02:00", (6, 0, 0, "+02:00")),
        ("wed 23:59 UTC", (2, 23, 59, "UTC")),
        ("off", None),
        ("None", None),
    ],
)
def test_the_flags_value(text, value):
    assert weekly(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "mon",
        "09:00",
        "mon 09:00 UTC extra",
        "mo 09:00",
        "m 09:00",
        "moon 09:00",
        "mon 24:00",
        "mon 09:60",
        "mon 9",
        "mon 09:00 Mars/Olympus",
        "mon 09:00 +15:00",
        "mon 09:00 ../../etc/passwd",
        "09:00 mon",
    ],
)
def test_a_bad_value_is_refused(text):
    with pytest.raises(ValueError):
        weekly(text)


def test_the_flag_and_its_variable():
    assert load([], {}).notify_digest is None and Config().notify_digest is None
    assert load(["--notify-digest", "tue 08:15 Asia/Tokyo"], {}).notify_digest == (
        1,
        8,
        15,
        "Asia/Tokyo",
    )
    assert load([], {"PATROLLER_NOTIFY_DIGEST": "mon 09:00"}).notify_digest == MONDAY_9
    with pytest.raises(ConfigError) as caught:
        load([], {"PATROLLER_NOTIFY_DIGEST": "someday"})
    assert str(caught.value).startswith("PATROLLER_NOTIFY_DIGEST: 'someday' is not a weekday")
    with pytest.raises(
        ConfigError, match="^--notify-digest: 'mon 09:00 Nowhere/City' is neither UTC, an offset"
    ):
        load(["--notify-digest", "mon 09:00 Nowhere/City"], {})
    # the kind is known to --notify-events (and so to `patroller notify mute digest`)
    assert load(["--notify-events", "digest"], {}).notify_events == ("digest",)


DUE = at(2026, 12, 7, 9, 0)
ROWS = [  # a usage report by user: (key, user, category, GPU-seconds)
    ("alice", "alice", "active", 30 * HOUR),
    ("alice", "alice", "unreserved", 2 * HOUR),
    ("alice", "alice", "idle_held", 5.5 * HOUR),
    ("bob", "bob", "reserved_unused", 40 * HOUR),
    ("bob", "bob", "trespass", 1.25 * HOUR),
    ("carol\x1b[31m", "carol\x1b[31m", "lost", 0.5 * HOUR),
    ("dave", "dave", "active", 59.0),  # under a minute: no digest
    (None, None, "free", 1000 * HOUR),
    (None, None, "lost", 24 * HOUR),
]
WHEN = "from 2026-11-30 09:00 to 2026-12-07 09:00 UTC"


def test_whose_week_the_digest_tells():
    lab = lab_of(ROWS, least=60.0)
    assert [w.user for w in lab.users] == ["bob", "alice", "carol\x1b[31m"]
    assert lab.users[1] == Week("alice", (32 * HOUR, 5.5 * HOUR, 0.0, 0.0, 0.0))
    assert lab.gpu_seconds == sum(r[3] for r in ROWS)
    assert (lab.free, lab.lost) == (1000 * HOUR, 24.5 * HOUR)
    assert [w.user for w in lab_of(ROWS, least=59.0).users][-1] == "dave"
    tied = lab_of([("zed", "zed", "active", HOUR), ("amy", "amy", "idle_held", HOUR)], 60.0)
    assert [w.user for w in tied.users] == ["amy", "zed"]  # equal: by name
    assert span(since_for(DUE), DUE, UTC, "UTC") == WHEN
    assert (
        span(since_for(DUE), DUE, PARIS, "Europe/Paris")
        == "from 2026-11-30 10:00 to 2026-12-07 10:00 Europe/Paris"
    )


def test_the_admins_table_word_for_word():
    lab = lab_of(ROWS, least=60.0)
    notice = lab_notice("gpu1", lab, WHEN, DUE, most=2)
    assert (notice.kind, notice.user, notice.devices, notice.concerns) == ("digest", None, (), ())
    assert notice.key == ("digest", "2026-12-07T09:00Z", "")
    assert notice.title == "gpu1: the week on the GPUs, 3 user(s), 79.25 GPU-hours"
    assert notice.body == (
        "GPU-hours by user on gpu1 from 2026-11-30 09:00 to 2026-12-07 09:00 UTC, the most "
        "first:\n"
        "bob: 41.25 (computing 0.00, held idle 0.00, reserved unused 40.00, trespass 1.25)\n"
        "alice: 37.50 (computing 32.00, held idle 5.50, reserved unused 0.00)\n"
        "and 1 more user(s): 0.50\n"
        "all users: 79.25 (computing 32.00, held idle 5.50, reserved unused 40.00, trespass "
        "1.25, held lost 0.50)\n"
        "The host's GPUs: 1103.27 GPU-hours, of which 1000.00 free and 24.50 lost. "
        "`patroller report --since 7d` shows the week by user, and `--by day` by day."
    )
    every = lab_notice("gpu1", lab, WHEN, DUE, most=30).body.splitlines()
    assert (
        every[3] == "carol\\x1b[31m: 0.50 (computing 0.00, held idle 0.00, reserved unused "
        "0.00, held lost 0.50)"
    )  # its escape made printable
    assert not any(line.startswith("and ") for line in every)
    nobody = lab_notice("gpu1", lab_of([(None, None, "free", 168 * HOUR)], 60.0), WHEN, DUE, 30)
    assert nobody.title == "gpu1: the week on the GPUs, 0 user(s), 0.00 GPU-hours"
    assert nobody.body == (
        "Nobody held or used a GPU of gpu1 from 2026-11-30 09:00 to 2026-12-07 09:00 UTC.\n"
        "The host's GPUs: 168.00 GPU-hours, of which 168.00 free and 0.00 lost. `patroller "
        "report --since 7d` shows the week by user, and `--by day` by day."
    )


def test_a_users_own_digest_word_for_word():
    lab = lab_of(ROWS, least=60.0)
    bob = user_notice("gpu1", lab.users[0], WHEN, DUE)
    assert (bob.kind, bob.user, bob.concerns) == ("digest", "bob", ("bob",))
    assert bob.key == ("digest", "2026-12-07T09:00Z", "bob")
    assert bob.title == "gpu1: your week on the GPUs, 41.25 GPU-hours"
    assert bob.body == (
        "bob's GPU-hours on gpu1 from 2026-11-30 09:00 to 2026-12-07 09:00 UTC:\n"
        "computing: 0.00\n"
        "held idle (a process of yours on the GPU, computing nothing): 0.00\n"
        "reserved unused (held for you, no process of yours on it): 40.00\n"
        "on GPUs others held (trespass): 1.25\n"
        "in all: 41.25\n"
        "Hours held idle or reserved unused are hours others could have computed in: release "
        "a GPU you are not using (`patroller release`). `patroller report --since 7d` shows "
        "the week by user, and `--by day` by day."
    )
    alice = user_notice("gpu1", lab.users[1], WHEN, DUE).body.splitlines()
    assert alice[1:5] == [
        "computing: 32.00",
        "held idle (a process of yours on the GPU, computing nothing): 5.50",
        "reserved unused (held for you, no process of yours on it): 0.00",
        "in all: 37.50",
    ]  # no trespass, nothing lost: not said
    carol = user_notice("gpu1", lab.users[2], WHEN, DUE).body.splitlines()
    assert (
        carol[0].startswith("carol\\x1b[31m's GPU-hours")
        and "held while the GPU was lost: 0.50" in carol
    )
    # a digest names its user alone: nobody else's name is in it
    for week in lab.users:
        words = user_notice("gpu1", week, WHEN, DUE)
        others = [w.user for w in lab.users if w.user != week.user]
        assert not any(other[:5] in words.title + words.body for other in others)


def test_a_long_name_is_cut():
    long = "x" * 300
    lab = lab_of([(long, long, "active", HOUR)], 60.0)
    assert (
        lab_notice("gpu1", lab, WHEN, DUE, 30).body.splitlines()[1]
        == "x" * 80 + "...: 1.00 (computing 1.00, held idle 0.00, reserved unused 0.00)"
    )
    assert user_notice("gpu1", lab.users[0], WHEN, DUE).body.startswith("x" * 80 + "...'s ")
