"""Reservations survive a restart: a real daemon killed (-9) or stopped, and started again on the
same --state-dir."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from helpers import (
    ROOT,
    ScenarioFile,
    ServerProcess,
    alive,
    async_test,
    children_of,
    claimed_known,
    running,
    until,
)

SIX = [{"minor": n} for n in range(6)]


def call(server, path):
    """(status, JSON body) of a GET."""
    try:
        with urllib.request.urlopen(server.url + path, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def ok(server, path):
    status, body = call(server, path)
    assert status == 200, (path, status, body)
    return body


def book(state):
    with open(os.path.join(state, "leases.json"), encoding="utf-8") as f:
        return json.load(f)


def held_by(status, user):
    return sorted(
        u for u, entry in status.items() if (entry["claim"]["user"] or {}).get("user") == user
    )


@pytest.fixture
def state(tmp_path):
    return str(tmp_path / "state")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_reservation_survives_a_restart_with_its_remaining_time(state, signum):
    server = ServerProcess("--test", "--state-dir", state, "--lease", "60").start()
    try:
        asked = time.time()
        granted = [d["uuid"] for d in ok(server, "/request?gpu=2&user=alice")]
        answered = time.time()
    finally:
        server.stop(signum)
    server = ServerProcess("--test", "--state-dir", state, "--lease", "60").start()
    try:
        before = time.time()
        status = ok(server, "/status")
        after = time.time()
        assert held_by(status, "alice") == sorted(granted)
        for uuid in granted:
            claim = status[uuid]["claim"]
            assert claim["state"] == "reserved"
            # the time left of the first lease, not a fresh one (slack: rounding to ms)
            assert asked + 60 - after - 0.01 <= claim["expires"] <= answered + 60 - before + 0.01
        code, busy = call(server, "/request?gpu=8&user=bob")
        assert code == 409 and busy["free"] == {"gpu": 6}
        others = [d["uuid"] for d in ok(server, "/request?gpu=6&user=bob")]
        assert not set(others) & set(granted)
        assert ok(server, "/release?user=alice")  # and alice can still give hers back
    finally:
        server.stop()
    assert "Traceback" not in server.log


def test_a_reservation_that_ran_out_while_the_daemon_was_down_comes_back_free(state):
    # The lease is long enough for the kill to come before it runs out, even on a loaded
    # machine (with 1.5 s the first daemon once expired it itself, and there was nothing left
    # to run out while it was down); the book says so after the kill.
    server = ServerProcess("--test", "--state-dir", state, "--lease", "4").start()
    try:
        [granted] = [d["uuid"] for d in ok(server, "/request?gpu=1&user=alice")]
        deadline = book(state)["devices"][granted]["deadline"]
    finally:
        server.stop(signal.SIGKILL)
    assert book(state)["devices"][granted]["deadline"] == deadline  # held when it died
    asyncio.run(until(lambda: time.time() > deadline + 0.1, timeout=20))
    server = ServerProcess("--test", "--state-dir", state, "--lease", "4").start()
    try:
        status = ok(server, "/status")
        assert [e["claim"]["state"] for e in status.values()] == ["free"] * 8
        assert f"lease of alice on {granted} ran out while the daemon was down" in server.log
        assert book(state)["devices"] == {}
    finally:
        server.stop()


def test_a_corrupt_book_is_set_aside_and_the_daemon_starts_empty(state):
    os.makedirs(state, mode=0o700)  # as the daemon makes it (one open to others is warned of)
    with open(os.path.join(state, "leases.json"), "w", encoding="utf-8") as f:
        f.write('{"version": 1, "devices": {"GPU-')
    server = ServerProcess("--test", "--state-dir", state).start()
    try:
        status = ok(server, "/status")
        assert [e["claim"]["state"] for e in status.values()] == ["free"] * 8
        lines = [line for line in server.log.splitlines() if "patroller.state.book" in line]
        assert len(lines) == 1 and "WARNING" in lines[0] and "set aside as" in lines[0], lines
        aside = [n for n in os.listdir(state) if n.startswith("leases.json.corrupt-")]
        assert len(aside) == 1 and aside[0] in lines[0]
        [granted] = ok(server, "/request?gpu=1&user=alice")
        assert list(book(state)["devices"]) == [granted["uuid"]]  # a new book in its place
    finally:
        server.stop()
    assert "Traceback" not in server.log


def test_a_second_daemon_on_the_same_state_dir_refuses_to_start(state):
    first = ServerProcess("--test", "--state-dir", state).start()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "patroller",
                "--test",
                "--port",
                "0",
                "--address",
                "127.0.0.1",
                "--state-dir",
                state,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            f"patroller: another patroller (pid {first.process.pid}) uses the state directory "
            f"{state}; stop it, or give this one another --state-dir"
        ]
        ok(first, "/status")  # the first one is untouched
    finally:
        first.stop()


# -- GPU host mode, on the simulator ----------------------------------------------------------


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=SIX)


def gpu_server(scenario, state):
    return ServerProcess(
        "--nvidia-smi", scenario.command, "--state-dir", state, "--lease", "60"
    ).start()


def kill_hard(server):
    """kill -9 the daemon, then its orphaned nvidia-smi children (which are not ours to test)."""
    children = children_of(server.process.pid)
    server.stop(signal.SIGKILL)
    for pid in children:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@async_test
async def test_gpu_host_mode_a_claim_and_a_reservation_survive_kill_9(scenario, state, sleeper):
    scenario.write(processes=[{"pid": sleeper.pid, "gpu": 1}])
    server = gpu_server(scenario, state)
    try:
        devices = ok(server, "/devices")
        uuid = {info["number"]: u for u, info in devices.items()}
        await until(lambda: claimed_known(ok(server, "/status")[uuid[1]]["claim"]))
        [reserved] = [d["uuid"] for d in ok(server, "/request?gpu=1")]  # the caller: our account
        user = ok(server, "/status")[reserved]["claim"]["user"]
        assert user["source"] == "host"
    finally:
        kill_hard(server)
    scenario.write(processes=[])  # pmon does not list the process yet after the restart
    server = gpu_server(scenario, state)
    try:
        status = ok(server, "/status")
        assert status[reserved]["claim"]["user"] == user
        assert status[reserved]["claim"]["state"] == "reserved"
        # the claimed device comes back reserved for the holder of its process, a fresh lease
        assert status[uuid[1]]["claim"]["state"] == "reserved"
        assert status[uuid[1]]["claim"]["user"]["user"] == user["user"]
        assert 0 < status[uuid[1]]["claim"]["expires"] <= 60
        # when pmon shows the process again, it claims its device again
        scenario.write(processes=[{"pid": sleeper.pid, "gpu": 1}])
        await until(lambda: claimed_known(ok(server, "/status")[uuid[1]]["claim"]))
        assert ok(server, "/status")[uuid[1]]["claim"]["processes"] == [sleeper.pid]
        free = [u for u, e in ok(server, "/status").items() if e["claim"]["state"] == "free"]
        assert len(free) == 4 and reserved not in free and uuid[1] not in free
    finally:
        server.stop()


@pytest.mark.errors_expected  # the failing write is logged as an error
@async_test
async def test_a_book_that_cannot_be_written_hands_nothing_out_and_recovers_by_itself(tmp_path):
    state = tmp_path / "state"
    async with running(state_dir=str(state), book_retry=0.1, lease=600) as h:
        everything = await h.ok("/request?gpu=8&user=alice")
        waiting = asyncio.ensure_future(h.call("/wait?gpu=2&user=carol"))
        await until(lambda: len(h.services.leases.waiters) == 1)
        await h.ok(f"/release?user=alice&uuid={everything[1]['uuid']}")  # carol wants two
        os.mkdir(state / "leases.json.tmp")  # every write fails now (as on a full disk)
        status, body = await h.call("/request?gpu=1&user=bob")  # written, failed, given back
        assert status == 503 and "cannot be written" in body["error"]
        assert h.services.leases.held_by("bob") == []
        await h.ok(f"/release?user=alice&uuid={everything[0]['uuid']}")
        status, body = await h.call("/request?gpu=1&user=bob")  # refused before the grant
        assert status == 503 and "cannot be written" in body["error"]
        assert not waiting.done() and len(h.services.leases.waiters) == 1  # carol waits on
        assert (await h.ok("/metrics.json"))["lease_book"]["writable"] is False
        os.rmdir(state / "leases.json.tmp")  # room again: the book recovers by itself
        status, granted = await asyncio.wait_for(waiting, 10)
        assert status == 200 and [g["uuid"] for g in granted] == [
            d["uuid"] for d in everything[:2]
        ]
        await h.ok(f"/release?user=alice&uuid={everything[2]['uuid']}")
        assert (await h.call("/request?gpu=1&user=bob"))[0] == 200  # handed out again
        assert (await h.ok("/metrics.json"))["lease_book"]["writable"] is True
    book = json.loads((state / "leases.json").read_text())
    assert book["devices"][granted[0]["uuid"]]["holder"]["user"] == "carol"  # on disk
