"""Which process is calling, and who: a unix-socket caller is the kernel's word (SO_PEERCRED); a
TCP caller on this host is the process holding its client socket; a caller from elsewhere (here
another network namespace) has no process the daemon can know, so a hold for it is refused
(422), and outside test mode it is the container at its address or nobody (403). Real sockets
in real network namespaces, real processes, the real /proc; the callers are run in the test's
own process."""

import asyncio
import ctypes
import os
import secrets
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
from helpers import FakeClock, async_test, engines_in, process_in_cgroup
from test_container_callers import ALICE, ByAddress, Engine
from test_trust_callers import HOST, OTHER, namespaces  # noqa: F401 (a fixture)
from tornado.http1connection import HTTP1Connection
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from patroller.config import Config
from patroller.core.errors import NoCallerProcess, Unidentified
from patroller.identify.callers import SOCKET_HINT, SystemCallers
from patroller.identify.callers import TestModeCallers as NamedCallers  # not collected as a test
from patroller.identify.connection import Accepted
from patroller.identify.peers import Peer, peer_credentials
from patroller.identify.procfs import process_state
from patroller.identify.resolver import ProcessIdentifier

NOBODY = 65534
CLONE_NEWNET = 0x40000000


def in_network(namespace, make):
    """What `make()` returns, made in a thread that joined the named network namespace: a
    socket made there belongs to it for good (the test's other threads stay where they are)."""

    def run():
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)
        return make()

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(run).result()


def listening(host):
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(8)
    return sock


def request_on(stream, uri="/request?gpu=1&hold=process"):
    """A request as Tornado hands it to the daemon, on the connection of `stream`."""
    return HTTPServerRequest(
        connection=HTTP1Connection(stream, is_client=False),
        start_line=RequestStartLine("GET", uri, "HTTP/1.1"),
        headers=HTTPHeaders({"Host": "patroller"}),
    )


@asynccontextmanager
async def request_from_elsewhere(namespaces, uri):
    """A request on a TCP connection the daemon accepted on HOST, in the host's network
    namespace, from a client at OTHER, in another: as http/server.py's PeerServer hands it on
    (the accepted stream, with the client's address in its facts)."""
    host, other = namespaces
    listener = in_network(host, lambda: listening(HOST))
    client = in_network(other, lambda: socket.create_connection(listener.getsockname()))
    conn, address = listener.accept()
    stream = Accepted(conn)
    stream.facts.address = (address[0], address[1])
    try:
        yield request_on(stream, uri)
    finally:
        stream.close()
        client.close()
        listener.close()


@asynccontextmanager
async def loopback(server="127.0.0.1", client_from=None):
    """(the client socket, a request on the connection the daemon accepted from it over
    loopback), the client held by this process."""
    listener = listening(server)
    client = socket.create_connection(listener.getsockname(), source_address=client_from)
    conn, address = listener.accept()
    stream = Accepted(conn)
    stream.facts.address = (address[0], address[1])
    try:
        yield client, request_on(stream)
    finally:
        stream.close()
        client.close()
        listener.close()


def me():
    return os.getpid(), process_state(os.getpid()).start


@pytest.fixture
def system_callers(tmp_path):
    """SystemCallers whose Docker Engine (tests/fake_engine.py) has Alice's container at OTHER:
    (the callers, the directory, the container's id)."""
    cid = secrets.token_hex(32)
    engine = Engine(str(tmp_path / "docker.sock"))
    engine.add(cid, ALICE)
    engine.start()
    config = replace(Config(), **engines_in(str(tmp_path)))
    directory = ByAddress(config, {OTHER: cid})
    identifier = ProcessIdentifier(config, directory)
    try:
        yield SystemCallers(identifier, directory, config), directory, cid, engine
    finally:
        identifier.close()
        directory.shutdown()
        engine.stop()


@async_test
async def test_a_caller_from_elsewhere_is_the_container_at_its_address_once_per_connection(
    namespaces, system_callers
):
    callers, directory, cid, engine = system_callers
    with process_in_cgroup(f"/system.slice/docker-{cid}.scope", NOBODY) as pid:
        engine.pids[cid] = pid
        async with request_from_elsewhere(namespaces, "/request?gpu=1") as request:
            caller = await callers.identify(request, None)
            assert (caller.user, caller.source, caller.uid) == (
                "alice@example.org",
                "container",
                NOBODY,
            )
            assert callers.lookups == 1 and directory.asked == [OTHER]
            # its next request on the same connection: the same caller, not looked up again
            assert await callers.identify(request, None) == caller
            assert callers.lookups == 1 and directory.asked == [OTHER]
            # and no process of it can be held for: the daemon cannot see it
            with pytest.raises(NoCallerProcess) as refused:
                await callers.process(request)
    assert refused.value.message == (
        f"hold=process: the daemon cannot know the calling process of a caller at {OTHER}; "
        + SOCKET_HINT
    )
    assert refused.value.data == {"hold": "process"}


@async_test
async def test_a_caller_from_elsewhere_at_no_containers_address_is_refused_each_time(
    namespaces, system_callers
):
    callers, directory, _, _ = system_callers
    directory.addresses.clear()
    async with request_from_elsewhere(namespaces, "/request?gpu=1") as request:
        for looked_up in (1, 2):  # a refusal is not kept: asked again, looked up again
            with pytest.raises(Unidentified) as refused:
                await callers.identify(request, None)
            assert refused.value.message.startswith(f"no container has the address {OTHER}:")
            assert callers.lookups == looked_up
    assert directory.asked == [OTHER, OTHER]


@async_test
async def test_in_test_mode_a_caller_from_elsewhere_is_whom_it_names_but_has_no_process(
    namespaces,
):
    callers = NamedCallers(Config())
    async with request_from_elsewhere(namespaces, "/request?gpu=1&hold=process") as request:
        assert (await callers.identify(request, "alice")).user == "alice"
        assert (await callers.identify(request, None)).user == "test-user"
        with pytest.raises(NoCallerProcess) as refused:
            await callers.process(request)
        assert callers.lookups == 1  # the kernel was asked, and knows no such client
    assert refused.value.message == (
        "hold=process: the calling process cannot be known for this connection; " + SOCKET_HINT
    )
    assert refused.value.data == {"hold": "process"}


@async_test
async def test_a_loopback_caller_is_the_process_holding_its_socket_looked_up_once():
    callers = NamedCallers(Config())
    for connections in (1, 2):
        async with loopback() as (_, request):
            for _ in range(2):  # two requests on one connection: one lookup
                ref = await callers.process(request)
                assert (ref.pid, ref.start) == me()
            assert callers.lookups == connections


@async_test
async def test_a_loopback_caller_that_closed_before_it_was_looked_up_is_refused():
    callers = NamedCallers(Config())
    async with loopback() as (client, request):
        port = client.getsockname()[1]
        client.close()  # FIN_WAIT from now on: a socket no process can be said to hold
        with pytest.raises(Unidentified) as refused:
            await callers.process(request)
    assert refused.value.message == (
        f"the connection from port {port} was closed before its caller could be identified: "
        "keep it open until the answer comes"
    )


@async_test
async def test_a_loopback_caller_is_looked_up_in_the_proc_the_configuration_names(tmp_path):
    (tmp_path / "net").mkdir()  # a /proc of the test's own, whose tables list no connection
    callers = NamedCallers(replace(Config(), proc_root=str(tmp_path)))
    async with loopback() as (_, request):
        with pytest.raises(NoCallerProcess):
            await callers.process(request)


# -- the unix socket: the kernel's word on who connected ---------------------------------------

CONNECT = "import os, socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"


@asynccontextmanager
async def unix_request(tmp_path, identifier, gone=False):
    """A request on a unix connection, its caller's credentials and /proc facts read as the
    server reads them when it accepts (http/server.py): from this process, or from a child
    that connected and has ended (`gone`)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "api.sock"))
    listener.listen(8)
    client = None
    if gone:
        subprocess.run(
            [sys.executable, "-c", CONNECT, str(tmp_path / "api.sock")], check=True, timeout=30
        )
    else:
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(tmp_path / "api.sock"))
    conn, _ = listener.accept()
    stream = Accepted(conn)
    credentials = peer_credentials(conn)
    stream.facts.peer = Peer(
        credentials, asyncio.ensure_future(identifier.peer_facts(credentials))
    )
    try:
        yield request_on(stream)
    finally:
        stream.close()
        if client is not None:
            client.close()
        listener.close()


@pytest.mark.parametrize("mode", ["test", "system"])
@async_test
async def test_a_unix_caller_is_the_process_that_connected(tmp_path, mode):
    config = Config()
    identifier = ProcessIdentifier(config)
    callers = NamedCallers(config) if mode == "test" else SystemCallers(identifier, None, config)
    async with unix_request(tmp_path, identifier) as request:
        ref = await callers.process(request)
        assert (ref.pid, ref.start) == me()
        if mode == "system":
            assert (await callers.identify(request, None)).uid == os.geteuid()
    assert callers.lookups == 0  # the kernel said it: no socket table was read
    identifier.close()


@pytest.mark.parametrize("mode", ["test", "system"])
@async_test
async def test_a_unix_caller_that_has_ended_is_refused_and_said_once_a_while(
    tmp_path, mode, caplog
):
    config = Config()
    identifier = ProcessIdentifier(config)
    callers = NamedCallers(config) if mode == "test" else SystemCallers(identifier, None, config)
    clock = callers.local.reports.clock = FakeClock()
    said = []
    for turn in range(4):
        folder = tmp_path / str(turn)
        folder.mkdir()
        async with unix_request(folder, identifier, gone=True) as request:
            pid = request.connection.stream.facts.peer.credentials.pid
            reason = f"the calling process (pid {pid}) is gone or cannot be read"
            with pytest.raises(Unidentified) as refused:
                if mode == "test":
                    await callers.process(request)
                else:
                    await callers.identify(request, None)
            assert refused.value.message == reason
            said.append(reason)
        if turn == 2:
            clock.advance(config.repeat_log_every)
    refusals = [r.getMessage() for r in caplog.records if r.name == "patroller.identify.callers"]
    assert refusals == [
        f"caller refused: {said[0]}",  # the first; the next two held back
        f"caller refused: {said[3]} (2 more since the last such line)",
    ]
    identifier.close()
