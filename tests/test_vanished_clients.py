"""A client that sends a request and leaves at once, closing its connection or shutting its
side of it (as `nc -N` and socat do): nothing is done for it, over the unix socket (--socket) as
over TCP, and a grant whose answer cannot be written is given back.

The daemons in this process share the tests' event loop: a blocking client here connects, sends
and closes before the daemon has even accepted the connection, every time. The clients are real
sockets; the daemon learns of their leaving from the kernel, as it would of any other.
"""

import asyncio
import json
import logging
import re
import signal
import socket
import time
import urllib.request

import pytest
from helpers import ScenarioFile, ServerProcess, async_test, gpu_running, until

from patroller.http import handlers

CLOSE, HALF_CLOSE = "close", "half-close"
GRANTS = [
    "/request?gpu=1",
    "/request?gpu=1&hold=process",
    "/request?gpu=1&hold=2h",
    "/wait?gpu=1",
    "/wait?gpu=1&hold=process",
    "/wait?gpu=1&hold=2h&timeout=5",
]
LEFT = 499  # the status the access log and /metrics count a client that left with


def send_and_leave(path: str, target: str, how: str) -> socket.socket:
    """A unix-socket client that sends one request and closes (or shuts its side, and may
    still read)."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    client.sendall(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
    if how == CLOSE:
        client.close()
    else:
        client.shutdown(socket.SHUT_WR)
    return client


async def read_all(client: socket.socket) -> bytes:
    """What a half-closed client is sent, up to the daemon's end of the connection."""
    client.setblocking(False)
    loop, told = asyncio.get_running_loop(), b""
    try:
        while True:
            piece = await asyncio.wait_for(loop.sock_recv(client, 65536), 10)
            if not piece:
                return told
            told += piece
    finally:
        client.close()


def answered(h, endpoint: str, status=None) -> int:
    """How many requests to `endpoint` the daemon has answered (with `status`)."""
    return sum(
        count
        for (path, code), count in h.api.requests.answers.items()
        if path == endpoint and status in (None, code)
    )


async def all_free(h) -> None:
    """Wait until /status shows no device held and /queue no waiter (or fail)."""

    async def free() -> bool:
        status = await h.ok("/status")
        return (
            all(d["claim"]["state"] == "free" for d in status.values())
            and await h.ok("/queue") == []
        )

    deadline = asyncio.get_running_loop().time() + 10
    while not await free():
        assert asyncio.get_running_loop().time() < deadline, await h.ok("/status")
        await asyncio.sleep(0.02)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


@pytest.fixture
def four(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}])


@pytest.mark.parametrize("how", [CLOSE, HALF_CLOSE])
@pytest.mark.parametrize("target", GRANTS)
@async_test
async def test_a_unix_client_that_leaves_at_once_is_granted_nothing(
    four, tmp_path, target, how, caplog
):
    path = str(tmp_path / "api.sock")
    async with gpu_running(four, socket=path, lease=600) as h:
        endpoint = target.split("?")[0]
        for n in range(1, 5):  # each of the four GPUs, would it be reserved
            client = send_and_leave(path, target, how)
            if how == HALF_CLOSE:
                assert await read_all(client) == b""  # no answer: none says what was done
            await until(lambda: answered(h, endpoint) == n)
            assert answered(h, endpoint, LEFT) == n
            await all_free(h)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("target", GRANTS)
@async_test
async def test_a_grant_whose_answer_cannot_be_written_is_given_back(
    four, tmp_path, target, monkeypatch
):
    # The client leaves just after the daemon looked: the write fails (a unix socket's peer
    # that has closed refuses it), and what was granted is given back.
    path, clients = str(tmp_path / "api.sock"), []

    def leaves_just_after(stream):
        while clients:
            clients.pop().close()
        return False

    monkeypatch.setattr(handlers, "left", leaves_just_after)
    async with gpu_running(four, socket=path, lease=600) as h:
        endpoint = target.split("?")[0]
        for n in range(1, 5):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(path)
            client.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            clients.append(client)
            await until(lambda: answered(h, endpoint, 200) == n)
            await all_free(h)
        releases = [e for e in await h.ok("/history") if e["event"] == "release"]
        assert [e.get("reason") for e in releases] == ["the client left before the answer"] * 4


@async_test
async def test_a_unix_client_that_leaves_while_it_waits_is_taken_out_of_the_queue(four, tmp_path):
    path = str(tmp_path / "api.sock")
    async with gpu_running(four, socket=path, lease=600) as h:
        await h.ok("/request?gpu=4")  # root's, over TCP
        waiters = h.services.leases.waiters
        for target in [g for g in GRANTS if g.startswith("/wait")]:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(path)
            client.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await until(lambda: len(waiters) == 1)
            client.close()
            await until(lambda: len(waiters) == 0)
        await h.ok("/release")
        await all_free(h)


@pytest.mark.parametrize("how", [CLOSE, HALF_CLOSE])
@async_test
async def test_a_release_or_renew_whose_client_left_is_not_carried_out(four, tmp_path, how):
    path = str(tmp_path / "api.sock")
    async with gpu_running(four, socket=path, lease=600) as h:
        mine = {d["uuid"] for d in await h.ok("/request?gpu=4")}  # root's, over TCP
        leases = h.services.leases
        deadlines = {uuid: leases.holds[uuid].deadline for uuid in mine}
        sent = {"/release": 0, "/renew": 0}
        for target in [
            "/release",
            f"/release?uuid={min(mine)}",
            "/renew",
            f"/renew?uuid={min(mine)}",
        ]:
            endpoint = target.split("?")[0]
            client = send_and_leave(path, target, how)
            if how == HALF_CLOSE:
                assert await read_all(client) == b""
            sent[endpoint] += 1
            await until(lambda: answered(h, endpoint) == sent[endpoint])
            assert answered(h, endpoint, LEFT) == sent[endpoint]
            assert {d for d in mine if leases.holder(d) is not None} == mine
            assert {uuid: leases.holds[uuid].deadline for uuid in mine} == deadlines


@pytest.mark.parametrize("how", [CLOSE, HALF_CLOSE])
@async_test
async def test_a_tcp_client_known_on_its_connection_that_leaves_is_granted_nothing(four, how):
    # Its caller was identified by an earlier request on the connection: no lookup in the
    # kernel's socket table comes between its request and the grant. (Tornado reads the end of
    # its input before the handler runs here, so this held before the kernel was asked too.)
    async with gpu_running(four, lease=600) as h:
        for n in range(1, 5):
            reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
            writer.write(b"GET /renew HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
            await asyncio.wait_for(reader.readexactly(length), 10)
            writer.write(b"GET /request?gpu=1 HTTP/1.1\r\nHost: x\r\n\r\n")
            if how == CLOSE:
                writer.close()
            else:
                writer.write_eof()
                assert await asyncio.wait_for(reader.read(), 10) == b""
                writer.close()
            await until(lambda: answered(h, "/request") == n)
            assert answered(h, "/request", LEFT) == n
            await all_free(h)


def test_a_daemon_process_grants_nothing_to_unix_clients_that_left(tmp_path):
    # The issue as it was met: over --socket, each client sends /request and closes, or shuts
    # its side; the daemon is stopped meanwhile, so that every one has left before it reads.
    path = str(tmp_path / "api.sock")
    server = ServerProcess("--test", "--socket", path, "--lease", "600").start()
    try:
        server.process.send_signal(signal.SIGSTOP)
        try:
            clients = [
                send_and_leave(path, "/request?gpu=1", how) for how in (CLOSE, HALF_CLOSE) * 4
            ]
        finally:
            server.process.send_signal(signal.SIGCONT)
        half = [c for c in clients if c.fileno() != -1]
        for client in half:
            client.settimeout(10)
            assert client.recv(65536) == b""
            client.close()
        left = 'patroller_http_requests_total{endpoint="/request",status="499"} 8.0'
        deadline = time.monotonic() + 20
        while left not in get(server.url + "/metrics").decode():
            assert time.monotonic() < deadline, server.log
            time.sleep(0.05)
        status = json.loads(get(server.url + "/status"))
        assert all(d["claim"]["state"] == "free" for d in status.values()), status
    finally:
        assert server.stop() == 0, server.log
    assert "Traceback" not in server.log
