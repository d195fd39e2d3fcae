"""Reservations held for the calling process (hold=process), /renew and /queue.

The lease rules on a fake clock; the watch on real processes (pidfd and polling); then daemons
on loopback, in test mode and in GPU host mode on the simulator, with real client processes.
"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import (
    ScenarioFile,
    ServerProcess,
    async_test,
    gpu_running,
    known_claim,
    lease_manager,
    reuse_pid,
    running,
    until,
)

from patroller.config import Config
from patroller.core.errors import NotHeld, NotYours, Unsatisfiable
from patroller.core.identity import ProcessRef, named_user
from patroller.http.views import claims, queue_view
from patroller.identify.procfs import is_alive, process_state
from patroller.state import lifetimes
from patroller.state.lifetimes import Lifelines, open_pidfd
from patroller.state.schema import restore, snapshot

LEASE = Config().lease  # the lease of the shared `leases` fixture (conftest.py)
alice, bob = named_user("alice"), named_user("bob")
SCRIPT = ProcessRef(4242, 777)  # a process, for the rules: they never look at /proc


def uuid(leases, number):
    return leases.inventory.by_number(number).uuid


async def leases_run_out(h, count: int = 3) -> None:
    """Return once `count` leases, each taken as the last ran out, have run out: the daemon's
    expiry has passed every deadline that a lease taken before the first would have had."""
    for _ in range(count):
        [device] = h.services.leases.request(named_user("clock"), {"gpu": 1})
        await until(lambda: h.services.leases.state(device.uuid) == "free", timeout=10)


# -- the rules --------------------------------------------------------------------------------


def test_a_process_hold_runs_no_lease_while_the_process_lives(leases, clock):
    [device] = leases.request(alice, {"gpu": 1}, held_for=SCRIPT)
    assert leases.hold_of(device.uuid) == {
        "hold": "process",
        "expires": None,
        "held_for_pid": SCRIPT.pid,
    }
    assert leases.next_deadline() is None
    clock.advance(100 * LEASE)
    assert leases.expire() == [] and leases.state(device.uuid) == "reserved"
    claim = claims(leases)[device.uuid]
    assert claim["held_for_pid"] == SCRIPT.pid and claim["expires"] is None
    assert leases.processes_held_for() == {SCRIPT}


def test_the_end_of_the_process_frees_its_devices_at_once(leases, clock):
    devices = leases.request(alice, {"gpu": 2}, held_for=SCRIPT)
    other = leases.request(alice, {"gpu": 1})  # a lease of the same user: untouched
    freed = leases.process_exited(SCRIPT)
    assert freed == devices
    assert [leases.state(d.uuid) for d in devices] == ["free", "free"]
    assert leases.state(other[0].uuid) == "reserved"
    assert leases.processes_held_for() == set()
    assert leases.process_exited(SCRIPT) == []  # told twice: nothing more


def test_another_process_of_the_same_pid_does_not_end_the_hold(leases):
    [device] = leases.request(alice, {"gpu": 1}, held_for=SCRIPT)
    assert leases.process_exited(ProcessRef(SCRIPT.pid, SCRIPT.start + 1)) == []
    assert leases.state(device.uuid) == "reserved"


def test_the_users_processes_on_the_device_outlive_the_hold_then_the_usual_rules(leases, clock):
    [device] = leases.request(alice, {"gpu": 1}, held_for=SCRIPT)
    leases.process_started(device.uuid, 5001, alice, "python")  # a worker it started
    assert leases.state(device.uuid) == "claimed"
    leases.process_exited(SCRIPT)
    assert leases.state(device.uuid) == "claimed"
    assert claims(leases)[device.uuid]["held_for_pid"] is None
    leases.process_ended(device.uuid, 5001)  # the last one ends: the usual lease
    assert leases.state(device.uuid) == "reserved"
    assert claims(leases)[device.uuid]["expires"] == LEASE
    clock.advance(LEASE)
    leases.expire()
    assert leases.state(device.uuid) == "free"


def test_the_process_itself_on_the_gpu_frees_it_when_it_ends_without_waiting_for_pmon(leases):
    [device] = leases.request(alice, {"gpu": 1}, held_for=SCRIPT)
    leases.process_started(device.uuid, SCRIPT.pid, alice, "python")
    assert leases.state(device.uuid) == "claimed"
    leases.process_exited(SCRIPT)  # before pmon notices: the kernel's word is enough
    assert leases.state(device.uuid) == "free"
    assert claims(leases)[device.uuid]["processes"] == []
    leases.process_ended(device.uuid, SCRIPT.pid)  # pmon, an interval later: nothing to do
    assert leases.state(device.uuid) == "free"


def test_a_gpu_process_ending_while_the_holder_lives_starts_no_lease(leases, clock):
    [device] = leases.request(alice, {"gpu": 1}, held_for=SCRIPT)
    leases.process_started(device.uuid, 5001, alice)
    leases.process_ended(device.uuid, 5001)  # e.g. one evaluation run of a notebook
    assert leases.state(device.uuid) == "reserved"
    assert leases.next_deadline() is None
    clock.advance(10 * LEASE)
    leases.expire()
    assert leases.state(device.uuid) == "reserved"


def test_release_ends_a_process_hold_asked_by_that_process_or_by_uuid(leases):
    [device] = leases.request(alice, {"gpu": 1}, held_for=SCRIPT)
    # All of alice's, asked from elsewhere: the job of the process it is held for runs there.
    assert leases.release(alice) == ([], [])
    assert leases.release(alice, caller=ProcessRef(SCRIPT.pid + 1, SCRIPT.start)) == ([], [])
    assert leases.state(device.uuid) == "reserved"
    assert leases.release(alice, caller=SCRIPT) == ([device], [])  # by that process
    assert leases.processes_held_for() == set() and leases.state(device.uuid) == "free"
    [device] = leases.request(alice, {"gpu": 1}, held_for=SCRIPT)
    assert leases.release(alice, device.uuid) == ([device], [])  # by uuid
    assert leases.state(device.uuid) == "free"


def test_released_with_processes_running_it_no_longer_waits_for_the_holder(leases):
    [device] = leases.request(alice, {"gpu": 1}, held_for=SCRIPT)
    leases.process_started(device.uuid, 5001, alice)
    assert leases.release(alice, caller=SCRIPT) == ([], [device])
    assert leases.processes_held_for() == set()
    leases.process_ended(device.uuid, 5001)
    assert leases.state(device.uuid) == "free"


def test_a_waiter_for_a_process_is_granted_a_process_hold(leases):
    taken = leases.request(bob, {"gpu": 8})
    granted = []
    waiter = leases.wait(alice, {"gpu": 2}, granted.append, held_for=SCRIPT)
    assert queue_view(leases) == [
        {
            "position": 1,
            "user": "alice",
            "wants": {"gpu": 2},
            "waited": 0.0,
            "hold": "process",
            "pid": SCRIPT.pid,
            "link": None,
        }
    ]
    leases.release(bob, taken[0].uuid)
    leases.release(bob, taken[1].uuid)
    assert granted == [taken[:2]] and waiter.granted == taken[:2]
    assert all(leases.hold_of(d.uuid)["held_for_pid"] == SCRIPT.pid for d in taken[:2])
    assert queue_view(leases) == []


def test_the_queue_lists_waiters_in_arrival_order_with_their_wait(leases, clock):
    leases.request(bob, {"gpu": 8})
    leases.wait(alice, {"gpu": 3}, lambda d: None)
    clock.advance(5)
    leases.wait(bob, {"gpu": 1}, lambda d: None, held_for=SCRIPT)
    queue = queue_view(leases)
    assert [
        (w["position"], w["user"], w["wants"], w["waited"], w["hold"], w["pid"]) for w in queue
    ] == [
        (1, "alice", {"gpu": 3}, 5.0, "lease", None),
        (2, "bob", {"gpu": 1}, 0.0, "process", SCRIPT.pid),
    ]


def test_renew_restarts_the_lease_of_the_callers_reservations(leases, clock):
    mine = leases.request(alice, {"gpu": 2})
    leases.request(alice, {"gpu": 1}, held_for=SCRIPT)
    theirs = leases.request(bob, {"gpu": 1})
    clock.advance(LEASE - 1)
    renewed = leases.renew(alice)
    assert len(renewed) == 3  # the process hold is listed, with no lease to renew
    assert [leases.hold_of(d.uuid)["expires"] for d in mine] == [LEASE, LEASE]
    assert leases.hold_of(theirs[0].uuid)["expires"] == 1.0
    clock.advance(LEASE - 1)
    assert leases.expire() == theirs
    assert leases.renew(alice, mine[0].uuid) == [mine[0]]
    clock.advance(2)
    assert leases.expire() == [mine[1]]  # renewed alone: the other ran out


def test_renew_of_a_device_not_held_says_why(leases, clock):
    [device] = leases.request(alice, {"gpu": 1})
    with pytest.raises(NotYours):
        leases.renew(bob, device.uuid)
    clock.advance(LEASE)
    leases.expire()
    with pytest.raises(NotHeld) as lost:
        leases.renew(alice, device.uuid)
    assert lost.value.data == {"uuid": device.uuid, "state": "free"}
    with pytest.raises(Unsatisfiable):
        leases.renew(alice, "GPU-nonesuch")
    assert leases.renew(alice) == []


def test_a_process_hold_survives_the_book_only_while_its_process_lives(leases, clock):
    [held] = leases.request(alice, {"gpu": 1}, held_for=SCRIPT)
    [other] = leases.request(bob, {"gpu": 1}, held_for=ProcessRef(4343, 1))
    book = snapshot(leases, offset=0.0)
    assert book[held.uuid]["pid"] == SCRIPT.pid and book[held.uuid]["start"] == SCRIPT.start
    assert book[held.uuid]["deadline"] is None
    fresh = lease_manager(clock)
    restored = restore(fresh, book, 0.0, alive=lambda ref: ref == SCRIPT)
    assert restored.held == [held.uuid] and restored.ended == [other.uuid]
    assert fresh.hold_of(held.uuid) == {
        "hold": "process",
        "expires": None,
        "held_for_pid": SCRIPT.pid,
    }
    assert fresh.processes_held_for() == {SCRIPT}
    with pytest.raises(ValueError):
        restore(fresh, {held.uuid: {**book[held.uuid], "start": "soon"}}, 0.0)


# -- the watch on real processes --------------------------------------------------------------


def sleeping():
    return subprocess.Popen(["sleep", "120"])


def ref_of(process):
    return ProcessRef(process.pid, process_state(process.pid)[1])


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "polling"])
@async_test
async def test_the_watch_frees_a_device_when_its_process_is_killed(pidfds, monkeypatch):
    checks = []  # each look at /proc: what polling does every lifeline_poll s
    monkeypatch.setattr(
        lifetimes, "is_alive", lambda ref, proc="/proc": checks.append(ref) or is_alive(ref, proc)
    )
    leases = lease_manager()
    lifelines = Lifelines(leases, replace(Config(), lifeline_poll=0.05), pidfds=pidfds)
    lifelines.start()
    process = sleeping()
    try:
        [device] = leases.request(alice, {"gpu": 1}, held_for=ref_of(process))
        await until(lambda: lifelines.metrics()["watched" if pidfds else "polled"] == 1)
        if pidfds:  # a readable pidfd would be handled within the loop's next two turns
            for _ in range(3):
                await asyncio.sleep(0)
        else:
            seen = len(checks)
            await until(
                lambda: (
                    len(checks) >= seen + 3  # three polls found it alive
                    or leases.state(device.uuid) == "free"
                )
            )
        assert leases.state(device.uuid) == "reserved" and lifelines.metrics()["ended"] == 0
        process.kill()
        process.wait()
        await until(lambda: leases.state(device.uuid) == "free", timeout=5)
        assert lifelines.metrics() == {"watched": 0, "polled": 0, "ended": 1}
    finally:
        lifelines.stop()
        process.kill()
        process.wait()


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "polling"])
@async_test
async def test_one_watched_process_after_another_each_end_is_seen(pidfds):
    """A pidfd is closed and taken off the loop when its process ends: the next one, opened on
    the same descriptor number, is watched afresh (left on the loop, the old registration would
    stand for the new descriptor, which the loop would then never watch). Polled, the poller
    stops once nothing is left to poll, and the next process starts another."""
    leases = lease_manager()
    lifelines = Lifelines(leases, replace(Config(), lifeline_poll=0.05), pidfds=pidfds)
    lifelines.start()
    numbers = []
    try:
        for _ in range(3):
            process = sleeping()
            try:
                [device] = leases.request(alice, {"gpu": 1}, held_for=ref_of(process))
                await until(lambda: lifelines.metrics()["watched" if pidfds else "polled"] == 1)
                numbers.append(lifelines._fds.get(ref_of(process)))
                process.kill()
                process.wait()
                await until(lambda: leases.state(device.uuid) == "free", timeout=5)
                await until(lambda: lifelines._poller is None)
            finally:
                process.kill()
                process.wait()
        assert lifelines.metrics() == {"watched": 0, "polled": 0, "ended": 3}
        assert len(set(numbers)) == 1  # the same descriptor number each time (None: polled)
    finally:
        lifelines.stop()


@async_test
async def test_polling_looks_in_the_proc_root_it_is_given(tmp_path):
    """Polled, a process is looked for under `Config.proc_root` (the host's /proc, mounted
    into Patroller's container), not under this process's own /proc."""
    process = sleeping()
    try:
        fake = tmp_path / str(process.pid)
        fake.mkdir()
        (fake / "stat").write_bytes((Path("/proc") / str(process.pid) / "stat").read_bytes())
        leases = lease_manager()
        lifelines = Lifelines(
            leases, replace(Config(), lifeline_poll=0.05, proc_root=str(tmp_path)), pidfds=False
        )
        lifelines.start()
        try:
            [device] = leases.request(alice, {"gpu": 1}, held_for=ref_of(process))
            await until(lambda: lifelines.metrics()["polled"] == 1)
            (fake / "stat").unlink()  # gone from the root it watches, though it runs here
            await until(lambda: leases.state(device.uuid) == "free", timeout=5)
            assert process.poll() is None
        finally:
            lifelines.stop()
    finally:
        process.kill()
        process.wait()


@async_test
async def test_a_zombie_has_ended():
    leases = lease_manager()
    lifelines = Lifelines(leases, Config())
    lifelines.start()
    process = sleeping()
    try:
        ref = ref_of(process)
        [device] = leases.request(alice, {"gpu": 1}, held_for=ref)
        await until(lambda: lifelines.metrics()["watched"] == 1)
        os.kill(process.pid, signal.SIGKILL)  # not reaped: a zombie keeps its pid
        await until(lambda: process_state(process.pid)[0] == "Z")
        assert not is_alive(ref)
        await until(lambda: leases.state(device.uuid) == "free", timeout=5)
    finally:
        lifelines.stop()
        process.kill()
        process.wait()


def test_a_pid_that_names_another_process_now_is_not_held_for():
    process = sleeping()
    try:
        ref = ref_of(process)
        assert is_alive(ref)
        fd = open_pidfd(ref)
        assert fd is not None
        os.close(fd)
        stranger = ProcessRef(process.pid, ref.start - 1)  # the pid, handed out again
        assert not is_alive(stranger) and open_pidfd(stranger) is None
    finally:
        process.kill()
        process.wait()


@async_test
async def test_a_reused_pid_does_not_inherit_the_hold():
    process = sleeping()
    ref = ref_of(process)
    process.kill()
    process.wait()
    # Start times count clock ticks (10 ms): a pid handed out again within the same tick would
    # look the same, which the kernel never does unless told to (ns_last_pid, as here).
    time.sleep(0.05)
    newcomer = reuse_pid(ref.pid)
    if newcomer is None:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(
            "the kernel did not hand out the same pid again (ns_last_pid not writable)"
        )
    try:
        assert process_state(ref.pid) is not None  # the pid lives, as another process
        leases = lease_manager()
        lifelines = Lifelines(leases, Config())
        lifelines.start()
        [device] = leases.request(alice, {"gpu": 1}, held_for=ref)  # granted as it died
        await until(lambda: leases.state(device.uuid) == "free", timeout=5)
        assert lifelines.metrics()["ended"] == 1
        lifelines.stop()
    finally:
        newcomer.kill()
        newcomer.wait()


# -- daemons and real callers -----------------------------------------------------------------

# A caller that asks once, prints the answer, then lives on (for ever, or until killed).
HOLDER = r"""
import http.client, json, socket, sys, time
where, path = sys.argv[1], sys.argv[2]
if where.startswith("/"):
    class Unix(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(where)
    connection = Unix("localhost", timeout=60)
else:
    host, port = where.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
connection.request("GET", path)
answer = connection.getresponse()
print(json.dumps([answer.status, json.loads(answer.read())]), flush=True)
connection.close()
time.sleep(600)
"""


class Holder:
    """A real client process that asks `path` once and then sleeps until killed."""

    def __init__(self, where, path):
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, where, path], stdout=subprocess.PIPE, text=True
        )
        self.pid = self.process.pid

    async def answer(self):
        line = await asyncio.get_running_loop().run_in_executor(None, self.process.stdout.readline)
        assert line, "the holder died before it answered"
        return json.loads(line)

    def kill(self):
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()


def where(harness):
    return harness.url[len("http://") :]


@async_test
async def test_a_process_hold_outlives_three_leases_and_ends_with_the_process():
    async with running(lease=0.3) as h:
        holder = Holder(where(h), "/request?gpu=2&hold=process&user=alice@example.org")
        try:
            status, granted = await holder.answer()
            assert status == 200, granted
            assert [(g["hold"], g["expires"], g["held_for_pid"]) for g in granted] == [
                ("process", None, holder.pid)
            ] * 2
            await leases_run_out(h)  # three leases, no GPU process anywhere
            status_body = await h.ok("/status")
            for grant in granted:
                claim = status_body[grant["uuid"]]["claim"]
                assert claim["state"] == "reserved" and claim["held_for_pid"] == holder.pid
                assert claim["user"]["user"] == "alice@example.org"
        finally:
            holder.kill()
        await until(
            lambda: all(h.services.leases.state(g["uuid"]) == "free" for g in granted), timeout=5
        )
        assert h.services.lifelines.metrics()["ended"] == 1


@async_test
async def test_a_lease_hold_is_still_the_default():
    async with running(lease=0.3) as h:
        holder = Holder(where(h), "/request?gpu=1")
        try:
            _, [grant] = await holder.answer()
            assert grant["hold"] == "lease" and grant["held_for_pid"] is None
            assert 0 < grant["expires"] <= 0.3
            await until(lambda: h.services.leases.state(grant["uuid"]) == "free", timeout=5)
        finally:
            holder.kill()


@async_test
async def test_a_waiting_process_is_granted_a_process_hold_and_shows_in_the_queue():
    async with running() as h:
        taken = await h.ok("/request?gpu=8&user=bob")
        holder = Holder(where(h), "/wait?gpu=1&hold=process&user=alice")
        try:
            await until(lambda: len(h.services.leases.waiters) == 1)
            [entry] = await h.ok("/queue")
            assert entry["user"] == "alice" and entry["pid"] == holder.pid
            assert entry["hold"] == "process" and entry["wants"] == {"gpu": 1}
            await h.ok(f"/release?uuid={taken[3]['uuid']}&user=bob")
            status, [grant] = await holder.answer()
            assert status == 200 and grant["uuid"] == taken[3]["uuid"]
            assert grant["held_for_pid"] == holder.pid
            assert await h.ok("/queue") == []
        finally:
            holder.kill()
        await until(lambda: h.services.leases.state(taken[3]["uuid"]) == "free", timeout=5)


@async_test
async def test_renew_over_http():
    async with running(lease=60) as h:
        [grant] = await h.ok("/request?gpu=1&user=alice")
        status, body = await h.call(f"/renew?uuid={grant['uuid']}&user=alice", "POST", b"")
        assert status == 200 and [g["uuid"] for g in body["renewed"]] == [grant["uuid"]]
        assert body["renewed"][0]["expires"] == pytest.approx(60, abs=1)
        status, body = await h.call(f"/renew?uuid={grant['uuid']}&user=bob")
        assert status == 403
        await h.ok("/release?user=alice")
        status, body = await h.call(f"/renew?uuid={grant['uuid']}&user=alice")
        assert status == 409 and body["uuid"] == grant["uuid"] and body["state"] == "free"
        assert "ran out or it was released" in body["error"]
        status, body = await h.call("/renew?gpu=1")
        assert status == 400 and "/renew takes uuid=" in body["error"]


@async_test
async def test_hold_must_be_lease_or_process():
    async with running() as h:
        status, body = await h.call("/request?gpu=1&hold=forever")
        assert status == 400 and body["holds"] == ["lease", "process", "<duration>"]
        assert all(c["claim"]["state"] == "free" for c in (await h.ok("/status")).values())


# Connects to the unix socket, waits for a word on stdin, hands the connection over the
# socket it inherited and exits.
CONNECTOR = r"""
import socket, sys
caller = socket.socket(socket.AF_UNIX)
caller.connect(sys.argv[1])
sys.stdin.readline()
socket.send_fds(socket.socket(fileno=int(sys.argv[2])), [b"x"], [caller.fileno()])
"""


@async_test
async def test_a_unix_caller_that_exits_before_its_request_is_still_who_connected(tmp_path):
    """Its credentials and /proc facts are read as it connects, not when its request comes:
    by then the caller may be gone, and its pid another process's."""
    path = str(tmp_path / "api.sock")
    async with running(socket=path, lease=60) as h:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            read = h.services.identifier.proc_reads
            child = subprocess.Popen(
                [sys.executable, "-c", CONNECTOR, path, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.PIPE,
                text=True,
            )
            try:
                await until(lambda: h.services.identifier.proc_reads > read)  # before any request
                child.stdin.write("go\n")
                child.stdin.flush()
                loop = asyncio.get_running_loop()
                _, [fd], _, _ = await loop.run_in_executor(None, socket.recv_fds, ours, 1, 1)
            finally:
                child.stdin.close()
                assert child.wait(10) == 0
        assert not os.path.exists(f"/proc/{child.pid}")  # gone before its request is sent
        with socket.socket(fileno=fd) as connection:
            connection.settimeout(10)
            connection.sendall(
                b"GET /request?gpu=1&hold=process&user=alice HTTP/1.1\r\n"
                b"Host: x\r\nConnection: close\r\n\r\n"
            )
            answer = b""
            while True:
                chunk = await loop.run_in_executor(None, connection.recv, 65536)
                if not chunk:
                    break
                answer += chunk
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200 "), answer
        [grant] = json.loads(body)
        assert grant["hold"] == "process" and grant["held_for_pid"] == child.pid
        # held for a process that has ended: freed at once, no lease to wait for
        await until(lambda: h.services.leases.state(grant["uuid"]) == "free", timeout=5)


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}])


@pytest.fixture
def socket_path():
    path = f"/tmp/pth{os.getpid()}.sock"
    yield path
    if os.path.exists(path):
        os.unlink(path)


@async_test
async def test_gpu_host_a_process_hold_over_the_unix_socket_ends_with_its_process(
    scenario, socket_path
):
    async with gpu_running(scenario, socket=socket_path, lease=0.3) as h:
        holder = Holder(socket_path, "/request?gpu=1&hold=process")
        try:
            status, [grant] = await holder.answer()
            assert status == 200 and grant["held_for_pid"] == holder.pid
            number = grant["info"]["number"]
            # its process computes on the GPU: claimed; it leaves the GPU: held again, no lease
            scenario.write(processes=[{"pid": holder.pid, "gpu": number, "name": "python"}])
            await until(lambda: known_claim(h.services.leases, grant["uuid"]))
            [detail] = (await h.ok("/status"))[grant["uuid"]]["claim"]["process_detail"]
            assert detail["pid"] == holder.pid and detail["command"] == "python"
            scenario.write(processes=[])
            await until(lambda: h.services.leases.state(grant["uuid"]) == "reserved")
            await leases_run_out(h)
            assert h.services.leases.state(grant["uuid"]) == "reserved"
            assert claims(h.services.leases)[grant["uuid"]]["held_for_pid"] == holder.pid
        finally:
            holder.kill()
        await until(lambda: h.services.leases.state(grant["uuid"]) == "free", timeout=5)


@async_test
async def test_gpu_host_a_process_hold_over_loopback_tcp(scenario):
    async with gpu_running(scenario) as h:
        holder = Holder(where(h), "/request?gpu=1&hold=process")
        try:
            status, [grant] = await holder.answer()
            assert status == 200 and grant["held_for_pid"] == holder.pid
        finally:
            holder.kill()
        await until(lambda: h.services.leases.state(grant["uuid"]) == "free", timeout=5)


def test_a_process_hold_is_held_again_after_a_restart_only_while_the_process_lives(tmp_path):
    state = str(tmp_path / "state")
    server = ServerProcess("--test", "--state-dir", state).start()
    holders = []
    try:
        for user in ("alice", "bob"):
            holder = Holder(server.server, f"/request?gpu=1&hold=process&user={user}")
            holders.append(holder)
            assert asyncio.run(holder.answer())[0] == 200
        assert server.stop() == 0
        holders[1].kill()  # bob's process ends while the daemon is down
        server = ServerProcess("--test", "--state-dir", state).start()
        assert "1 device(s) held again" in server.log and "1 whose process ended" in server.log
        status = get_status(server)
        held = {
            c["claim"]["user"]["user"]: c["claim"]["held_for_pid"]
            for c in status.values()
            if c["claim"]["user"]
        }
        assert held == {"alice": holders[0].pid}
        holders[0].kill()  # and the restarted daemon watches it
        asyncio.run(until_free(server))
    finally:
        for holder in holders:
            if holder.process.poll() is None:
                holder.kill()
        server.stop()


def get_status(server):
    with urllib.request.urlopen(server.url + "/status", timeout=10) as answer:
        return json.load(answer)


async def until_free(server):
    await until(
        lambda: all(c["claim"]["state"] == "free" for c in get_status(server).values()), timeout=5
    )
