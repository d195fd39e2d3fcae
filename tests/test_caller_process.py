"""Which process is calling, and who: a unix-socket caller is the kernel's word (SO_PEERCRED); a
TCP caller on this host is the process holding its client socket; a caller from elsewhere (here
another network namespace) has no process the daemon can know, so a hold for it is refused
(422), and outside test mode it is the container at its address or nobody (403). Real sockets
in real network namespaces, real processes, the real /proc; the callers are run in the test's
own process."""
import ctypes
import os
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
from tornado.http1connection import HTTP1Connection
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from helpers import async_test, engines_in, process_in_cgroup
from patroller.config import Config
from patroller.core.errors import NoCallerProcess, Unidentified
from patroller.identify.callers import SOCKET_HINT, SystemCallers
from patroller.identify.callers import TestModeCallers as NamedCallers  # not collected as a test
from patroller.identify.connection import Accepted
from patroller.identify.resolver import ProcessIdentifier
from test_container_callers import ALICE, ByAddress, Engine
from test_trust_callers import HOST, OTHER, namespaces  # noqa: F401 (a fixture)

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


@asynccontextmanager
async def request_from_elsewhere(namespaces, uri):  # noqa: F811 (the fixture's value)
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
        yield HTTPServerRequest(connection=HTTP1Connection(stream, is_client=False),
                                start_line=RequestStartLine("GET", uri, "HTTP/1.1"),
                                headers=HTTPHeaders({"Host": HOST}))
    finally:
        stream.close()
        client.close()
        listener.close()


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
        namespaces, system_callers):  # noqa: F811
    callers, directory, cid, engine = system_callers
    with process_in_cgroup(f"/system.slice/docker-{cid}.scope", NOBODY) as pid:
        engine.pids[cid] = pid
        async with request_from_elsewhere(namespaces, "/request?gpu=1") as request:
            caller = await callers.identify(request, None)
            assert (caller.user, caller.source, caller.uid) == ("alice@example.org",
                                                                "container", NOBODY)
            assert callers.lookups == 1 and directory.asked == [OTHER]
            # its next request on the same connection: the same caller, not looked up again
            assert await callers.identify(request, None) == caller
            assert callers.lookups == 1 and directory.asked == [OTHER]
            # and no process of it can be held for: the daemon cannot see it
            with pytest.raises(NoCallerProcess) as refused:
                await callers.process(request)
    assert refused.value.message == (
        f"hold=process: the daemon cannot know the calling process of a caller at {OTHER}; "
        + SOCKET_HINT)
    assert refused.value.data == {"hold": "process"}


@async_test
async def test_a_caller_from_elsewhere_at_no_containers_address_is_refused_each_time(
        namespaces, system_callers):  # noqa: F811
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
        namespaces):  # noqa: F811
    callers = NamedCallers(Config())
    async with request_from_elsewhere(namespaces, "/request?gpu=1&hold=process") as request:
        assert (await callers.identify(request, "alice")).user == "alice"
        assert (await callers.identify(request, None)).user == "test-user"
        with pytest.raises(NoCallerProcess) as refused:
            await callers.process(request)
        assert callers.lookups == 1  # the kernel was asked, and knows no such client
    assert refused.value.message == ("hold=process: the calling process cannot be known for "
                                     "this connection; " + SOCKET_HINT)
    assert refused.value.data == {"hold": "process"}
