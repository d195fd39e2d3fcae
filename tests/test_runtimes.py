"""Every container runtime's processes, as real processes in cgroups of each runtime's shape
(made here, as the runtime makes them, in cgroup v1 and v2), resolved through the
ProcessIdentifier: which engine is asked about each (none, when its socket is not there), LXD's
names and shifted uids, and the host accounts of the rest. No engine runs here: the one engine
configured is at a socket that does not exist, so a lookup routed to it shows as degraded."""

import asyncio
import logging
import os
import secrets
import socket
import uuid
from dataclasses import replace

import pytest
from helpers import (
    NOBODY,
    async_test,
    engines_in,
    process_in_cgroup,
    user_manager,
)
from helpers import (
    ROOTLESS_UID as OWNER,
)
from helpers import (
    SHIFTED_UID as SHIFTED,
)

from patroller.config import Config
from patroller.identify.cgroups import ContainerRef
from patroller.identify.containers import ContainerDirectory
from patroller.identify.engines import Engines, route
from patroller.identify.resolver import ProcessIdentifier, host_identity

TAG = f"pt{os.getpid()}"
VERSIONS = [1, 2]


def container_id():
    return secrets.token_hex(32)


@pytest.fixture
def config(engine_sockets):
    """Every engine at a socket that is not there; the Docker Engine is asked all the same
    (it always is) and so degrades: a lookup routed to it is seen."""
    return replace(Config(), **engines_in(engine_sockets, docker_retry_after=0.05))


def identifier_for(config):
    return ProcessIdentifier(config, ContainerDirectory(config))


@pytest.mark.parametrize("version", VERSIONS)
@async_test
async def test_an_lxd_process_is_its_container_and_a_shifted_uid_is_no_account(version, config):
    identifier = identifier_for(config)
    name = f"{TAG}-box"
    with process_in_cgroup(
        f"/lxc.payload.{name}/system.slice/ssh.service", SHIFTED, version
    ) as pid:
        identity = await identifier.resolve(pid)
    assert identity.user == f"lxd:{name}" and identity.source == "container"
    assert identity.container == (name, name) and identity.email is None
    assert identity.account is None and identity.uid is None and not identity.degraded
    assert identifier.docker_calls == 0  # no engine is asked about an LXD container


@async_test
async def test_an_lxd_process_running_as_a_host_uid_counts_as_that_account(config):
    """A privileged LXD container shifts nothing: the kernel's uid is the host's."""
    with process_in_cgroup(f"/lxc.payload.{TAG}-priv/init.scope", NOBODY) as pid:
        identity = await identifier_for(config).resolve(pid)
    assert identity.user == f"lxd:{TAG}-priv"
    assert identity.uid == NOBODY and identity.account == host_identity(NOBODY).account


@async_test
async def test_the_shifted_uids_start_where_the_config_says(config):
    moved = replace(config, shifted_uids_from=SHIFTED + 1)
    with process_in_cgroup(f"/lxc.payload.{TAG}-moved", SHIFTED) as pid:
        identity = await identifier_for(moved).resolve(pid)
    assert identity.uid == SHIFTED and identity.account == f"uid:{SHIFTED}"


@pytest.mark.parametrize("version", VERSIONS)
@async_test
async def test_a_host_process_is_its_account_even_with_a_high_uid(version, config):
    """A process in no container is the account it runs as, as Apptainer's are (it makes no
    container cgroup): a high uid outside a container is a real account (LDAP)."""
    identifier = identifier_for(config)
    with process_in_cgroup(
        f"/user.slice/user-{SHIFTED}.slice/session-{TAG}.scope", SHIFTED, version
    ) as pid:
        identity = await identifier.resolve(pid)
    assert identity == host_identity(SHIFTED) and identity.source == "host"
    assert identifier.docker_calls == 0


KUBERNETES = {
    "containerd, systemd, burstable": "/kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod{pod_}.slice/cri-containerd-{id}.scope",
    "cri-o, systemd, guaranteed": "/kubepods.slice/kubepods-pod{pod_}.slice/crio-{id}.scope",
    "containerd outside kubernetes": "/system.slice/containerd.service/cri-containerd-{id}.scope",
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("shape", KUBERNETES)
@async_test
async def test_a_kubernetes_container_is_itself_and_asks_no_engine(shape, version, config):
    pod, cid = str(uuid.uuid4()), container_id()
    identifier = identifier_for(config)
    path = KUBERNETES[shape].format(pod_=pod.replace("-", "_"), id=cid)
    with process_in_cgroup(path, NOBODY, version) as pid:
        identity = await identifier.resolve(pid)
    assert identity.user == f"container:{cid[:12]}" and identity.container == (cid[:12], None)
    assert identity.uid == NOBODY and not identity.degraded
    assert identifier.docker_calls == 0


ROOTLESS = {
    "docker": "{user}/user.slice/docker-{id}.scope",
    "podman": "{user}/user.slice/libpod-{id}.scope/container",
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("runtime", ROOTLESS)
@async_test
async def test_a_rootless_container_without_its_engine_is_itself_and_its_users(
    runtime, version, config, caplog
):
    """Its user's engine has no socket: nothing is asked, nothing logged, and the system's
    Docker Engine is never asked about a container in a user's slice. It counts as the user
    whose slice holds it. (One of its processes running as a shifted uid, in the user's own
    namespace: tests/test_delegated_cgroups.py, with a real user and namespace.)"""
    cid = container_id()
    identifier = identifier_for(config)
    path = ROOTLESS[runtime].format(user=user_manager(OWNER), id=cid)
    with process_in_cgroup(path, OWNER, version) as pid:
        identity = await identifier.resolve(pid)
    assert identity.user == f"container:{cid[:12]}" and not identity.degraded
    assert identity.uid == OWNER and identity.account == f"uid:{OWNER}"
    assert identifier.docker_calls == 0
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "path", ["/machine.slice/libpod-{id}.scope", "/libpod_parent/libpod-{id}"]
)
@async_test
async def test_a_podman_container_without_the_service_is_itself(path, version, config):
    cid = container_id()
    identifier = identifier_for(config)
    with process_in_cgroup(path.format(id=cid), NOBODY, version) as pid:
        identity = await identifier.resolve(pid)
    assert identity.user == f"container:{cid[:12]}" and not identity.degraded
    assert identity.uid == NOBODY and identifier.docker_calls == 0


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "path",
    ["/system.slice/docker-{id}.scope", "/docker/{id}", "/kubepods/burstable/pod{pod}/{id}"],
)
@async_test
async def test_a_docker_container_is_asked_of_the_docker_engine(path, version, config):
    """As before: the Docker Engine (here unreachable: degraded, its container known), also
    for a bare id whose parents do not say which runtime made it."""
    cid = container_id()
    identifier = identifier_for(config)
    with process_in_cgroup(path.format(id=cid, pod=uuid.uuid4()), NOBODY, version) as pid:
        identity = await identifier.resolve(pid)
    assert identity.degraded and identity.user == "unknown"
    assert identity.container == (cid[:12], None) and identity.uid == NOBODY


@async_test
async def test_a_rootless_engine_that_does_not_answer_degrades(config, engine_sockets):
    """A socket that is there with nobody listening (its engine died): degraded, asked again."""
    folder = os.path.join(engine_sockets, str(OWNER))
    os.makedirs(folder)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(os.path.join(folder, "docker.sock"))
    stale.close()  # the file stays; connecting to it is refused
    cid = container_id()
    identifier = identifier_for(config)
    with process_in_cgroup(f"{user_manager(OWNER)}/user.slice/docker-{cid}.scope", OWNER) as pid:
        identity = await identifier.resolve(pid)
    assert identity.degraded and identity.user == "unknown"
    assert identity.container == (cid[:12], None) and identity.uid == OWNER


# -- the engines' clients -------------------------------------------------------------------


def rootless(uid, runtime="docker"):
    return ContainerRef(runtime, "a" * 64, owner=uid)


def test_routes():
    config = Config()
    assert route(ContainerRef("docker", "a" * 64), config).address is None
    assert route(ContainerRef("", "a" * 64), config).address is None
    assert (
        route(ContainerRef("podman", "a" * 64), config).address == "unix:///run/podman/podman.sock"
    )
    assert route(rootless(1000), config).address == "unix:///run/user/1000/docker.sock"
    assert route(rootless(1000, ""), config).address == "unix:///run/user/1000/docker.sock"
    assert (
        route(rootless(1000, "podman"), config).address
        == "unix:///run/user/1000/podman/podman.sock"
    )
    for runtime in ("lxd", "containerd", "crio"):
        assert route(ContainerRef(runtime, "a" * 64), config) is None
        assert route(ContainerRef(runtime, "a" * 64, owner=1000), config) is None
    off = replace(
        config, podman_socket=None, rootless_docker_socket=None, rootless_podman_socket=None
    )
    assert route(ContainerRef("podman", "a" * 64), off) is None
    assert route(rootless(1000), off) is None and route(rootless(1000, "podman"), off) is None


def listening_file(path):
    """A unix socket file at `path` (bound: a socket as the file system sees it)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    return sock


@async_test
async def test_a_socket_is_looked_for_once_in_a_while_and_each_gets_one_client(
    config, engine_sockets
):
    config = replace(config, engine_socket_ttl=0.3, engine_clients=2)
    engines = Engines(config, ContainerDirectory(config))
    try:
        assert await engines.directory(rootless(OWNER)) is None
        sock = listening_file(os.path.join(engine_sockets, str(OWNER), "docker.sock"))
        assert await engines.directory(rootless(OWNER)) is None  # remembered a while
        await asyncio.sleep(0.35)
        first = await engines.directory(rootless(OWNER))
        assert first is not None and first.base_url.endswith(f"/{OWNER}/docker.sock")
        assert await engines.directory(rootless(OWNER)) is first  # one client per socket
        assert first.engine == f"the rootless Docker Engine of uid {OWNER}"
        others = [
            listening_file(os.path.join(engine_sockets, str(OWNER + n), "docker.sock"))
            for n in (1, 2)
        ]
        second = await engines.directory(rootless(OWNER + 1))
        third = await engines.directory(rootless(OWNER + 2))
        assert len({id(first), id(second), id(third)}) == 3
        assert first.closed and not second.closed and not third.closed  # pushed out: closed
        again = await engines.directory(rootless(OWNER))
        assert again is not first and not again.closed and second.closed
        for each in [sock, *others]:
            each.close()
    finally:
        engines.shutdown()


@async_test
async def test_a_path_that_is_no_socket_is_said_once(config, engine_sockets, caplog):
    os.makedirs(os.path.join(engine_sockets, str(OWNER)))
    with open(os.path.join(engine_sockets, str(OWNER), "docker.sock"), "w"):
        pass
    engines = Engines(replace(config, engine_socket_ttl=0), ContainerDirectory(config))
    try:
        for _ in range(3):
            assert await engines.directory(rootless(OWNER)) is None
    finally:
        engines.shutdown()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "it is not a socket" in said[0], said
