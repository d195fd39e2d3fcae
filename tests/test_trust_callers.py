"""Who a TCP caller is when it misbehaves: a socket closed at once, the host's own address,
a Docker Engine that cannot be reached. Real daemons, real processes, real sockets."""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import replace

import pytest
from helpers import ScenarioFile, ServerProcess, async_test, need_root, python_for, reuse_pid

from patroller.config import Config
from patroller.core.errors import Unidentified
from patroller.identify.callers import SystemCallers
from patroller.identify.containers import ContainerDirectory, DockerUnavailable
from patroller.identify.resolver import ProcessIdentifier
from patroller.identify.sockets import ESTABLISHED, SocketEntry, owner_of

NOBODY = 65534
CLIENT = ("127.0.0.1", 40000)
SERVER = ("127.0.0.1", 8080)


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}])


# -- the rule, on parsed socket-table entries (pure) ---------------------------------------------


def entry(state=ESTABLISHED, uid=1000, inode=5151):
    return SocketEntry(CLIENT, SERVER, uid, inode, state)


def test_a_held_socket_names_its_holder():
    assert owner_of(entry(), holder=4242, hidden=False).pid == 4242
    assert owner_of(entry(), holder=4242, hidden=True).pid == 4242


def test_a_timewait_socket_names_nobody_even_with_uid_0():
    # what the kernel reports for a client that closed first: TIME_WAIT (6), uid 0, inode 0
    owner = owner_of(entry(state=6, uid=0, inode=0), holder=None, hidden=True)
    assert owner.pid is None and owner.uid is None and "closed" in owner.reason


@pytest.mark.parametrize("state", [2, 4, 5, 7, 8, 9, 10, 11])  # SYN_SENT, FIN_WAIT*, CLOSE...
def test_a_socket_not_established_names_nobody(state):
    owner = owner_of(entry(state=state), holder=None, hidden=True)
    assert owner.pid is None and owner.uid is None and owner.reason


def test_an_orphan_socket_names_nobody_though_its_uid_is_kept():
    owner = owner_of(entry(inode=0), holder=None, hidden=True)
    assert owner.pid is None and owner.uid is None and "closed" in owner.reason


def test_a_live_socket_nobody_holds_names_nobody():
    owner = owner_of(entry(), holder=None, hidden=False)
    assert (
        owner.pid is None
        and owner.uid is None
        and owner.reason
        == (
            "no process of uid 1000 holds the connection from port 40000 any more: it was closed "
            "before its caller could be identified, or handed to another user's process"
        )
    )


def test_a_search_stopped_at_its_budget_names_nobody():
    owner = owner_of(entry(), holder=None, hidden=True, exhausted=True)
    assert (
        owner.pid is None
        and owner.uid is None
        and owner.reason.startswith(
            "the processes of uid 1000 hold too many descriptors to find the one holding the "
            "connection from port 40000"
        )
    )


def test_a_live_socket_whose_holder_cannot_be_read_is_its_creators_account():
    owner = owner_of(entry(uid=1000), holder=None, hidden=True)
    assert owner.pid is None and owner.uid == 1000 and owner.reason == ""


# -- a client that closes at once ---------------------------------------------------------------

CLOSER = r"""
import socket, sys
host, port, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(rounds):
    for path in ("/release", "/request?gpu=1"):
        s = socket.create_connection((host, port))
        s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path).encode())
        s.close()
"""
ROUNDS = 25


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=20) as answer:
        return json.loads(answer.read())


def own_state(tmp_path):
    """Environment for a daemon that keeps its lease book apart from any other daemon's."""
    return {"PATROLLER_STATE_DIR": str(tmp_path / "state")}


def test_a_client_that_closes_at_once_never_acts_as_root(scenario, tmp_path):
    need_root("the closing client runs as an unprivileged uid")
    server = ServerProcess(
        "--nvidia-smi", scenario.command, "--lease", "300", env=own_state(tmp_path)
    ).start()
    try:
        [grant] = get(server.url, "/request?gpu=1")  # root's, over a connection kept open
        booked = time.monotonic()
        mine = get(server.url, "/status")[grant["uuid"]]["claim"]
        assert mine["user"]["user"] == "root" and mine["user"]["uid"] == 0
        before = get(server.url, "/metrics.json")["caller_lookups"]
        host, port = server.server.split(":")
        subprocess.run(
            [python_for(NOBODY), "-c", CLOSER, host, port, str(ROUNDS)],
            check=True,
            timeout=120,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
        )
        # every request the closer sent has been looked up (and answered, or refused)
        deadline = time.monotonic() + 30
        while get(server.url, "/metrics.json")["caller_lookups"] < before + 2 * ROUNDS:
            assert time.monotonic() < deadline, server.log
            time.sleep(0.05)
        checked = time.monotonic()
        status = get(server.url, "/status")
        roots = {u for u, e in status.items() if (e["claim"]["user"] or {}).get("uid") == 0}
        assert roots == {grant["uuid"]}, status  # nothing released, nothing booked to root
        claim = status[grant["uuid"]]["claim"]
        assert claim["state"] == "reserved"
        assert claim["age"] >= checked - booked - 0.01  # held since, never released and rebooked
        assert "Traceback" not in server.log
    finally:
        server.stop()


# -- the host's own address, in network namespaces the test makes -------------------------------

HOST, OTHER = "192.0.2.1", "192.0.2.2"  # documentation addresses (RFC 5737), never routed
CLONE_NEWNET = 0x40000000

ASK = r"""
import http.client, json, sys
host, port, *paths = sys.argv[1:]
connection = http.client.HTTPConnection(host, int(port), timeout=20)
answers = []
for path in paths:
    connection.request("GET", path)
    answer = connection.getresponse()
    answers.append([answer.status, json.loads(answer.read())])
print(json.dumps(answers))
"""


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def entering(namespace, uid=None):
    """A preexec_fn: join the named network namespace, then (optionally) become `uid`."""

    def enter():
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
        os.close(fd)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

    return enter


@pytest.fixture
def namespaces():
    """Two network namespaces joined by a veth pair: the host (HOST) and another one (OTHER)."""
    need_root("it makes network namespaces")
    if shutil.which("ip") is None:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)("no iproute2 (ip)")
    host, other = f"pth{os.getpid()}", f"pto{os.getpid()}"
    try:
        ip("netns", "add", host)
        ip("netns", "add", other)
        ip("-n", host, "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", other)
        ip("-n", host, "addr", "add", f"{HOST}/24", "dev", "v0")
        ip("-n", other, "addr", "add", f"{OTHER}/24", "dev", "v1")
        for namespace, link in ((host, "v0"), (host, "lo"), (other, "v1"), (other, "lo")):
            ip("-n", namespace, "link", "set", link, "up")
        yield host, other
    finally:
        for namespace in (host, other):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)


@pytest.fixture
def host_daemon(namespaces, scenario, tmp_path):
    """A GPU-host daemon in the host namespace on HOST, whose Docker Engine is nowhere."""
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--address",
        HOST,
        "--docker-host",
        f"unix://{tmp_path}/docker.sock",
        env=own_state(tmp_path),
        preexec_fn=entering(namespaces[0]),
    ).start()
    try:
        yield server
    finally:
        server.stop()


def ask_from(namespace, server, *paths):
    """[status, body] of each path, asked on one connection by `nobody` in the namespace."""
    host, port = server.server.rsplit(":", 1)
    result = subprocess.run(
        [python_for(NOBODY), "-c", ASK, host, port, *paths],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=entering(namespace, NOBODY),
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_caller_through_the_hosts_own_address_is_its_account(namespaces, host_daemon):
    [[status, grant], [_, view]] = ask_from(
        namespaces[0], host_daemon, "/request?gpu=1", "/status"
    )
    assert status == 200, grant
    holder = view[grant[0]["uuid"]]["claim"]["user"]
    assert holder["source"] == "host" and holder["uid"] == NOBODY, holder


def test_a_caller_in_another_network_namespace_is_not_taken_for_local(namespaces, host_daemon):
    [[status, body]] = ask_from(namespaces[1], host_daemon, "/request?gpu=1")
    assert status == 403
    said = body["error"]
    assert said.startswith(f"cannot identify a caller at {OTHER}: the Docker Engine at unix://")
    assert said.endswith("cannot be reached: no such file or directory"), said


def test_a_caller_whose_process_cannot_be_known_gets_no_process_hold(namespaces, tmp_path):
    # Test mode takes user= for the identity, but the process is still the kernel's word: a
    # caller from another network namespace has none that the daemon can see.
    server = ServerProcess(
        "--test", "--address", HOST, env=own_state(tmp_path), preexec_fn=entering(namespaces[0])
    ).start()
    try:
        [[status, body], [_, view]] = ask_from(
            namespaces[1], server, "/request?gpu=1&hold=process&user=alice", "/status"
        )
        assert status == 422 and body["hold"] == "process", body
        assert f"caller at {OTHER}" not in body["error"]  # test mode does not look it up
        assert "unix socket" in body["error"] and "hold=lease" in body["error"]
        assert all(device["claim"]["state"] == "free" for device in view.values())
        [[status, _]] = ask_from(namespaces[1], server, "/request?gpu=1&user=alice")
        assert status == 200  # a lease it can have
    finally:
        server.stop()


# -- Docker Engine unreachable: the reason in words ---------------------------------------------


@async_test
async def test_an_unreachable_docker_engine_is_said_in_words(tmp_path):
    where = f"unix://{tmp_path}/docker.sock"  # nothing there
    config = replace(Config(), docker_host=where, docker_retry_after=60)
    directory = ContainerDirectory(config)
    try:
        for _ in range(2):  # the first failure, then the remembered one
            with pytest.raises(DockerUnavailable) as failed:
                await directory.by_address("192.0.2.7")
            said = str(failed.value)
            assert where in said and "no such file or directory" in said, said
            assert "Error(" not in said and "('" not in said, said
        callers = SystemCallers(ProcessIdentifier(config, directory), directory, config)
        with pytest.raises(Unidentified) as refused:
            await callers._remote("192.0.2.7")
        assert refused.value.message.startswith("cannot identify a caller at 192.0.2.7")
        assert "no such file or directory" in refused.value.message
        assert "FileNotFoundError" not in refused.value.message
    finally:
        directory.shutdown()


BORROWER = """
import os, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])  # the kernel records this process's pid and uid now
sock.sendall(("GET " + sys.argv[2] + " HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n").encode())
print(os.getpid(), flush=True)
if os.fork():
    os._exit(0)  # the caller ends; a child keeps its connection open to read the answer
answer = b""
while b"\\r\\n\\r\\n" not in answer:
    chunk = sock.recv(65536)
    if not chunk:
        break
    answer += chunk
print(answer.split(b"\\r\\n")[0].decode(), flush=True)
"""


def test_a_pid_reused_while_its_connection_waits_does_not_lend_its_identity(scenario, tmp_path):
    # As found: a uid-65534 caller's connection waited in the backlog; its process exited and
    # its pid went to root's process; the caller then acted as root (an administrator's release).
    need_root("the caller runs as uid 65534, and its pid is given to a root process")
    where = tempfile.mkdtemp(prefix="psock", dir="/tmp")  # a directory uid 65534 may enter
    os.chmod(where, 0o755)
    path = os.path.join(where, "api.sock")
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--lease",
        "300",
        "--socket",
        path,
        env=own_state(tmp_path),
    ).start()
    reused = None
    borrower = None
    try:
        [held] = get(server.url, "/request?gpu=1")  # held by root, as the kernel says
        server.process.send_signal(signal.SIGSTOP)  # connections wait in the backlog meanwhile
        try:
            borrower = subprocess.Popen(
                [
                    python_for(NOBODY),
                    "-c",
                    BORROWER,
                    path,
                    f"/release?uuid={held['uuid']}&reason=borrowed",
                ],
                user=NOBODY,
                group=NOBODY,
                extra_groups=[],
                stdout=subprocess.PIPE,
                text=True,
            )
            pid = int(borrower.stdout.readline())
            borrower.wait(timeout=20)  # the caller has ended, and its pid is free
            reused = reuse_pid(pid)
            if reused is None:
                pytest.skip("the kernel does not let us choose the next pid (ns_last_pid)")
        finally:
            server.process.send_signal(signal.SIGCONT)
        status_line = borrower.stdout.readline().strip()
        assert status_line.startswith("HTTP/1.1 403 "), status_line
        holder = get(server.url, "/status")[held["uuid"]]["claim"]["user"]
        assert holder is not None and holder["uid"] == 0  # still root's
        assert "is not the process that connected" in server.log
    finally:
        if borrower is not None and borrower.poll() is None:
            borrower.kill()
        if reused is not None:
            reused.kill()
            reused.wait()
        assert server.stop() == 0
        shutil.rmtree(where)
