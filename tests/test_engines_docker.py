"""Podman's and the users' rootless engines, through a real engine that serves the Docker API:
the tests' private dockerd, its socket placed where Podman's service or a user's rootless engine
listens (a link at that path), a labelled container on it, and a real process moved into a
cgroup of the runtime's shape naming that container. Podman itself is not run here: its service
speaks the same API, through the same client."""

import asyncio
import os
import socket
from dataclasses import replace

import pytest
from helpers import (
    ROOTLESS_UID as OWNER,
)
from helpers import (
    ScenarioFile,
    async_test,
    engines_in,
    gpu_running,
    known_claim,
    process_in_cgroup,
    until,
    user_manager,
)

from patroller.config import Config
from patroller.http.views import claims
from patroller.identify.containers import ContainerDirectory
from patroller.identify.resolver import ProcessIdentifier


def user_slice(uid):
    """Where a user's rootless engines put their containers."""
    return f"{user_manager(uid)}/user.slice"


@pytest.fixture
def alice(engine):
    return engine.run(labels={"user.email": "Alice <alice@example.org>", "team": "vision"})


def serve_at(engine, path):
    """The engine's socket, also at `path` (where another engine would listen)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(engine.socket, path)


def config_for(folder, **more):
    """Every engine's socket in `folder`, none there unless the test puts it there."""
    return replace(Config(), **engines_in(folder, user_info_labels=("team",), **more))


def assert_alice(identity, container, rootless=False):
    """Its labels' user; a rootless container's labels are its user's own claim, shown as such,
    and its user is the host account it runs as."""
    assert identity.user == (f"uid:{OWNER}" if rootless else "alice@example.org")
    assert identity.email == "alice@example.org" and identity.claimed == rootless
    assert identity.container == (container.short, container.name)
    assert identity.info == (("team", "vision"),) and not identity.degraded


@pytest.mark.parametrize("version", [1, 2])
@async_test
async def test_a_rootless_docker_container_is_named_by_its_users_engine(
    engine, alice, engine_sockets, version
):
    """(Its processes that run as shifted uids of the user's namespace are the user's too:
    tests/test_delegated_cgroups.py, with a real user and namespace.)"""
    serve_at(engine, f"{engine_sockets}/{OWNER}/docker.sock")
    config = config_for(engine_sockets)
    directory = ContainerDirectory(config)  # the system's Docker Engine: not there
    identifier = ProcessIdentifier(config, directory)
    path = f"{user_slice(OWNER)}/docker-{alice.id}.scope"
    with (
        process_in_cgroup(path, OWNER, version) as first,
        process_in_cgroup(path, OWNER, version) as second,
    ):
        identities = await asyncio.gather(identifier.resolve(first), identifier.resolve(second))
    for identity in identities:
        assert_alice(identity, alice, rootless=True)
        assert identity.uid == OWNER and identity.account == f"uid:{OWNER}"
    assert directory.calls == 0  # the system's engine was never asked
    assert identifier.docker_calls == 2  # one client, its version, one lookup for both


@async_test
async def test_a_container_in_a_users_slice_is_never_asked_of_the_systems_engine(
    engine, alice, engine_sockets
):
    """Anyone may name a cgroup in their own slice after someone else's container: the system's
    engine knows alice's container, but a process in another user's slice is not alice."""
    config = config_for(engine_sockets, docker_host=engine.url)
    identifier = ProcessIdentifier(config, ContainerDirectory(config))
    with process_in_cgroup(f"{user_slice(OWNER)}/docker-{alice.id}.scope", OWNER) as pid:
        identity = await identifier.resolve(pid)
    assert identity.user == f"container:{alice.short}" and identity.email is None
    assert identity.uid == OWNER and not identity.degraded
    assert identifier.docker_calls == 0
    with process_in_cgroup(f"/system.slice/docker-{alice.id}.scope", OWNER) as pid:
        assert_alice(await identifier.resolve(pid), alice)  # the system's own: asked of it


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    "shape", ["/machine.slice/libpod-{id}.scope/container", "/libpod_parent/libpod-{id}"]
)
@async_test
async def test_a_podman_container_is_named_by_the_podman_service(
    engine, alice, engine_sockets, shape, version
):
    serve_at(engine, f"{engine_sockets}/podman.sock")
    config = config_for(engine_sockets)
    directory = ContainerDirectory(config)
    identifier = ProcessIdentifier(config, directory)
    with process_in_cgroup(shape.format(id=alice.id), 0, version) as pid:
        identity = await identifier.resolve(pid)
    assert_alice(identity, alice)
    assert identity.uid == 0 and directory.calls == 0


@pytest.mark.parametrize("version", [1, 2])
@async_test
async def test_a_rootless_podman_container_is_named_by_its_users_service(
    engine, alice, engine_sockets, version
):
    serve_at(engine, f"{engine_sockets}/{OWNER}/podman/podman.sock")
    config = config_for(engine_sockets)
    identifier = ProcessIdentifier(config, ContainerDirectory(config))
    path = f"{user_slice(OWNER)}/libpod-{alice.id}.scope/container"
    with process_in_cgroup(path, OWNER, version) as pid:
        identity = await identifier.resolve(pid)
    assert_alice(identity, alice, rootless=True)
    assert identity.uid == OWNER and identity.account == f"uid:{OWNER}"


@async_test
async def test_a_rootless_engine_that_does_not_answer_degrades_and_recovers(
    engine, alice, engine_sockets
):
    """The daemon: the user's engine has a socket nobody answers on (it died): the GPU's owner
    is degraded, its container known; once the engine answers there, the owner is learned."""
    path = f"{engine_sockets}/{OWNER}/docker.sock"
    os.makedirs(os.path.dirname(path))
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # the file stays; connections to it are refused
    scenario = ScenarioFile(os.path.join(engine_sockets, "scenario.json"), devices=[{}, {}])
    settings = engines_in(
        engine_sockets, user_info_labels=("team",), docker_retry_after=0.2, owner_retry=0.2
    )
    with process_in_cgroup(f"{user_slice(OWNER)}/docker-{alice.id}.scope", OWNER) as pid:
        async with gpu_running(scenario, **settings) as h:
            scenario.write(processes=[{"pid": pid, "gpu": 1, "name": "python"}])
            uuid = h.uuids()[1]
            await until(lambda: known_claim(h.services.leases, uuid))
            owner = (await h.ok("/status"))[uuid]["claim"]["user"]
            assert owner["degraded"] is True and owner["user"] == "unknown"
            assert owner["container"]["id"] == alice.short and owner["uid"] == OWNER
            serve_at(engine, path)
            await until(
                lambda: (
                    (claims(h.services.leases)[uuid]["user"] or {}).get("user") == f"uid:{OWNER}"
                )
            )
            owner = (await h.ok("/status"))[uuid]["claim"]["user"]
            assert owner["email"] == "alice@example.org" and owner["account"] == f"uid:{OWNER}"
            assert owner["claimed"] is True
            assert owner["container"] == {"id": alice.short, "name": alice.name}
