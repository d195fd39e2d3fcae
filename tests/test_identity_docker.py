"""Identity against a real Docker Engine and real processes: labels, peers, pid reuse, outages."""

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import replace

import pytest
from helpers import (
    ScenarioFile,
    alive,
    async_test,
    client_in,
    gpu_running,
    known_claim,
    on_gpu,
    reuse_pid,
    until,
    unused_uid,
)

from patroller.config import Config
from patroller.http.views import claims
from patroller.identify.callers import SystemCallers
from patroller.identify.containers import ContainerDirectory
from patroller.identify.procfs import uid as read_uid
from patroller.identify.resolver import ProcessIdentifier, host_identity

LABELS = ("user.email", "email", "maintainer")
# The identity tests look at a reservation after the client has exited: a lease, not a process hold
RESERVE_1 = "print(json.dumps(client.reserve(1, server=server, hold='lease')))"
RESERVE_2 = "print(json.dumps(client.reserve(2, server=server, hold='lease')))"


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}])


@pytest.fixture
def socket_dir():
    # Short, so that the socket path stays far below the 107-byte limit.
    path = f"/tmp/pts{os.getpid()}"
    os.makedirs(path, exist_ok=True)
    yield path
    subprocess.run(["rm", "-rf", path])


@async_test
async def test_a_containers_process_shows_its_labels_email_and_info(engine, scenario):
    alice = engine.run(labels={"user.email": "Alice <alice@example.org>", "team": "vision"})
    plain = engine.run()
    async with gpu_running(scenario, docker_host=engine.url, user_info_labels=("team",)) as h:
        scenario.write(processes=on_gpu((alice.pid, 1), (plain.pid, 2)))
        await until(
            lambda: (
                known_claim(h.services.leases, h.uuids()[1])
                and known_claim(h.services.leases, h.uuids()[2])
            )
        )
        status = await h.ok("/status")
        owner = status[h.uuids()[1]]["claim"]["user"]
        assert owner["user"] == "alice@example.org" and owner["email"] == "alice@example.org"
        assert owner["source"] == "container" and owner["info"] == {"team": "vision"}
        assert owner["container"] == {"id": alice.short, "name": alice.name}
        anonymous = status[h.uuids()[2]]["claim"]["user"]
        assert anonymous["user"] == f"container:{plain.short}" and anonymous["email"] is None
        assert anonymous["container"] == {"id": plain.short, "name": plain.name}


@async_test
async def test_a_host_process_shows_its_account(engine, scenario):
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        async with gpu_running(scenario, docker_host=engine.url) as h:
            scenario.write(processes=on_gpu((sleeper.pid, 0)))
            await until(lambda: known_claim(h.services.leases, h.uuids()[0]))
            owner = (await h.ok("/status"))[h.uuids()[0]]["claim"]["user"]
            assert owner["source"] == "host" and owner["uid"] == read_uid(sleeper.pid)
            assert owner["user"] == host_identity(os.getuid()).user
    finally:
        sleeper.kill()
        sleeper.wait()


@async_test
async def test_a_caller_in_a_container_reserves_over_the_unix_socket(engine, scenario, socket_dir):
    alice = engine.run(labels={"user.email": "alice@example.org"}, command="sleep 600")
    bob = engine.run(labels={"email": "bob@example.org"})
    path = os.path.join(socket_dir, "api.sock")
    async with gpu_running(scenario, docker_host=engine.url, socket=path) as h:
        loop = asyncio.get_running_loop()
        granted = await loop.run_in_executor(None, client_in, alice, f"unix://{path}", RESERVE_1)
        uuid = granted[0]["uuid"]
        claim = (await h.ok("/status"))[uuid]["claim"]
        assert claim["state"] == "reserved" and claim["user"]["user"] == "alice@example.org"
        assert claim["user"]["container"]["id"] == alice.short
        # that user's process then claims it
        scenario.write(processes=on_gpu((alice.pid, granted[0]["info"]["number"])))
        await until(lambda: known_claim(h.services.leases, uuid))
        # another user's process on it makes it shared
        scenario.write(
            processes=on_gpu(
                (alice.pid, granted[0]["info"]["number"]), (bob.pid, granted[0]["info"]["number"])
            )
        )
        await until(lambda: h.services.leases.state(uuid) == "shared")
        users = [u["user"] for u in (await h.ok("/status"))[uuid]["claim"]["users"]]
        assert users == ["alice@example.org", "bob@example.org"]
        # and bob cannot release alice's device
        refused = await loop.run_in_executor(
            None,
            client_in,
            bob,
            f"unix://{path}",
            (
                f"try:\n    client.release(server, uuid={uuid!r})\n    "
                "print(json.dumps('released'))\n"
                "except client.RequestRefused as e:\n    print(json.dumps(e.status))"
            ),
        )
        assert refused == 403


@async_test
async def test_a_loopback_tcp_caller_in_a_container_is_that_container(engine, scenario):
    alice = engine.run(labels={"user.email": "alice@example.org"})
    async with gpu_running(scenario, docker_host=engine.url) as h:
        loop = asyncio.get_running_loop()
        granted = await loop.run_in_executor(None, client_in, alice, h.url, RESERVE_2)
        claims = await h.ok("/status")
        assert {claims[g["uuid"]]["claim"]["user"]["user"] for g in granted} == {
            "alice@example.org"
        }


@async_test
async def test_a_reused_pid_is_not_taken_for_the_old_process(engine):
    alice = engine.run(labels={"user.email": "alice@example.org"})
    config = replace(Config(), docker_host=engine.url, user_labels=tuple(LABELS))
    identifier = ProcessIdentifier(config, ContainerDirectory(config))
    old = alice.exec_pid("sleep 301")
    assert (await identifier.resolve(old)).user == "alice@example.org"
    os.kill(old, 9)
    await until(lambda: not os.path.exists(f"/proc/{old}"))
    newcomer = reuse_pid(old)
    if newcomer is None:
        pytest.skip("the kernel did not hand out the same pid again (ns_last_pid not writable)")
    try:
        again = await identifier.resolve(old)
        assert again.source == "host" and again.user == host_identity(os.getuid()).user
    finally:
        newcomer.kill()
        newcomer.wait()


@async_test
async def test_one_docker_call_per_container_and_none_at_steady_state(engine, scenario):
    alice = engine.run(labels={"user.email": "alice@example.org"})
    pids = [alice.pid] + [alice.exec_pid(f"sleep 60{n}") for n in range(4)]
    config = replace(Config(), docker_host=engine.url, user_labels=tuple(LABELS))
    directory = ContainerDirectory(config)
    identifier = ProcessIdentifier(config, directory)
    owners = await asyncio.gather(*(identifier.resolve(pid) for pid in pids))
    assert {o.user for o in owners} == {"alice@example.org"}
    assert directory.calls == 2  # the version negotiation and one lookup, shared by all five
    async with gpu_running(scenario, docker_host=engine.url) as h:
        scenario.write(processes=on_gpu(*[(pid, n % 4) for n, pid in enumerate(pids)]))
        await until(lambda: all(known_claim(h.services.leases, u) for u in h.uuids()))
        calls, listed = h.services.directory.calls, []
        h.services.signals.processes_listed.connect(lambda s, record: listed.append(1), weak=False)
        await until(lambda: len(listed) >= 10)  # ten pmon intervals of the same processes
        assert h.services.directory.calls == calls == 2


@async_test
async def test_docker_down_degrades_and_recovers(engine, scenario, socket_dir):
    alice = engine.run(labels={"user.email": "alice@example.org"})
    path = os.path.join(socket_dir, "api.sock")
    async with gpu_running(scenario, docker_host=engine.url, socket=path) as h:
        h.services.directory.retry_after = 0.2
        h.services.tracker.retry = 0.2
        os.rename(engine.socket, engine.socket + ".away")  # the engine is unreachable
        try:
            scenario.write(processes=on_gpu((alice.pid, 3)))
            target = h.uuids()[3]
            await until(lambda: known_claim(h.services.leases, target))
            owner = (await h.ok("/status"))[target]["claim"]["user"]
            assert owner["degraded"] is True and owner["user"] == "unknown"
            assert owner["container"]["id"] == alice.short  # the container is still known
            loop = asyncio.get_running_loop()
            refused = await loop.run_in_executor(
                None,
                client_in,
                alice,
                f"unix://{path}",
                (
                    "try:\n    client.reserve(1, server=server, hold='lease')\n    "
                    "print(json.dumps(0))\n"
                    "except client.RequestRefused as e:\n    print(json.dumps([e.status, "
                    "e.body['error']]))"
                ),
            )
            assert refused[0] == 403 and "unreachable" in refused[1]
            assert len(await h.ok("/devices")) == 4  # the API keeps answering
        finally:
            os.rename(engine.socket + ".away", engine.socket)
        await until(
            lambda: (
                (claims(h.services.leases)[target]["user"] or {}).get("user")
                == "alice@example.org"
            ),
            timeout=10,
        )
        assert known_claim(h.services.leases, target)
        loop = asyncio.get_running_loop()
        granted = await loop.run_in_executor(None, client_in, alice, f"unix://{path}", RESERVE_1)
        assert granted and granted[0]["uuid"] != target


@async_test
async def test_a_hung_docker_engine_degrades_without_stalling_the_api(engine, scenario):
    alice = engine.run(labels={"user.email": "alice@example.org"})
    async with gpu_running(scenario, docker_host=engine.url) as h:
        h.services.directory.timeout = 1.0  # the client is made at the first lookup
        h.services.directory.retry_after = 0.2
        h.services.tracker.retry = 0.2
        os.kill(engine.process.pid, signal.SIGSTOP)  # the engine hangs: calls time out
        try:
            scenario.write(processes=on_gpu((alice.pid, 2)))
            target = h.uuids()[2]
            began = time.monotonic()
            while h.services.leases.state(target) != "claimed":
                status, _ = await h.call("/status", timeout=5)  # answered while Docker hangs
                assert status == 200 and time.monotonic() - began < 20
                await asyncio.sleep(0.05)
            owner = claims(h.services.leases)[target]["user"]
            assert owner["degraded"] is True and owner["container"]["id"] == alice.short
        finally:
            os.kill(engine.process.pid, signal.SIGCONT)
        await until(
            lambda: (
                (claims(h.services.leases)[target]["user"] or {}).get("user")
                == "alice@example.org"
            ),
            timeout=15,
        )


def client_as(container, uid, server, code):
    """Like client_in, but the process then runs as `uid`, as one started with
    `docker exec --user` would."""
    return client_in(
        container, server, f"os.setgroups([]); os.setgid({uid}); os.setuid({uid})\n" + code
    )


TRY_RESERVE = (
    "try:\n"
    "    print(json.dumps([200, client.reserve(1, server=server, hold='lease')]))\n"
    "except client.RequestRefused as e:\n"
    "    print(json.dumps([e.status, e.body]))\n"
)


@async_test
async def test_limits_count_the_host_account_a_container_runs_as(engine, scenario, socket_dir):
    # As found: with --max-per-user 1, a container labelled alice+2@example.org, or none, run
    # as alice's uid, got a GPU beside alice's, and a process of one took another by computing.
    scenario.write(devices=[{} for _ in range(6)])
    uid = unused_uid(1001)  # an account here (alice, on a lab host) would be named instead
    bob_uid = unused_uid(uid + 1)
    alice = engine.run("--user", f"{uid}:{uid}", labels={"user.email": "alice@example.org"})
    alice2 = engine.run("--user", f"{uid}:{uid}", labels={"user.email": "alice+2@example.org"})
    plain = engine.run("--user", f"{uid}:{uid}")
    bob = engine.run("--user", f"{bob_uid}:{bob_uid}", labels={"user.email": "bob@example.org"})
    carol = engine.run(labels={"user.email": "carol@example.org"})  # as root, the default
    dave = engine.run(labels={"user.email": "dave@example.org"})
    path = os.path.join(socket_dir, "api.sock")
    async with gpu_running(scenario, docker_host=engine.url, socket=path, max_per_user=1) as h:
        loop = asyncio.get_running_loop()

        async def reserve(container, as_uid):
            return await loop.run_in_executor(
                None, client_as, container, as_uid, f"unix://{path}", TRY_RESERVE
            )

        status, granted = await reserve(alice, uid)
        assert status == 200
        claim = (await h.ok("/status"))[granted[0]["uuid"]]["claim"]["user"]
        assert claim["user"] == "alice@example.org" and claim["uid"] == uid
        for other in (alice2, plain):
            status, body = await reserve(other, uid)
            assert status == 403, body
            assert body["account"] == f"uid:{uid}" and body["uid"] == uid and body["limit"] == 1
            assert "the most one host account may hold is 1" in body["error"]
        assert (await reserve(bob, bob_uid))[0] == 200  # another account
        assert (await reserve(carol, 0))[0] == 200  # root: counted by its labels alone
        assert (await reserve(dave, 0))[0] == 200
        # A process of the unlabelled container computes on the last free GPU: it holds it, a
        # trespass beyond the account's limit, in /users, the metrics and the audit record.
        free = [
            n
            for n in range(6)
            if (await h.ok("/status"))[h.uuids()[n]]["claim"]["state"] == "free"
        ]
        scenario.write(processes=on_gpu((plain.pid, free[-1])))
        await until(lambda: known_claim(h.services.leases, h.uuids()[free[-1]]))
        anonymous = f"container:{plain.short}"
        users = await h.ok("/users")
        assert users[anonymous]["over_limit"] == 1
        assert users[anonymous]["accounts"] == [
            {
                "account": f"uid:{uid}",
                "uid": uid,
                "held": 2,
                "devices": sorted([granted[0]["info"]["number"], free[-1]]),
                "limit": 1,
            }
        ]
        assert users["alice@example.org"]["over_limit"] == 0
        metrics = (await h.http.fetch(h.url + "/metrics")).body.decode()
        assert f'patroller_user_gpus_over_limit{{user="{anonymous}"}} 1.0' in metrics
        assert 'patroller_user_gpus_over_limit{user="alice@example.org"} 0.0' in metrics
        (trespass,) = [e for e in await h.ok("/history") if e["event"] == "trespass"]
        assert trespass["user"] == anonymous and trespass["why"] == "over_limit"
        assert trespass["account"] == f"uid:{uid}" and trespass["pid"] == plain.pid


@async_test
async def test_an_accounts_refusal_does_not_say_which_devices_others_hold(
    engine, scenario, socket_dir
):
    # --hide-users: alice's GPU is a pseudonym's to alice+2, whose account it also counts
    # under; the refusal says how many the account holds, not which (that would name whose).
    uid = unused_uid(1001)
    alice = engine.run("--user", f"{uid}:{uid}", labels={"user.email": "alice@example.org"})
    alice2 = engine.run("--user", f"{uid}:{uid}", labels={"user.email": "alice+2@example.org"})
    path = os.path.join(socket_dir, "api.sock")
    async with gpu_running(
        scenario, docker_host=engine.url, socket=path, max_per_user=1, hide_users=True
    ):
        loop = asyncio.get_running_loop()
        status, _ = await loop.run_in_executor(
            None, client_as, alice, uid, f"unix://{path}", TRY_RESERVE
        )
        assert status == 200
        status, body = await loop.run_in_executor(
            None, client_as, alice2, uid, f"unix://{path}", TRY_RESERVE
        )
        assert status == 403 and body["held"] == [None] and body["account"] == f"uid:{uid}"
        assert "holds 1 device(s) (1 under other identities)" in body["error"], body


@async_test
async def test_a_caller_at_a_containers_address_counts_under_the_account_it_runs_as(engine):
    # The test's containers have no network (--network none): the address is looked up as the
    # daemon would, and names this container; its first process is the engine's word.
    alice2 = engine.run("--user", "1001:1001", labels={"user.email": "alice+2@example.org"})
    config = replace(Config(), docker_host=engine.url)

    class AtAddress(ContainerDirectory):
        async def by_address(self, address):
            return await self.get(alice2.id)

    directory = AtAddress(config)
    try:
        callers = SystemCallers(ProcessIdentifier(config, directory), directory, config)
        caller = await callers._remote("192.0.2.7")
        assert caller.user == "alice+2@example.org" and caller.uid == 1001
        engine.docker("kill", alice2.id)
        await until(lambda: not alive(alice2.pid))
        caller = await callers._remote("192.0.2.7")  # its labels known, its process gone
        assert caller.user == "alice+2@example.org" and caller.uid is None
    finally:
        directory.shutdown()
