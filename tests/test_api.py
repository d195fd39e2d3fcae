"""Every endpoint over a real Tornado server on a loopback port, in test mode."""

import asyncio
import subprocess
import time

import pytest
from helpers import async_test, known_claim, running, until

from patroller.identify.procfs import uid as read_uid
from patroller.identify.resolver import host_identity
from patroller.observe.signals import GpuProcess

INFO_KEYS = {
    "name",
    "brand",
    "arch",
    "number",
    "pci_address",
    "total_mem",
    "group",
    "lost",
    "mig_instances",
    "minor_number",
    "mig_mode",
    "topology",
}
STAT_KEYS = {"power", "gtemp", "mtemp", "sm", "mem", "enc", "dec", "mclk", "pclk"}
CLAIM_KEYS = {
    "state",
    "user",
    "users",
    "processes",
    "process_detail",
    "age",
    "expires",
    "held_for_pid",
    "hold",
    "asked",
    "withheld",
    "set_aside_for",
    "ends_at",
    "idle_for",
    "processes_stale",
    "jobs",
    "pods",
    "health",
}


@async_test
async def test_index_names_the_endpoints():
    async with running() as h:
        body = await h.ok("/")
        assert body["mode"] == "test" and body["devices"] == 8
        assert "/status" in body["endpoints"]


@async_test
async def test_devices_lists_the_inventory_in_order():
    async with running() as h:
        body = await h.ok("/devices")
        assert list(body) == h.uuids()
        assert [d["number"] for d in body.values()] == list(range(8))
        for uuid, info in body.items():
            assert uuid.startswith("GPU-")
            assert set(info) == INFO_KEYS
            assert info["group"] == "gpu" and info["total_mem"].endswith("MiB")
        assert len({info["pci_address"] for info in body.values()}) == 8


@async_test
async def test_status_has_live_statistics_and_claims():
    async with running() as h:
        body = await h.ok("/status")
        assert list(body) == h.uuids()
        for entry in body.values():
            assert set(entry) >= STAT_KEYS
            assert entry["updated"].endswith("+00:00") and entry["stale"] is False
            assert set(entry["claim"]) == CLAIM_KEYS
            assert entry["claim"]["state"] == "free" and entry["claim"]["user"] is None
        first = body[h.uuids()[0]]["updated"]
        await until(lambda: h.services.stats.view(h.uuids()[0])["updated"] != first, timeout=5)


@async_test
async def test_eight_requests_get_eight_devices_and_the_ninth_is_busy():
    async with running() as h:
        granted = []
        for _ in range(8):
            [grant] = await h.ok("/request?gpu=1")
            assert set(grant) == {"uuid", "group", "info", "hold", "expires", "held_for_pid"}
            assert grant["group"] == "gpu" and grant["hold"] == "lease"
            granted.append(grant["uuid"])
        assert sorted(granted) == sorted(h.uuids())
        status, body = await h.call("/request?gpu=1")
        assert status == 409
        assert body["free"] == {"gpu": 0} and body["requested"] == {"gpu": 1}
        status_body = await h.ok("/status")
        claim = status_body[granted[0]]["claim"]
        assert claim["state"] == "reserved"
        assert claim["user"]["user"] == "test-user" and claim["user"]["source"] == "test"
        assert 0 < claim["expires"] <= 10


@async_test
async def test_multi_device_request_is_in_device_order():
    async with running() as h:
        grants = await h.ok("/request?gpu=3")
        assert [g["info"]["number"] for g in grants] == [0, 1, 2]


@async_test
async def test_release_gives_back_only_the_callers_devices():
    async with running() as h:
        [mine] = await h.ok("/request?gpu=1&user=alice")
        [theirs] = await h.ok("/request?gpu=1&user=bob")
        status, body = await h.call(f"/release?uuid={theirs['uuid']}&user=alice")
        assert status == 403 and "another user" in body["error"]
        body = await h.ok("/release?user=alice")
        assert [g["uuid"] for g in body["released"]] == [mine["uuid"]]
        assert body["after_exit"] == []
        states = {u: e["claim"]["state"] for u, e in (await h.ok("/status")).items()}
        assert states[mine["uuid"]] == "free" and states[theirs["uuid"]] == "reserved"
        status, body = await h.call(
            "/release", method="POST", body=f"uuid={theirs['uuid']}&user=bob".encode()
        )
        assert status == 200 and [g["uuid"] for g in body["released"]] == [theirs["uuid"]]


@async_test
async def test_wait_is_answered_when_a_device_is_released():
    async with running() as h:
        await h.ok("/request?gpu=8&user=alice")
        waiting = asyncio.ensure_future(h.call("/wait?gpu=1&user=bob"))
        await until(lambda: len(h.services.leases.waiters) == 1)
        assert not waiting.done()
        await h.ok(f"/release?user=alice&uuid={h.uuids()[4]}")
        status, body = await asyncio.wait_for(waiting, 5)
        assert status == 200 and body[0]["uuid"] == h.uuids()[4]
        claim = (await h.ok("/status"))[h.uuids()[4]]["claim"]
        assert claim["user"]["user"] == "bob"


@async_test
async def test_wait_is_answered_when_the_lease_expires_and_not_before():
    async with running(lease=0.5) as h:
        started = time.monotonic()
        await h.ok("/request?gpu=8&user=alice")
        status, body = await h.call("/wait?gpu=2&user=bob")
        assert status == 200 and len(body) == 2
        assert time.monotonic() - started >= 0.5  # the lease was honoured


@async_test
async def test_wait_is_answered_when_a_process_ends():
    async with running() as h:
        sleeper = subprocess.Popen(["sleep", "30"])
        try:
            me = host_identity(read_uid(sleeper.pid)).user  # a real process, a real account
            target = h.uuids()[0]
            record = GpuProcess(uuid=target, pid=sleeper.pid, type="C", command="sleep")
            h.services.signals.process_started.send(object(), record=record)
            await until(lambda: known_claim(h.services.leases, target))
            claim = (await h.ok("/status"))[target]["claim"]
            assert claim["processes"] == [sleeper.pid] and claim["user"]["user"] == me
            await h.ok(f"/request?gpu=7&user={me}")
            waiting = asyncio.ensure_future(h.call("/wait?gpu=1&user=carol"))
            await until(lambda: len(h.services.leases.waiters) == 1)  # queued before the release
            body = await h.ok(f"/release?user={me}&uuid={target}")
            assert [g["uuid"] for g in body["after_exit"]] == [target]
            # The release served the queue as it was answered: carol is still in it.
            assert len(h.services.leases.waiters) == 1 and not waiting.done()
            assert known_claim(h.services.leases, target)  # the process still runs there
            h.services.signals.process_ended.send(object(), record=record)
            status, body = await asyncio.wait_for(waiting, 5)
            assert status == 200 and body[0]["uuid"] == target
        finally:
            sleeper.kill()
            sleeper.wait()


@async_test
async def test_wait_with_timeout_answers_like_a_busy_request():
    async with running() as h:
        await h.ok("/request?gpu=8&user=alice")
        status, body = await h.call("/wait?gpu=1&timeout=0.2&user=bob")
        assert status == 409 and body["free"] == {"gpu": 0}
        assert len(h.services.leases.waiters) == 0


@async_test
async def test_wait_granted_at_once_when_free():
    async with running() as h:
        body = await h.ok("/wait?gpu=2&timeout=5")
        assert len(body) == 2


@async_test
async def test_a_client_that_disconnects_stops_waiting_and_gets_nothing():
    async with running(lease=600) as h:  # no lease ends in the test: only the close can act
        await h.ok("/request?gpu=8&user=alice")
        reader, writer = await h.raw(b"GET /wait?gpu=1&user=bob HTTP/1.1\r\nHost: x\r\n\r\n")
        await until(lambda: len(h.services.leases.waiters) == 1)
        writer.close()
        await until(lambda: len(h.services.leases.waiters) == 0)
        status = await h.ok("/status")
        assert {e["claim"]["user"]["user"] for e in status.values()} == {"alice"}
        await h.ok("/release?user=alice")
        status = await h.ok("/status")
        assert {e["claim"]["state"] for e in status.values()} == {"free"}


@async_test
async def test_waiters_are_answered_503_on_shutdown():
    async with running() as h:
        await h.ok("/request?gpu=8&user=alice")
        waiting = asyncio.ensure_future(h.call("/wait?gpu=1&user=bob"))
        await until(lambda: len(h.services.leases.waiters) == 1)
        await h.daemon.stop(grace=2.0)
        status, body = await asyncio.wait_for(waiting, 5)
        assert status == 503 and "shutting down" in body["error"]


@async_test
async def test_many_waiters_are_served_in_arrival_order():
    async with running() as h:
        await h.ok("/request?gpu=8&user=alice")
        waits = []
        for n in range(3):
            waits.append(asyncio.ensure_future(h.call(f"/wait?gpu=1&user=w{n}")))
            await until(lambda: len(h.services.leases.waiters) == n + 1)
        for uuid in h.uuids()[:3]:
            await h.ok(f"/release?user=alice&uuid={uuid}")
        results = [await asyncio.wait_for(w, 5) for w in waits]
        assert [body[0]["uuid"] for _, body in results] == h.uuids()[:3]


BAD_REQUESTS = [
    # (path, status, words the error must contain)
    ("/request", 400, "nothing requested"),
    ("/request?gpu=", 400, "whole number"),
    ("/request?gpu=abc", 400, "whole number"),
    ("/request?gpu=1.5", 400, "whole number"),
    ("/request?gpu=-1", 400, "negative"),
    ("/request?gpu=0", 400, "zero"),
    ("/request?gpu=%EF%BC%91", 400, "whole number"),  # a full-width digit
    ("/request?gpu=99999999999999999999999", 400, "absurdly large"),
    ("/request?gpu=1&gpu=1", 400, "given 2 times"),
    ("/request?gpu=1&timeout=5", 400, "/wait"),
    ("/request?g%20pu=1", 400, "not a device group"),
    ("/request?gpu=%FF", 400, "UTF-8"),
    ("/request?gpu=1&user=a%20b", 400, "user="),
    ("/request?gpu=1&user=" + "x" * 200, 400, "user="),
    ("/request?" + "&".join(f"g{n}=1" for n in range(20)), 400, "too many groups"),
    ("/request?gpu=1&pad=" + "x" * 3000, 400, "too long"),
    ("/wait?gpu=1&timeout=abc", 400, "number of seconds"),
    ("/wait?gpu=1&timeout=-1", 400, "zero or more"),
    ("/wait?gpu=1&timeout=nan", 400, "zero or more"),
    ("/wait?gpu=1&timeout=1e12", 400, "at most"),
    ("/wait?gpu=1&timeout=1&timeout=2", 400, "given 2 times"),
    ("/release?gpu=1", 400, "uuid="),
    ("/release?uuid=%3Cscript%3E", 400, "not a device uuid"),
    ("/request?tpu=1", 422, "no device group"),
    ("/request?gpu=9", 422, "only 8 exist"),
    ("/wait?gpu=9", 422, "only 8 exist"),
    ("/wait?fpga=1&timeout=3", 422, "no device group"),
    ("/release?uuid=GPU-nope", 422, "no device"),
    ("/nowhere", 404, "no such endpoint"),
    ("/devices/extra", 404, "no such endpoint"),
]


@pytest.mark.parametrize(
    "path,status,words", BAD_REQUESTS, ids=[p[:40] for p, _, _ in BAD_REQUESTS]
)
@async_test
async def test_bad_requests_get_a_4xx_json_answer_that_says_why(path, status, words):
    async with running() as h:
        got, body = await h.call(path)
        assert got == status, body
        assert words in body["error"]
        assert len(h.services.leases.waiters) == 0
        assert {e["claim"]["state"] for e in (await h.ok("/status")).values()} == {"free"}


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/devices"),
        ("PUT", "/request?gpu=1"),
        ("DELETE", "/status"),
        ("PATCH", "/release"),
    ],
)
@async_test
async def test_wrong_methods_get_405_json(method, path):
    async with running() as h:
        status, body = await h.call(path, method=method, body=b"" if method != "DELETE" else None)
        assert status == 405
        assert method in body["error"] and body["allowed"]


@async_test
async def test_a_busy_request_reports_the_counts():
    async with running() as h:
        await h.ok("/request?gpu=6&user=alice")
        status, body = await h.call("/request?gpu=3&user=bob")
        assert status == 409
        assert body == {
            "error": "busy: 3 gpu requested, 2 free",
            "requested": {"gpu": 3},
            "free": {"gpu": 2},
        }


@async_test
async def test_an_oversized_body_is_refused_and_the_daemon_goes_on():
    async with running() as h:
        reader, writer = await h.raw(
            b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"a" * 1000
        )
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 413")
        assert b'{"error":"the request body is 100000 bytes' in answer
        assert len(await h.ok("/devices")) == 8


@async_test
async def test_garbage_on_the_socket_does_not_stop_the_daemon():
    async with running() as h:
        for junk in (
            b"\x00\xff\r\n\r\n",
            b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
            b"GET /request?gpu=1 HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        ):
            reader, writer = await h.raw(junk)
            await asyncio.wait_for(reader.read(), 5)
            writer.close()
        assert len(await h.ok("/devices")) == 8
        assert {e["claim"]["state"] for e in (await h.ok("/status")).values()} == {"free"}


@async_test
async def test_routes_match_their_whole_path_and_one_query_limit_holds_everywhere():
    async with running() as h:
        status, body = await h.call("/openapiXjson")
        assert status == 404 and "no such endpoint" in body["error"]
        assert (await h.call("/openapi.json"))[0] == 200
        long_query = "?" + "a" * 60000
        for path in ("/status", "/devices", "/queue", "/users", "/metrics.json", "/"):
            status, body = await h.call(path + long_query)
            assert status == 400 and "query is too long" in body["error"], path
