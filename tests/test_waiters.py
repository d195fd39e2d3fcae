"""/wait under misbehaviour: clients that leave at once, and one user trying to fill the queue."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from helpers import Harness, async_test, running, started, until

from patroller.app import assemble
from patroller.config import Config, ConfigError, load
from patroller.core.identity import Identity, named_user
from patroller.http.views import claims
from patroller.identify.callers import TestModeCallers as NamedCallers  # not collected as a test
from patroller.identify.resolver import ProcessIdentifier
from patroller.observe.signals import Signals
from patroller.observe.testmode import SyntheticMonitor, synthetic_inventory

GHOST = b"GET /wait?gpu=1&user=ghost HTTP/1.1\r\nHost: x\r\n\r\n"


def count_finished(h: Harness, path: str) -> list[int]:
    """A list that grows by one as each request for `path` is answered (or dropped) and logged."""
    finished: list[int] = []
    log_function = h.api.app.settings["log_function"]

    def counting(handler: Any) -> None:
        if handler.request.path == path:
            finished.append(handler.get_status())
        log_function(handler)

    h.api.app.settings["log_function"] = counting
    return finished


async def holders(h: Harness) -> list[str | None]:
    """Who holds each device, in device order, as /status says."""
    return [(e["claim"]["user"] or {}).get("user") for e in (await h.ok("/status")).values()]


@async_test
async def test_clients_that_send_and_close_at_once_leave_no_waiter_behind():
    async with running(lease=600) as h:  # no lease ends during the test
        await h.ok("/request?gpu=8&user=alice")
        finished = count_finished(h, "/wait")
        ghosts = 200
        for _ in range(ghosts):  # as found: connect, send, close, many at once
            _, writer = await h.raw(GHOST)
            writer.close()
        await until(lambda: len(finished) == ghosts)  # every one of them was handled
        assert len(h.services.leases.waiters) == 0
        waiting = asyncio.ensure_future(h.call("/wait?gpu=1&user=bob"))
        await until(lambda: len(h.services.leases.waiters) == 1)
        await h.ok(f"/release?user=alice&uuid={h.uuids()[3]}")
        status, body = await asyncio.wait_for(waiting, 5)  # served first: no ghost ahead of it
        assert status == 200 and [g["uuid"] for g in body] == [h.uuids()[3]]
        assert await holders(h) == ["alice"] * 3 + ["bob"] + ["alice"] * 4


class GatedCallers(NamedCallers):
    """Test-mode callers whose /wait identification waits at a gate the test opens."""

    def __init__(self) -> None:
        super().__init__(Config())
        self.gate = asyncio.Event()
        self.connections: list[Any] = []  # of every /wait caller, in arrival order
        self.streams: list[Any] = []
        self.identified = 0
        self.left_meanwhile = 0  # callers whose connection closed while they were identified

    async def identify(self, request: Any, claimed: str | None) -> Identity:
        if request.path == "/wait":
            stream = request.connection.stream
            self.connections.append(request.connection)
            self.streams.append(stream)
            await self.gate.wait()
            self.identified += 1
            self.left_meanwhile += stream.closed()
        return await super().identify(request, claimed)


@asynccontextmanager
async def gated(**settings: Any) -> AsyncIterator[tuple[Harness, GatedCallers]]:
    """A test-mode daemon, as build() makes one, with GatedCallers."""
    config = Config(test=True, port=0, address="127.0.0.1", **settings)
    signals, inventory = Signals(), synthetic_inventory(config.test_devices)
    callers = GatedCallers()
    monitor = SyntheticMonitor(inventory, signals, config.test_interval)
    daemon = assemble(config, inventory, signals, [monitor], ProcessIdentifier(config), callers)
    async with started(daemon) as harness:
        yield harness, callers


@async_test
async def test_a_client_that_leaves_while_it_is_identified_is_never_queued():
    async with gated(lease=600) as (h, callers):
        await h.ok("/request?gpu=8&user=alice")
        ghosts = 20
        writers = [(await h.raw(GHOST))[1] for _ in range(ghosts)]
        await until(lambda: len(callers.streams) == ghosts)  # all are being identified
        for writer in writers:
            writer.close()
        await until(lambda: all(stream.closed() for stream in callers.streams))
        callers.gate.set()
        # Each handler decides, without awaiting anything, once its caller is identified.
        await until(lambda: callers.identified == ghosts)
        assert callers.left_meanwhile == ghosts
        assert len(h.services.leases.waiters) == 0
        waiting = asyncio.ensure_future(h.call("/wait?gpu=1&user=bob"))
        await until(lambda: len(h.services.leases.waiters) == 1)
        await h.ok(f"/release?user=alice&uuid={h.uuids()[0]}")
        status, body = await asyncio.wait_for(waiting, 5)
        assert status == 200 and [g["uuid"] for g in body] == [h.uuids()[0]]
        assert await holders(h) == ["bob"] + ["alice"] * 7


@async_test
async def test_a_grant_that_finds_its_client_gone_is_given_back():
    async with gated(lease=600) as (h, callers):
        callers.gate.set()
        await h.ok("/request?gpu=8&user=alice")
        _, writer = await h.raw(GHOST)
        await until(lambda: len(h.services.leases.waiters) == 1)
        target, holder = h.uuids()[5], []

        def grant_first() -> None:  # a release grants the waiter just as its close is seen
            h.services.leases.release(named_user("alice"), target)
            holder.append(claims(h.services.leases)[target]["user"]["user"])

        callers.connections[0].set_close_callback(grant_first)  # in place of the handler's
        writer.close()
        await until(lambda: holder == ["ghost"] and h.services.leases.state(target) == "free")
        assert len(h.services.leases.waiters) == 0
        assert await holders(h) == ["alice"] * 5 + [None] + ["alice"] * 2


@async_test
async def test_one_user_at_the_cap_gets_429_while_another_is_still_queued():
    async with running(lease=600, max_waiting_per_user=3) as h:
        await h.ok("/request?gpu=8&user=alice")
        calls = []
        for n in range(3):
            calls.append(asyncio.ensure_future(h.call("/wait?gpu=1&user=mallory")))
            await until(lambda: len(h.services.leases.waiters) == n + 1)
        status, body = await h.call("/wait?gpu=1&user=mallory")
        assert status == 429
        assert body == {
            "error": "mallory already has 3 requests waiting, the most one user may have",
            "limit": 3,
            "waiting": 3,
        }
        calls.append(asyncio.ensure_future(h.call("/wait?gpu=1&user=bob")))
        await until(lambda: len(h.services.leases.waiters) == 4)
        # One of mallory's is served: she may queue one more.
        await h.ok(f"/release?user=alice&uuid={h.uuids()[0]}")
        await until(lambda: len(h.services.leases.waiters) == 3)
        calls.append(asyncio.ensure_future(h.call("/wait?gpu=1&user=mallory")))
        await until(lambda: len(h.services.leases.waiters) == 4)
        status, body = await h.call("/wait?gpu=1&timeout=0&user=mallory")
        assert status == 429 and body["waiting"] == 3
        await h.ok("/release?user=alice")  # everyone waiting is served
        answers = await asyncio.wait_for(asyncio.gather(*calls), 5)
        assert [status for status, _ in answers] == [200] * 5
        assert sorted(await holders(h), key=str) == [None] * 3 + ["bob"] + ["mallory"] * 4


def test_the_cap_is_a_setting_with_an_environment_fallback():
    assert load([], {}).max_waiting_per_user == 100
    assert load(["--max-waiting-per-user", "7"], {}).max_waiting_per_user == 7
    assert load([], {"PATROLLER_MAX_WAITING_PER_USER": "9"}).max_waiting_per_user == 9
    for bad in ("0", "-1", "1.5", "many", ""):
        with pytest.raises(ConfigError, match="--max-waiting-per-user"):
            load(["--max-waiting-per-user", bad], {})
    with pytest.raises(ConfigError, match="PATROLLER_MAX_WAITING_PER_USER"):
        load([], {"PATROLLER_MAX_WAITING_PER_USER": "0"})
