"""What keeps the fleet view's CPU small at 1,000 hosts (docs/performance.md, "1,010 hosts at
load"), each held to what it must still do: the askings of one Config.fleet_slot are made
together; an answer the same as the last is not decoded again, and a changed one is; nothing of
/fleet.json is built or packed until someone asks for it, and then it is whole and right; the
schema check's lookup of a decoder's types judges every value as `answers.is_kind` does. The
hosts are recording listeners on loopback (test_fleet_polling.Recorder) that answer a real
daemon's /status and /devices, under a real daemon's fleet view."""

from __future__ import annotations

import asyncio
import enum
import gzip
import json
import math
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import pairwise
from typing import Any

import pytest
from helpers import async_test, running, until
from test_fleet_polling import Recorder, bodies
from tornado.tcpclient import TCPClient

from patroller import answers
from patroller.http.fleetlink import Link, Silent


@asynccontextmanager
async def recorded(count: int, **config: Any) -> AsyncIterator[tuple[Any, list[Recorder]]]:
    """A daemon's fleet view over `count` recorders of a real daemon's answers."""
    async with running() as real:
        status, devices = await bodies(real)
    hosts = [await Recorder(status, devices, '"v1"').start() for _ in range(count)]
    try:
        async with running(fleet=tuple(h.host for h in hosts), **config) as h:
            yield h, hosts
    finally:
        for host in hosts:
            await host.stop()


@async_test
async def test_the_hosts_due_in_one_slot_are_asked_together():
    # Six hosts due 0.2 s apart in a 1.2 s interval, slots of 1.2 s: their first askings are
    # made at one or two moments. Each at its own moment (fleet_slot 0), at six.
    async with recorded(6, fleet_interval=1.2, fleet_slot=1.2) as (_, hosts):
        await until(lambda: all(host.requests for host in hosts), timeout=20)
        firsts = sorted(host.requests[0][0] for host in hosts)
        moments = 1 + sum(1 for a, b in pairwise(firsts) if b - a > 0.1)
        assert moments <= 2, firsts


@async_test
async def test_an_unchanged_answer_is_not_read_again_and_a_changed_one_is():
    async with recorded(1, fleet_interval=0.3) as (h, [host]):
        fleet = h.api.fleet
        [shown] = fleet.hosts
        await until(lambda: host.asked("/status") >= 4, timeout=20)
        assert fleet.reads == 1, fleet.reads  # the same bodies every time: read once
        uuid = shown.gpus[0]["uuid"]
        status = json.loads(host.status)
        status[uuid]["sm"] = 93
        host.status = json.dumps(status).encode()
        await until(lambda: shown.gpus[0]["sm"] == 93, timeout=20)
        asked = host.asked("/status")
        await until(lambda: host.asked("/status") >= asked + 3, timeout=20)
        assert fleet.reads == 2, fleet.reads  # the change once, then the same again


@async_test
async def test_fleet_json_is_not_built_until_asked_for_and_then_whole():
    async with recorded(3, fleet_interval=0.3) as (h, hosts):
        fleet = h.api.fleet
        await until(lambda: all(host.asked("/status") >= 4 for host in hosts), timeout=20)
        assert (fleet.builds, fleet.packer.made) == (0, 0)  # asked 12 times, never shown
        answer = await h.http.fetch(
            h.url + "/fleet.json", headers={"Accept-Encoding": "gzip"}, decompress_response=False
        )
        assert answer.headers["Content-Encoding"] == "gzip"
        shown = json.loads(gzip.decompress(answer.body))
        assert shown["totals"]["answering"] == 3, shown["totals"]
        assert [host["host"] for host in shown["hosts"]] == [host.host for host in hosts]
        assert all(len(host["gpus"]) == 8 for host in shown["hosts"]), shown["hosts"]
        assert (fleet.builds, fleet.packer.made) == (1, 1)


class Count(enum.IntEnum):
    ONE = 1


class Text(str):
    pass


VALUES = [None, True, False, 0, -7, 2**70, 1.5, -0.0, math.nan, math.inf, -math.inf, "", "x"]
VALUES += [{}, {"a": 1}, [], [1], Count.ONE, Text("y"), (1,), b"z", object()]
TABLES = [
    answers.DEVICE,
    answers.STATISTICS,
    answers.CLAIM,
    answers.PROCESS,
    answers.IDENTITY,
    answers.CONTAINER,
    answers.JOB,
    answers.POD,
]


@pytest.mark.parametrize("table", TABLES, ids=lambda table: ",".join(table)[:30])
def test_the_type_lookup_judges_every_value_as_is_kind_does(table):
    for name, kinds in table.items():
        for value in VALUES:
            expected = any(answers.is_kind(value, k) for k in kinds)
            try:
                answers.fields({name: value}, {name: kinds}, "here")
                passed = True
            except answers.BadAnswer as exc:
                passed = False
                assert str(exc).startswith(f"here.{name} is "), str(exc)
            assert passed == expected, (name, kinds, value)


@async_test
async def test_an_asking_whose_deadline_passes_while_connecting_is_said_not_to_answer():
    """Connecting is bounded by the answer's deadline as well as by the connect timeout, and a
    connection made once the deadline's timer went off is given up, not read from without a
    timer (here the deadline is already past; either guard alone says so, neither: it hangs)."""
    listener = socket.socket()  # accepts (the kernel's backlog), never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    tcp = TCPClient()
    link = Link(f"http://127.0.0.1:{listener.getsockname()[1]}", tcp, 5.0, 3.0, 1 << 20, "t")
    try:
        loop = asyncio.get_running_loop()
        for _ in range(5):
            with pytest.raises(Silent, match="no answer within 3s"):
                await asyncio.wait_for(link.get("/status", loop.time() - 1.0), 10)
    finally:
        link.close()
        tcp.close()
        listener.close()
