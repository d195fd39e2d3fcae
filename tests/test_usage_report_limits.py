"""What reports may take of a daemon, bounded: at most usage_reports_at_once answered at once,
usage_reports_waiting waiting for a turn (the next a 429 with Retry-After), none larger than
usage_report_max_rows rows (a 400 that says
to narrow the range or the grouping), and the reader's connection and answers let go once
reports stop coming. (How much memory comes back is measured, not asserted:
docs/performance.md.)"""

import asyncio
import json
import threading
import time

from helpers import async_test, find, running, scrape, until
from test_openapi import answer_schema, undocumented
from tornado.httpclient import HTTPRequest
from usage_history import DAY, HOUR, gpu_hour, lab, write

FILE = "usage.sqlite3"


def history(state, days=3):
    """`days` of a lab's hours in the store's file, before the daemon starts."""
    state.mkdir(mode=0o700)
    write(str(state / FILE), lab(time.time(), days))


@async_test
async def test_reports_beyond_the_few_at_once_wait_and_past_those_waiting_are_a_429(tmp_path):
    history(tmp_path / "state")
    async with running(
        state_dir=str(tmp_path / "state"),
        usage_reports_at_once=1,
        usage_reports_waiting=1,
        usage_report_retry_after=3,
    ) as h:
        reader = h.services.usage.reader
        held = threading.Event()
        reader._reading().submit(held.wait, 20)  # busy: a report waits
        first = asyncio.ensure_future(h.call("/usage?since=3d&by=user"))
        await until(lambda: reader.running == 1)
        second = asyncio.ensure_future(h.call("/usage?since=3d&by=day"))
        await until(lambda: reader.waiting == 1)  # its turn comes after the first's
        response = await h.http.fetch(
            HTTPRequest(h.url + "/usage?since=2d&by=day"), raise_error=False
        )
        body = json.loads(response.body)
        assert response.code == 429, (response.code, body)
        assert response.headers["Retry-After"] == "3"
        assert (body["limit"], body["running"], body["waiting"], body["retry_after"]) == (
            1,
            1,
            1,
            3,
        )
        assert list(undocumented(body, answer_schema("/usage", "get", 429))) == []
        assert not second.done()
        held.set()
        for asked in (first, second):
            code, answer = await asked
            assert code == 200 and answer["rows"]
        assert reader.running == 0 and reader.waiting == 0
        assert (await h.call("/usage?since=2d&by=day"))[0] == 200  # room again
        counters = await h.ok("/metrics.json")
        assert counters["usage"]["reports_busy"] == 1
        assert counters["usage"]["reports_running"] == 0
        found, _, _ = await scrape(h)
        assert find(found, "patroller_usage_reports_refused_total", reason="busy") == [1.0]


def crowd(state, days=3, users=10, gpus=8):
    """`days` of hours in which `users` take turns on `gpus` GPUs, computing: the same mix of
    users every day, whatever the weekday and hour the test runs at (a lab's history does not
    have it: on a Sunday evening its last three days hold fewer users)."""
    state.mkdir(mode=0o700)
    last = int(time.time() // HOUR * HOUR)
    intervals = [
        (
            start + HOUR,
            [
                gpu_hour(
                    n,
                    "claimed",
                    f"u{(h + n) % users}",
                    True,
                    [(f"u{(h + n) % users}", True)],
                    busy=30,
                )
                for n in range(gpus)
            ],
        )
        for h, start in enumerate(range(last - days * DAY, last, HOUR))
    ]
    write(str(state / FILE), intervals)


@async_test
async def test_a_report_of_more_rows_than_it_may_hold_is_refused_saying_how_to_narrow_it(tmp_path):
    # ten users: by user some 20-25 rows of the store, by day and user, by day in a zone and
    # by hour over 40
    crowd(tmp_path / "state")
    async with running(state_dir=str(tmp_path / "state"), usage_report_max_rows=30) as h:
        for path in (
            "/usage?since=3d&by=day,user",
            "/usage?since=3d&by=hour",
            "/usage?since=3d&by=day&tz=Europe/Paris",
        ):
            code, body = await h.call(path)
            assert code == 400, (path, code, body)
            assert "narrow the range" in body["error"] and "grouping" in body["error"]
            assert body["max_rows"] == 30
            assert list(undocumented(body, answer_schema("/usage", "get", 400))) == []
        code, body = await h.call("/usage?since=3d&by=user")  # a narrower one is answered
        assert code == 200 and body["rows"]
        counters = await h.ok("/metrics.json")
        assert counters["usage"]["reports_too_large"] == 3
        found, _, _ = await scrape(h)
        assert find(found, "patroller_usage_reports_refused_total", reason="too_large") == [3.0]


@async_test
async def test_the_reader_lets_its_connection_and_answers_go_once_reports_stop(tmp_path):
    history(tmp_path / "state")
    async with running(state_dir=str(tmp_path / "state"), usage_reader_idle=0.3) as h:
        reader = h.services.usage.reader
        for by in ("user", "day", "job"):
            assert (await h.call(f"/usage?since=3d&by={by}"))[0] == 200
        assert reader._db is not None and len(reader._answers) == 3
        await until(lambda: reader.let_go == 1)
        assert reader._db is None and len(reader._answers) == 0
        assert (await h.call("/usage?since=3d&by=user"))[0] == 200  # opened again
        assert reader._db is not None
        await until(lambda: reader.let_go == 2)
