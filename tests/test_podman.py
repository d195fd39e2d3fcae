"""Identity against a real Podman: the tests' own rootful Podman service (tests/podman.py), and a
throwaway user's rootless one, their labelled containers, and the containers' real processes on
the simulator's GPUs."""

import asyncio
import json
import logging
import os
import signal
import urllib.request
from dataclasses import replace

import pytest
from helpers import (
    ScenarioFile,
    ServerProcess,
    async_test,
    client_in,
    engines_in,
    gpu_running,
    known_claim,
    on_gpu,
    until,
)
from prometheus import eventually

from patroller.config import Config
from patroller.http.views import claims
from patroller.identify.containers import ContainerDirectory
from patroller.identify.resolver import ProcessIdentifier, host_identity


@pytest.fixture
def scenario(engine_sockets):
    return ScenarioFile(os.path.join(engine_sockets, "scenario.json"), devices=[{}, {}, {}, {}])


def settings(folder, **more):
    """Every engine's socket in `folder` (none there), but those `more` names."""
    return engines_in(folder, user_info_labels=("team",), **more)


def identifier_for(folder, **more):
    config = replace(Config(), **settings(folder, **more))
    return ProcessIdentifier(config, ContainerDirectory(config))


@async_test
async def test_a_podman_containers_process_on_a_gpu_is_its_labels_user(
    podman, scenario, engine_sockets
):
    alice = podman.run(labels={"user.email": "Alice <alice@example.org>", "team": "vision"})
    plain = podman.run()
    async with gpu_running(scenario, **settings(engine_sockets, podman_socket=podman.url)) as h:
        scenario.write(processes=on_gpu((alice.pid, 1), (plain.pid, 2)))
        await until(lambda: settled(h, 1, 2))
        status = await h.ok("/status")
        owner = status[h.uuids()[1]]["claim"]["user"]
        assert owner["user"] == "alice@example.org" and owner["email"] == "alice@example.org"
        assert owner["source"] == "container" and owner["info"] == {"team": "vision"}
        assert owner["container"] == {"id": alice.short, "name": alice.name}
        assert owner["uid"] == 0 and not owner.get("degraded")  # rootful: its root is root
        anonymous = status[h.uuids()[2]]["claim"]["user"]
        assert anonymous["user"] == f"container:{plain.short}" and anonymous["email"] is None
        assert anonymous["container"] == {"id": plain.short, "name": plain.name}
        assert h.services.directory.calls == 0  # the Docker Engine was never asked


def settled(h, *numbers):
    """Whether those GPUs are claimed by owners known (while a Podman call is answered, a
    process's owner is shown as not known yet: `unknown`, degraded)."""
    holds = [h.services.leases.holds[h.uuids()[n]] for n in numbers]
    return all(hold.state == "claimed" and not hold.holder.degraded for hold in holds)


def owners(server):
    """The holders known of the GPUs of a daemon started as a process, from its /status."""
    with urllib.request.urlopen(server.url + "/status", timeout=10) as response:
        devices = json.loads(response.read())
    return [
        d["claim"]["user"]
        for d in devices.values()
        if d["claim"]["user"] and not d["claim"]["user"]["degraded"]
    ]


def test_the_daemon_asks_the_service_its_podman_socket_flag_names(
    podman, scenario, engine_sockets
):
    alice = podman.run(labels={"email": "alice@example.org"})
    scenario.write(processes=on_gpu((alice.pid, 3)))
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--docker-host",
        f"unix://{engine_sockets}/docker.sock",
        "--podman-socket",
        podman.url,
        "--rootless-podman-socket",
        "none",
        "--rootless-docker-socket",
        "none",
    ).start()
    try:
        (owner,) = eventually(lambda: owners(server) or None, what="the GPU's owner", timeout=20)
        assert owner["user"] == "alice@example.org", server.log
        assert owner["container"] == {"id": alice.short, "name": alice.name}
    finally:
        assert server.stop() == 0
    # no error logged (the simulator's nvidia-smi, an old driver's, says "ERROR: Option topo is
    # not recognized", which the daemon quotes in a warning: no error of the daemon's)
    assert "Traceback" not in server.log and " ERROR " not in server.log


@async_test
async def test_a_docker_container_is_still_asked_of_the_docker_engine(
    podman, engine, scenario, engine_sockets
):
    alice = podman.run(labels={"user.email": "alice@example.org"})
    bob = engine.run(labels={"user.email": "bob@example.org"})
    async with gpu_running(
        scenario, **settings(engine_sockets, podman_socket=podman.url, docker_host=engine.url)
    ) as h:
        scenario.write(processes=on_gpu((alice.pid, 0), (bob.pid, 1)))
        await until(lambda: settled(h, 0, 1))
        status = await h.ok("/status")
        assert status[h.uuids()[0]]["claim"]["user"]["user"] == "alice@example.org"
        bobs = status[h.uuids()[1]]["claim"]["user"]
        assert bobs["user"] == "bob@example.org"
        assert bobs["container"] == {"id": bob.short, "name": bob.name}
        assert h.services.directory.calls == 2  # the version and bob's; alice's went to Podman


LABELLED = [
    (
        {
            "user.email": "Alice <alice@example.org>",
            "email": "x@example.org",
            "maintainer": "y@example.org",
        },
        "alice@example.org",
        "alice@example.org",
    ),
    (
        {"email": "Bob@Example.org", "maintainer": "y@example.org"},
        "bob@example.org",
        "Bob@Example.org",
    ),
    ({"maintainer": "Carol <carol@example.org>"}, "carol@example.org", "carol@example.org"),
    (
        {"user.email": "not an address", "maintainer": "dave@example.org"},
        "dave@example.org",
        "dave@example.org",
    ),
    ({"team": "vision"}, None, None),
]


@pytest.mark.parametrize("runtime", ["podman", "engine"])
@async_test
async def test_the_label_rules_are_dockers(runtime, request, engine_sockets):
    """user.email, then email, then maintainer; the first that holds an address counts."""
    engine = request.getfixturevalue(runtime)
    containers = [engine.run(labels=labels) for labels, _, _ in LABELLED]
    where = {"podman": "podman_socket", "engine": "docker_host"}[runtime]
    identifier = identifier_for(engine_sockets, **{where: engine.url})
    try:
        found = await asyncio.gather(*(identifier.resolve(c.pid) for c in containers))
    finally:
        identifier.close()
    for container, identity, (_, user, email) in zip(containers, found, LABELLED, strict=True):
        assert identity.user == (user or f"container:{container.short}")
        assert identity.email == email and not identity.degraded
        assert identity.container == (container.short, container.name)


@async_test
async def test_with_no_podman_socket_its_container_is_its_id_and_nothing_is_said(
    podman, engine_sockets, caplog
):
    alice = podman.run(labels={"user.email": "alice@example.org"})
    identifier = identifier_for(engine_sockets)  # Podman's socket is not there
    caplog.set_level(logging.DEBUG, logger="patroller")
    try:
        identity = await identifier.resolve(alice.pid)
    finally:
        identifier.close()
    assert identity.user == f"container:{alice.short}" and identity.container == (
        alice.short,
        None,
    )
    assert identity.uid == 0 and not identity.degraded
    assert identifier.docker_calls == 0  # no engine was asked, none waited for
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@async_test
async def test_a_caller_in_a_podman_container_reserves_as_its_user(
    podman, scenario, engine_sockets
):
    alice = podman.run(labels={"user.email": "alice@example.org"})
    path = os.path.join(engine_sockets, "api.sock")
    async with gpu_running(
        scenario, socket=path, **settings(engine_sockets, podman_socket=podman.url)
    ) as h:
        granted = await asyncio.get_running_loop().run_in_executor(
            None,
            client_in,
            alice,
            f"unix://{path}",
            "print(json.dumps(client.reserve(1, server=server, hold='lease')))",
        )
        claim = (await h.ok("/status"))[granted[0]["uuid"]]["claim"]
        assert claim["state"] == "reserved" and claim["user"]["user"] == "alice@example.org"
        assert claim["user"]["container"] == {"id": alice.short, "name": alice.name}


@async_test
async def test_podman_down_degrades_and_recovers(podman, scenario, engine_sockets):
    """The service dies (its socket stays, nobody answers): the GPU's owner is degraded, its
    container known; once the service is back, the owner is learned."""
    alice = podman.run(labels={"user.email": "alice@example.org"})
    more = dict(podman_socket=podman.url, docker_retry_after=0.2, owner_retry=0.2)
    async with gpu_running(scenario, **settings(engine_sockets, **more)) as h:
        podman.stop_service(signal.SIGKILL)
        try:
            scenario.write(processes=on_gpu((alice.pid, 2)))
            uuid = h.uuids()[2]
            await until(lambda: known_claim(h.services.leases, uuid))
            owner = (await h.ok("/status"))[uuid]["claim"]["user"]
            assert owner["degraded"] is True and owner["user"] == "unknown"
            assert owner["container"]["id"] == alice.short and owner["uid"] == 0
            assert len(await h.ok("/devices")) == 4  # the API keeps answering
        finally:
            podman.run_daemon()
        await until(
            lambda: (
                (claims(h.services.leases)[uuid]["user"] or {}).get("user") == "alice@example.org"
            ),
            timeout=15,
        )
        owner = (await h.ok("/status"))[uuid]["claim"]["user"]
        assert owner["container"] == {"id": alice.short, "name": alice.name}


@pytest.mark.parametrize("shifted", [False, True])
@async_test
async def test_a_rootless_podman_container_is_named_by_its_users_service(
    rootless_podman, podman, engine_sockets, shifted
):
    """Its process runs as the user (the container's root) or as one of the user's subordinate
    uids: either way it counts as the user, and its labels come from the user's own service."""
    user = rootless_podman.user
    bob = rootless_podman.run(
        *(["--user", "1000:1000"] if shifted else []),
        labels={"user.email": "Bob <bob@example.org>", "team": "nlp"},
    )
    bob.place()
    with open(f"/proc/{bob.pid}/status", encoding="ascii") as f:
        real_uid = int(next(x for x in f if x.startswith("Uid:")).split()[1])
    assert (real_uid != user.uid) == shifted
    identifier = identifier_for(
        engine_sockets, podman_socket=podman.url, rootless_podman_socket=rootless_podman.template
    )
    try:
        identity = await identifier.resolve(bob.pid)
    finally:
        identifier.close()
    # Its labels are the user's own word: shown, marked so, and never its user.
    assert identity.user == user.name and identity.info == (("team", "nlp"),)
    assert identity.email == "bob@example.org" and identity.claimed
    assert identity.container == (bob.short, bob.name) and not identity.degraded
    assert identity.uid == user.uid and identity.account == host_identity(user.uid).account
    assert identity.account == user.name


@async_test
async def test_a_rootless_containers_labels_name_neither_a_pod_nor_another_user(
    rootless_podman, scenario, engine_sockets, tmp_path
):
    """The attack: a user labels her rootless container as a Kubernetes pod's container, as the
    kubelet would (io.kubernetes.pod.namespace, .name, .uid), and with another user's e-mail.
    Neither counts: it is no pod, its user is her host account (the kernel's word), and the
    e-mail is shown only as her own claim, in /status as in the usage history."""
    user = rootless_podman.user
    forged = rootless_podman.run(
        labels={
            "io.kubernetes.pod.namespace": "ml",
            "io.kubernetes.pod.name": "train-0",
            "io.kubernetes.pod.uid": "0f7c3a52-9d1e-4b7a-8c55-2e9f1d3b6a10",
            "io.kubernetes.container.name": "trainer",
            "user.email": "Carol <carol@example.org>",
        }
    )
    forged.place()
    more = dict(
        rootless_podman_socket=rootless_podman.template,
        state_dir=str(tmp_path / "state"),
        usage_interval=0.2,
    )
    async with gpu_running(scenario, **settings(engine_sockets, **more)) as h:
        scenario.write(processes=on_gpu((forged.pid, 1)))
        await until(lambda: settled(h, 1))
        owner = (await h.ok("/status"))[h.uuids()[1]]["claim"]["user"]
        assert owner["user"] == user.name and owner["uid"] == user.uid
        assert owner["email"] == "carol@example.org" and owner["claimed"] is True
        assert owner["source"] == "container" and owner["pod"] is None
        assert owner["container"] == {"id": forged.short, "name": forged.name}
        users = await h.ok("/users")
        assert user.name in users and "carol@example.org" not in users
        store = h.services.usage
        settled_at = store.intervals
        await until(lambda: store.intervals > settled_at + 2)
        for by in ("user", "namespace", "pod"):
            keys = {row["key"] for row in (await h.ok(f"/usage?by={by}&since=1h"))["rows"]}
            assert not keys & {"carol@example.org", "ml", "ml/train-0"}, (by, keys)
        users = {row["key"] for row in (await h.ok("/usage?by=user&since=1h"))["rows"]}
        assert user.name in users


@async_test
async def test_podman_stopped_in_order_is_learned_once_it_is_back(
    podman, scenario, engine_sockets
):
    alice = podman.run(labels={"user.email": "alice@example.org"})
    more = dict(
        podman_socket=podman.url,
        docker_retry_after=0.2,
        owner_retry=0.2,
        engine_socket_ttl=0.2,
        engine_recheck=0.2,
    )
    async with gpu_running(scenario, **settings(engine_sockets, **more)) as h:
        podman.stop_service(signal.SIGTERM)
        try:
            assert not os.path.exists(podman.socket)  # as `systemctl stop podman.socket` does
            scenario.write(processes=on_gpu((alice.pid, 1)))
            uuid = h.uuids()[1]
            await until(lambda: known_claim(h.services.leases, uuid))
            owner = (await h.ok("/status"))[uuid]["claim"]["user"]
            assert owner["container"]["id"] == alice.short
        finally:
            podman.run_daemon()
        await until(
            lambda: (
                (claims(h.services.leases)[uuid]["user"] or {}).get("user") == "alice@example.org"
            ),
            timeout=5,
        )
