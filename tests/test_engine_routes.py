"""Which engine is asked about a container, over the Docker API or containerd's, and what it is
called when it fails: each container by its own engine (the system's Docker Engine, Podman's
service on a unix socket or on TCP, a user's rootless Docker or Podman), never by another that
knows a container of the same id; an engine whose socket is not there (or is no socket) leaves
its containers named by their ids, pending, until it is. Run where no engine can: the engines
are tests/fake_engine.py, answering what the real ones answered; real processes in real
cgroups. (The same against real engines: test_engines_docker, test_podman, test_containerd.)"""

import asyncio
import os
import secrets
import socket
import uuid
from dataclasses import replace

import pytest
from helpers import NOBODY, async_test, process_in_cgroup, user_manager
from helpers import ROOTLESS_UID as OWNER
from test_engine_answers import (
    ALICE,
    DEGRADES,
    config_in,
    engines,  # noqa: F401 (a fixture)
    warnings,
)

from patroller.identify.containers import ContainerDirectory
from patroller.identify.resolver import ProcessIdentifier, host_identity

# -- which engine is asked, and what it is called ------------------------------------------------

ROUTES = {
    # (the container's cgroup, the uid it runs as, its engine's socket or None for loopback TCP,
    #  the engine's captured answers, what Patroller calls the engine)
    "Docker": (
        "/system.slice/docker-{id}.scope",
        NOBODY,
        "docker.sock",
        "docker",
        "the Docker Engine",
    ),
    "a bare id": ("/containers/{id}", NOBODY, "docker.sock", "docker", "the Docker Engine"),
    "Podman": ("/machine.slice/libpod-{id}.scope", NOBODY, "podman.sock", "podman", "Podman"),
    "Podman on TCP": ("/libpod_parent/libpod-{id}", NOBODY, None, "podman", "Podman"),
    "rootless Docker": (
        "{user}/user.slice/docker-{id}.scope",
        OWNER,
        "{uid}/docker.sock",
        "docker",
        f"the rootless Docker Engine of uid {OWNER}",
    ),
    "rootless Podman": (
        "{user}/user.slice/libpod-{id}.scope/container",
        OWNER,
        "{uid}/podman/podman.sock",
        "podman",
        f"rootless Podman of uid {OWNER}",
    ),
}


@pytest.mark.parametrize("runtime", ROUTES)
@async_test
async def test_each_container_is_named_by_its_own_engine_and_its_trouble_said_as_that_engines(
    runtime, engine_sockets, engines, caplog
):
    """A container's user is what its own engine's labels say (the system's Docker Engine,
    which knows another container of that id, is never asked about another engine's, nor
    containerd, here unreachable, about any of these); its engine's 404 names it by its id for
    good; its engine's failure degrades it, said in the log with that engine's name and
    address."""
    path, uid, sock, kind, engine = ROUTES[runtime]
    cid, unknown, failing = (secrets.token_hex(32) for _ in range(3))
    own = (
        engines(f"{engine_sockets}/{sock.format(uid=OWNER)}", kind) if sock else engines.tcp(kind)
    )
    for each in (cid, failing):
        own.add(each, {"user.email": "mallory@example.org"})
    own.start()
    settings = {} if sock else {"podman_socket": own.url}
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(f"{engine_sockets}/containerd.sock")
    stale.close()  # containerd's socket is there; connecting to it is refused
    if own.url != f"unix://{engine_sockets}/docker.sock":
        system = engines(f"{engine_sockets}/docker.sock").start()
        system.add(cid, ALICE)  # the same id: the system's engine must not be the one asked
    config = config_in(engine_sockets, docker_retry_after=60, **settings)
    resolver = ProcessIdentifier(config, ContainerDirectory(config))
    identities = {}
    try:
        for each in (cid, unknown, failing):
            if each == failing:
                own.failing = "the engine is restarting"
            with process_in_cgroup(path.format(user=user_manager(OWNER), id=each), uid) as pid:
                identities[each] = await resolver.resolve(pid)
    finally:
        resolver.close()
    named, nobody, degraded = identities[cid], identities[unknown], identities[failing]
    if runtime.startswith("rootless"):  # a user's own labels: a claim, her account the user
        assert named.user == host_identity(uid).user and named.claimed
        assert named.email == "mallory@example.org"
    else:
        assert named.user == "mallory@example.org" and not named.claimed
    assert named.uid == uid
    assert degraded.user == "unknown" and degraded.degraded and degraded.uid == uid
    assert warnings(caplog) == [
        f"cannot read container labels: {engine} at {own.url} answered "
        f"500: the engine is restarting{DEGRADES}"
    ]
    assert nobody.user == f"container:{unknown[:12]}" and nobody.email is None
    assert named.source == nobody.source == degraded.source == "container"
    assert not nobody.degraded and not nobody.pending
    assert own.url == f"unix://{engine_sockets}/docker.sock" or system.requests == 0


SOCKET_TROUBLE = {
    "not there": None,  # no such engine here: nothing to say
    "a file": "it is not a socket",
    "a link to itself": "too many levels of symbolic links",
}


@pytest.mark.parametrize("what", SOCKET_TROUBLE)
@async_test
async def test_an_engine_socket_that_cannot_be_used_is_said_once_and_its_containers_wait(
    what, engine_sockets, caplog
):
    """Podman's socket path holds no socket: its containers are named by their ids, pending
    (asked again until the service is there); what is wrong with the path is said once,
    however many look at once or later, and a path that is not there is no trouble to say."""
    sock = f"{engine_sockets}/podman.sock"
    if what == "a file":
        open(sock, "w").close()
    elif what == "a link to itself":
        os.symlink(sock, sock)
    cid = secrets.token_hex(32)
    config = config_in(engine_sockets)
    resolver = ProcessIdentifier(config, ContainerDirectory(config))
    try:
        with process_in_cgroup(f"/machine.slice/libpod-{cid}.scope") as pid:
            shown = await asyncio.gather(*(resolver.resolve(pid) for _ in range(3)))
            shown.append(await resolver.resolve(pid))
    finally:
        resolver.close()
    assert all(s.user == f"container:{cid[:12]}" and s.pending for s in shown)
    said = (
        [f"cannot use {sock}: {SOCKET_TROUBLE[what]}; its containers are named by their ids"]
        if SOCKET_TROUBLE[what]
        else []
    )
    assert warnings(caplog) == said


@async_test
async def test_a_containerd_container_waits_for_containerd_only_where_one_is_configured(
    engine_sockets,
):
    """containerd configured and its socket not there: its containers are named by their ids,
    pending (asked again until it is there); there but not answering, degraded; gone again,
    pending again. None configured: named by their ids for good."""
    cid = secrets.token_hex(32)
    sock = f"{engine_sockets}/containerd.sock"
    configured = config_in(engine_sockets, containerd_timeout=2.0)
    unconfigured = replace(configured, containerd_socket=None)
    resolvers = [ProcessIdentifier(c, ContainerDirectory(c)) for c in (configured, unconfigured)]
    shown = []
    try:
        with process_in_cgroup(
            f"/system.slice/containerd.service/cri-containerd-{cid}.scope"
        ) as pid:
            shown.append(await resolvers[0].resolve(pid))
            stale = socket.socket(socket.AF_UNIX)
            stale.bind(sock)
            stale.close()  # the file stays; connecting to it is refused
            shown.append(await resolvers[0].resolve(pid))
            os.unlink(sock)
            shown.append(await resolvers[0].resolve(pid))
            shown.append(await resolvers[1].resolve(pid))
    finally:
        for resolver in resolvers:
            resolver.close()
    assert [(s.user, s.pending, s.degraded) for s in shown] == [
        (f"container:{cid[:12]}", True, False),
        ("unknown", False, True),
        (f"container:{cid[:12]}", True, False),
        (f"container:{cid[:12]}", False, False),
    ]
    assert all(s.uid == NOBODY for s in shown)


@async_test
async def test_a_pods_container_no_engine_knows_while_containerd_is_down_is_degraded(
    engine_sockets, engines
):
    """A bare id in a Kubernetes pod's cgroup: containerd may know it, and cannot be asked
    just now; the Docker Engine answers that it does not: not named for good by its id, but
    degraded, and asked again."""
    cid = secrets.token_hex(32)
    engines(f"{engine_sockets}/docker.sock").start()  # it knows no such container
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(f"{engine_sockets}/containerd.sock")
    stale.close()  # containerd's socket is there; connecting to it is refused
    config = config_in(engine_sockets, containerd_timeout=2.0)
    resolver = ProcessIdentifier(config, ContainerDirectory(config))
    try:
        with process_in_cgroup(f"/kubepods/burstable/pod{uuid.uuid4()}/{cid}") as pid:
            shown = await resolver.resolve(pid)
    finally:
        resolver.close()
    assert shown.user == "unknown" and shown.degraded and shown.container == (cid[:12], None)


@async_test
async def test_the_calls_of_an_engine_client_pushed_out_are_still_counted(engine_sockets, engines):
    """At most engine_clients clients are kept; /metrics' count of Docker API calls keeps
    those of a client pushed out."""
    owners = (OWNER, OWNER + 1, OWNER + 2)
    served = []
    for uid in owners:
        engine = engines(f"{engine_sockets}/{uid}/docker.sock")
        served.append(engine)
    cids = [secrets.token_hex(32) for _ in owners]
    for engine, cid in zip(served, cids, strict=True):
        engine.add(cid, ALICE)
        engine.start()
    config = config_in(engine_sockets, engine_clients=1)
    resolver = ProcessIdentifier(config, ContainerDirectory(config))
    try:
        for uid, cid in zip(owners, cids, strict=True):
            path = f"{user_manager(uid)}/user.slice/docker-{cid}.scope"
            with process_in_cgroup(path, uid) as pid:
                found = await resolver.resolve(pid)  # the labels were asked: a claim
                assert found.email == "alice@example.org" and found.claimed
        assert resolver.docker_calls == sum(e.requests for e in served) == 6
    finally:
        resolver.close()
