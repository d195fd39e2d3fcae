"""A report's Python runs on the event loop in slices, the reports' thread doing only SQLite:
Python in that thread held the interpreter's lock in long C calls, and the loop, which lets it
go at each system call, waited for it back each time (/status's p99 from 4 to 23-28 ms under
a year by day; docs/performance.md). Between two slices the loop runs what waits."""

import asyncio
import json
import random
import threading
import time
from datetime import datetime, timedelta, timezone

from helpers import async_test, running
from usage_history import lab, write

from patroller.core import usage as core
from patroller.state.usage import groupings, queries

FILE = "usage.sqlite3"
# each a report's rows made, summed or merged: the Python of an answer
PARTS = {
    "rows_of": (queries, "rows_of"),
    "summed": (groupings, "summed"),
    "merged": (groupings.Merged, "add"),
    "summary": (core.Summary, "add"),
}
# the reports of many slices (20 rows each), and the kinds of slice each makes several of
LONG = {
    "/usage?since=20d&by=day": {"rows_of", "summary"},
    "/usage?since=20d&by=day,user": {"merged", "summed", "summary"},
}
ASKED = ("/usage?since=20d&by=day", "/usage?since=20d&by=day,user", "/usage?since=20d&by=user")


def history(state, days=20):
    state.mkdir(mode=0o700)
    write(str(state / FILE), lab(time.time(), days))


def recorded(monkeypatch, calls):
    """Each part of PARTS wrapped to record the thread it runs in and what had run on the
    loop by then (`calls`: a list of (part, thread ident))."""
    for label, (owner, name) in PARTS.items():
        original = getattr(owner, name)

        def wrapper(*args, original=original, label=label):
            calls.append((label, threading.get_ident()))
            return original(*args)

        monkeypatch.setattr(owner, name, wrapper)


@async_test
async def test_the_reports_thread_runs_sqlite_only_and_the_answer_is_made_on_the_loop(
    tmp_path, monkeypatch
):
    history(tmp_path / "state")
    calls: list[tuple[str, int]] = []
    read_in: list[str] = []
    texts = queries.texts

    def reading(*args):
        read_in.append(threading.current_thread().name)
        return texts(*args)

    monkeypatch.setattr(queries, "texts", reading)
    monkeypatch.setattr(groupings, "texts", reading)
    recorded(monkeypatch, calls)
    loop_thread = threading.get_ident()
    async with running(state_dir=str(tmp_path / "state")) as h:
        for path in ASKED:
            assert (await h.ok(path))["rows"]
    assert read_in and all(name.startswith("usage-reader") for name in read_in), read_in
    made = {name for name, _ in calls}
    assert made == set(PARTS), made
    assert {thread for _, thread in calls} == {loop_thread}


@async_test
async def test_a_long_report_lets_the_loop_run_between_its_slices(tmp_path, monkeypatch):
    """A callback put on the loop when a report makes its first slice of a kind (parsing,
    merging, summing) runs before its last slice of that kind: the report let the loop turn
    in between."""
    history(tmp_path / "state")
    made: dict[str, int] = {}  # part -> slices of it made so far in this report
    ran: dict[str, int] = {}  # part -> slices of it made when its callback ran
    for label, (owner, name) in PARTS.items():
        original = getattr(owner, name)

        def wrapper(*args, original=original, label=label):
            made[label] = made.get(label, 0) + 1
            if made[label] == 1:
                asyncio.get_running_loop().call_soon(
                    lambda label=label: ran.setdefault(label, made[label])
                )
            return original(*args)

        monkeypatch.setattr(owner, name, wrapper)
    async with running(state_dir=str(tmp_path / "state"), usage_report_chunk_rows=20) as h:
        for path, kinds in LONG.items():
            made.clear()
            ran.clear()
            assert (await h.ok(path))["rows"]
            several = {name: count for name, count in made.items() if count > 1}
            assert several.keys() == kinds, (path, made)
            for name, count in several.items():
                assert ran[name] < count, (path, name, ran[name], count)


@async_test
async def test_an_answer_made_in_slices_is_the_one_made_in_one_piece(tmp_path):
    """Byte for byte, for each kind of report (one key, two, a zone, a hidden user's view
    aside): a daemon that parses, sums and encodes 7 rows a slice answers what one that does
    each in one piece answers."""
    history(tmp_path / "state")
    now = datetime.fromtimestamp(time.time() // 3600 * 3600, timezone.utc)
    span = f"since={(now - timedelta(days=20)).strftime('%Y-%m-%dT%H:%M')}Z"
    span += f"&until={now.strftime('%Y-%m-%dT%H:%M')}Z"
    asked = [
        f"/usage?{span}&by={by}"
        for by in (
            "day",
            "user",
            "gpu",
            "day,user",
            "weekday,hour&tz=America/New_York",
            "day&tz=Asia/Kolkata",
        )
    ]
    bodies = []
    for rows in (7, 1_000_000):
        async with running(
            state_dir=str(tmp_path / "state"),
            usage_report_chunk_rows=rows,
            usage_report_chunk_entries=rows,
        ) as h:
            found = []
            for path in asked:
                response = await h.http.fetch(h.url + path)
                found.append(response.body)
            bodies.append(found)
    for path, sliced, whole in zip(asked, *bodies, strict=True):
        assert json.loads(sliced)["rows"], path
        assert sliced == whole, path


def test_a_summary_made_in_parts_is_the_one_made_at_once():
    """Pure: rows added a few at a time and the order made a few keys a slice (each part
    sorted, then the parts merged) give what one `add` and one sort give, ties included (keys
    of equal use keep their order by name; days in time's order), for one key and for two."""
    rnd = random.Random(5)
    users = [f"u{n}" for n in range(9)] + [None]
    days = [f"2026-01-{n:02d}" for n in range(1, 20)]
    categories = [*core.CATEGORIES, "some_later_category"]
    plain = [
        (rnd.choice(users), rnd.choice(categories), float(rnd.choice((60, 120, 3600))))
        for _ in range(400)
    ]
    grouped = [
        (
            (rnd.choice(days), rnd.choice(users)),
            rnd.choice(categories),
            float(rnd.choice((60, 3600))),
        )
        for _ in range(600)
    ]
    for make, rows in (
        (lambda: core.Summary(), plain),
        (lambda: core.Summary(chronological=True), [(d, c, s) for (d, _), c, s in grouped]),
        (lambda: core.GroupedSummary(("day", "user")), grouped),
        (
            lambda: core.GroupedSummary(("user", "day")),
            [((u, d), c, s) for (d, u), c, s in grouped],
        ),
    ):
        whole = make()
        whole.add(rows)
        parts = make()
        for start in range(0, len(rows), 7):
            parts.add(rows[start : start + 7])
        steps = sum(1 for _ in parts.ordering(3))
        assert steps > 3  # several parts, merged
        ordered = parts.ordered()
        assert [key for key, _ in ordered] == [key for key, _ in whole.ordered()]
        assert {"rows": parts.entries(ordered), "total": parts.total()} == whole.result()
