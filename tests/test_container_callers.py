"""A TCP caller that is not on this host: the container whose network address it comes from,
named by its labels, and counted under the host account its first process runs as, or refused
(403) when no container has that address or none can be asked. The engine is
tests/fake_engine.py, answering as the real Docker Engine did; real processes in real cgroups,
a real /proc. (The same against a real engine: test_identity_docker.)"""

import secrets
import subprocess
from contextlib import contextmanager
from dataclasses import replace

import pytest
from fake_engine import FakeEngine
from helpers import async_test, engines_in, process_in_cgroup

from patroller.config import Config
from patroller.core.errors import Unidentified
from patroller.identify.callers import SystemCallers
from patroller.identify.containers import ContainerDirectory
from patroller.identify.resolver import ProcessIdentifier, host_identity

NOBODY = 65534
ALICE = {"user.email": "Alice <alice@example.org>", "team": "vision"}
AT = "192.0.2.7"  # a documentation address (RFC 5737): a container network's, here


class Engine(FakeEngine):
    """The fake engine, with each container's first process (`State.Pid`; 0 while it is not
    running, as the engine says of a stopped container)."""

    def __init__(self, path):
        super().__init__(path)
        self.pids = {}

    def answer(self, path):
        status, body = super().answer(path)
        if status == 200 and isinstance(body, dict) and "State" in body:
            body["State"]["Pid"] = self.pids.get(body["Id"], 0)
        return status, body


class ByAddress(ContainerDirectory):
    """The engine's directory, with the network address of each container set by the test
    (the fake engine lists no networks); what is known of the container is the engine's answer."""

    def __init__(self, config, addresses):
        super().__init__(config)
        self.addresses = addresses
        self.asked = []

    async def by_address(self, address):
        self.asked.append(address)
        cid = self.addresses.get(address)
        return None if cid is None else await self.get(cid)


@pytest.fixture
def docker(tmp_path):
    engine = Engine(str(tmp_path / "docker.sock")).start()
    yield engine
    engine.stop()


@pytest.fixture
def callers(tmp_path, docker):
    """SystemCallers whose Docker Engine is `docker`; (callers, directory, container id at AT)."""
    cid = secrets.token_hex(32)
    docker.add(cid, ALICE)
    config = replace(Config(), **engines_in(str(tmp_path), user_info_labels=("team",)))
    directory = ByAddress(config, {AT: cid})
    identifier = ProcessIdentifier(config, directory)
    yield SystemCallers(identifier, directory, config), directory, cid
    identifier.close()
    directory.shutdown()


@async_test
async def test_a_container_caller_is_its_labels_user_under_the_account_it_runs_as(callers, docker):
    callers, directory, cid = callers
    with process_in_cgroup(f"/system.slice/docker-{cid}.scope", NOBODY) as pid:
        docker.pids[cid] = pid
        caller = await callers._remote(f"::ffff:{AT}")  # as a dual-stack socket gives it
    nobody = host_identity(NOBODY)
    assert directory.asked == [AT]  # the container network's own form of the address
    assert (caller.user, caller.email, caller.source) == (
        "alice@example.org",
        "alice@example.org",
        "container",
    )
    assert caller.container == (cid[:12], "train-" + cid[:4]) and caller.info == (
        ("team", "vision"),
    )
    assert (caller.account, caller.uid) == (nobody.account, NOBODY)  # the kernel's word


@contextmanager
def first_process(where):
    """The pid the engine names as a container's first process: in another container's cgroup
    (it restarted since the engine was asked), in none, or gone (ended and reaped)."""
    if where == "another container":
        with process_in_cgroup(
            f"/system.slice/docker-{secrets.token_hex(32)}.scope", NOBODY
        ) as pid:
            yield pid
        return
    process = subprocess.Popen(["sleep", "60"], user=NOBODY, group=NOBODY, extra_groups=[])
    try:
        if where == "gone":
            process.kill()
            process.wait()
        yield process.pid
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("where", ["another container", "no container", "gone"])
@async_test
async def test_a_first_process_that_is_not_the_containers_gives_no_account(callers, docker, where):
    callers, _, cid = callers
    with first_process(where) as pid:
        docker.pids[cid] = pid
        caller = await callers._remote(AT)
    # the labels stand; no account is guessed
    assert (caller.user, caller.source, caller.account, caller.uid) == (
        "alice@example.org",
        "container",
        None,
        None,
    )


@async_test
async def test_a_stopped_container_is_its_labels_user_and_no_process_is_read(callers, docker):
    callers, _, cid = callers
    reads = callers.identifier.proc_reads
    caller = await callers._remote(AT)  # State.Pid 0
    assert (caller.user, caller.account, caller.uid) == ("alice@example.org", None, None)
    assert callers.identifier.proc_reads == reads


@async_test
async def test_an_address_no_container_has_is_refused(callers):
    callers, directory, _ = callers
    with pytest.raises(Unidentified) as refused:
        await callers._remote("192.0.2.9")
    assert refused.value.message == (
        "no container has the address 192.0.2.9: call from a container on this host, from the "
        "host itself, or over the unix socket"
    )
    assert directory.asked == ["192.0.2.9"]


@async_test
async def test_without_a_docker_engine_a_caller_off_the_host_is_refused():
    config = Config()
    callers = SystemCallers(ProcessIdentifier(config), None, config)
    with pytest.raises(Unidentified) as refused:
        await callers._remote(AT)
    assert refused.value.message == f"cannot identify a caller at {AT}"
