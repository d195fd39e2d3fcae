"""The reports' answers kept in memory (state/usage/reader.py): the same report asked again
while nothing was committed is answered without reading the file; anything committed (by the
writer, or by any other connection), a file replaced, or a read that failed forgets them all;
and they hold at most `usage_report_cache_rows` rows, the least recently asked going first.
Real stores on disk, real reader threads."""

import asyncio
import os
import random
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta, timezone

from test_usage_rollup import HOUR, START, fresh, history, rounded
from test_usage_store import by_category, interval, report, store_in, wait

from patroller.config import Config
from patroller.state.usage import queries, schema, tables
from patroller.state.usage.files import FILE
from patroller.state.usage.reader import Reader

NOW = time.time() // HOUR * HOUR + 600  # ten minutes into an hour


def test_the_same_report_asked_again_is_answered_from_memory_until_a_write(tmp_path):
    with store_in(tmp_path) as store:
        store.put(NOW - 60, interval())
        wait(lambda: store.intervals == 1)
        first = report(store, NOW - 2 * HOUR, NOW)
        again = report(store, NOW - 2 * HOUR + 5, NOW + 100)  # the same hours: the same answer
        assert again == first and store.metrics()["answered_again"] == 1
        report(store, NOW - 3 * HOUR, NOW)  # another hour: read
        assert store.metrics()["answered_again"] == 1
        store.put(NOW, interval())  # committed: every answer is forgotten
        wait(lambda: store.intervals == 2)
        after = report(store, NOW - 2 * HOUR, NOW + 100)
        assert by_category(first)[("alice", "active")] == 30.0
        assert by_category(after)[("alice", "active")] == 60.0
        assert report(store, NOW - 2 * HOUR, NOW + 100) == after
        assert store.metrics()["answered_again"] == 2


def test_a_commit_by_any_other_connection_forgets_the_answers(tmp_path):
    with store_in(tmp_path) as store:
        store.put(NOW - 60, interval())
        wait(lambda: store.intervals == 1)
        first = report(store, NOW - 2 * HOUR, NOW)
        other = sqlite3.connect(tmp_path / FILE, isolation_level=None)
        other.execute("UPDATE hourly SET seconds = seconds * 2")
        other.execute("UPDATE daily SET seconds = seconds * 2")
        other.close()
        assert (
            by_category(report(store, NOW - 2 * HOUR, NOW))[("alice", "active")]
            == 2 * by_category(first)[("alice", "active")]
        )
        assert store.metrics()["answered_again"] == 0


def test_a_report_in_another_zone_is_read_for_that_zone(tmp_path):
    with store_in(tmp_path) as store:
        store.put(NOW - 60, interval())
        wait(lambda: store.intervals == 1)
        in_utc = asyncio.run(store.grouped(NOW - 2 * HOUR, NOW, ("hour", "user"), timezone.utc))
        east = asyncio.run(
            store.grouped(NOW - 2 * HOUR, NOW, ("hour", "user"), timezone(timedelta(hours=5)))
        )  # 5 hours later there
        assert store.metrics()["answered_again"] == 0
        assert {key for key, *_ in east.rows} != {key for key, *_ in in_utc.rows}


def read(reader, since, until, by="user", zone=None):
    return asyncio.run(reader.read(since, until, by, zone))


def test_a_file_replaced_is_read_afresh_not_answered_from_the_one_before(tmp_path):
    """A fresh connection's data_version may well equal the last one's: the answers go with the
    connection they were read on."""
    path = tmp_path / FILE
    for name, seconds in (("old", 60.0), ("new", 120.0)):
        db = fresh(tmp_path / name)
        tables.write_interval(db, tables.Keys(), NOW - 60, interval(seconds))
        db.close()
    os.rename(tmp_path / "old", path)
    reader = Reader(str(path), Config())
    try:
        assert by_category(read(reader, NOW - HOUR, NOW))[("alice", "active")] == 30.0
        os.rename(tmp_path / "new", path)  # as the writer does after setting a file aside
        reader.file_replaced()
        assert by_category(read(reader, NOW - HOUR, NOW))[("alice", "active")] == 60.0
    finally:
        reader.close()


def one_interval(tmp_path):
    """A store file with one interval written straight into it: its path."""
    path = tmp_path / FILE
    tables.write_interval(fresh(path), tables.Keys(), NOW - 60, interval())
    return path


@contextmanager
def reader_on(path, **settings):
    """A Reader of the file at `path`, on Config changed by `settings`, closed afterwards."""
    reader = Reader(str(path), replace(Config(), **settings))
    try:
        yield reader
    finally:
        reader.close()


def test_a_read_that_fails_forgets_the_answers(tmp_path):
    with reader_on(one_interval(tmp_path)) as reader:
        first = read(reader, NOW - HOUR, NOW)
        reader._close()  # as a failed read does, on the reader's connection
        assert read(reader, NOW - HOUR, NOW) == first
        assert reader.answered_again == 0


def test_the_answers_kept_hold_at_most_the_rows_configured(tmp_path):
    path = one_interval(tmp_path)  # reports of 3 rows
    with reader_on(path, usage_report_cache_rows=10) as reader:
        by_user = read(reader, NOW - HOUR, NOW)  # 3 rows (and one for the answer)
        by_gpu = read(reader, NOW - HOUR, NOW, "gpu")  # 3 rows: 8 of 10 in all
        assert len(by_user.rows) == 3 and len(by_gpu.rows) == 3
        assert read(reader, NOW - HOUR, NOW) == by_user  # asked last: kept longer
        assert reader.answered_again == 1
        read(reader, NOW - 2 * HOUR, NOW, "day")  # no room for both: by_gpu goes
        assert read(reader, NOW - HOUR, NOW) == by_user and reader.answered_again == 2
        assert read(reader, NOW - HOUR, NOW, "gpu") == by_gpu  # read again
        assert reader.answered_again == 2
    with reader_on(path, usage_report_cache_rows=3) as small:
        # an answer as large as all the room is not kept
        assert read(small, NOW - HOUR, NOW) == read(small, NOW - HOUR, NOW)
        assert small.answered_again == 0
    with reader_on(path, usage_report_cache_rows=4) as exact:
        # one that fills it exactly is (3 rows and one for the answer)
        assert read(exact, NOW - HOUR, NOW) == read(exact, NOW - HOUR, NOW)
        assert exact.answered_again == 1


def test_the_close_lets_go_of_the_file_in_the_reader_thread(tmp_path):
    reader = Reader(str(one_interval(tmp_path)), Config())
    read(reader, NOW - HOUR, NOW)
    assert reader._db is not None
    reader.close()
    wait(lambda: reader._db is None)  # closed by the reader's own thread


def test_ranges_of_the_same_answer_key_read_the_same_rows(tmp_path):
    """What the answers are kept by: the hour since is in, the end of the hour until is in."""
    db = fresh(tmp_path / "u.sqlite3")
    history(db)
    tables.fold(db, START + 3 * 86400)  # some days with daily totals alone
    rnd = random.Random(3)
    for _ in range(150):
        since = START + rnd.randrange(-86400, 13 * 86400)
        until = since + rnd.randrange(0, 12 * 86400)
        by = rnd.choice(sorted(queries.KEYS))
        same_since = since // HOUR * HOUR + rnd.randrange(HOUR)
        same_until = -(-until // HOUR) * HOUR - rnd.randrange(HOUR)
        if same_until <= since // HOUR * HOUR:
            same_until = until
        key = queries.answer_key(since, until, by, None)
        assert queries.answer_key(same_since, same_until, by, None) == key
        assert rounded(queries.totals(db, same_since, same_until, by)) == rounded(
            queries.totals(db, since, until, by)
        ), (since, until, by)
    # until: the hour that ends at it or after it; since: the hour it is in
    assert (
        queries.answer_key(START, START + 1, "user", None)
        == queries.answer_key(START, START + HOUR, "user", None)
        != queries.answer_key(START, START + HOUR + 1, "user", None)
    )
    assert queries.answer_key(START - 1, START + HOUR, "user", None) != queries.answer_key(
        START, START + HOUR, "user", None
    )
    assert schema.version(db) == schema.LATEST
