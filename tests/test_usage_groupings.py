"""/usage by two keys (day,user; weekday,hour), by weekday or hour of the day, and in a time zone
(tz=), against real daemons whose usage store holds hours written straight into its file:
GPU-hours anyone can add up, an hour moved to another day by an offset, a zone's change to
summer time, daily totals (no hour), the one-key answers as before, bad by= and tz= named, and
--hide-users for a table of callers (test mode's named users; real uids and root on the
simulator)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from helpers import ScenarioFile, async_test, gpu_running, need_root, running, until
from test_hide_users import PSEUDONYM, ask_as
from test_openapi import answer_schema, undocumented
from test_usage_store import store_in, wait
from usage_history import DAY, HOUR, gpu_hour, write

from patroller.core.usage import Party, Present, summarize_grouped
from patroller.identify.resolver import host_identity
from patroller.state.usage.groupings import spans

FILE = "usage.sqlite3"
NOBODY, DAEMON = 65534, 1
UTC = timezone.utc


def midnight(days_ago: int) -> int:
    """The start (UTC) of the day `days_ago` days before today's."""
    return int(time.time() // DAY * DAY) - days_ago * DAY


def day_of(at: float, zone=UTC) -> str:
    return datetime.fromtimestamp(at, zone).strftime("%Y-%m-%d")


def utc_date(at: float) -> str:
    return day_of(at)


def hours(answer, *categories):
    """Each row's GPU-hours in `categories` (all of them if none), by its key (a tuple for two
    keys), zero rows left out."""
    found = {}
    for row in answer["rows"]:
        value = sum(row["hours"][c] for c in categories) if categories else row["gpu_hours"]
        if value:
            key = row["key"]
            found[tuple(key) if isinstance(key, list) else key] = round(value, 6)
    return found


def three_hours(day: int):
    """Hours anyone can add up, on the day starting at `day` and the next: alice computes an
    hour on GPU 0 while bob leaves GPU 1 reserved and unused; alice computes half of the next
    hour and holds GPU 0 idle for the rest; bob computes from 23:00 UTC the next day."""
    return [
        (
            day + 11 * HOUR,
            [
                gpu_hour(0, "claimed", "alice", True, [("alice", True)], busy=60),
                gpu_hour(1, "reserved", "bob", True),
            ],
        ),
        (
            day + 12 * HOUR,
            [gpu_hour(0, "claimed", "alice", True, [("alice", True)], busy=30), gpu_hour(1)],
        ),
        (
            day + DAY + 24 * HOUR,
            [gpu_hour(0, "claimed", "bob", True, [("bob", True)], busy=60), gpu_hour(1)],
        ),
    ]


@pytest.fixture
def state(tmp_path):
    where = tmp_path / "state"
    where.mkdir(mode=0o700)
    return where


@async_test
async def test_by_day_and_user_each_hour_counts_in_its_day_and_user(state):
    day = midnight(5)
    write(str(state / FILE), three_hours(day))
    first, second, third = utc_date(day), utc_date(day + DAY), utc_date(day + 2 * DAY)
    async with running(state_dir=str(state), usage_interval=3600) as h:
        answer = await h.ok(f"/usage?since={first}&until={utc_date(day + 4 * DAY)}&by=day,user")
        assert answer["by"] == "day,user" and answer["tz"] == "UTC"
        assert [row["key"] for row in answer["rows"]] == [
            [first, "alice"],
            [first, "bob"],
            [first, None],
            [second, "bob"],
            [second, None],
        ]
        assert hours(answer, "active") == {(first, "alice"): 1.5, (second, "bob"): 1.0}
        assert hours(answer, "idle_held") == {(first, "alice"): 0.5}
        assert hours(answer, "reserved_unused") == {(first, "bob"): 1.0}
        assert hours(answer, "free") == {(first, None): 1.0, (second, None): 1.0}
        assert answer["total"]["gpu_hours"] == 6.0
        assert list(undocumented(answer, answer_schema("/usage", "get", 200))) == []
        # Two hours east of UTC, bob's hour from 23:00 is the day after's, from 01:00; and a
        # date alone is midnight there
        east = await h.ok(
            f"/usage?since={first}&until={utc_date(day + 4 * DAY)}&by=day,user&tz=%2B02:00"
        )
        assert east["tz"] == "+02:00"
        assert east["since"].startswith(day_of(day - DAY) + "T22:00:00")
        assert hours(east, "active") == {(first, "alice"): 1.5, (third, "bob"): 1.0}
        # by user, then day: a user's days in time's order, the users by use
        flipped = await h.ok(f"/usage?since={first}&by=user,day")
        assert [row["key"] for row in flipped["rows"]] == [
            ["alice", first],
            ["bob", first],
            ["bob", second],
            [None, first],
            [None, second],
        ]


def latest_change(zone: ZoneInfo, before: float) -> int:
    """The last hour (UTC) before `before` at which the zone's offset changed, found by asking
    Python hour by hour (not the code under test)."""
    hour = int(before // HOUR * HOUR) - HOUR
    current = datetime.fromtimestamp(hour, zone).utcoffset()
    for _ in range(400 * 24):
        hour -= HOUR
        if datetime.fromtimestamp(hour, zone).utcoffset() != current:
            return hour + HOUR
    raise AssertionError("no change of offset in 400 days")


@async_test
async def test_weekday_and_hour_in_utc_an_offset_and_a_zone_across_its_change_of_offset(state):
    zone = ZoneInfo("America/New_York")
    change = latest_change(zone, time.time() - 6 * DAY)  # 4 days after it: in the past
    starts = [change + n * 5 * HOUR for n in range(-20, 20)]  # some 4 days either side
    write(
        str(state / FILE),
        [
            (start + HOUR, [gpu_hour(0, "claimed", "alice", True, [("alice", True)], busy=60)])
            for start in starts
        ],
    )
    since = datetime.fromtimestamp(starts[0], UTC).isoformat()
    until = datetime.fromtimestamp(starts[-1] + HOUR, UTC).isoformat().replace("+", "%2B")
    since = since.replace("+", "%2B")
    async with running(state_dir=str(state), usage_interval=3600) as h:
        for tz, moved in (
            ("UTC", UTC),
            ("-05:00", timezone(timedelta(hours=-5))),
            ("America/New_York", zone),
        ):
            query = f"since={since}&until={until}&tz={tz.replace('+', '%2B')}"
            heat = await h.ok(f"/usage?{query}&by=weekday,hour")
            expected = {}
            for start in starts:
                local = datetime.fromtimestamp(start, moved)
                key = (local.strftime("%a"), local.strftime("%H"))
                expected[key] = expected.get(key, 0) + 1.0
            assert hours(heat, "active") == expected, tz
            weekdays = [row["key"][0] for row in heat["rows"]]
            assert weekdays == sorted(
                weekdays, key=["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"].index
            ), tz
            alone = await h.ok(f"/usage?{query}&by=hour")
            by_hour = {}
            for (_, hour), value in expected.items():
                by_hour[hour] = by_hour.get(hour, 0) + value
            assert hours(alone, "active") == by_hour, tz
            assert [row["key"] for row in alone["rows"]] == sorted(by_hour), tz


def test_a_range_is_cut_where_the_offset_changes_and_nowhere_else():
    zone = ZoneInfo("Europe/Paris")
    change = latest_change(zone, time.time())
    before = datetime.fromtimestamp(change - HOUR, zone).utcoffset().total_seconds()
    after = datetime.fromtimestamp(change, zone).utcoffset().total_seconds()
    assert spans(change - 40 * DAY, change + 40 * DAY, zone) == [
        (None, change, before),
        (change, None, after),
    ]
    assert spans(change - 40 * DAY, change, zone) == [(None, None, before)]
    assert spans(change + 1, change + 30 * DAY, zone) == [(None, None, after)]
    assert spans(0, 400 * DAY, UTC) == [(None, None, 0)]


def test_a_change_from_utc_itself_or_on_the_half_hour_is_cut_at_the_hour_it_falls_in():
    """Europe/London's winter offset is UTC's own (0); St. John's changes at 05:30 UTC: its
    hours count with the offset they begin in, so the cut is at the next whole hour; a range
    that begins within an hour is cut at the hours all the same."""
    london, spring = ZoneInfo("Europe/London"), 1743296400  # 2025-03-30 01:00 UTC
    assert spans(spring - 40 * DAY + 1800, spring + 40 * DAY, london) == [
        (None, spring, 0),
        (spring, None, 3600),
    ]
    st_johns, change = ZoneInfo("America/St_Johns"), 1741498200  # 2025-03-09 05:30 UTC
    assert spans(change // DAY * DAY - 10 * DAY, change + 10 * DAY, st_johns) == [
        (None, change + 1800, -12600),
        (change + 1800, None, -9000),
    ]


def alice_hours(path, ends):
    """An hour of alice's computing on GPU 0 ending at each of `ends`, written into the file."""
    write(
        str(path),
        [
            (end, [gpu_hour(0, "claimed", "alice", True, [("alice", True)], busy=60)])
            for end in ends
        ],
    )


def grouped(store, since, until, zone=UTC, by=("user",)):
    return asyncio.run(store.grouped(since, until, by, zone))


def active(totals):
    return {
        keys: round(seconds / HOUR, 6)
        for keys, _, category, seconds in totals.rows
        if category == "active"
    }


def test_a_range_counts_the_hour_it_begins_in_and_none_before_and_says_the_first(state):
    day = midnight(5)
    alice_hours(state / FILE, [day + n * HOUR for n in (10, 11, 12)])
    with store_in(state) as store:
        wait(lambda: store.state == "writable")
        hours = sorted(
            h for (h,) in sqlite3.connect(state / FILE).execute("SELECT hour FROM hourly")
        )
        assert len(hours) == 3
        # from within the second hour: it counts, the first does not
        found = grouped(store, hours[1] + 1800, hours[2] + HOUR)
        assert active(found) == {("alice",): 2.0}
        assert found.first == float(hours[0])  # the first hour kept, whatever the range


def test_daily_totals_count_from_the_day_the_range_begins_in_once_across_a_change(state):
    zone = ZoneInfo("Europe/London")
    change = latest_change(zone, time.time() - 40 * DAY)
    day = change // DAY * DAY  # the change's UTC day
    alice_hours(state / FILE, [day + n * DAY + 12 * HOUR for n in (-2, -1, 1)])
    with store_in(state, usage_days=30) as store:  # folded into daily totals at start
        wait(lambda: store.state == "writable")
        db = sqlite3.connect(state / FILE)
        assert db.execute("SELECT COUNT(*) FROM hourly").fetchone() == (0,)
        since = day - DAY + 6 * HOUR  # within the second day: it counts, the first does not
        assert len(spans(since, day + 3 * DAY, zone)) == 2
        found = grouped(store, since, day + 3 * DAY, zone)
        assert active(found) == {("alice",): 2.0}
        assert found.first == float(day - 2 * DAY)


def test_two_keys_are_ordered_first_by_the_first_then_within_it():
    rows = [
        (("2026-11-02", "bob"), "active", 3600.0),
        (("2026-11-01", "bob"), "active", 60.0),
        (("2026-11-01", "alice"), "active", 7200.0),
        (("2026-11-01", None), "free", 9e4),
        (("2026-11-01", "carol"), "idle_held", 7200.0),
    ]
    found = summarize_grouped(rows, ("day", "user"))
    assert [r["key"] for r in found["rows"]] == [
        ["2026-11-01", "alice"],
        ["2026-11-01", "carol"],
        ["2026-11-01", "bob"],
        ["2026-11-01", None],
        ["2026-11-02", "bob"],
    ]
    assert found["total"]["gpu_hours"] == round((3600 + 60 + 7200 + 9e4 + 7200) / 3600, 6)
    users = summarize_grouped(
        [
            (("bob", "Sun"), "active", 1.0),
            (("bob", "Mon"), "active", 1.0),
            (("alice", "Tue"), "active", 5.0),
        ],
        ("user", "weekday"),
    )
    assert [r["key"] for r in users["rows"]] == [["alice", "Tue"], ["bob", "Mon"], ["bob", "Sun"]]


def test_the_order_by_use_and_its_ties():
    """By use: a first key by the GPU-time used under all its second keys; a tie (up to float
    noise) by all GPU-time, free included; then by the key. Null keys last, at any place."""
    keys = lambda found: [r["key"] for r in found["rows"]]
    rows = [
        (("ann", "d1"), "active", 40.0),
        (("ann", "d2"), "active", 40.0),
        (("bob", "d1"), "active", 70.0),
        ((None, "d1"), "active", 500.0),
        (("ann", None), "idle_held", 1.0),
    ]
    # ann used 81 s in all, bob 70: ann first, though bob's one day is the longest
    assert keys(summarize_grouped(rows, ("user", "day"))) == [
        ["ann", "d1"],
        ["ann", "d2"],
        ["ann", None],
        ["bob", "d1"],
        [None, "d1"],
    ]
    # a use equal up to float noise is a tie: all GPU-time decides, then the key
    tie = [
        (("bob",), "active", 1.0),
        (("bob",), "free", 4.0),
        (("ann",), "active", 1.0000001),
        (("cat",), "active", 1.0),
        (("dan",), "lost", 9.0),
    ]
    found = summarize_grouped(tie, ("user",))
    assert keys(found) == ["bob", "ann", "cat", "dan"]
    assert found["rows"][1]["gpu_hours"] == round(1.0000001 / 3600, 6) == 0.000278
    # a category this version does not know is left out, and the rows after it still count
    later = [(("ann",), "warp", 5.0), (("ann",), "active", 3600.0), (("bob",), "active", 7.0)]
    found = summarize_grouped(later, ("user",))
    assert keys(found) == ["ann", "bob"] and found["total"]["gpu_hours"] == round(3607 / 3600, 6)
    # weekdays in the week's order whatever their use; other keys in time's order by their text
    week = [(("Sun",), "active", 9.0), (("Mon",), "active", 1.0), ((None,), "active", 99.0)]
    assert keys(summarize_grouped(week, ("weekday",))) == ["Mon", "Sun", None]
    days = [
        (("2026-11-02",), "active", 1.0),
        (("2026-11-01",), "active", 9.0),
        (("Zed",), "active", 5.0),
        (("Fri",), "active", 5.0),
    ]  # only a weekday's are
    assert keys(summarize_grouped(days, ("day",))) == ["2026-11-01", "2026-11-02", "Fri", "Zed"]
    hours = [
        (("Tue", "10"), "active", 1.0),
        (("Mon", "11"), "active", 1.0),
        (("Mon", "09"), "active", 1.0),
    ]
    assert keys(summarize_grouped(hours, ("weekday", "hour"))) == [
        ["Mon", "09"],
        ["Mon", "11"],
        ["Tue", "10"],
    ]


def test_use_and_all_gpu_time_are_compared_to_the_microsecond():
    keys = lambda found: [r["key"] for r in found["rows"]]
    # used: 1.4 s against 1.2 (no tie, whatever the rest)
    assert keys(
        summarize_grouped(
            [(("ann",), "active", 1.2), (("ann",), "free", 9.0), (("bob",), "active", 1.4)],
            ("user",),
        )
    ) == ["bob", "ann"]
    # the same use: all GPU-time, 4.4 s against 4.2, then a difference under a microsecond
    # is a tie, and the key decides
    same = [
        (("ann",), "active", 1.0),
        (("ann",), "free", 3.2),
        (("bob",), "active", 1.0),
        (("bob",), "free", 3.4),
        (("cat",), "active", 1.0),
        (("cat",), "free", 3.2000001),
    ]
    assert keys(summarize_grouped(same, ("user",))) == ["bob", "ann", "cat"]
    # a first key's use counts its rows' use only, not the free time of the rows before
    free_first = [
        (("ann", "d1"), "active", 10.0),
        (("ann", "d1"), "free", 100.0),
        (("ann", "d2"), "active", 10.0),
        (("bob", "d1"), "active", 50.0),
    ]
    assert keys(summarize_grouped(free_first, ("user", "day"))) == [
        ["bob", "d1"],
        ["ann", "d1"],
        ["ann", "d2"],
    ]
    # a value that is no weekday, under weekday: before the week, by its text
    assert keys(
        summarize_grouped([(("Mon",), "active", 1.0), (("Aaa",), "active", 1.0)], ("weekday",))
    ) == ["Aaa", "Mon"]


def daily_rows(path, table="daily") -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    except sqlite3.OperationalError:  # not made yet
        return -1
    finally:
        db.close()


@async_test
async def test_daily_totals_keep_their_utc_day_and_have_no_hour(state):
    day = midnight(60)
    write(str(state / FILE), three_hours(day))
    async with running(state_dir=str(state), usage_interval=3600, usage_days=30) as h:
        # folded by the writer at start: the daily totals were written with each interval,
        # so the fold is done once the hourly ones (60 days old) are gone
        await until(
            lambda: daily_rows(state / FILE) > 0 and daily_rows(state / FILE, "hourly") == 0
        )
        query = f"since={utc_date(day)}&until={utc_date(day + 3 * DAY)}"
        heat = await h.ok(f"/usage?{query}&by=weekday,hour&tz=Asia/Tokyo")
        weekday = datetime.fromtimestamp(day, UTC).strftime("%a")
        assert hours(heat, "active")[(weekday, None)] == 1.5
        daily = await h.ok(f"/usage?{query}&by=day,user&tz=-08:00")
        assert hours(daily, "active") == {
            (utc_date(day), "alice"): 1.5,
            (utc_date(day + DAY), "bob"): 1.0,
        }


@async_test
async def test_one_key_in_utc_answers_as_before_and_the_grouped_reading_agrees(state):
    write(str(state / FILE), three_hours(midnight(3)))
    async with running(state_dir=str(state), usage_interval=3600) as h:
        for by in ("user", "account", "gpu", "day", "job"):
            plain = await h.ok(f"/usage?since=7d&by={by}")
            grouped = await h.ok(f"/usage?since=7d&by={by}&tz=%2B00:00")
            assert plain["rows"] and plain["rows"] == grouped["rows"], by
            assert plain["total"] == grouped["total"] and plain["tz"] == "UTC"
            assert {k: v for k, v in plain.items() if k != "tz"}.keys() == {
                "since",
                "until",
                "by",
                "first",
                "interval",
                "busy_sm",
                "categories",
                "rows",
                "total",
            }
        pairs = await h.ok("/usage?since=7d&by=gpu,user")
        assert {row["number"] for row in pairs["rows"]} == {0, 1}


@async_test
async def test_a_bad_by_or_tz_is_a_400_naming_it(state):
    async with running(state_dir=str(state), usage_interval=3600) as h:
        for query, field in (
            ("by=day,user,gpu", "by"),
            ("by=user,user", "by"),
            ("by=day,", "by"),
            ("by=week", "by"),
            ("by=,user", "by"),
            ("tz=Mars/Olympus", "tz"),
            ("tz=%2B15:00", "tz"),
            ("tz=../../etc/passwd", "tz"),
            ("tz=%2B02:61", "tz"),
            ("tz=/etc/localtime", "tz"),
            ("tz=Europe", "tz"),
            ("tz=", "tz"),
            ("tz=Europe/../Europe/Paris", "tz"),
            ("tz=a%00b", "tz"),
            ("since=2026-11-01T00:00&tz=UTC", "since"),
        ):
            code, body = await h.call(f"/usage?{query}")
            assert code == 400 and body["field"] == field, (query, body)
            assert list(undocumented(body, answer_schema("/usage", "get", 400))) == []
        assert (await h.ok("/usage?tz=Europe/Paris&by=weekday"))["tz"] == "Europe/Paris"
        assert (await h.ok("/usage?tz=-0530&by=hour"))["tz"] == "-0530"


def shared_hours(day: int, alice: str, bob: str, carol: str):
    """alice and carol compute under one host account (lab), bob under his own."""
    lab = [
        gpu_hour(0, "claimed", alice, True, [(alice, True)], busy=60),
        gpu_hour(1, "claimed", bob, True, [(bob, True)], busy=60),
        gpu_hour(2, "claimed", carol, True, [(carol, True)], busy=60),
    ]
    for n, user in ((0, alice), (2, carol)):
        party = Party(user=user, account="lab")
        lab[n] = replace(lab[n], holder=party, present=(Present(party, own=True, pids=(7,)),))
    return [(day + 10 * HOUR, lab)]


@async_test
async def test_test_mode_callers_see_their_own_name_and_pseudonyms_for_each_of_two_keys(state):
    day = midnight(2)
    write(str(state / FILE), shared_hours(day, "alice", "bob", "carol"))
    date = utc_date(day)
    async with running(state_dir=str(state), usage_interval=3600, hide_users=True) as h:
        seen = {}
        for caller in ("alice", "bob", "zed"):
            users = await h.ok(f"/usage?since=7d&by=user&user={caller}")
            pairs = await h.ok(f"/usage?since=7d&by=day,user&user={caller}")
            accounts = await h.ok(f"/usage?since=7d&by=account,user&user={caller}")
            heat = await h.ok(f"/usage?since=7d&by=weekday,hour&user={caller}")
            alone = {row["key"] for row in users["rows"]} - {None}
            assert {row["key"][1] for row in pairs["rows"]} - {None} == alone, caller
            assert {row["key"][0] for row in pairs["rows"]} == {date}
            named = {name for name in alone if not PSEUDONYM.match(name)}
            assert named == ({caller} if caller != "zed" else set()), (caller, alone)
            assert len(alone) == 3
            shown = {tuple(row["key"]) for row in accounts["rows"]}
            # an account is named when every user under it is one the caller may see
            expect_bob = "bob" if caller == "bob" else None
            assert any(account == "bob" for account, _ in shown) == (expect_bob == "bob")
            assert not any(account == "lab" for account, _ in shown), caller
            assert len({account for account, _ in shown}) == 2
            assert heat["rows"] and all(
                not PSEUDONYM.match(str(k)) for row in heat["rows"] for k in row["key"]
            )
            seen[caller] = alone
        # one pseudonym per user, the same for every caller who does not see the name
        assert seen["zed"] >= (seen["alice"] - {"alice"})


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}])


@async_test
async def test_real_callers_see_their_own_name_and_root_every_name_by_two_keys(scenario, state):
    need_root("the callers run as other uids, and root is the host's administrator")
    nobody, daemon = host_identity(NOBODY).user, host_identity(DAEMON).user
    write(str(state / FILE), shared_hours(midnight(2), nobody, daemon, "carol"))
    async with gpu_running(
        scenario, state_dir=str(state), hide_users=True, usage_interval=3600
    ) as h:
        path = "/usage?since=7d&by=day,user"
        table = {NOBODY: nobody, DAEMON: daemon}
        for uid, own in table.items():
            [[code, answer]] = await ask_as(uid, h, path)
            users = {row["key"][1] for row in answer["rows"]} - {None}
            assert code == 200 and own in users, uid
            others = users - {own}
            assert len(others) == 2 and all(PSEUDONYM.match(u) for u in others), (uid, users)
        root = await h.ok(path)
        assert {row["key"][1] for row in root["rows"]} - {None} == {nobody, daemon, "carol"}
        accounts = await h.ok("/usage?since=7d&by=account,user")
        assert {row["key"][0] for row in accounts["rows"]} >= {"lab"}
