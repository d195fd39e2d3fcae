"""A TCP caller on this host outside test mode: the account of the process holding its client
socket, as the kernel's socket table and /proc say, or refused (403) when that cannot be known
for sure, never a default account. Real loopback connections, real processes (one in a
container's cgroup, its engine tests/fake_engine.py), the real /proc; the callers are run in the
test's own process. (The daemon on such callers: test_trust_callers, test_borrowed_pid.)"""

import asyncio
import os
import secrets
import socket
import subprocess
import sys
from dataclasses import replace

import pytest
from helpers import async_test, cgroup_root, engines_in, process_in_cgroup
from test_caller_process import Accepted, listening, loopback, me, request_on
from test_container_callers import ALICE, Engine
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine
from tornado.iostream import IOStream

from patroller.config import Config
from patroller.core.errors import BadRequest, NoCallerProcess, Unidentified
from patroller.identify.callers import SOCKET_HINT, SystemCallers
from patroller.identify.callers import TestModeCallers as NamedCallers  # not collected as a test
from patroller.identify.containers import ContainerDirectory
from patroller.identify.resolver import ProcessIdentifier, host_identity


@pytest.fixture
def system_callers():
    """SystemCallers with no container engine, on the real /proc, and their identifier."""
    config = Config()
    identifier = ProcessIdentifier(config)
    yield SystemCallers(identifier, None, config)
    identifier.close()


@async_test
async def test_a_loopback_caller_is_the_account_of_the_process_holding_its_socket(system_callers):
    async with loopback() as (_, request):
        assert await system_callers.identify(request, None) == host_identity(os.geteuid())
        ref = await system_callers.process(request)
        assert (ref.pid, ref.start) == me()
    assert system_callers.lookups == 1


@async_test
async def test_outside_test_mode_a_caller_cannot_name_itself(system_callers):
    async with loopback() as (_, request):
        with pytest.raises(BadRequest) as refused:
            await system_callers.identify(request, "alice")
    assert refused.value.message == (
        "user= is accepted in test mode only: callers are identified by the system"
    )
    assert system_callers.lookups == 0


@async_test
async def test_a_connection_closed_before_its_caller_is_known_has_no_caller(system_callers):
    async with loopback() as (_, request):
        request.connection.stream.close()
        with pytest.raises(Unidentified) as refused:
            await system_callers.identify(request, None)
        assert refused.value.message == (
            "the connection was closed before its caller could be identified"
        )
        with pytest.raises(NoCallerProcess) as no_process:
            await system_callers.process(request)
        assert no_process.value.message == (
            "hold=process: the daemon cannot know the calling process of a caller; " + SOCKET_HINT
        )


@async_test
async def test_a_loopback_caller_that_closed_before_it_was_looked_up_is_refused(system_callers):
    async with loopback() as (client, request):
        port = client.getsockname()[1]
        client.close()
        with pytest.raises(Unidentified) as refused:
            await system_callers.identify(request, None)
    assert refused.value.message == (
        f"the connection from port {port} was closed before its caller could be identified: "
        "keep it open until the answer comes"
    )


@async_test
async def test_a_loopback_caller_missing_from_the_socket_table_is_not_looked_for_elsewhere(
    tmp_path,
):
    # The socket table of the /proc the configuration names lists no such client: over
    # loopback (here from another loopback address than the daemon's), it is none of the
    # containers', whose addresses are their networks'.
    (tmp_path / "net").mkdir()
    config = replace(Config(), proc_root=str(tmp_path))
    callers = SystemCallers(ProcessIdentifier(config), None, config)
    async with loopback("127.0.0.2", ("127.0.0.3", 0)) as (client, request):
        port = client.getsockname()[1]
        with pytest.raises(Unidentified) as refused:
            await callers.identify(request, None)
    assert refused.value.message == (
        f"the connection from port {port} is no longer in the kernel's socket table: it was "
        "closed before its caller could be identified"
    )
    assert callers.lookups == 1


@async_test
async def test_a_container_caller_whose_engine_cannot_answer_is_refused_until_it_can(tmp_path):
    cid = secrets.token_hex(32)
    engine = Engine(str(tmp_path / "docker.sock"))
    engine.add(cid, ALICE)
    engine.failing = "the engine is restarting"
    engine.start()
    config = replace(
        Config(), **engines_in(str(tmp_path), engine_socket_ttl=0.0, docker_retry_after=0.05)
    )
    directory = ContainerDirectory(config)
    identifier = ProcessIdentifier(config, directory)
    callers = SystemCallers(identifier, directory, config)
    scope = f"/system.slice/docker-{cid}.scope"
    holder = None
    try:
        with process_in_cgroup(scope, uid=0):
            async with loopback() as (client, request):
                # the client socket is held by a process of the container alone
                holder = subprocess.Popen(["sleep", "60"], pass_fds=[client.fileno()])
                with open(f"{cgroup_root(1)}{scope}/cgroup.procs", "w") as f:
                    f.write(str(holder.pid))
                client.close()
                with pytest.raises(Unidentified) as refused:
                    await callers.identify(request, None)
                assert refused.value.message == (
                    "your container's labels cannot be read just now (its container engine is "
                    "unreachable): try again shortly"
                )
                engine.failing = None
                deadline = asyncio.get_running_loop().time() + 10
                while True:  # asked again on the same connection, once the engine answers
                    try:
                        caller = await callers.identify(request, None)
                        break
                    except Unidentified:
                        assert asyncio.get_running_loop().time() < deadline, "never named"
                        await asyncio.sleep(0.02)
                assert (caller.user, caller.uid) == ("alice@example.org", 0)
                assert (await callers.process(request)).pid == holder.pid
                holder.kill()
                holder.wait()
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait()
        identifier.close()
        directory.shutdown()
        engine.stop()


@pytest.mark.parametrize("on", ["no connection", "a stream the server did not accept"])
@async_test
async def test_a_request_on_no_connection_of_the_servers_has_no_caller(system_callers, on):
    # Only the server's own connections carry what is known of their callers (their facts):
    # a request on anything else is nobody's, in either mode.
    async with loopback() as (_, accepted):
        stream = IOStream(accepted.connection.stream.socket.dup())
        request = (
            request_on(stream)
            if on != "no connection"
            else HTTPServerRequest(
                connection=None,
                start_line=RequestStartLine("GET", "/request", "HTTP/1.1"),
                headers=HTTPHeaders({"Host": "patroller"}),
            )
        )
        with pytest.raises(Unidentified):
            await system_callers.identify(request, None)
        for callers in (system_callers, NamedCallers(Config())):
            with pytest.raises(NoCallerProcess):
                await callers.process(request)
        stream.close()
    assert system_callers.lookups == 1 and callers.lookups == 0


@async_test
async def test_a_holder_not_found_within_the_search_budget_is_no_one_not_the_sockets_creator():
    # The search for the holder reads at most holder_search_budget descriptors: a caller not
    # found within them is refused, never taken for the uid that made the socket.
    config = replace(Config(), holder_search_budget=1)
    callers = SystemCallers(ProcessIdentifier(config), None, config)
    async with loopback() as (client, request):
        port = client.getsockname()[1]
        with pytest.raises(Unidentified) as refused:
            await callers.identify(request, None)
    assert refused.value.message == (
        f"the processes of uid {os.geteuid()} hold too many descriptors to find the one holding "
        f"the connection from port {port}: try again from a process with fewer, or over the "
        "unix socket"
    )
    assert callers.descriptors_read == 1


TCP_HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    "  timeout inode\n"
)


def kernel_form(address):
    """An IPv4 address and port as /proc/net/tcp prints them."""
    host, port = address
    return f"{bytes(reversed(socket.inet_aton(host))).hex().upper()}:{port:04X}"


def written_proc(tmp_path, client):
    """A /proc of the test's own in which process 4242 of uid 0 holds the client socket (inode
    777777) of a real loopback connection, listed in its net/tcp."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "4242" / "fd").mkdir(parents=True)
    os.symlink("socket:[777777]", proc / "4242" / "fd" / "5")
    (proc / "4242" / "stat").write_text("4242 (train (gpu)) S" + " 1" * 18 + " 31337 0\n")
    (proc / "4242" / "status").write_text("Name:\ttrain\nUid:\t0\t0\t0\t0\n")
    (proc / "4242" / "cgroup").write_text("0::/user.slice\n")
    ends = kernel_form(client.getsockname()), kernel_form(client.getpeername())
    (proc / "net" / "tcp").write_text(
        TCP_HEADER + f"   0: {ends[0]} {ends[1]} 01 00000000:00000000 00:00000000 00000000"
        "     0        0 777777 1 0000000000000000 20 4 30 10 -1\n"
    )
    return proc


@pytest.mark.parametrize("mode", ["test", "system"])
@async_test
async def test_every_reading_of_a_callers_process_is_of_the_proc_the_configuration_names(
    tmp_path, mode
):
    # The connection is found in that /proc, not in the kernel's own tables, and so is its
    # holder, its facts, and that it still holds it.
    async with loopback() as (client, request):
        config = replace(Config(), proc_root=str(written_proc(tmp_path, client)))
        identifier = ProcessIdentifier(config)
        callers = (
            NamedCallers(config) if mode == "test" else SystemCallers(identifier, None, config)
        )
        if mode == "system":
            assert await callers.identify(request, None) == host_identity(0)
        ref = await callers.process(request)
    assert (ref.pid, ref.start) == (4242, 31337)
    identifier.close()


@async_test
async def test_a_holder_that_ends_as_it_is_found_is_no_one(tmp_path):
    # Found holding the socket, gone before its facts could be read (its stat is no more):
    # refused, not guessed from the socket's creator.
    async with loopback() as (client, request):
        proc = written_proc(tmp_path, client)
        port = client.getsockname()[1]
        (proc / "4242" / "stat").unlink()
        config = replace(Config(), proc_root=str(proc))
        callers = SystemCallers(ProcessIdentifier(config), None, config)
        with pytest.raises(Unidentified) as refused:
            await callers.identify(request, None)
    assert refused.value.message == (
        f"the process holding the connection from port {port} (pid 4242) "
        "ended before it could be identified"
    )


MANY = 300
HOLD_MANY = (
    "import os, sys\n"
    f"held = [os.open('/dev/null', os.O_RDONLY) for _ in range({MANY})]\n"
    "print(flush=True)\n"
    "sys.stdin.read()\n"
)


CONNECT_EACH_LINE = (
    "import socket, sys\n"
    "held = []\n"
    "for _ in sys.stdin:\n"
    "    held.append(socket.create_connection(('127.0.0.1', int(sys.argv[1]))))\n"
    "    print(flush=True)\n"
)


@async_test
async def test_a_process_that_called_lately_is_looked_at_first():
    # The holder of a client socket is searched for among its uid's processes, newest first:
    # a process that called lately (recent_callers of them) is looked at before, so that its
    # next connection is found without reading a newer process's hundreds of descriptors.
    config = replace(Config(), recent_callers=1)
    callers = SystemCallers(ProcessIdentifier(config), None, config)
    listener = listening("127.0.0.1")
    port = str(listener.getsockname()[1])
    children = []
    try:
        while True:  # the caller, then a newer process (by pid: again if the pids wrapped round)
            caller = subprocess.Popen(
                [sys.executable, "-c", CONNECT_EACH_LINE, port],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            newer = subprocess.Popen(
                [sys.executable, "-c", HOLD_MANY],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            children += [caller, newer]
            newer.stdout.readline()  # its descriptors are open
            if newer.pid > caller.pid:
                break
        read = []
        for _ in range(2):
            caller.stdin.write("\n")
            caller.stdin.flush()
            caller.stdout.readline()  # connected
            conn, address = listener.accept()
            stream = Accepted(conn)
            stream.facts.address = (address[0], address[1])
            try:
                before = callers.descriptors_read
                request = request_on(stream)
                await callers.identify(request, None)
                assert (await callers.process(request)).pid == caller.pid
                read.append(callers.descriptors_read - before)
            finally:
                stream.close()
    finally:
        listener.close()
        for child in children:
            child.kill()
            child.wait()
    assert read[0] > MANY > read[1], read  # the first time, the newer process was read
