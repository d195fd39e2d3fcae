"""The web page's live feed (/events) on live daemons, and the feed's coalescing on its own."""

import asyncio
import json
import os
import subprocess
from dataclasses import replace

import pytest
from helpers import ScenarioFile, async_test, gpu_running, running, until
from tornado.httpclient import HTTPRequest

from patroller.config import Config
from patroller.http.live import LiveFeed, Page


class Reader:
    """An /events client (`path`: with its query, if any): the snapshots it has read so far."""

    def __init__(self, h, path="/events") -> None:
        self.snapshots = []
        self.comments = 0
        self.retry = None
        self._pending = b""
        request = HTTPRequest(
            h.url + path,
            streaming_callback=self._chunk,
            request_timeout=3600,
            headers={"Accept": "text/event-stream"},
        )
        self.response = asyncio.ensure_future(h.http.fetch(request, raise_error=False))

    def _chunk(self, data: bytes) -> None:
        self._pending += data
        *messages, self._pending = self._pending.split(b"\n\n")
        for message in messages:
            fields = dict(
                line.split(b": ", 1) if b": " in line else (line, b"")
                for line in message.split(b"\n")
            )
            if message.startswith(b": "):
                self.comments += 1
            elif b"retry" in fields:
                self.retry = int(fields[b"retry"])
            elif fields.get(b"event") == b"snapshot":
                self.snapshots.append(json.loads(fields[b"data"]))


@async_test
async def test_a_page_gets_a_snapshot_at_once_and_after_each_change():
    async with running(lease=60) as h:
        reader = Reader(h)
        await until(lambda: reader.snapshots)
        assert reader.retry == 1000
        first = reader.snapshots[0]
        assert set(first) == {
            "time",
            "mode",
            "status",
            "devices",
            "queue",
            "users",
            "events",
            "history",
            "interval",
        }
        assert first["mode"] == "test" and list(first["status"]) == h.uuids()
        assert first["devices"][h.uuids()[0]]["number"] == 0
        [grant] = await h.ok("/request?gpu=1&user=alice@example.org")

        def shows_alice():
            last = reader.snapshots[-1]
            claim = last["status"][grant["uuid"]]["claim"]
            return claim["user"] and claim["user"]["user"] == "alice@example.org"

        await until(shows_alice, timeout=3)
        last = reader.snapshots[-1]
        assert last["users"]["alice@example.org"]["held"] == 1
        assert last["events"][-1]["event"] == "grant"
        await h.ok("/release?user=alice@example.org")
        await until(
            lambda: reader.snapshots[-1]["status"][grant["uuid"]]["claim"]["state"] == "free",
            timeout=3,
        )


@async_test
async def test_the_stream_ends_with_the_daemon_and_the_page_is_told_to_retry_soon():
    async with running() as h:
        reader = Reader(h)
        await until(lambda: reader.snapshots)
        assert len(h.api.feed.pages) == 1
    response = await asyncio.wait_for(reader.response, 10)  # the daemon stopped: it ended
    assert response.code == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")


async def open_page(h):
    """A raw /events connection that has read its first snapshot."""
    reader, writer = await h.raw(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
    seen = b""
    while b"event: snapshot" not in seen:
        seen += await asyncio.wait_for(reader.read(65536), 10)
    return reader, writer


@async_test
async def test_a_page_that_leaves_is_forgotten_and_too_many_are_refused():
    async with running() as h:
        h.api.feed.max_pages = 2
        pages = [await open_page(h), await open_page(h)]
        status, body = await h.call("/events")
        assert status == 503 and "too many open pages" in body["error"]
        status, body = await h.call("/events?x=1")
        assert status == 400
        for _, writer in pages:
            writer.close()
        await until(lambda: len(h.api.feed.pages) == 0)
        await open_page(h)  # room again


class Recorder(Page):
    def __init__(self):
        self.messages = []

    def write(self, message):
        self.messages.append(message)

    def close(self):
        pass


@async_test
async def test_many_changes_make_one_snapshot_a_period_and_no_page_costs_nothing():
    built = []
    config = replace(Config(), feed_every=0.2)
    feed = LiveFeed(lambda: built.append(1) or {"n": len(built)}, config)
    feed.start()
    idle = LiveFeed(lambda: built.append(1) or {}, config)
    idle.start()
    for _ in range(100):
        idle.changed()  # no page open: nothing is built or scheduled
    assert built == [] and idle._flush is None
    page = Recorder()
    feed.add(page)
    assert len(built) == 1 and b"event: snapshot" in page.messages[0]
    for _ in range(100):
        feed.changed()
    await until(lambda: len(page.messages) >= 2)
    assert len(built) == 2 and len(page.messages) == 2  # a hundred changes, one snapshot
    assert page.messages[1] == b'event: snapshot\ndata: {"n":2}\n\n'
    assert feed._flush is None  # nothing changed since: nothing is due
    # Past any send that was due within a period: the loop runs its timers in deadline order.
    await asyncio.sleep(2 * config.feed_every)
    assert len(built) == 2 and len(page.messages) == 2
    feed.stop()
    idle.stop()


HOG = """
import json, socket, sys
pages = []
for _ in range(int(sys.argv[2])):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    s.sendall(b"GET /events HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    pages.append(s)
print(json.dumps([s.recv(12)[9:12].decode() for s in pages]), flush=True)
sys.stdin.read()  # the pages stay open until the test is done
"""


@async_test
async def test_one_user_cannot_take_every_page_slot(tmp_path):
    if os.getuid() != 0:
        pytest.skip("the other user runs as uid 65534: run as root")
    from test_trust_callers import python_for

    # As found: one uid held every /events slot, and every other page got 503.
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    async with gpu_running(scenario, max_pages=6, max_pages_per_user=3) as h:
        loop = asyncio.get_running_loop()
        hog = await loop.run_in_executor(
            None,
            lambda: subprocess.Popen(
                [python_for(65534), "-c", HOG, str(h.port), "6"],
                user=65534,
                group=65534,
                extra_groups=[],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            ),
        )
        try:
            line = await loop.run_in_executor(None, hog.stdout.readline)
            # three pages each at most (answered in whatever order they were identified)
            assert sorted(json.loads(line)) == ["200"] * 3 + ["503"] * 3
            await open_page(h)  # root's page: there is room for it
            assert len(h.api.feed.pages) == 4
        finally:
            hog.stdin.close()
            await loop.run_in_executor(None, hog.wait)
