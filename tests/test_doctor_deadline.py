"""The doctor ends in a bounded time, whatever it knocks on: a user's rootless engine that answers
one byte every 2 s (each read well inside a socket's timeout, the whole answer never), a hung
nvidia-smi, a probe that never returns. Each is a real thing (a unix socket server, the
simulator hanging, a thread held on an event); what it waited for is said, degraded."""

import asyncio
import os
import socket
import sys
import threading
import time
from dataclasses import replace

import pytest
from helpers import ScenarioFile, async_test, children_of, engines_in
from test_doctor import command_of, doctor, isolated

from patroller.config import Config
from patroller.doctor import examine

DRIBBLE = 2.0  # seconds between the bytes the slow engine sends


class Dribbler:
    """A unix socket server that answers every connection with an HTTP head one byte every
    DRIBBLE seconds, for as long as it runs: it never finishes the answer."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stop = threading.Event()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.listener.settimeout(0.2)
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            thread = threading.Thread(target=self._dribble, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _dribble(self, conn: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100000
        with conn:
            for byte in answer:
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return  # the doctor gave up and closed it
                if self.stop.wait(DRIBBLE):
                    return

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)
        self.listener.close()


@pytest.fixture
def slow_engine(engine_sockets):
    """uid 1000's rootless Docker Engine, where the doctor looks for it, answering a byte at a
    time."""
    os.makedirs(f"{engine_sockets}/1000")
    server = Dribbler(f"{engine_sockets}/1000/docker.sock")
    yield server
    server.close()


@pytest.mark.timeout(120)
def test_a_rootless_engine_answering_a_byte_at_a_time_is_given_up_on(slow_engine, engine_sockets):
    # Without a deadline on the whole answer this never ends: each byte comes within the
    # socket's timeout. The subprocess's timeout makes that a failure, not a hang.
    code, found, listed = doctor(*isolated(engine_sockets, "--test"), timeout=60)
    assert code == 0, listed
    rootless = found["rootless Docker"]
    assert rootless["status"] == "degraded", rootless
    assert f"uid 1000's at unix://{slow_engine.path}: no answer in time" in rootless["detail"]
    assert "no whole answer within 5s" in rootless["detail"], rootless  # Config.docker_timeout
    assert "hung" in rootless["fix"]
    assert found["Docker Engine"]["status"] == "ok", found["Docker Engine"]  # not there: fine


@pytest.mark.timeout(60)
@async_test
async def test_the_whole_examination_ends_at_its_bound_saying_what_it_waited_for(
    slow_engine, engine_sockets
):
    # Each answer may take all its 600 s; the examination as a whole may take 2.
    config = replace(
        Config(port=0, address="127.0.0.1", test=True),
        doctor_deadline=2.0,
        docker_timeout=600.0,
        **engines_in(engine_sockets),
    )
    os.makedirs(f"{engine_sockets}/1001")
    second = Dribbler(f"{engine_sockets}/1001/docker.sock")  # asked after uid 1000's
    try:
        began = time.monotonic()
        results = {r.check: r for r in await asyncio.wait_for(examine(config), 30)}
        assert time.monotonic() - began < 20
    finally:
        second.close()
    rootless = results["rootless Docker"]
    assert rootless.status == "degraded", rootless
    assert rootless.detail == (
        f"2 found; 2 not answering, uid 1000's at unix://{slow_engine.path}: no answer within "
        "the doctor's bound (waited 2s for its answer)"
    )
    assert "answer a little at a time" in rootless.fix
    assert results["Docker Engine"].status == "ok"  # a slow engine holds up no other
    assert [r.check for r in results.values() if "doctor's" in r.detail] == ["rootless Docker"]


@pytest.mark.timeout(60)
@async_test
async def test_a_probe_that_never_returns_is_degraded_and_its_checks_named(
    engine_sockets, monkeypatch
):
    held = threading.Event()

    def hung_proc(root: str) -> None:
        held.wait(30)  # a /proc on a hung file system

    monkeypatch.setattr(sys.modules["patroller.doctor.examine"], "probe_proc", hung_proc)
    config = replace(
        Config(port=0, address="127.0.0.1", test=True, proc_root="/proc"),
        doctor_deadline=1.0,
        **engines_in(engine_sockets),
    )
    try:
        results = {r.check: r for r in await asyncio.wait_for(examine(config), 20)}
    finally:
        held.set()
    for check in ("/proc", "cgroups"):
        assert results[check].status == "degraded", results[check]
        assert (
            results[check].detail == "no answer within the doctor's 1s: waited for "
            "/proc's processes"
        )
    assert results["address and port"].status == "ok"


@pytest.mark.timeout(60)
@async_test
async def test_a_hung_nvidia_smi_is_cut_at_the_bound_and_leaves_no_child(tmp_path, engine_sockets):
    hung = ScenarioFile(str(tmp_path / "s.json"), faults={"-q": {"hang": True}})
    config = replace(
        Config(port=0, address="127.0.0.1", nvidia_smi=hung.command),
        discovery_timeout=600.0,
        doctor_deadline=2.0,
        **engines_in(engine_sockets),
    )
    results = await asyncio.wait_for(examine(config), 30)
    found = {r.check: r for r in results}
    assert found["nvidia-smi"].status == "degraded", found["nvidia-smi"]
    assert found["nvidia-smi"].detail.startswith(
        f"no answer within the doctor's 2s: waited for {hung.command}: -q -x"
    )
    assert [pid for pid in children_of(os.getpid()) if hung.path in command_of(pid)] == []


def test_what_the_bound_cut_short_is_said_check_by_check():
    """Pure: an engine still asked at the bound, users' engines not reached, and users' sockets
    still being listed (a hung file system), each as the doctor says it."""
    from patroller.doctor.runtimes import EngineFacts, Knock, engine_results

    config = replace(Config(), **engines_in("/run/e"))
    waited = Knock("unix:///run/e/docker.sock", "overdue", "waited 30s for its answer")
    facts = EngineFacts(
        waited,
        None,
        [
            (
                1000,
                Knock(
                    "unix:///run/e/1000/docker.sock",
                    "unasked",
                    "the doctor's 30s went on those asked before it",
                ),
            )
        ],
        [],
        None,
        None,
        unlisted=("podman",),
    )
    found = {r.check: r for r in engine_results(facts, config)}
    assert (
        found["Docker Engine"].detail == "unix:///run/e/docker.sock: no answer within the "
        "doctor's bound (waited 30s for its answer)"
    )
    assert found["rootless Docker"].detail == (
        "1 found; 1 not answering, uid 1000's at unix:///run/e/1000/docker.sock: not asked (the "
        "doctor's 30s went on those asked before it)"
    )
    assert "asked before it" in found["rootless Docker"].fix
    assert (
        found["rootless Podman"].detail == "its users' sockets (/run/e/{uid}/podman/podman.sock) "
        "were still being listed when the doctor's bound came"
    )
    assert all(
        found[c].status == "degraded"
        for c in ("Docker Engine", "rootless Docker", "rootless Podman")
    )


@pytest.mark.timeout(30)
def test_a_bounded_socket_ends_the_whole_exchange_not_each_read():
    from patroller.doctor.deadline import Overdue, bounded, deadline

    ours, theirs = socket.socketpair()
    stop = threading.Event()

    def dribble():
        while not stop.wait(0.05):
            theirs.sendall(b"a")

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    sock = bounded(ours, deadline(0.5), 0.5)
    got = b""
    began = time.monotonic()
    try:
        with pytest.raises(Overdue) as overdue:
            while True:
                got += sock.recv(1)  # each read comes at once: only the deadline ends this
        assert time.monotonic() - began < 5
        assert str(overdue.value) == f"no whole answer within 0.5s ({len(got)} byte(s) came)"
        assert isinstance(overdue.value, TimeoutError) and got
    finally:
        stop.set()
        thread.join()
        sock.close()
        theirs.close()


# tornado's bind_sockets drops the socket it could not bind (EADDRINUSE) unclosed
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.timeout(60)
@async_test
async def test_a_port_held_by_a_server_answering_a_byte_at_a_time_is_said_taken(engine_sockets):
    """Whoever holds the port may be any user: the head of its answer must come whole within
    doctor_timeout, or it is something that does not answer as Patroller does."""
    held = socket.create_server(("127.0.0.1", 0))
    port = held.getsockname()[1]
    stop = threading.Event()

    def serve():
        held.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = held.accept()
            except OSError:
                continue
            with conn:
                for byte in b"HTTP/1.0 200 OK\r\nServer: patroller" + b" " * 4096:
                    if stop.wait(0.1):
                        break
                    conn.sendall(bytes([byte]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    config = replace(
        Config(port=port, address="127.0.0.1", test=True),
        doctor_timeout=0.5,
        doctor_deadline=20.0,
        **engines_in(engine_sockets),
    )
    try:
        results = {r.check: r for r in await asyncio.wait_for(examine(config), 40)}
    finally:
        stop.set()
        thread.join()
        held.close()
    taken = results["address and port"]
    assert taken.status == "failed", taken
    assert "does not answer as Patroller does holds it" in taken.detail, taken
