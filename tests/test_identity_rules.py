"""The identity rules that need an engine's answer, run where no engine can: pending and degraded
identities are never cached, and are learned again until the engine names them, by the resolver
and by the tracker that tells the leases. The engine is tests/fake_engine.py, which answers with
what the real Docker Engine answered; real processes in real cgroups, a real /proc. (The same
rules against real engines: test_identity_docker, test_engines_docker, test_containerd.)"""

import asyncio
import logging
import secrets
from dataclasses import replace

import pytest
from fake_engine import FakeEngine
from helpers import (
    ScenarioFile,
    async_test,
    engines_in,
    gpu_running,
    host_user,
    lease_manager,
    process_in_cgroup,
    until,
)

from patroller.config import Config
from patroller.core.identity import IDENTIFYING, UNKNOWN, Identity, named_user
from patroller.identify.cgroups import ContainerRef
from patroller.identify.containers import ContainerDirectory
from patroller.identify.resolver import ProcessIdentifier, ProcFacts
from patroller.identify.tracker import ProcessTracker
from patroller.observe.signals import GpuProcess, Signals

ALICE = {"user.email": "Alice <alice@example.org>", "team": "vision"}


@pytest.fixture
def folder(tmp_path):
    return str(tmp_path)


def config_in(folder, **more):
    """Every engine's socket in `folder`, none there until a test starts one; quick rechecks."""
    return replace(
        Config(), **engines_in(folder, engine_socket_ttl=0.0, docker_retry_after=0.05, **more)
    )


@pytest.fixture
def engines():
    started = []
    yield lambda path: started.append(FakeEngine(path)) or started[-1]
    for engine in started:
        engine.stop()


@async_test
async def test_a_pending_identity_is_not_cached_and_is_named_once_its_engine_is_there(
    folder, engines
):
    """A Podman container's process while Podman's socket is not there: named by its id,
    pending; asked again, once the service is there, it is its labels' user."""
    cid = secrets.token_hex(32)
    config = config_in(folder)
    resolver = ProcessIdentifier(config, ContainerDirectory(config))
    with process_in_cgroup(f"/machine.slice/libpod-{cid}.scope") as pid:
        first = await resolver.resolve(pid)
        assert first.user == f"container:{cid[:12]}" and first.pending and not first.degraded
        podman = engines(f"{folder}/podman.sock")
        podman.add(cid, ALICE)
        podman.start()
        second = await resolver.resolve(pid)
    resolver.close()
    assert second.user == "alice@example.org" and not second.pending
    assert second.info == ()  # only the configured info labels are kept
    assert podman.requests >= 2  # the version, then the container


@async_test
async def test_a_degraded_identity_is_not_cached_and_is_named_once_the_engine_answers(
    folder, engines
):
    """The Docker Engine answers 500: the container's process is degraded (its container known,
    its user not);
    once the engine answers again (after its fail-fast pause), it is its labels' user."""
    cid = secrets.token_hex(32)
    docker = engines(f"{folder}/docker.sock")
    docker.add(cid, ALICE)
    docker.failing = "the engine is restarting"
    docker.start()
    config = config_in(folder, user_info_labels=("team",))
    resolver = ProcessIdentifier(config, ContainerDirectory(config))
    with process_in_cgroup(f"/system.slice/docker-{cid}.scope") as pid:
        first = await resolver.resolve(pid)
        assert first.user == "unknown" and first.degraded
        assert first.container == (cid[:12], None)
        docker.failing = None
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            second = await resolver.resolve(pid)
            if not second.degraded:
                break
            assert asyncio.get_running_loop().time() < deadline, "never named again"
            await asyncio.sleep(0.02)
    resolver.close()
    assert second.user == "alice@example.org" and second.info == (("team", "vision"),)


@async_test
async def test_an_unknown_container_is_named_by_its_id_and_cached(folder, engines):
    """The engine answers 404: nobody knows it; that answer is final (cached, not pending)."""
    cid = secrets.token_hex(32)
    docker = engines(f"{folder}/docker.sock").start()
    config = config_in(folder)
    resolver = ProcessIdentifier(config, ContainerDirectory(config))
    with process_in_cgroup(f"/system.slice/docker-{cid}.scope") as pid:
        first = await resolver.resolve(pid)
        asked = docker.requests
        docker.add(cid, ALICE)  # it would name it now, but the answer was final
        second = await resolver.resolve(pid)
    resolver.close()
    assert first == second and first.user == f"container:{cid[:12]}"
    assert not first.degraded and not first.pending and docker.requests == asked


# -- the tracker: what it tells the leases while an owner is degraded or pending ---------------


def tracking(leases, resolver, retry=0.01, recheck=0.01):
    """A tracker between fresh process signals and `leases`: (it, the signals, the first
    device's uuid)."""
    tracker, signals = ProcessTracker(leases, resolver, retry=retry, recheck=recheck), Signals()
    tracker.connect(signals)
    return tracker, signals, list(leases.inventory)[0].uuid


class Scripted:
    """A resolver that answers from a list, then the last: what the tracker asks of the
    process identifier (facts, then the identity behind them; resolve() does both)."""

    def __init__(self, *answers: Identity) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def facts(self, pid: int) -> ProcFacts:
        return ProcFacts(pid, 1, None, None)

    async def identify(self, facts: ProcFacts) -> Identity:
        self.asked += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):  # the resolver fails, as a bug in it would
            raise answer
        return answer

    async def resolve(self, pid: int) -> Identity:
        return await self.identify(await self.facts(pid))


DEGRADED = Identity(
    user="unknown", source="container", container=("0123456789ab", None), degraded=True
)  # as containers.unlabelled_identity makes them
PENDING = replace(DEGRADED, user="container:0123456789ab", degraded=False, pending=True)


@pytest.mark.parametrize("unsettled", [DEGRADED, PENDING], ids=["degraded", "pending"])
@async_test
async def test_the_tracker_learns_an_unsettled_owner_and_tells_the_leases(unsettled):
    """A degraded owner (its engine failed) is asked again every owner_retry seconds, a
    pending one (its engine's socket not there) every engine_recheck seconds: here the other
    is an hour."""
    alice = named_user("alice")
    leases = lease_manager()
    resolver = Scripted(unsettled, unsettled, alice)
    hour = 3600.0
    tracker, signals, uuid = tracking(
        leases, resolver, **({"recheck": hour} if unsettled.degraded else {"retry": hour})
    )
    signals.process_started.send(None, record=GpuProcess(uuid, 4242, "C", "python"))
    await until(lambda: leases.holder(uuid) == alice)
    assert resolver.asked == 3 and leases.state(uuid) == "claimed"
    await until(lambda: not tracker._unsettled)
    tracker.close()


@pytest.mark.errors_expected
@async_test
async def test_a_resolver_that_fails_while_the_tracker_asks_again_is_logged_and_asked_on(caplog):
    """A lookup that raises while a degraded owner is asked again loses nothing: it is said
    with the process's pid, and the tracker asks on until the owner is known."""
    alice, leases = named_user("alice"), lease_manager()
    resolver = Scripted(DEGRADED, RuntimeError("the engine's client broke"), DEGRADED, alice)
    tracker, signals, uuid = tracking(leases, resolver)
    signals.process_started.send(None, record=GpuProcess(uuid, 4242, "C", "python"))
    await until(lambda: leases.holder(uuid) == alice)
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failed] == ["resolving pid 4242 failed"]
    assert failed[0].exc_info[1].args == ("the engine's client broke",)
    assert resolver.asked == 4
    tracker.close()


BOB = host_user("bob", 1002)  # the host account a container's process runs as


class Slow(Scripted):
    """A resolver whose engine takes the call and answers only when told to, in a container
    /proc names."""

    def __init__(self, *answers: Identity) -> None:
        super().__init__(*answers)
        self.answer = asyncio.Event()
        self.cancelled = False

    async def facts(self, pid: int) -> ProcFacts:
        return ProcFacts(pid, 1, ContainerRef("docker", "0123456789ab" * 4), BOB)

    async def identify(self, facts: ProcFacts) -> Identity:
        try:
            await self.answer.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return await super().identify(facts)


@async_test
async def test_the_tracker_holds_the_gpu_from_the_moment_a_process_is_seen():
    """Told at once, before anything is asked: the GPU is held by an owner being looked up,
    then in its container, then by its owner once the engine answers (a claim only then)."""
    alice, leases, resolver = named_user("alice"), lease_manager(), Slow(named_user("alice"))
    events = []
    leases.on_event(lambda e: events.append((e.kind, e.user)))
    tracker, signals, uuid = tracking(leases, resolver)
    signals.process_started.send(None, record=GpuProcess(uuid, 4242, "C", "python"))
    assert leases.state(uuid) == "claimed" and leases.holder(uuid) == IDENTIFYING
    await until(lambda: leases.holder(uuid).container is not None)
    assert leases.holder(uuid).identifying and leases.holder(uuid).container[0] == "0123456789ab"
    assert leases.holder(uuid).uid == 1002 and leases.holder(uuid).account == "bob"
    assert events == []
    resolver.answer.set()
    await until(lambda: leases.holder(uuid) == alice)
    assert events == [("claim", "alice")] and leases.state(uuid) == "claimed"
    tracker.close()


@async_test
async def test_a_process_announced_again_while_looked_up_is_looked_up_once():
    """Both monitors (pmon and the cross-check) may announce one process: one lookup."""
    leases, resolver = lease_manager(), Slow(named_user("alice"))
    tracker, signals, uuid = tracking(leases, resolver)
    for _ in range(2):
        signals.process_started.send(None, record=GpuProcess(uuid, 4242, "C", "python"))
    await until(lambda: leases.holder(uuid).container is not None)  # being looked up now
    signals.process_started.send(None, record=GpuProcess(uuid, 4242, "C", "python"))
    resolver.answer.set()
    await until(lambda: leases.holder(uuid) == named_user("alice"))
    assert resolver.asked == 1
    tracker.close()


class Broken(Scripted):
    """A resolver that fails (a bug in it) reading /proc for pid 4242, and identifying the
    others."""

    async def facts(self, pid: int) -> ProcFacts:
        if pid == 4242:
            raise RuntimeError("cannot read /proc")
        return await super().facts(pid)


@pytest.mark.errors_expected
@async_test
async def test_a_resolver_that_fails_leaves_the_gpu_held_by_unknown_and_says_which_pid(caplog):
    leases = lease_manager()
    resolver = Broken(RuntimeError("the engine's client broke"))
    tracker, signals, uuid = tracking(leases, resolver)
    other = list(leases.inventory)[1].uuid
    signals.process_started.send(None, record=GpuProcess(uuid, 4242, "C", "python"))
    signals.process_started.send(None, record=GpuProcess(other, 4243, "C", "python"))
    await until(lambda: not leases.holder(uuid).identifying)
    await until(lambda: not leases.holder(other).identifying)
    assert leases.holder(uuid) == UNKNOWN and leases.holder(other) == UNKNOWN
    assert leases.state(uuid) == leases.state(other) == "claimed"
    failed = sorted(
        (r.getMessage(), r.exc_info[1].args[0])
        for r in caplog.records
        if r.levelno == logging.ERROR
    )
    assert failed == [
        ("resolving pid 4242 failed", "cannot read /proc"),
        ("resolving pid 4243 failed", "the engine's client broke"),
    ]
    tracker.close()


@async_test
async def test_a_process_that_ends_while_looked_up_frees_its_gpu_and_the_lookup_stops():
    leases, resolver = lease_manager(), Slow(named_user("alice"))
    events = []
    leases.on_event(lambda e: events.append((e.kind, e.user)))
    tracker, signals, uuid = tracking(leases, resolver)
    record = GpuProcess(uuid, 4242, "C", "python")
    signals.process_started.send(None, record=record)
    await until(lambda: leases.holder(uuid).container is not None)  # being looked up now
    signals.process_ended.send(None, record=record)
    assert leases.state(uuid) == "free" and leases.holder(uuid) is None
    await until(lambda: resolver.cancelled)
    resolver.answer.set()
    assert leases.state(uuid) == "free" and events == [] and leases.next_deadline() is None
    tracker.close()


@async_test
async def test_an_owner_that_turns_degraded_on_a_retry_is_shown_as_it_was():
    """A pending owner (named by its container) whose engine then fails: the GPU still shows
    the container, not `unknown`, while the tracker keeps asking."""
    leases = lease_manager()
    resolver = Scripted(PENDING, DEGRADED)
    tracker, signals, uuid = tracking(leases, resolver)
    signals.process_started.send(None, record=GpuProcess(uuid, 4242, "C", "python"))
    await until(lambda: resolver.asked >= 4)  # asked again, and again after the degraded one
    assert leases.holder(uuid) == PENDING and leases.holder(uuid).user.startswith("container:")
    tracker.close()


@async_test
async def test_the_tracker_keeps_a_settled_owner_and_asks_no_more():
    bob = host_user("bob", 1002)
    leases = lease_manager()
    alice = named_user("alice")
    resolver = Scripted(bob, alice)
    tracker, signals, uuid = tracking(leases, resolver)
    signals.process_started.send(None, record=GpuProcess(uuid, 4242, "C", "python"))
    await until(lambda: leases.holder(uuid) == bob)
    marker = GpuProcess(list(leases.inventory)[1].uuid, 4243, "C", "python")
    signals.process_started.send(None, record=marker)  # a later process, resolved after
    await until(lambda: leases.holder(marker.uuid) == alice)
    assert leases.holder(uuid) == bob and resolver.asked == 2
    tracker.close()


@async_test
async def test_a_degraded_gpu_owner_is_learned_by_the_daemon_once_the_engine_answers(
    folder, engines, tmp_path
):
    """End to end: the simulator shows a container's process on a GPU while the engine fails;
    the GPU is held by the container (degraded); once the engine answers, by alice."""
    cid = secrets.token_hex(32)
    docker = engines(f"{folder}/docker.sock")
    docker.add(cid, ALICE)
    docker.failing = "the engine is restarting"
    docker.start()
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    with process_in_cgroup(f"/system.slice/docker-{cid}.scope") as pid:
        async with gpu_running(
            scenario, owner_retry=0.05, **engines_in(folder, docker_retry_after=0.05)
        ) as h:
            uuid = h.uuids()[1]
            scenario.write(processes=[{"pid": pid, "gpu": 1, "name": "python"}])
            await until(lambda: not (h.services.leases.holder(uuid) or IDENTIFYING).identifying)
            assert h.services.leases.holder(uuid).degraded  # learned: the engine failed
            docker.failing = None
            await until(lambda: h.services.leases.holder(uuid).user == "alice@example.org")
            claim = (await h.ok("/status"))[uuid]["claim"]
            assert claim["user"]["degraded"] is False and claim["state"] == "claimed"
