"""How the fleet view asks its hosts (--fleet): each host first at its own moment of the interval,
on one connection kept open, /devices again only when the host's /status names another version
of it, and /fleet.json built once per change rather than per request. The hosts are recording
listeners on loopback that answer a real daemon's /status and /devices (and count connections
and requests), and a real daemon."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from itertools import pairwise
from typing import Any

from helpers import async_test, running, until

from patroller.config import Config, load


class Recorder:
    """A fleet host on a loopback port: answers GET /status and /devices with the bodies it is
    given, over HTTP/1.1 keep-alive, and records each connection and request."""

    def __init__(self, status: bytes, devices: bytes, tag: str | None) -> None:
        self.status, self.devices, self.tag = status, devices, tag
        self.connections = 0
        self.requests: list[tuple[float, str]] = []  # (monotonic time, path)
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> Recorder:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return self

    @property
    def host(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def asked(self, path: str) -> int:
        return sum(1 for _, p in self.requests if p == path)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                self.requests.append((time.monotonic(), path))
                body = self.status if path == "/status" else self.devices
                extra = ""
                if self.tag is not None:
                    extra = (
                        f"X-Devices-ETag: {self.tag}\r\n"
                        if path == "/status"
                        else f"ETag: {self.tag}\r\n"
                    )
                writer.write(
                    f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{extra}"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def bodies(h) -> tuple[bytes, bytes]:
    """A real daemon's /status and /devices."""
    status = (await h.http.fetch(h.url + "/status")).body
    devices = (await h.http.fetch(h.url + "/devices")).body
    return status, devices


@async_test
async def test_each_host_is_first_asked_at_its_own_moment_of_the_interval():
    async with running() as real:
        status, devices = await bodies(real)
    hosts = [await Recorder(status, devices, '"v1"').start() for _ in range(4)]
    try:
        async with running(fleet=tuple(h.host for h in hosts), fleet_interval=2.0) as h:
            await until(lambda: all(host.requests for host in hosts), timeout=15)
            firsts = sorted(host.requests[0][0] for host in hosts)
            # Evenly: 0, 0.5, 1 and 1.5 s into the interval. All at once, as before: 0 apart.
            assert firsts[-1] - firsts[0] > 0.9, firsts
            assert all(b - a > 0.2 for a, b in pairwise(firsts)), firsts
            await until(lambda: all(host.asked("/status") >= 2 for host in hosts), timeout=15)
            answer = json.loads((await h.http.fetch(h.url + "/fleet.json")).body)
            assert [host["state"] for host in answer["hosts"]] == ["up"] * 4
    finally:
        for host in hosts:
            await host.stop()


@async_test
async def test_one_connection_carries_every_asking_of_a_host(caplog):
    caplog.set_level(logging.INFO, logger="patroller.http.fleet")
    async with running() as real:
        status, devices = await bodies(real)
    host = await Recorder(status, devices, None).start()  # no tag: both asked every round
    try:
        async with running(fleet=(host.host,), fleet_interval=0.5):
            await until(lambda: len(host.requests) >= 8, timeout=15)
        assert host.asked("/devices") >= 4  # a host that says no version: asked every round
        said = [r.getMessage() for r in caplog.records if r.name == "patroller.http.fleet"]
        # A connection is opened again only after an asking failed (a loop stalled past
        # --fleet-timeout on a loaded machine closes it): each such failure is said.
        failed = [line for line in said if " answers: " not in line]
        assert host.connections == 1 + len(failed), (host.connections, len(host.requests), said)
    finally:
        await host.stop()


class Closer(Recorder):
    """A host that closes each connection after its first answer, saying nothing of it (as a
    proxy's idle timeout does), when the next request comes on it."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            self.requests.append((time.monotonic(), path))
            body = self.status if path == "/status" else self.devices
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            await reader.read(1)  # the next request comes: closed unanswered
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@async_test
async def test_a_kept_connection_the_host_closed_meanwhile_is_asked_again_on_a_new_one(caplog):
    caplog.set_level(logging.INFO, logger="patroller.http.fleet")
    async with running() as real:
        status, devices = await bodies(real)
    host = await Closer(status, devices, None).start()
    try:
        async with running(fleet=(host.host,), fleet_interval=0.3) as h:
            [shown] = h.api.fleet.hosts
            await until(lambda: len(host.requests) >= 6, timeout=15)
            assert shown.state == "up", (shown.state, shown.error)
        assert host.connections == len(host.requests)  # one answer a connection
        said = [r.getMessage() for r in caplog.records if r.name == "patroller.http.fleet"]
        # up once, and never down
        assert [line for line in said if line.startswith(f"fleet: {host.host} ")] == [
            f"fleet: {host.host} answers: 8 GPUs"
        ], said
    finally:
        await host.stop()


@async_test
async def test_devices_is_asked_again_only_when_its_etag_changes():
    async with running() as real:
        status, devices = await bodies(real)
    host = await Recorder(status, devices, '"v1"').start()
    try:
        async with running(fleet=(host.host,), fleet_interval=0.5) as h:
            await until(lambda: host.asked("/status") >= 5, timeout=15)
            assert host.asked("/devices") == 1
            renamed = json.loads(devices)
            first = next(iter(renamed))
            renamed[first]["name"] = "NVIDIA H100 80GB HBM3"
            host.devices, host.tag = json.dumps(renamed).encode(), '"v2"'

            async def shown_name() -> str:
                answer = json.loads((await h.http.fetch(h.url + "/fleet.json")).body)
                gpus = answer["hosts"][0]["gpus"]
                return next(g["name"] for g in gpus if g["uuid"] == first)

            deadline = time.monotonic() + 15
            while await shown_name() != "NVIDIA H100 80GB HBM3":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            asked = host.asked("/status")
            await until(lambda: host.asked("/status") >= asked + 3, timeout=15)
            assert host.asked("/devices") == 2
    finally:
        await host.stop()


@async_test
async def test_a_real_daemon_names_its_inventorys_version_and_is_asked_devices_once():
    async with running() as real:
        fast = await real.http.fetch(real.url + "/devices")  # the fast lane's answer
        # Tornado's (a conditional request goes to it): a tag that does not match
        slow = await real.http.fetch(real.url + "/devices", headers={"If-None-Match": '"x"'})
        status = await real.http.fetch(real.url + "/status")
        tag = fast.headers["ETag"]
        assert tag == slow.headers["ETag"] == status.headers["X-Devices-ETag"], tag
        again = await real.http.fetch(
            real.url + "/devices", headers={"If-None-Match": tag}, raise_error=False
        )
        assert again.code == 304
        async with running(fleet=(real.url.split("//")[1],), fleet_interval=0.5) as h:
            fleet = h.api.fleet
            await until(lambda: fleet.asked["/status"] >= 4, timeout=15)
            assert fleet.asked["/devices"] == 1
            assert fleet.hosts[0].state == "up" and len(fleet.hosts[0].gpus) == 8


@asynccontextmanager
async def polling_recorders(count: int, rounds: int) -> AsyncIterator[tuple[Any, list[Any]]]:
    """A daemon with --fleet over `count` recording hosts that answer as a real test-mode
    daemon does, once each has been asked /status `rounds` times: (its harness, the hosts)."""
    async with running() as real:
        status, devices = await bodies(real)
    hosts = [await Recorder(status, devices, '"v1"').start() for _ in range(count)]
    try:
        async with running(fleet=tuple(h.host for h in hosts), fleet_interval=0.5) as h:
            await until(lambda: all(host.asked("/status") >= rounds for host in hosts), timeout=15)
            yield h, hosts
    finally:
        for host in hosts:
            await host.stop()


@async_test
async def test_fleet_json_is_built_once_per_change_not_per_request():
    async with polling_recorders(3, 2) as (h, _):
        fleet = h.api.fleet
        began, built = time.monotonic(), fleet.builds
        for _ in range(100):
            await h.http.fetch(h.url + "/fleet.json")
        took = time.monotonic() - began
        # At most one build per Config.fleet_build_every, whatever the requests.
        assert fleet.builds - built <= took / Config.fleet_build_every + 1, (
            fleet.builds - built,
            took,
        )


def unconnectable() -> tuple[socket.socket, list[socket.socket]]:
    """A listener whose accept queue is full (never accepted): the kernel drops further SYNs,
    so connecting to it hangs, as to a host switched off."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filling = []
    for _ in range(4):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect(listener.getsockname())
        except BlockingIOError:
            pass
        filling.append(sock)
    return listener, filling


@async_test
async def test_a_host_that_does_not_connect_is_given_up_at_the_connect_timeout(caplog):
    caplog.set_level(logging.INFO, logger="patroller.http.fleet")
    listener, filling = unconnectable()
    try:
        host = f"127.0.0.1:{listener.getsockname()[1]}"
        async with running(
            fleet=(host,), fleet_interval=0.5, fleet_connect_timeout=0.3, fleet_timeout=5.0
        ) as h:
            [shown] = h.api.fleet.hosts
            await until(lambda: shown.state == "not answering", timeout=4.0)  # < 5 s
            assert shown.error == "no connection within 0.3s", shown.error
        # the log says which host, once, when it went down
        said = [r.getMessage() for r in caplog.records if r.name == "patroller.http.fleet"]
        assert said.count(f"fleet: {host} not answering: no connection within 0.3s") == 1, said
    finally:
        listener.close()
        for sock in filling:
            sock.close()


def test_the_connect_timeout_is_a_flag_apart_from_the_answer_timeout():
    config = load(
        [
            "--test",
            "--fleet",
            "gpu1:8080",
            "--fleet-connect-timeout",
            "0.25",
            "--fleet-timeout",
            "2",
        ],
        {},
    )
    assert (config.fleet_connect_timeout, config.fleet_timeout) == (0.25, 2.0)
    config = load(["--test", "--fleet", "gpu1:8080"], {"PATROLLER_FLEET_CONNECT_TIMEOUT": "2"})
    assert config.fleet_connect_timeout == 2.0 and Config.fleet_connect_timeout == 1.0


def test_a_host_down_one_way_then_another_stays_down_since_the_first():
    from patroller.http.fleet import Host

    host = Host("gpu1:8080", "http://gpu1:8080", since=0.0)
    host.answered([], now=10.0)
    assert (host.state, host.since) == ("up", 10.0)
    host.failed("refused", "connection refused", asked=20.0, now=20.5)
    assert host.since == 20.0
    host.failed("not_answering", "no answer in 1 s", asked=30.0, now=31.0)
    assert (host.state, host.since) == ("not_answering", 20.0)
    host.answered([], now=40.0)
    assert host.since == 40.0


@async_test
async def test_a_round_that_runs_late_is_not_followed_by_every_round_it_missed_at_once():
    """An asking that takes 3.5 intervals is followed by the next at the interval's next
    moment, not by the three it missed, back to back."""
    from patroller.http.fleet import Fleet

    fleet = Fleet(replace(Config(), fleet=("127.0.0.1:9",), fleet_interval=0.4))
    loop = asyncio.get_running_loop()
    times: list[float] = []

    async def ask(host):
        times.append(loop.time())
        if len(times) == 1:
            await asyncio.sleep(1.4)

    fleet.ask = ask  # what the watch calls each round: here, no host at all
    task = asyncio.ensure_future(fleet._watch(fleet.hosts[0], 0.0))
    try:
        await until(lambda: len(times) >= 3, timeout=10)
    finally:
        task.cancel()
    # the next moments of the interval after 1.4 s are 1.6 and 2.0 s: 0.4 s apart; the
    # missed rounds, asked at once, would be none apart
    assert times[2] - times[1] > 0.2, times


def test_the_totals_a_rebuild_only_on_change_and_what_each_failure_is_called():
    """Pure: /fleet.json's totals over hosts up, down and not yet asked; a body not built
    again while nothing changed, however long; the words for what asking a host raised."""
    from patroller.http.fleet import FAILED, REFUSED, Fleet

    now = [100.0]
    fleet = Fleet(
        replace(Config(), fleet=("gpu1:8080", "gpu2:8080", "gpu3:8080")), monotonic=lambda: now[0]
    )
    fleet.hosts[0].answered(
        [{"free": True, "state": "free"}, {"free": False, "state": "reserved"}], now=1.0
    )
    fleet.hosts[1].failed(REFUSED, "connection refused", asked=1.0, now=1.5)
    assert fleet.data()["totals"] == {
        "hosts": 3,
        "answering": 1,
        "gpus": 2,
        "free": 1,
        "states": {"free": 1, "reserved": 1},
    }
    now[0] += 3600
    fleet.body()
    assert fleet.builds == 1
    assert fleet.trouble(ConnectionRefusedError()) == (REFUSED, "connection refused")
    assert fleet.trouble(RuntimeError("it broke")) == (FAILED, "it broke")
    assert fleet.trouble(RuntimeError()) == (FAILED, "RuntimeError")


def test_a_connection_is_kept_only_after_a_whole_http_1_1_answer_that_does_not_close_it():
    from tornado import httputil

    from patroller.http.fleetlink import _Reading

    def kept(version: str, headers: dict[str, str]) -> bool:
        reading = _Reading()
        reading.headers_received(
            httputil.ResponseStartLine(version, 200, "OK"), httputil.HTTPHeaders(headers)
        )
        return reading.keeps_open()

    assert kept("HTTP/1.1", {"Content-Length": "2"})
    assert kept("HTTP/1.1", {"Transfer-Encoding": "chunked"})
    assert not kept("HTTP/1.1", {})  # read to its end: the connection ends with it
    assert not kept("HTTP/1.1", {"Content-Length": "2", "Connection": "close"})
    assert not kept("HTTP/1.0", {"Content-Length": "2"})
