"""What Patroller makes of each answer a container engine gives over the Docker API, run where no
engine can (the engine-free suite): the engine is tests/fake_engine.py, answering what the real
Docker Engine and Podman's service answered; real processes in real cgroups, a real /proc. Each
way an engine fails is said in words (the log line an administrator reads, the refusal a caller
reads), a degraded engine is said once and its recovery once, it is not asked while it is down,
every call is counted, and a caller at a container's address is its labels' user. (The same
against the real engines: test_identity_docker, test_engines_docker, test_podman.)"""

import asyncio
import logging
import secrets
from dataclasses import replace

import pytest
from fake_engine import Engines
from helpers import NOBODY, async_test, engines_in, process_in_cgroup

from patroller.config import Config
from patroller.core.errors import Unidentified
from patroller.identify.callers import SystemCallers
from patroller.identify.containers import ContainerDirectory, DockerUnavailable, in_words
from patroller.identify.resolver import ProcessIdentifier

ALICE = {"user.email": "Alice <alice@example.org>", "team": "vision"}
DEGRADES = "; identities degrade to the container id until it is back"


@pytest.fixture
def engines():
    made = Engines()
    yield made
    for engine in made:
        engine.stop()


def config_in(folder, **more):
    """Every engine's socket in `folder`, none there until a test starts one; quick rechecks."""
    return replace(Config(), **engines_in(folder, engine_socket_ttl=0.0, **more))


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def infos(caplog, name):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.name == name]


# -- each way an engine fails, in words ----------------------------------------------------------

FAILURES = {
    # how the engine fails: what Patroller says of it, after "the Docker Engine at <url> "
    "answers 500": "answered 500: the engine is restarting",
    "answers 502 with no body": "answered 502",
    "never answers": "did not answer within 0.3s",
    # each read within the timeout, the whole never: given up at the lookup's deadline
    "answers a byte at a time": "gave no whole answer within 0.6s",
    "closes the connection": "cannot be used: Remote end closed connection without response",
    "died, its socket left": "cannot be reached: connection refused",
    "is not there": "cannot be reached: no such file or directory",
}


def fail(engine, how):
    if how == "answers 500":
        engine.failing = "the engine is restarting"
    elif how == "answers 502 with no body":
        engine.answering = (502, "")
    elif how == "never answers":
        engine.hanging = True
    elif how == "answers a byte at a time":
        engine.dribbling = 0.1
    elif how == "closes the connection":
        engine.dropping = True
    elif how == "died, its socket left":
        engine.crash()
    elif how == "is not there":
        engine.stop()


@pytest.mark.parametrize("how", FAILURES)
@async_test
async def test_each_way_the_engine_fails_is_said_in_words(how, engine_sockets, engines, caplog):
    """The reason a lookup fails, as the log says it once and as a caller at a container's
    address is refused with it: the engine, where it is, and what it did, never an exception's
    repr."""
    docker = engines(f"{engine_sockets}/docker.sock").start()
    fail(docker, how)
    config = config_in(
        engine_sockets, docker_timeout=0.3, docker_deadline=0.6, docker_retry_after=60
    )
    directory = ContainerDirectory(config)
    reason = f"the Docker Engine at unix://{engine_sockets}/docker.sock {FAILURES[how]}"
    try:
        with pytest.raises(DockerUnavailable) as failed:
            await directory.get(secrets.token_hex(32))
        assert str(failed.value) == reason
        callers = SystemCallers(ProcessIdentifier(config, directory), directory, config)
        with pytest.raises(Unidentified) as refused:
            await callers._remote("192.0.2.7")
        assert refused.value.message == f"cannot identify a caller at 192.0.2.7: {reason}"
    finally:
        directory.shutdown()  # at once, though a call is still held (a stop must not wait)
        if how == "answers a byte at a time":
            await let_go_of_the_held_call(docker)
    assert warnings(caplog) == [f"cannot read container labels: {reason}{DEGRADES}"]


async def let_go_of_the_held_call(engine):
    """Stop the engine so that the call it held ends, and let its client go here: the SDK,
    whose version negotiation then fails on a cut answer, leaves that socket to the collector."""
    import gc
    import threading
    import warnings as python_warnings

    engine.stop()
    for _ in range(100):
        if not any(t.name.startswith("docker") for t in threading.enumerate()):
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0)  # the loop takes the call's outcome
    with python_warnings.catch_warnings():
        python_warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@async_test
async def test_a_degraded_engine_is_said_once_and_its_recovery_once(
    engine_sockets, engines, caplog
):
    """While the engine fails, its containers' processes are `unknown` (degraded), said once
    however often they are asked; once it answers, their labels' user, and that it is back is
    said once; a second outage is said again."""
    caplog.set_level(logging.INFO, logger="patroller.identify.containers")
    cid = secrets.token_hex(32)
    docker = engines(f"{engine_sockets}/docker.sock")
    docker.add(cid, ALICE)
    docker.failing = "the engine is restarting"
    docker.start()
    config = config_in(engine_sockets, docker_retry_after=0.05)
    directory = ContainerDirectory(config)
    resolver = ProcessIdentifier(config, directory)
    where = f"unix://{engine_sockets}/docker.sock"
    try:
        with process_in_cgroup(f"/system.slice/docker-{cid}.scope") as pid:
            for _ in range(3):
                first = await resolver.resolve(pid)
                assert first.degraded and first.user == "unknown" and first.uid == NOBODY
                await asyncio.sleep(0.06)  # past the fail-fast pause: the engine is asked again
            assert docker.requests == 3
            docker.failing = None
            second = await resolver.resolve(pid)
            assert resolver.proc_reads == 4  # /metrics counts each process's /proc read
        assert infos(caplog, "patroller.identify.containers") == [
            f"the Docker Engine at {where} is reachable again"
        ]
        assert await directory.get(cid) is not None  # and said no more while it answers
        docker.failing = "out of memory"
        with pytest.raises(DockerUnavailable):
            await directory.get(secrets.token_hex(32))
    finally:
        resolver.close()
    assert second.user == "alice@example.org" and not second.degraded and second.uid == NOBODY
    assert len(infos(caplog, "patroller.identify.containers")) == 1
    assert warnings(caplog) == [
        f"cannot read container labels: the Docker Engine at {where} answered 500: the engine "
        f"is restarting{DEGRADES}",
        f"cannot read container labels: the Docker Engine at {where} answered 500: out of "
        f"memory{DEGRADES}",
    ]


@async_test
async def test_while_the_engine_is_down_it_is_not_asked_and_lookups_fail_at_once(
    engine_sockets, engines
):
    """For docker_retry_after seconds after it failed, a lookup (by id or by address) fails
    with the same reason without a request; every call made is counted, as /metrics shows."""
    known, unknown = secrets.token_hex(32), secrets.token_hex(32)
    docker = engines(f"{engine_sockets}/docker.sock")
    docker.add(known, ALICE)
    docker.start()
    config = config_in(engine_sockets, docker_retry_after=60)
    directory = ContainerDirectory(config)
    try:
        shared = await asyncio.gather(*(directory.get(known) for _ in range(3)))
        assert [info.labels for info in shared] == [ALICE] * 3  # one request, shared
        assert await directory.get(unknown) is None  # the engine's 404: nobody knows it
        assert directory.calls == docker.requests == 3  # the version, then one a container
        docker.failing = "the engine is restarting"
        with pytest.raises(DockerUnavailable) as failed:
            await directory.get(secrets.token_hex(32))
        assert directory.calls == docker.requests == 4
        docker.failing = None  # back, but not asked until the pause is over
        for lookup in (directory.get(secrets.token_hex(32)), directory.by_address("10.0.0.9")):
            with pytest.raises(DockerUnavailable) as again:
                await lookup
            assert str(again.value) == str(failed.value)
        assert directory.calls == docker.requests == 4
        assert (await directory.get(known)).labels == ALICE  # cached: nothing asked
        assert docker.requests == 4
    finally:
        directory.shutdown()


@async_test
async def test_after_an_outage_the_engine_is_asked_again_with_a_new_connection(
    engine_sockets, engines
):
    """An engine that closed a connection: the next lookup connects afresh (the version asked
    again), and each request it makes is counted."""
    cid = secrets.token_hex(32)
    docker = engines(f"{engine_sockets}/docker.sock")
    docker.add(cid, ALICE)
    docker.start()
    config = config_in(engine_sockets, docker_retry_after=0.05)
    directory = ContainerDirectory(config)
    try:
        assert await directory.get(secrets.token_hex(32)) is None
        docker.dropping = True
        with pytest.raises(DockerUnavailable):
            await directory.get(secrets.token_hex(32))
        docker.dropping = False
        await asyncio.sleep(0.06)  # past the fail-fast pause
        assert (await directory.get(cid)).labels == ALICE
        assert directory.calls == docker.requests == 5  # version, get, get; version, get
    finally:
        directory.shutdown()


# -- a caller at a container's address ---------------------------------------------------------


@async_test
async def test_a_caller_at_a_containers_address_is_its_labels_user_as_its_account(
    engine_sockets, engines
):
    """The container with the caller's address (IPv4 or IPv6, on any of its networks) names
    the user; the account is that of its first process, when the engine's pid is still a
    process of that container; a stopped container has none."""
    running, stopped, restarted = (secrets.token_hex(32) for _ in range(3))
    docker = engines(f"{engine_sockets}/docker.sock")
    config = config_in(engine_sockets, user_info_labels=("team",))
    directory = ContainerDirectory(config)
    callers = SystemCallers(ProcessIdentifier(config, directory), directory, config)
    try:
        with process_in_cgroup(f"/system.slice/docker-{running}.scope") as pid:
            docker.add(running, ALICE, ["10.0.0.2", "fd00::2"], pid)
            docker.add(stopped, {"user.email": "bob@example.org"}, ["10.0.0.3"], None)
            docker.add(restarted, {"user.email": "carol@example.org"}, ["10.0.0.4"], pid)
            docker.start()
            for address in ("10.0.0.2", "fd00::2", "::ffff:10.0.0.2"):
                alice = await callers._remote(address)
                assert alice.user == "alice@example.org" and alice.info == (("team", "vision"),)
                assert alice.container == (running[:12], f"train-{running[:4]}")
                assert alice.uid == NOBODY and alice.account == "nobody"
            bob = await callers._remote("10.0.0.3")
            carol = await callers._remote("10.0.0.4")  # its pid is another container's
            with pytest.raises(Unidentified) as nobody:
                await callers._remote("10.0.0.5")
    finally:
        directory.shutdown()
    assert bob.user == "bob@example.org" and bob.uid is None and bob.account is None
    assert carol.user == "carol@example.org" and carol.uid is None
    assert nobody.value.message == (
        "no container has the address 10.0.0.5: call from a "
        "container on this host, from the host itself, or over the "
        "unix socket"
    )
    assert docker.requests == 5  # the version, the list, one for each container: once
    assert callers.identifier.proc_reads == 4  # the running ones' pid; none of the stopped one


@async_test
async def test_a_container_removed_while_the_engine_lists_them_is_passed_over(
    engine_sockets, engines
):
    """`docker rm` between the listing and the look at one of its containers: the engine
    answers 404 for it; the others' addresses still name their users."""
    kept, removed = secrets.token_hex(32), secrets.token_hex(32)
    docker = engines(f"{engine_sockets}/docker.sock")
    docker.add(removed, {"user.email": "bob@example.org"}, ["10.0.0.3"], None)
    docker.add(kept, ALICE, ["10.0.0.2"], None)
    docker.vanishing.add(removed)
    docker.start()
    config = config_in(engine_sockets)
    directory = ContainerDirectory(config)
    callers = SystemCallers(ProcessIdentifier(config, directory), directory, config)
    try:
        assert (await callers._remote("10.0.0.2")).user == "alice@example.org"
        with pytest.raises(Unidentified) as gone:
            await callers._remote("10.0.0.3")
    finally:
        directory.shutdown()
    assert gone.value.message.startswith("no container has the address 10.0.0.3: ")


@async_test
async def test_the_address_table_is_listed_once_a_while_and_shared(engine_sockets, engines):
    """Concurrent callers share one listing, which also answers lookups by id; within
    address_ttl nothing is asked again, and after it a container started meanwhile is found."""
    first, later = secrets.token_hex(32), secrets.token_hex(32)
    docker = engines(f"{engine_sockets}/docker.sock")
    docker.add(first, ALICE, ["10.0.0.2"], None)
    docker.start()
    config = config_in(engine_sockets, address_ttl=0.3)
    directory = ContainerDirectory(config)
    try:
        found = await asyncio.gather(*(directory.by_address("10.0.0.2") for _ in range(3)))
        assert [info.id for info in found] == [first] * 3
        assert docker.requests == 3  # the version, the list, the container
        assert (await directory.get(first)).labels == ALICE
        docker.add(later, {"user.email": "bob@example.org"}, ["10.0.0.3"], None)
        assert await directory.by_address("10.0.0.3") is None  # the table is fresh enough
        assert docker.requests == 3
        deadline = asyncio.get_running_loop().time() + 10
        while (await directory.by_address("10.0.0.3")) is None:
            assert asyncio.get_running_loop().time() < deadline, "never listed again"
            await asyncio.sleep(0.05)
        assert (await directory.by_address("10.0.0.3")).id == later
        assert docker.requests == 3 + 3  # the list, and each container
    finally:
        directory.shutdown()


# -- the words themselves, of errors as the SDK raises them ---------------------------------------


def looping():
    """An error whose chain of causes comes back to itself."""
    outer, inner = RuntimeError("the engine's client broke"), RuntimeError("and again")
    outer.__cause__, inner.__cause__ = inner, outer
    return outer


def wrapping(cause):
    """An error in words, caused by one whose text is no words (a repr of its arguments)."""
    error = RuntimeError("the engine's client broke")
    error.__cause__ = cause
    return error


def sdk_errors():
    """(an error as the Docker SDK and its libraries raise it, raised with no chain, what is
    said of it after "Podman at unix:///run/podman/podman.sock ")"""
    import requests.exceptions
    import urllib3.exceptions

    missing = FileNotFoundError(2, "No such file or directory")
    return [
        (
            requests.exceptions.ReadTimeout("Read timed out. (read timeout=2.5)"),
            "did not answer within 2.5s",
        ),
        (
            urllib3.exceptions.MaxRetryError(None, "/version", missing),
            "cannot be reached: no such file or directory",
        ),
        (
            requests.exceptions.ConnectionError(
                urllib3.exceptions.ProtocolError("Connection aborted.", missing)
            ),
            "cannot be reached: no such file or directory",
        ),
        (looping(), "cannot be used: and again"),
        (wrapping(KeyError(("engine", 1))), "cannot be used: the engine's client broke"),
        (RuntimeError("line one\nline two"), "cannot be used: line one"),
        (RuntimeError("x" * 300), "cannot be used: " + "x" * 200),
        (RuntimeError(), "cannot be used: RuntimeError"),
    ]


def test_the_sdks_errors_are_said_in_words():
    """Whatever the chain of the error (a timeout by its name alone, a cause kept only as a
    `reason`, or in a tuple of arguments, a chain that loops back), one line of words, at most
    200 characters of a message, never a repr."""
    for error, said in sdk_errors():
        assert in_words(error, "unix:///run/podman/podman.sock", 2.5, "Podman") == (
            f"Podman at unix:///run/podman/podman.sock {said}"
        )
