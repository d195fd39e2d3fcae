"""Writing the usage store's tables row by row (state/usage/tables.py, schema.py), on a real
SQLite file: what a sample's row holds of its processes, a GPU whose index changed, an interval
that fails leaving the connection ready for the next, and the schema versions refused."""

import json
import sqlite3
from dataclasses import replace

import pytest
from test_usage_rollup import HOUR, fresh
from test_usage_store import interval

from patroller.state.usage import queries, schema, tables

AT = 1_790_000_000 // HOUR * HOUR + 600


def test_a_samples_row_holds_its_processes_as_compact_json(tmp_path):
    db = fresh(tmp_path / "u.sqlite3")
    tables.write_interval(db, tables.Keys(), AT, interval())
    [(processes,)] = db.execute(
        "SELECT processes FROM samples WHERE gpu = (SELECT id FROM gpus WHERE uuid = 'GPU-a')"
    ).fetchall()
    [alice] = db.execute("SELECT id FROM parties WHERE user = 'alice'").fetchone()
    assert processes == json.dumps(
        [{"party": alice, "own": True, "pids": [42], "containers": ["train"]}],
        separators=(",", ":"),
    )
    assert processes == f'[{{"party":{alice},"own":true,"pids":[42],"containers":["train"]}}]'


def test_a_gpu_whose_index_changed_is_shown_at_its_new_one(tmp_path):
    db = fresh(tmp_path / "u.sqlite3")
    keys = tables.Keys()
    tables.write_interval(db, keys, AT, interval())
    moved = [replace(sample, number=sample.number + 4) for sample in interval()]
    tables.write_interval(db, keys, AT + 60, moved)  # the same connection and keys: renumbered
    assert queries.totals(db, AT - HOUR, AT + HOUR, "gpu").numbers == {"GPU-a": 4, "GPU-b": 5}
    assert db.execute("SELECT COUNT(*) FROM gpus").fetchone() == (2,)


def test_each_gpu_of_an_interval_has_its_seconds_by_hour_and_by_day(tmp_path):
    db = fresh(tmp_path / "u.sqlite3")
    keys = tables.Keys()
    tables.write_interval(db, keys, AT, interval())
    tables.write_interval(db, keys, AT + 60, interval(seconds=30.0))  # the same hour: added
    hour, day = (AT - 60) // HOUR * HOUR, (AT - 60) // 86400 * 86400
    totals = (
        "SELECT {0}, uuid, category, COALESCE(user, ''), seconds FROM {1} "
        "JOIN gpus ON gpus.id = gpu LEFT JOIN parties ON parties.id = party ORDER BY 2, 3"
    )
    expected = [
        ("GPU-a", "active", "alice", 45.0),  # computing half of 60 s and of 30 s
        ("GPU-a", "idle_held", "alice", 45.0),
        ("GPU-b", "free", "", 90.0),
    ]
    assert db.execute(totals.format("hour", "hourly")).fetchall() == [
        (hour, *row) for row in expected
    ]
    assert db.execute(totals.format("day", "daily")).fetchall() == [
        (day, *row) for row in expected
    ]


def test_an_interval_that_fails_is_rolled_back_and_the_next_is_written(tmp_path):
    db = fresh(tmp_path / "u.sqlite3")
    keys = tables.Keys()
    broken = [interval()[0], replace(interval()[1], state=None)]  # NOT NULL: the second row fails
    with pytest.raises(sqlite3.IntegrityError):
        tables.write_interval(db, keys, AT, broken)
    assert not db.in_transaction
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (0,)  # the first row too
    assert tables.write_interval(db, keys, AT + 60, interval()) == 2
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (2,)


def test_a_file_with_tables_but_no_version_is_named_by_its_first_five_tables(tmp_path):
    db = sqlite3.connect(tmp_path / "other.sqlite3")
    for name in ("a", "b", "c", "d", "e", "f", "g"):
        db.execute(f"CREATE TABLE {name} (x)")
    with pytest.raises(schema.NotAStore) as raised:
        schema.version(db)
    assert str(raised.value) == (
        "holds tables (a, b, c, d, e) but no schema version: not a usage store"
    )


@pytest.mark.parametrize("value", [None, "two", 2.0, 0, -1])
def test_a_version_that_is_not_a_positive_whole_number_is_not_a_store(tmp_path, value):
    db = sqlite3.connect(tmp_path / "u.sqlite3")
    db.execute("CREATE TABLE schema_version (version)")
    if value is not None:
        db.execute("INSERT INTO schema_version VALUES (?)", (value,))
    with pytest.raises(schema.NotAStore) as raised:
        schema.version(db)
    assert str(raised.value) == "has no readable schema version"


def test_a_version_that_is_a_positive_whole_number_is_read(tmp_path):
    db = sqlite3.connect(tmp_path / "u.sqlite3")
    db.execute("CREATE TABLE schema_version (version)")
    db.execute("INSERT INTO schema_version VALUES (1)")
    assert schema.version(db) == 1


def test_a_report_over_the_room_says_how_many_rows_it_may_have():
    refused = queries.TooLarge(5000)
    assert (str(refused), refused.limit) == ("more than 5000 rows", 5000)
