"""`patroller history`, `users` and `queue`: the audit record, who holds, uses and waits, and the
waiting requests, as tables or JSON, from a live test-mode daemon; the tables' formatting on the
bodies that daemon answered."""

import json
import re
import threading

import pytest
from helpers import ServerProcess
from test_cli import call, patroller

from patroller import client
from patroller.cli.records import detail, history_table, queue_table, since_of, users_table


@pytest.fixture
def server():
    process = ServerProcess("--test", "--lease", "300").start()
    yield process.server
    assert process.stop() == 0


def rows(text):
    """The table's rows, cells two or more spaces apart (the header first)."""
    return [re.split(r"\s{2,}", line) for line in text.splitlines()]


def test_history_shows_each_event_and_filters_by_user(server):
    assert call(server, "/request?gpu=2&user=alice@example.org")[0] == 200
    assert call(server, "/request?gpu=1&user=bob&hold=2h")[0] == 200
    assert call(server, "/release?user=alice@example.org")[0] == 200
    done = patroller("history", "--server", server)
    assert done.returncode == 0, done.stderr
    table = rows(done.stdout)
    assert table[0] == ["TIME", "EVENT", "USER", "GPUS", "DETAIL"]
    assert [(r[1], r[2], r[3]) for r in table[1:]] == [
        ("grant", "alice@example.org", "0,1"),
        ("grant", "bob", "2"),
        ("release", "alice@example.org", "0"),
        ("release", "alice@example.org", "1"),
    ]
    assert table[2][4].split()[0] == "hold=2h" and "seconds" not in table[2][4]  # not 7200.0
    mine = patroller("history", "--user", "bob", "--since", "1h", "--server", server)
    assert [r[1:3] for r in rows(mine.stdout)[1:]] == [["grant", "bob"]]
    raw = patroller("history", "--json", "--user", "bob", "--server", server)
    assert [e["event"] for e in json.loads(raw.stdout)] == ["grant"]
    later = patroller("history", "--since", "2099-01-01T00:00:00Z", "--server", server)
    assert later.returncode == 0 and later.stdout == "no events\n"


@pytest.mark.parametrize(
    "since,code,said",
    [
        ("yesterday", 2, "--since: 'yesterday' is neither a duration"),
        ("2026-13-01T00:00Z", 77, "since="),  # the server names what is wrong
    ],
)
def test_a_bad_since_is_refused_with_what_was_wrong(server, since, code, said):
    done = patroller("history", "--since", since, "--server", server)
    assert done.returncode == code and said in done.stderr, done.stderr


def test_users_and_queue_as_tables_and_json(server):
    assert call(server, "/request?gpu=8&user=alice@example.org")[0] == 200
    waiting = threading.Thread(target=call, args=(server, "/wait?gpu=2&user=carol&timeout=30"))
    waiting.start()
    try:
        deadline = 200
        while not client.queue(server) and deadline:
            deadline -= 1
            threading.Event().wait(0.05)
        users = rows(patroller("users", "--server", server).stdout)
        assert users[0][:4] == ["USER", "HELD", "UNUSED", "UNASKED"]
        by_user = {r[0]: r for r in users[1:]}
        assert by_user["alice@example.org"][1:3] == ["8", "8"]
        assert by_user["carol"][1] == "0" and by_user["carol"][5].startswith("1 (")
        queue = rows(patroller("queue", "--server", server).stdout)
        assert queue[0] == ["#", "USER", "WANTS", "WAITED", "HOLD"]
        assert queue[1][:3] == ["1", "carol", "2 GPUs"] and queue[1][4] == "lease"
        assert (
            json.loads(patroller("queue", "--json", "--server", server).stdout)[0]["user"]
            == "carol"
        )
        assert "alice@example.org" in json.loads(
            patroller("users", "--json", "--server", server).stdout
        )
    finally:
        call(server, "/release?user=alice@example.org")
        waiting.join(30)
    assert patroller("queue", "--server", server).stdout == "nobody is waiting\n"


def test_the_formatting_is_pure_and_says_when_there_is_nothing():
    assert history_table([]) == "no events\n" and queue_table([]) == "nobody is waiting\n"
    assert users_table({}) == "nobody holds, uses or waits for a GPU\n"
    event = {
        "time": "t",
        "at": 1.0,
        "event": "trespass",
        "user": "bob",
        "devices": [],
        "pid": 42,
        "jobs": ["4242"],
        "job": None,
        "holder": "alice",
    }
    assert detail(event) == "pid=42 jobs=4242 holder=alice"
    assert since_of(None, 1000.0) is None and since_of("90s", 1000.0) == "910.000"
    assert since_of("2026-12-01T00:00:00Z", 1000.0) == "2026-12-01T00:00:00Z"


def test_a_hold_for_a_duration_is_written_as_one():
    # As found: `hold=duration seconds=3600.0`.
    assert (
        detail({"event": "grant", "hold": "duration", "seconds": 3600.0, "pid": 7})
        == "hold=1h pid=7"
    )
    assert detail({"event": "grant", "hold": "duration", "seconds": 5400}) == "hold=1h30m"
    assert detail({"event": "grant", "hold": "lease"}) == "hold=lease"
    assert detail({"event": "x", "idle_seconds": 90.0, "count": 3}) == "idle_seconds=1m30s count=3"
