"""Cached response bodies, the fast lane at the connection's door, and /metrics."""

import asyncio
import json
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from helpers import FakeClock, async_test, lease_manager, running, until
from tornado.iostream import IOStream

from patroller.core.identity import IDENTIFYING, named_user
from patroller.http import routes
from patroller.http.fastlane import Connection, FastLane
from patroller.http.statusview import StatusView
from patroller.observe.signals import ProcessList, ProcessSamples, Sample, Signals
from patroller.observe.stats import StatsStore
from patroller.observe.testmode import synthetic_inventory


@pytest.fixture
def parts():
    clock = FakeClock()
    inventory = synthetic_inventory(2)
    leases = lease_manager(clock, inventory, lease=10)
    stats = StatsStore(inventory, stale_after=3, history_every=5, history_points=120, clock=clock)
    signals = Signals()
    stats.connect(signals)
    view = StatusView(inventory, leases, stats, None, max_age=0.1, clock=clock)
    return clock, inventory, leases, signals, view


def test_the_body_is_built_once_until_something_changes(parts):
    clock, inventory, leases, signals, view = parts
    first = view.body()
    assert view.body() is first and view.builds == 1
    leases.request(named_user("alice"), {"gpu": 1})
    second = json.loads(view.body())
    assert view.builds == 2 and second[inventory.devices[0].uuid]["claim"]["state"] == "reserved"
    signals.sample.send(object(), record=Sample(inventory.devices[1].uuid, {"sm": 42}, 0.0))
    assert json.loads(view.body())[inventory.devices[1].uuid]["sm"] == 42


def test_clock_driven_fields_are_at_most_max_age_old(parts):
    clock, inventory, leases, signals, view = parts
    leases.request(named_user("alice"), {"gpu": 1})
    uuid = inventory.devices[0].uuid
    assert json.loads(view.body())[uuid]["claim"]["expires"] == 10
    clock.advance(0.05)
    assert json.loads(view.body())[uuid]["claim"]["expires"] == 10  # cached
    clock.advance(0.06)
    assert json.loads(view.body())[uuid]["claim"]["expires"] == pytest.approx(9.89)


@async_test
async def test_the_fast_lane_serves_the_cached_bodies_and_leaves_the_rest_to_the_app():
    async with running() as h:
        response = await h.http.fetch(h.url + "/devices")
        assert response.body == h.api.devices.body()
        assert response.headers["Content-Type"].startswith("application/json")
        assert response.headers["Cache-Control"] == "no-store"
        status, body = await h.call("/status?user=x")
        assert status == 200 and list(body) == h.uuids()
        for method in ("POST", "PUT"):  # not the fast lane: the application answers 405
            status, body = await h.call("/status", method=method, body=b"")
            assert status == 405 and body["allowed"] == ["GET", "HEAD"]


@async_test
async def test_metrics_counts_what_the_daemon_does():
    async with running() as h:
        await h.ok("/status")
        metrics = await h.ok("/metrics.json")
        assert metrics["devices"] == 8 and metrics["waiting"] == 0
        assert metrics["status_builds"] >= 1 and metrics["docker_calls"] == 0
        assert metrics["monitors"]["synthetic"]["samples"] >= 8


def test_process_lists_are_stale_until_listed_and_after_three_intervals_without(parts):
    clock, inventory, leases, signals, view = parts
    first, second = (d.uuid for d in inventory)
    claim = lambda uuid: json.loads(view.body())[uuid]["claim"]
    assert claim(first)["processes_stale"] is True  # nothing listed yet: unknown
    built = view.builds
    signals.processes_listed.send(object(), record=ProcessList((first,), 0.0))
    assert claim(first)["processes_stale"] is False and view.builds == built + 1  # at once
    assert claim(second)["processes_stale"] is True
    assert set(claim(first)) >= {"state", "user", "users", "processes", "age", "expires"}
    clock.advance(2.9)
    signals.processes_listed.send(object(), record=ProcessList((first, second), 0.0))
    built = view.builds
    clock.advance(0.05)
    view.body()
    assert view.builds == built + 1  # `second` revived: rebuilt although within MAX_AGE
    clock.advance(2.9)
    assert claim(first)["processes_stale"] is False  # 2.95 s after its last list: not yet
    clock.advance(0.1)
    assert claim(first)["processes_stale"] is True  # the clock alone turns it, within MAX_AGE


def test_a_fresh_list_listed_again_does_not_rebuild_the_body(parts):
    clock, inventory, leases, signals, view = parts
    uuids = tuple(d.uuid for d in inventory)
    signals.processes_listed.send(object(), record=ProcessList(uuids, 0.0))
    view.body()
    built = view.builds
    signals.processes_listed.send(object(), record=ProcessList(uuids, 0.0))
    view.body()
    assert view.builds == built  # nothing shown changed: no rebuild a second per pmon interval


@async_test
async def test_test_mode_process_lists_are_never_stale():
    async with running() as h:
        status = await h.ok("/status")
        assert {e["claim"]["processes_stale"] for e in status.values()} == {False}


async def answers(
    reader: asyncio.StreamReader, count: int
) -> list[tuple[str, dict[str, str], bytes]]:
    """`count` HTTP answers read off one connection: (status line, headers, body)."""
    found = []
    for _ in range(count):
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1")
        lines = head.split("\r\n")
        headers = {
            k.strip().lower(): v.strip()
            for k, v in (line.split(":", 1) for line in lines[1:] if line)
        }
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
        found.append((lines[0], headers, body))
    return found


PLAIN = b"GET /status HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n"


@async_test
async def test_the_simplest_polls_are_answered_at_the_door_and_the_rest_in_order_by_the_app():
    async with running() as h:
        reader, writer = await h.raw(
            PLAIN
            + b"GET /queue HTTP/1.1\r\nHost: localhost\r\n\r\n"
            + PLAIN
            + b"GET /status?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        got = await answers(reader, 4)
        assert [line for line, _, _ in got] == ["HTTP/1.1 200 OK"] * 4
        assert json.loads(got[1][2]) == [] and list(json.loads(got[0][2])) == h.uuids()
        # The fast lane's answers carry none of the application's Etag: the others do.
        assert ["etag" in headers for _, headers, _ in got] == [False, True, False, True]
        assert got[0][2] == got[2][2] == h.api.status.body()
        assert not reader.at_eof()  # keep-alive: the connection stays open
        writer.write(b"GET /devices HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        [(_, headers, body)] = await answers(reader, 1)
        assert headers["connection"] == "close" and body == h.api.devices.body()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and it is closed
        writer.close()
        samples = h.api.requests.answers
        assert samples[("/status", 200)] == 3 and samples[("/devices", 200)] == 1


@async_test
async def test_the_fast_lane_sends_its_answers_straight_to_the_socket(monkeypatch):
    """With nothing waiting to be written, an answer goes to the socket at once, not through
    the stream's write (a Future and a write handler each)."""
    through_stream = []

    def write(self, data):
        through_stream.append(len(data))
        return IOStream.write(self, data)

    monkeypatch.setattr(Connection, "write", write)
    async with running() as h:
        reader, writer = await h.raw(b"")
        for _ in range(10):
            writer.write(PLAIN)
            [(line, _, body)] = await answers(reader, 1)
            assert line == "HTTP/1.1 200 OK" and body == h.api.status.body()
        assert through_stream == []
        writer.write(b"GET /queue HTTP/1.1\r\nHost: localhost\r\n\r\n")  # the app's
        await answers(reader, 1)
        assert len(through_stream) == 1
        writer.close()


@async_test
async def test_what_the_socket_does_not_take_goes_through_the_stream_in_order(monkeypatch):
    """Polls sent while the client reads nothing: once the socket's buffer is full, the rest of
    an answer, and the answers after it, are written by the stream, each whole and in order,
    the application's among them."""
    through_stream = []

    def write(self, data):
        through_stream.append(len(data))
        return IOStream.write(self, data)

    monkeypatch.setattr(Connection, "write", write)
    async with running() as h:
        body = h.api.status.body()
        many = (8 << 20) // len(body)  # far more than a socket's buffers take
        queue = b"GET /queue HTTP/1.1\r\nHost: localhost\r\n\r\n"
        reader, writer = await h.raw(b"")
        writer.transport.pause_reading()  # nothing is read until the stream has had to write
        writer.write(PLAIN * many + queue + PLAIN)
        await until(lambda: through_stream, timeout=30)
        assert through_stream[0] < len(body) + 200  # the rest of an answer the socket cut
        reader._limit = 1 << 30
        writer.transport.resume_reading()
        got = await answers(reader, many + 2)
        uuids = h.uuids()  # each a whole /status (its figures move with the clock meanwhile)
        assert all(list(json.loads(b)) == uuids for _, _, b in got[:many])
        assert json.loads(got[many][2]) == [] and list(json.loads(got[many + 1][2])) == uuids
        assert all(line == "HTTP/1.1 200 OK" for line, _, _ in got)
        writer.close()


@async_test
async def test_a_busy_connection_is_not_taken_for_an_idle_one():
    # Tornado's idle timer runs while it waits for a head: the lane hands a head back to it
    # now and then, so that a connection polled without a pause is never closed as idle.
    async with running(header_timeout=0.6) as h:
        reader, writer = await h.raw(b"")
        polled = 0
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            writer.write(PLAIN)
            await answers(reader, 1)
            polled += 1
        writer.close()
        assert polled > 20


def test_the_clock_alone_rebuilds_no_part(parts):
    """A body only older is put together again from the parts, with the clock's fields
    spliced in: none of the devices' parts is serialized again."""
    clock, inventory, leases, signals, view = parts
    leases.request(named_user("alice"), {"gpu": 1})
    uuid = inventory.devices[0].uuid
    first = json.loads(view.body())
    built = view.parts_built
    clock.advance(0.5)
    later = json.loads(view.body())
    assert view.parts_built == built and view.builds == 2
    assert later[uuid]["claim"]["expires"] == pytest.approx(first[uuid]["claim"]["expires"] - 0.5)
    assert later[uuid]["claim"]["age"] == pytest.approx(first[uuid]["claim"]["age"] + 0.5)
    for entry in (*first.values(), *later.values()):  # the clock's fields aside
        entry["claim"].update(expires=None, age=None, ends_at=None)
    assert later == first


def test_only_the_device_that_changed_is_built_again(parts):
    clock, inventory, leases, signals, view = parts
    one, other = (d.uuid for d in inventory)
    view.body()
    built = view.parts_built
    leases.request(named_user("alice"), {"gpu": 1})  # the first device's claim
    assert json.loads(view.body())[one]["claim"]["state"] == "reserved"
    assert view.parts_built == built + 1  # its claim: its processes (none) are the same
    built = view.parts_built
    signals.sample.send(object(), record=Sample(other, {"sm": 42}, 0.0))
    assert json.loads(view.body())[other]["sm"] == 42
    assert view.parts_built == built + 1  # its statistics: its processes' figures are the same
    leases.process_started(other, 4242, named_user("bob"), "python")
    view.body()
    built = view.parts_built
    signals.process_sampled.send(None, record=ProcessSamples({other: {4242: {"sm": 30}}}, 1.0))
    clock.advance(0.1)  # shown with the next body (no sample came to hasten it)
    assert json.loads(view.body())[other]["claim"]["process_detail"][0]["sm"] == 30
    assert view.parts_built == built + 1  # its processes: no new sample of its statistics


def test_a_process_starting_renamed_and_ending_is_shown_at_once(parts):
    """Each change of a device's processes rebuilds its claim and its process list, and
    nothing else: its start, its owner becoming known, its end."""
    clock, inventory, leases, signals, view = parts
    uuid = inventory.devices[0].uuid
    view.body()

    def shown_after(change) -> tuple[dict, int]:
        built = view.parts_built
        change()
        claim = json.loads(view.body())[uuid]["claim"]
        return claim, view.parts_built - built

    claim, rebuilt = shown_after(lambda: leases.process_started(uuid, 7, IDENTIFYING, "python"))
    assert claim["processes"] == [7] and rebuilt == 2
    assert claim["process_detail"][0]["user"] == "unknown"
    claim, rebuilt = shown_after(lambda: leases.update_owner(uuid, 7, named_user("dora")))
    assert claim["process_detail"][0]["user"] == "dora" and rebuilt == 2
    assert claim["user"]["user"] == "dora"
    claim, rebuilt = shown_after(lambda: leases.update_owner(uuid, 7, named_user("dora@lab")))
    assert claim["process_detail"][0]["user"] == "dora@lab" and rebuilt == 2
    claim, rebuilt = shown_after(lambda: leases.process_ended(uuid, 7))
    assert claim["processes"] == [] and claim["process_detail"] == [] and rebuilt == 2


def test_an_inventory_change_rebuilds_the_devices_it_names_alone():
    """The daemon's inventory signal rebuilds the parts of the devices the change names (one
    now smaller, one fallen off the bus), and keeps the third's."""
    clock, inventory = FakeClock(), synthetic_inventory(3)
    leases = lease_manager(clock, inventory)
    stats = StatsStore(inventory, stale_after=3, history_every=5, history_points=120, clock=clock)
    view = StatusView(inventory, leases, stats, None, 0.1, clock=clock)
    receive = routes._inventory_changed(
        SimpleNamespace(devices=SimpleNamespace(invalidate=lambda: None), status=view)
    )
    smaller, gone, kept = inventory.devices
    assert json.loads(view.body())[smaller.uuid]["fb_total"] == 81920
    built = view.parts_built
    change = inventory.update([replace(smaller, total_mem="40960 MiB"), kept])
    leases.devices_changed()
    receive(None, record=change)
    shown = json.loads(view.body())
    assert (
        shown[smaller.uuid]["fb_total"] == 40960 and shown[gone.uuid]["claim"]["state"] == "lost"
    )
    assert view.parts_built == built + 6  # statistics, claim and processes of two devices


def test_the_body_and_the_data_say_the_same(parts):
    clock, inventory, leases, signals, view = parts
    leases.request(named_user("alice"), {"gpu": 1})
    leases.process_started(inventory.devices[1].uuid, 4242, named_user("bob"), "python")
    signals.sample.send(object(), record=Sample(inventory.devices[1].uuid, {"sm": 7}, 0.0))
    assert json.loads(view.body()) == view.latest() == view.data()
    entry = view.latest()[inventory.devices[1].uuid]
    assert entry["claim"]["process_detail"] == [
        {
            "pid": 4242,
            "user": "bob",
            "command": "python",
            "trespass": False,
            "sm": None,
            "mem": None,
            "fb": None,
        }
    ]
    assert entry["sm"] == 7 and entry["claim"]["state"] == "claimed"


def test_a_process_that_trespasses_is_marked_and_unmarked_as_its_holder_changes(parts):
    """bob's process on alice's GPU trespasses; when alice lets it go, bob's process holds it
    and no longer does: the same processes, shown again because the holder changed."""
    clock, inventory, leases, signals, view = parts
    uuid = inventory.devices[0].uuid
    leases.request(named_user("alice"), {"gpu": 1})
    leases.process_started(uuid, 4242, named_user("bob"), "python")
    leases.process_started(uuid, 4343, IDENTIFYING, None)  # nobody's yet
    detail = json.loads(view.body())[uuid]["claim"]["process_detail"]
    assert [(p["pid"], p["trespass"]) for p in detail] == [(4242, True), (4343, False)]
    leases.release(named_user("alice"), uuid)
    shown = json.loads(view.body())[uuid]["claim"]
    assert shown["user"]["user"] == "bob"
    assert [(p["pid"], p["trespass"]) for p in shown["process_detail"]] == [
        (4242, False),
        (4343, False),
    ]


def test_a_host_with_no_device_has_an_empty_status():
    """Every device fell off the bus (or none was found): /status is still a JSON object."""
    clock, inventory = FakeClock(), synthetic_inventory(0)
    stats = StatsStore(inventory, stale_after=3, history_every=5, history_points=120, clock=clock)
    view = StatusView(inventory, lease_manager(clock, inventory), stats, None, 0.1, clock=clock)
    assert view.body() == b"{}" and view.data() == {}


@async_test
async def test_new_figures_are_built_off_the_request_path():
    """In the daemon, a sample's figures are built by a task of their own, soon after it
    arrives: a /status asked for meanwhile builds no statistics, though it shows a lease
    change at once; once built, the very next body shows them (the clock alone would take a
    minute here)."""
    async with running(status_max_age=60) as h:
        view, uuid = h.api.status, h.uuids()[0]
        await until(lambda: json.loads(view.body())[uuid]["updated"] is not None)
        built = view.parts_built
        h.services.signals.sample.send(object(), record=Sample(uuid, {"sm": 99}, 1e9))
        h.services.leases.request(named_user("alice"), {"gpu": 1})
        shown = json.loads(view.body())[uuid]
        assert shown["claim"]["state"] == "reserved" and shown["sm"] != 99
        assert view.parts_built == built + 1  # the claim: no statistics, the same processes
        await until(lambda: view.parts_built >= built + 2)  # the task built them
        assert json.loads(view.body())[uuid]["sm"] == 99


def test_a_holder_that_changes_alone_is_shown(parts):
    """carol took a device by computing, bob's process came too; carol's ended and her lease
    ran out: bob holds it, though nothing else of it shows a change."""
    clock, inventory, leases, signals, view = parts
    uuid = inventory.devices[0].uuid
    leases.process_started(uuid, 1, named_user("carol"), "python")
    leases.process_started(uuid, 2, named_user("bob"), "python")
    leases.process_ended(uuid, 1)
    assert json.loads(view.body())[uuid]["claim"]["user"]["user"] == "carol"
    clock.advance(10)
    assert leases.expire() == [inventory.devices[0]]
    assert json.loads(view.body())[uuid]["claim"]["user"]["user"] == "bob"


def test_a_figure_not_known_this_interval_keeps_the_last_one(parts):
    """pmon prints `-` for an interval without a sample, and the cross-check knows memory
    alone: a None is no news, and the figure shown stays the last one known."""
    clock, inventory, leases, signals, view = parts
    uuid = inventory.present()[0].uuid
    figures = {"sm": 40, "mem": 12, "fb": 900}
    signals.process_sampled.send(None, record=ProcessSamples({uuid: {4242: figures}}, 0.0))
    seen = view.stats.process_view(uuid, 4242)
    assert (seen["sm"], seen["mem"], seen["fb"]) == (40, 12, 900)
    before = view.stats.figures_version(uuid)
    signals.process_sampled.send(
        None, record=ProcessSamples({uuid: {4242: {"sm": None, "mem": 7, "fb": None}}}, 1.0)
    )
    seen = view.stats.process_view(uuid, 4242)
    assert (seen["sm"], seen["mem"], seen["fb"]) == (40, 7, 900)
    assert view.stats.figures_version(uuid) == before + 1  # shown again: something changed
    signals.process_sampled.send(
        None, record=ProcessSamples({uuid: {4242: {"sm": None, "mem": None, "fb": None}}}, 2.0)
    )  # `-` in every cell
    seen = view.stats.process_view(uuid, 4242)
    assert (seen["sm"], seen["mem"], seen["fb"]) == (40, 7, 900)
    assert view.stats.figures_version(uuid) == before + 1  # nothing new: the device is not rebuilt


@pytest.mark.parametrize(
    "head, taken",
    [
        (b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"GET /status HTTP/1.1\r\nHost: x:8080\r\nConnection: keep-alive\r\n\r\n", True),
        (b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", True),
        # Tornado answers two Host lines with a 400: the lane must not answer 200
        (b"GET /status HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", False),
        (b"GET /status HTTP/1.1\r\n\r\n", False),  # no Host at all
        # HTTP/1.0 is answered by Tornado, which closes it (the lane speaks 1.1 keep-alive)
        (b"GET /status HTTP/1.0\r\nHost: x\r\n\r\n", False),
        (b"GET /status HTTP/1.0\r\n\r\n", False),
        # a Connection the lane does not know (an upgrade, a list) goes to Tornado
        (b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\n\r\n", False),
        (b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, upgrade\r\n\r\n", False),
        (b"GET /status HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n", False),
    ],
)
def test_the_fast_lane_takes_only_the_heads_tornado_would_answer_the_same_way(head, taken):
    lane = FastLane({"/status": lambda connection: b"{}"}, lambda path, status: None, 60.0)
    answered = lane.answer(head)
    assert (answered is not None) == taken, head
    if answered is not None:
        assert answered[0].startswith(b"HTTP/1.1 200 OK\r\n") and answered[0].endswith(b"{}")
        assert answered[1] == (b"close" in head)
