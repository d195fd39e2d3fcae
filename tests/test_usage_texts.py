"""How a report's rows leave SQLite (patroller/state/usage/queries.py `texts`, `at_once`): as
JSON texts of at most `chunk` rows, in the order of their keys, each sum of seconds the exact
float it is, and TooLarge past the rows a report may hold. In-process and fast: the mutation
suite runs this file."""

from __future__ import annotations

import sqlite3
import time
from datetime import timedelta, timezone

import pytest
from usage_history import DAY, HOUR, gpu_hour, write

from patroller.state.usage import groupings, queries
from patroller.state.usage.queries import TooLarge, at_once, texts

SQL = "SELECT a, b, s FROM t WHERE s >= ?"
# in an order that is neither the keys' nor the seconds'
ROWS = [("b", "y", 0.1), ("b", "x", 3600.0), ("a", "z", 1 / 3), ("c", "w", 2.5), ("a", "y", 7.0)]
IN_ORDER = [
    ["a", "y", "7.0"],
    ["a", "z", "0.33333333333333331"],
    ["b", "x", "3600.0"],
    ["b", "y", "0.10000000000000001"],
    ["c", "w", "2.5"],
]


@pytest.fixture
def db():
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a TEXT, b TEXT, s REAL)")
    db.executemany("INSERT INTO t VALUES (?, ?, ?)", ROWS)
    yield db
    db.close()


def test_rows_come_in_texts_of_a_chunk_in_the_order_of_their_keys(db):
    assert texts(db, SQL, (0.0,), 3, None, 2) == [
        ('[["a","y","7.0"],["a","z","0.33333333333333331"]]', 2),
        ('[["b","x","3600.0"],["b","y","0.10000000000000001"]]', 2),
        ('[["c","w","2.5"]]', 1),
    ]
    whole = texts(db, SQL, (0.0,), 3)  # no chunk: one text
    assert len(whole) == 1 and whole[0][1] == 5
    assert float(IN_ORDER[1][2]) == 1 / 3 and float(IN_ORDER[3][2]) == 0.1  # exact


def test_the_parameters_choose_the_rows(db):
    assert at_once(db, SQL, (1.0,), 3) == [IN_ORDER[0], IN_ORDER[2], IN_ORDER[4]]
    assert texts(db, SQL, (10_000.0,), 3) == []


def test_at_once_parses_every_chunk_into_one_list(db):
    assert at_once(db, SQL, (0.0,), 3, None, 2) == IN_ORDER
    assert at_once(db, SQL, (0.0,), 3, 5, 2) == IN_ORDER
    assert at_once(db, SQL, (0.0,), 3) == IN_ORDER


def test_a_report_of_its_limit_is_whole_and_one_row_past_it_is_too_large(db):
    assert sum(n for _, n in texts(db, SQL, (0.0,), 3, 5, 2)) == 5
    with pytest.raises(TooLarge) as found:
        texts(db, SQL, (0.0,), 3, 4, 2)
    assert found.value.limit == 4 and str(found.value) == "more than 4 rows"
    with pytest.raises(TooLarge):
        at_once(db, SQL, (0.0,), 3, 4)


def test_a_report_says_the_first_hour_the_store_has_whatever_its_range(tmp_path):
    path = str(tmp_path / "usage.sqlite3")
    start = 1_800_000_000 // HOUR * HOUR
    write(path, [(start + n * HOUR, [gpu_hour(0, "claimed", holder="alice")]) for n in (1, 2, 3)])
    db = sqlite3.connect(path, isolation_level=None)
    try:
        [(first,)] = db.execute("SELECT MIN(hour) FROM hourly")
        since, until = start + 2 * HOUR, start + 4 * HOUR  # not the first hour
        plain = queries.totals(db, since, until, "user")
        grouped = groupings.totals(db, since, until, ("user",), timezone.utc)
    finally:
        db.close()
    assert plain.first == grouped.first == float(first)
    assert plain.numbers == grouped.numbers and list(grouped.numbers.values()) == [0]
    assert {row[0] for row in plain.rows} == {"alice"}
    assert {row[0] for row in grouped.rows} == {("alice",)}


USERS = ("alice", "bob")


def test_a_grouped_report_has_its_days_in_its_zone_and_its_limit(tmp_path):
    """Hours late in a UTC day are the next day's at +09:00; a limit holds however the texts
    are cut (chunk)."""
    path = str(tmp_path / "usage.sqlite3")
    midnight = 1_800_000_000 // 86400 * 86400
    ends = [midnight - 3 * HOUR, midnight - 2 * HOUR]  # 21:00-23:00 UTC the day before
    write(
        path,
        [(at, [gpu_hour(0, "claimed", holder=who)]) for at, who in zip(ends, USERS, strict=True)],
    )
    since, until = midnight - DAY, midnight + DAY
    tokyo = timezone(timedelta(hours=9))
    db = sqlite3.connect(path, isolation_level=None)
    try:
        days = groupings.totals(db, since, until, ("day", "user"), tokyo, None, 1)
        with pytest.raises(TooLarge):
            groupings.totals(db, since, until, ("day", "user"), tokyo, 1)
    finally:
        db.close()
    next_day = time.strftime("%Y-%m-%d", time.gmtime(midnight))
    assert {row[0] for row in days.rows} == {(next_day, "alice"), (next_day, "bob")}
