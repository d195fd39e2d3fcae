"""The usage store's daily totals of every day (schema version 2): written with each interval
beside the hourly ones, kept when the hourly ones are removed after --usage-days, made from the
hourly ones when a version 1 file is migrated; and reports that read the whole days of a range
from them and only its ends from the hourly totals, counting every hour once (pure `ranges`
checked against the rule hour by hour, and whole reports against the hourly totals alone)."""

import random
import sqlite3
from dataclasses import replace
from datetime import timedelta, timezone

import pytest
from test_usage_store import BOB, by_category, interval

from patroller.state.usage import groupings, queries, schema, tables

HOUR, DAY = 3600, 86400
START = 1_790_000_000 // DAY * DAY  # a day's start (UTC)


def starts(begin, end, step):
    """The multiples of `step` in [begin, end)."""
    return [n for n in range(int(-(-begin // step) * step), int(-(-end // 1)), step) if n < end]


def units(found, kept):
    """What `found` (queries.Ranges) counts, as ("h", hour) and ("d", day) units: a day with
    hourly totals (from `kept` on) counts as its 24 hours. Fails if anything counts twice."""
    counted = []
    for begin, end in found.days:
        for day in starts(begin, end, DAY):
            if kept is not None and day >= kept:
                counted += [("h", day + n * HOUR) for n in range(24)]
            else:
                counted.append(("d", day))
    for begin, end in found.hours:
        counted += [("h", hour) for hour in starts(begin, end, HOUR)]
    assert len(counted) == len(set(counted)), "an hour or a day counted twice"
    return set(counted)


def rule(since, until, kept):
    """The rule a range follows: the hours with hourly totals (from `kept` on) that begin at or
    after `since` rounded down to its hour, and before `until`; the days before `kept` (daily
    totals alone) that begin at or after `since` rounded down to its day, and before `until`."""
    hours = (
        set()
        if kept is None
        else {("h", hour) for hour in starts(max(since // HOUR * HOUR, kept), until, HOUR)}
    )
    days = {
        ("d", day)
        for day in starts(since // DAY * DAY, until if kept is None else min(until, kept), DAY)
    }
    return hours | days


@pytest.mark.parametrize("seed", range(4))
def test_a_range_reads_every_hour_once_from_the_daily_or_the_hourly_totals(seed):
    rnd = random.Random(seed)
    for _ in range(500):
        kept = rnd.choice([None, START, START + 3 * DAY, START + 40 * DAY])
        since = START - 5 * DAY + rnd.randrange(0, 60 * DAY, rnd.choice([1, HOUR, DAY]))
        until = (
            since
            + rnd.choice(
                [0, 1, HOUR - 1, HOUR, DAY - 1, DAY, DAY + 1, 30 * DAY, rnd.randrange(0, 50 * DAY)]
            )
            + rnd.choice([0, 0.5])
        )
        found = queries.ranges(since // HOUR * HOUR, since // DAY * DAY, until, kept)
        assert units(found, kept) == rule(since, until, kept), (since, until, kept, found)


def test_the_whole_days_of_a_range_are_read_as_daily_totals_and_its_ends_as_hours():
    since, until = START + 5 * HOUR + 10, START + 10 * DAY + 2 * HOUR + 1
    found = queries.ranges(since // HOUR * HOUR, since // DAY * DAY, until, START)
    assert found.days == ((START, START), (START + DAY, START + 10 * DAY))  # nine whole days
    assert found.hours == ((START + 5 * HOUR, START + DAY), (START + 10 * DAY, until))
    # until within the last hour of a day: that day counts whole
    found = queries.ranges(START, START, START + DAY - 1, START)
    assert found.days[1] == (START, START + DAY) and found.hours == (
        (START, START),
        (START + DAY, START + DAY - 1),
    )
    # a range within one day: hours alone; no hourly totals at all: days alone
    assert queries.ranges(START, START, START + 5 * HOUR, START).days[1] == (
        START + 5 * HOUR,
        START + 5 * HOUR,
    )
    assert queries.ranges(START + HOUR, START, START + DAY, None) == queries.Ranges(
        ((START, START + DAY), (START + DAY, START + DAY)),
        ((START + DAY, START + DAY), (START + DAY, START + DAY)),
    )


def fresh(path, latest=None):
    db = sqlite3.connect(path, isolation_level=None)
    schema.migrate(db, latest=latest)
    return db


def history(db, days=12, seed=7):
    """Intervals of two GPUs at random hours over `days` days from START."""
    rnd, keys = random.Random(seed), tables.Keys()
    for _ in range(days * 6):
        at = START + rnd.randrange(60, days * DAY, 60)
        samples = interval()
        if rnd.random() < 0.5:  # bob holds the second GPU, idle
            samples[1] = replace(samples[0], uuid="GPU-b", number=1, holder=BOB, present=())
        tables.write_interval(db, keys, at, samples)


def test_each_interval_adds_to_the_daily_totals_what_it_adds_to_the_hourly_ones(tmp_path):
    db = fresh(tmp_path / "u.sqlite3")
    history(db)
    by_hours = db.execute(
        "SELECT hour - hour % 86400, gpu, category, party, SUM(seconds) "
        "FROM hourly GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
    ).fetchall()
    assert (
        by_hours
        and db.execute(
            "SELECT day, gpu, category, party, seconds FROM daily ORDER BY 1, 2, 3, 4"
        ).fetchall()
        == by_hours
    )
    tables.fold(db, START + 5 * DAY)  # the hourly totals go; the daily ones stay
    assert db.execute("SELECT MIN(hour) FROM hourly").fetchone()[0] >= START + 5 * DAY
    assert (
        db.execute(
            "SELECT day, gpu, category, party, seconds FROM daily ORDER BY 1, 2, 3, 4"
        ).fetchall()
        == by_hours
    )


def hour_by_hour(db, since, until, by):
    """A report by the rule, from the hourly totals alone (a file where nothing was folded)."""
    rows = db.execute(
        f"SELECT {queries.KEYS[by].replace('t.start', 't.hour')}, p.user, "
        "t.category, SUM(t.seconds) FROM hourly AS t JOIN parties AS p "
        "ON p.id = t.party JOIN gpus AS g ON g.id = t.gpu "
        "WHERE t.hour >= ? AND t.hour < ? GROUP BY 1, 2, 3",
        (since // HOUR * HOUR, until),
    ).fetchall()
    return sorted(
        (
            (key or None, user or None, category, round(seconds, 6))
            for key, user, category, seconds in rows
        ),
        key=repr,
    )


def rounded(totals):
    return sorted(
        ((key, user, category, round(seconds, 6)) for key, user, category, seconds in totals.rows),
        key=repr,
    )


@pytest.mark.parametrize("by", sorted(queries.KEYS))
def test_a_report_from_whole_days_and_end_hours_is_the_report_hour_by_hour(tmp_path, by):
    db = fresh(tmp_path / "u.sqlite3")
    history(db)
    rnd = random.Random(by)
    for _ in range(40):
        since = START + rnd.randrange(-DAY, 13 * DAY, rnd.choice([1, HOUR]))
        until = since + rnd.randrange(0, 14 * DAY, rnd.choice([1, HOUR]))
        assert rounded(queries.totals(db, since, until, by)) == hour_by_hour(
            db, since, until, by
        ), (since, until)
    whole = queries.totals(db, START, START + 20 * DAY, by)
    assert whole.rows and whole.first == float(
        db.execute("SELECT MIN(hour) FROM hourly").fetchone()[0]
    )


@pytest.mark.parametrize(
    "by,zone",
    [
        (("day", "user"), timezone.utc),
        (("weekday", "gpu"), timezone.utc),
        (("user", "job"), timezone(timedelta(hours=-5))),
        (("day", "user"), timezone(timedelta(hours=9))),
        (("hour", "user"), timezone.utc),
    ],
)
def test_a_grouped_report_is_the_same_whether_its_days_are_read_whole_or_by_the_hour(
    tmp_path, monkeypatch, by, zone
):
    """Whole days are read as daily totals only where the keys allow (no hour, UTC days or no
    time at all): the same figures as a report read hour by hour (`whole_days` refused)."""
    db = fresh(tmp_path / "u.sqlite3")
    history(db)
    since, until = START + 5 * HOUR + 7, START + 11 * DAY + 3 * HOUR
    whole = rounded(groupings.totals(db, since, until, by, zone))
    monkeypatch.setattr(groupings, "whole_days", lambda by, moved: False)
    assert whole and rounded(groupings.totals(db, since, until, by, zone)) == whole
    monkeypatch.undo()
    assert groupings.whole_days(by, 0) is ("hour" not in by)
    assert groupings.whole_days(("user", "job"), -18000) is True
    assert groupings.whole_days(("day", "user"), 32400) is False


def test_a_version_1_file_is_migrated_with_every_day_in_the_daily_totals(tmp_path):
    """Version 1 kept daily totals only of the days folded; the step adds the hourly totals up
    into the others, and every report reads as it did."""
    db = fresh(tmp_path / "u.sqlite3", latest=1)
    db.execute("INSERT INTO gpus (uuid, number) VALUES ('GPU-a', 0)")
    db.execute("INSERT INTO parties VALUES (1, 'alice', 'alice', '', '', '', '')")
    rows = [
        (START - 2 * DAY, 1, "active", 1, 3600.0),  # folded before the step: daily alone
        (START - DAY, 1, "active", 1, 1800.0),
    ]
    db.executemany("INSERT INTO daily VALUES (?, ?, ?, ?, ?)", rows)
    hours = [(START + n * HOUR, 1, "active", 1, 600.0) for n in range(30)]  # 24 h + 6 h
    hours.append((START + HOUR, 1, "free", 0, 3000.0))
    db.executemany("INSERT INTO hourly VALUES (?, ?, ?, ?, ?)", hours)
    assert schema.migrate(db) == 1 and schema.version(db) == schema.LATEST
    assert db.execute(
        "SELECT day, category, party, seconds FROM daily ORDER BY 1, 2"
    ).fetchall() == [
        (START - 2 * DAY, "active", 1, 3600.0),
        (START - DAY, "active", 1, 1800.0),
        (START, "active", 1, 24 * 600.0),
        (START, "free", 0, 3000.0),
        (START + DAY, "active", 1, 6 * 600.0),
    ]
    # from 5 s into a folded day: that day whole; from 2 a.m. of a day with hours: its hours
    assert by_category(queries.totals(db, START - DAY + 5, START + 2 * DAY, "user")) == {
        ("alice", "active"): 1800.0 + 30 * 600.0,
        (None, "free"): 3000.0,
    }
    assert by_category(queries.totals(db, START + 2 * HOUR, START + 2 * DAY, "user")) == {
        ("alice", "active"): 28 * 600.0
    }
    assert by_category(queries.totals(db, START - 3 * DAY, START + 2 * DAY, "user")) == {
        ("alice", "active"): 3600.0 + 1800.0 + 30 * 600.0,
        (None, "free"): 3000.0,
    }


@pytest.mark.parametrize(
    "module,read",
    [
        (queries, lambda db, since, until: queries.totals(db, since, until, "user")),
        (
            groupings,
            lambda db, since, until: groupings.totals(
                db, since, until, ("user", "job"), timezone.utc
            ),
        ),
    ],
)
def test_a_report_is_read_in_one_transaction_however_the_writer_moves_on(
    tmp_path, monkeypatch, module, read
):
    """The first day with hourly totals and the rows are read from one snapshot: a fold that
    commits between the two cannot make a day count nowhere."""
    path = tmp_path / "u.sqlite3"
    db = fresh(path)
    db.execute("PRAGMA journal_mode = WAL")
    history(db)
    tables.write_interval(db, tables.Keys(), START + 5 * HOUR + 60, interval())  # an end hour
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    since, until = START + 3 * HOUR, START + 20 * DAY + 5 * HOUR  # hours at both ends
    expected = rounded(read(reader, since, until))
    kept_from = queries.kept_from

    def fold_meanwhile(conn):
        kept = kept_from(conn)
        tables.fold(db, START + 6 * DAY)  # the writer, between the reader's two reads
        return kept

    monkeypatch.setattr(module, "kept_from", fold_meanwhile)
    assert rounded(read(reader, since, until)) == expected
    assert not reader.in_transaction


class Stepped:
    """A connection that counts the rows each statement hands to Python (each one a step of
    SQLite after which the module takes the interpreter's lock back)."""

    def __init__(self, db):
        self.db, self.rows = db, 0

    def execute(self, sql, parameters=()):
        outer = self

        class Cursor:
            def __init__(self, cursor):
                self.cursor = cursor

            def fetchone(self):
                row = self.cursor.fetchone()
                outer.rows += row is not None
                return row

            def __iter__(self):
                for row in self.cursor:
                    outer.rows += 1
                    yield row

        return Cursor(self.db.execute(sql, parameters))


@pytest.mark.parametrize(
    "read",
    [
        lambda db, since, until: queries.totals(db, since, until, "day"),
        lambda db, since, until: groupings.totals(
            db, since, until, ("day", "user"), timezone(timedelta(hours=5))
        ),
    ],
)
def test_a_report_of_many_rows_reaches_python_in_a_few_steps_not_one_a_row(tmp_path, read):
    """Under load a report waited for the interpreter's lock once a row it stepped to (a
    year by day is 20,000 rows); its rows now come in one step a statement (that they are
    the right rows: the hour-by-hour test above)."""
    db = fresh(tmp_path / "u.sqlite3")
    history(db, days=40, seed=3)
    since, until = START + 5 * HOUR, START + 40 * DAY
    stepped = Stepped(db)
    found = read(stepped, since, until)
    assert len(found.rows) > 50
    assert stepped.rows <= 12, stepped.rows  # the bounds, the GPUs, the first: not the rows
    assert rounded(found) == rounded(read(db, since, until))  # read as the reader reads it


def test_a_reports_rows_come_in_pieces_of_at_most_chunk_rows_each_one_step(tmp_path):
    """Each piece is parsed in one call that holds the interpreter's lock: a year by day in
    one piece held it 10-19 ms. In pieces of 10 rows, a report of N rows is N/10 steps."""
    db = fresh(tmp_path / "u.sqlite3")
    history(db, days=40, seed=3)
    since, until = START + 5 * HOUR, START + 40 * DAY
    whole = queries.totals(db, since, until, "day")
    stepped = Stepped(db)
    pieces = queries.totals(stepped, since, until, "day", chunk=10)
    assert rounded(pieces) == rounded(whole) and len(whole.rows) > 50
    assert -(-len(whole.rows) // 10) <= stepped.rows <= -(-len(whole.rows) // 10) + 12
    grouped = groupings.totals(db, since, until, ("day", "user"), timezone.utc)
    stepped = Stepped(db)
    found = groupings.totals(stepped, since, until, ("day", "user"), timezone.utc, chunk=10)
    assert rounded(found) == rounded(grouped) and stepped.rows >= len(grouped.rows) // 10
