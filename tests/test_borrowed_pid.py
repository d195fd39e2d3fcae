"""A pid names a caller only while it is the process the kernel saw connect: the checks that
keep a caller's identity from being borrowed by whoever gets its pid next. Real sockets, real
processes, the real /proc; the daemon-level attack is in test_trust_callers.py."""

import asyncio
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import pytest
from helpers import async_test, need_root, process_in_cgroup, python_for, reuse_pid

from patroller.config import Config
from patroller.core.errors import Unidentified
from patroller.core.identity import UNKNOWN
from patroller.identify import procfs
from patroller.identify.callers import LocalProcesses
from patroller.identify.connection import ConnectionFacts
from patroller.identify.peers import Credentials, Peer, peer_credentials
from patroller.identify.resolver import ProcessIdentifier, ProcFacts, read_facts, read_peer_facts
from patroller.identify.sockets import ESTABLISHED, SocketEntry, find_client

NOBODY = 65534
CONNECT_AND_EXIT = (
    "import os, socket, sys\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.connect(sys.argv[1])\n"
    "print(os.getpid(), flush=True)\n"
)


def kernel_has_peer_pidfd():
    major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    return (major, minor) >= (6, 5)


@pytest.fixture
def listener(tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "api.sock"))
    sock.listen(8)
    yield sock, str(tmp_path / "api.sock")
    sock.close()


def connect_and_exit(path):
    """The pid of a process that connected to `path` and has ended (and been reaped)."""
    child = subprocess.run(
        [sys.executable, "-c", CONNECT_AND_EXIT, path],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return int(child.stdout)


def test_the_process_that_connected_is_the_caller(listener):
    sock, path = listener
    client = socket.socket(socket.AF_UNIX)
    client.connect(path)
    conn, _ = sock.accept()
    try:
        credentials = peer_credentials(conn)
        assert credentials is not None and credentials.pid == os.getpid()
        facts = read_peer_facts(credentials, "/proc")
        assert isinstance(facts, ProcFacts), facts
        assert facts.pid == os.getpid() and os.geteuid() in facts.uids
    finally:
        conn.close()
        client.close()


def test_a_pid_taken_by_a_process_of_the_same_uid_is_not_the_caller(listener):
    # Two containers may run as the same uid: the uid alone cannot tell their processes apart,
    # the connecting process's pidfd can.
    need_root("the next pid is chosen through /proc/sys/kernel/ns_last_pid")
    if not kernel_has_peer_pidfd():
        pytest.skip(f"kernel {os.uname().release} gives no SO_PEERPIDFD (6.5 and later do)")
    sock, path = listener
    pid = connect_and_exit(path)
    reused = reuse_pid(pid)  # a process of ours, the same uid as the caller's
    if reused is None:
        pytest.skip("the kernel does not let us choose the next pid (ns_last_pid)")
    conn, _ = sock.accept()  # the connection waited in the backlog meanwhile
    try:
        credentials = peer_credentials(conn)
        assert credentials is not None and credentials.pid == pid
        assert credentials.pidfd is not None
        refused = read_peer_facts(credentials, "/proc")
        assert isinstance(refused, str), refused
        assert f"pid {pid} is not the process that connected: that process has ended" == refused
        with pytest.raises(OSError):  # its pidfd was closed
            os.fstat(credentials.pidfd)
    finally:
        conn.close()
        reused.kill()
        reused.wait()


def test_a_pid_taken_by_another_uid_is_not_the_caller():
    # The kernel's record of the uid at connect() is the ground truth.
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        other = NOBODY if os.geteuid() != NOBODY else 0
        credentials = Credentials(sleeper.pid, other, other, procfs.boot_ticks() + 10**6)
        refused = read_peer_facts(credentials, "/proc")
        assert refused == (
            f"pid {sleeper.pid} is not the process that connected: it runs as "
            f"uid {os.getuid()}, the connection was made by uid {other}"
        )
    finally:
        sleeper.kill()
        sleeper.wait()


def test_without_a_pidfd_a_process_started_after_the_connection_is_not_the_caller():
    accepted = procfs.boot_ticks()
    while procfs.boot_ticks() == accepted:  # a tick later: the process starts after it
        pass
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        uid = os.geteuid()
        later = read_peer_facts(Credentials(sleeper.pid, uid, uid, accepted), "/proc")
        assert later == (
            f"pid {sleeper.pid} is not the process that connected: it started "
            "after the connection was made"
        )
        before = read_peer_facts(Credentials(sleeper.pid, uid, uid, procfs.boot_ticks()), "/proc")
        assert isinstance(before, ProcFacts) and before.pid == sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_loopback_socket_held_by_another_uid_than_its_creator_names_no_caller():
    # The socket owner's uid (sock_diag) must be the process's: here root made the socket and
    # handed it to a process of uid 65534, which is not searched, let alone taken for root.
    need_root("the socket is handed to a process of uid 65534")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    holder = subprocess.Popen(
        ["sleep", "30"], pass_fds=[client.fileno()], user=NOBODY, group=NOBODY, extra_groups=[]
    )
    ends = client.getsockname(), server.getsockname()
    client.close()
    try:
        entry = find_client(ends[0], ends[1])
        assert entry is not None and entry.uid == 0
        local = LocalProcesses(Config())
        owner, facts = local.owner(entry)
        assert facts is None and owner.pid is None
        assert owner.reason == (
            f"no process of uid 0 holds the connection from port "
            f"{ends[0][1]} any more: it was closed before its caller could "
            "be identified, or handed to another user's process"
        )
        # Had the search found it (its uid changed as it was searched), its uid still refuses it.
        facts = read_facts(holder.pid)
        assert facts is not None and facts.uids[0] == NOBODY
        assert local._not_the_holder(entry, facts) == (
            f"pid {holder.pid} is not the process that made the connection from port "
            f"{ends[0][1]}: it runs as uid {NOBODY}, the socket is uid 0's"
        )
    finally:
        holder.kill()
        holder.wait()
        conn.close()
        server.close()


def test_facts_of_a_process_that_does_not_hold_the_socket_name_no_caller():
    # Read after the holder was found: a pid reused in between holds no such socket.
    facts = read_facts(os.getpid())
    assert facts is not None
    entry = SocketEntry(("127.0.0.1", 40000), ("127.0.0.1", 8080), os.geteuid(), 1, ESTABLISHED)
    assert LocalProcesses(Config())._not_the_holder(entry, facts) == (
        f"pid {os.getpid()} is not the process that made the connection from port 40000: it "
        "no longer holds it"
    )


@async_test
async def test_a_refused_caller_is_said_once_a_while_with_how_many_were_not(caplog):
    # Each refusal is the caller's 403; the log says the first, then at most one line every
    # repeat_log_every seconds, with how many it did not say meanwhile.
    local = LocalProcesses(replace(Config(), repeat_log_every=0.3))
    sleeper = subprocess.Popen(["sleep", "30"])
    other = NOBODY if os.geteuid() != NOBODY else 0
    reason = (
        f"pid {sleeper.pid} is not the process that connected: it runs as uid "
        f"{os.getuid()}, the connection was made by uid {other}"
    )

    async def refused():
        credentials = Credentials(sleeper.pid, other, other, procfs.boot_ticks() + 10**6)
        facts = asyncio.get_running_loop().run_in_executor(
            None, read_peer_facts, credentials, "/proc"
        )
        with pytest.raises(Unidentified) as failed:
            await local.of_connection(ConnectionFacts(peer=Peer(credentials, facts)))
        assert failed.value.message == reason

    try:
        for _ in range(3):
            await refused()
        await asyncio.sleep(0.3)  # the next line may be said from now on
        await refused()
    finally:
        sleeper.kill()
        sleeper.wait()
    said = [r.getMessage() for r in caplog.records if r.name == "patroller.identify.callers"]
    assert said == [
        f"caller refused: {reason}",
        f"caller refused: {reason} (2 more since the last such line)",
    ]
    assert all(
        r.levelno == logging.WARNING
        for r in caplog.records
        if r.name == "patroller.identify.callers"
    )


@async_test
async def test_a_callers_facts_are_read_as_the_configuration_says_and_a_gone_caller_is_said(
    listener,
):
    # Read off the loop with the daemon's settings: a container's process running as a uid from
    # shifted_uids_from up (a user namespace's) counts as no host account; and a caller gone
    # before its facts are read is said as such. Each is one /proc read, as /metrics counts.
    need_root("the caller runs as uid 65534 in a container's cgroup")
    config = replace(Config(), shifted_uids_from=NOBODY)
    identifier = ProcessIdentifier(config)
    cid = secrets.token_hex(32)
    with process_in_cgroup(f"/system.slice/docker-{cid}.scope", NOBODY) as pid:
        credentials = Credentials(pid, NOBODY, NOBODY, procfs.boot_ticks())
        facts = await identifier.peer_facts(credentials)
    assert isinstance(facts, ProcFacts), facts
    assert facts.container.id == cid and facts.host is None
    sock, path = listener
    gone = connect_and_exit(path)
    said = await identifier.peer_facts(
        Credentials(gone, os.getuid(), os.getgid(), procfs.boot_ticks())
    )
    assert said == f"the calling process (pid {gone}) is gone or cannot be read"
    assert await identifier.resolve(gone) == UNKNOWN  # a GPU process gone as it was seen
    assert identifier.proc_reads == 3


def test_a_caller_whose_uid_is_above_2_to_the_31_is_that_uid():
    # uids run to 2**32 - 2 (user namespaces are often handed ranges up there): the kernel's
    # record of one is no negative number, and the caller is not refused as another uid.
    need_root("the caller runs as a uid above 2**31")
    high = 3_000_000_000
    where = tempfile.mkdtemp(prefix="psock", dir="/tmp")  # a directory any uid may enter
    os.chmod(where, 0o755)
    path = os.path.join(where, "api.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    os.chmod(path, 0o777)
    sock.listen(1)
    client = subprocess.Popen(
        [python_for(high), "-c", CONNECT_AND_EXIT + "sys.stdin.read()\n", path],
        user=high,
        group=high,
        extra_groups=[],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pid = int(client.stdout.readline())  # connected, and living on
        conn, _ = sock.accept()
        with conn:
            credentials = peer_credentials(conn)
            assert credentials is not None
            assert (credentials.pid, credentials.uid, credentials.gid) == (pid, high, high)
            facts = read_peer_facts(credentials, "/proc")
            assert isinstance(facts, ProcFacts), facts
            assert facts.uids[0] == high and facts.host.uid == high
    finally:
        client.kill()
        client.wait()
        sock.close()
        shutil.rmtree(where)


def test_a_refusal_names_the_real_uid_of_a_process_whose_effective_uid_differs():
    # A process of uid 65534 running with root's effective uid (as a setuid program does):
    # what it runs as is its real uid, in the words of both refusals.
    need_root("the process's real uid is set apart from its effective uid")
    process = subprocess.Popen(["setpriv", "--ruid=65534", "--", "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while procfs.uids(process.pid)[:1] != (NOBODY,):  # setpriv has run
            assert time.monotonic() < deadline, "the real uid was never set"
            time.sleep(0.01)
        assert procfs.uids(process.pid) == (NOBODY, 0, 0, 0)
        other = 4321
        refused = read_peer_facts(
            Credentials(process.pid, other, other, procfs.boot_ticks()), "/proc"
        )
        assert refused == (
            f"pid {process.pid} is not the process that connected: it runs as "
            f"uid {NOBODY}, the connection was made by uid {other}"
        )
        facts = read_facts(process.pid)
        entry = SocketEntry(("127.0.0.1", 40000), ("127.0.0.1", 8080), other, 1, ESTABLISHED)
        assert LocalProcesses(Config())._not_the_holder(entry, facts) == (
            f"pid {process.pid} is not the process that made the connection from port 40000: it "
            f"runs as uid {NOBODY}, the socket is uid {other}'s"
        )
    finally:
        process.kill()
        process.wait()
