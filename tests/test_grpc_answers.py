"""What the kubelet's pod-resources and containerd answer, at its worst, from a real gRPC server
on a unix socket (tests/grpc_server.py) at their sockets: megabytes of junk (decoded off the
event loop, in time linear in its size; over Config.grpc_max_message refused before decoding,
and the source failing until its answers are sane again), newlines in device ids, pod names,
labels and error details (escaped in the log), an OCI spec nested 100,000 deep (a bad spec like
any other), and a server that hangs (the pod's GPU held by an owner not known yet, never free;
SIGTERM ends the call in flight at once). The daemon runs in this process where the test reads
its state, and as `python -m patroller` where a stop or the event loop's thread is measured."""

import json
import logging
import os
import secrets
import signal
import time
import urllib.request
from dataclasses import dataclass, replace

import grpc
import pytest
from grpc_server import Abort, Hang, Server
from helpers import (
    ScenarioFile,
    ServerProcess,
    async_test,
    engines_in,
    gpu_running,
    process_in_cgroup,
    running,
    until,
)
from kubelet import Kubelet, gpu_pod, pod

from patroller.config import Config
from patroller.core.pods import Pod, PodAllocation
from patroller.http.views import claims
from patroller.identify import containerd as ctrd
from patroller.identify.cgroups import ContainerRef
from patroller.identify.containers import ContainerDirectory
from patroller.identify.resolver import ProcessIdentifier
from patroller.observe import protowire as pw
from patroller.observe.podresources import allocations, gpu_of
from patroller.observe.testmode import synthetic_inventory

MIB = 1 << 20
LIMIT = Config.grpc_max_message


def junk(size: int) -> bytes:
    """`size` bytes (even) of the costliest well-formed junk to decode: field 2, a varint 0,
    again and again (nothing the kubelet's answer has, so it lists no pod)."""
    return b"\x10\x00" * (size // 2)


def watch_of(h):
    return next(m for m in h.services.monitors if m.name == "kubelet_pod_resources")


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- the kubelet: size, time, names ------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CountedPod(Pod):
    """A pod that counts how often it is compared."""

    compared = [0]

    def __eq__(self, other):
        self.compared[0] += 1
        return Pod.__eq__(self, other)

    __hash__ = Pod.__hash__


def test_many_pods_of_one_gpu_cost_time_in_proportion():
    """45,000 pods that each list one GPU fit in 4 MiB: finding each pod's place once costs a
    comparison or so, not one with every pod before it (that took 492 s for 87,000)."""
    inventory = synthetic_inventory(2)
    uuid = inventory.devices[0].uuid
    listed = [(CountedPod("ml", f"p{i}"), (f"{uuid}::{i}",)) for i in range(3000)]
    CountedPod.compared[0] = 0
    found, unknown = allocations(listed, inventory)
    assert found[uuid] == PodAllocation(tuple(p for p, _ in listed)) and unknown == set()
    assert CountedPod.compared[0] < 3000 * 2  # a search of a list: about 4.5 million


def test_a_log_line_names_ten_pods_of_a_gpu_at_most():
    pods = PodAllocation(tuple(Pod("ml", f"p{i}") for i in range(25)))
    assert pods.describe() == "pods " + ", ".join(f"ml/p{i}" for i in range(10)) + ", and 15 more"
    assert PodAllocation((Pod("ml", "a"),)).describe() == "pod ml/a"


def test_a_minor_number_of_thousands_of_digits_matches_nothing():
    inventory = synthetic_inventory(2)
    assert gpu_of("nvidia" + "9" * 5000, inventory) is None  # int() refuses so many digits
    assert (
        gpu_of(f"nvidia{inventory.devices[1].minor_number}", inventory)
        == inventory.devices[1].uuid
    )


@pytest.mark.parametrize("size", [int(7.6 * MIB), 57 * MIB])
@async_test
async def test_an_answer_over_the_limit_fails_the_watch_until_answers_are_sane(
    tmp_path, size, caplog
):
    """Before: 7.6 MB stalled the daemon 5.9 s, 57 MB 43 s. Now gRPC refuses it unread."""
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    try:
        async with running(kubelet_socket=kubelet.path, kubelet_every=0.05) as h:
            uuid = h.uuids()[0]
            watch, state = watch_of(h), lambda: h.services.leases.state(uuid)
            kubelet.pods = [gpu_pod("ml", "train-0", uuid)]
            await until(lambda: state() == "allocated")
            kubelet.answer = junk(size)
            failures = watch.failures
            await until(lambda: watch.failures > failures + 1, timeout=30)
            assert state() == "allocated" and watch.metrics().state == "failing"
            [said] = [m for m in warnings(caplog) if "cannot read the kubelet" in m]
            assert f"larger than {LIMIT} bytes, the most taken" in said, said
            assert "RESOURCE_EXHAUSTED" in said
            kubelet.answer = None  # sane again: the pod's listing
            await until(lambda: watch.metrics().state == "up")
            kubelet.pods = []
            await until(lambda: state() == "free")
    finally:
        kubelet.stop()


def thread_cpu(pid: int) -> dict[int, int]:
    """Nanoseconds each thread of a process has run on a CPU (/proc's schedstat)."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                found[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return found


def test_junk_under_the_limit_is_decoded_off_the_event_loop(tmp_path):
    """The daemon as a process: an answer just under the limit, costly to decode, asked every
    2 s. Its decoding runs in threads other than the event loop's (the main thread): a second
    of their CPU time is spent on it while nothing else runs there, and /status is answered
    while they run. The latencies are printed: the assertions are on the threads, not on this
    machine's speed (before: decoded on the loop, /status waited for each decoding)."""
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    server = ServerProcess("--test", "--kubelet-socket", kubelet.path).start()
    main = server.process.pid
    try:
        deadline = time.monotonic() + 30
        while kubelet.answered == 0:  # the watch is up
            assert time.monotonic() < deadline, server.log
            time.sleep(0.02)
        kubelet.answer = junk(LIMIT - 64)
        answered = kubelet.answered
        while kubelet.answered == answered:
            assert time.monotonic() < deadline, server.log
            time.sleep(0.005)
        start, latencies, during = thread_cpu(main), [], 0
        deadline = time.monotonic() + 60
        while True:
            time.sleep(0.01)  # a pace, not a wait for anything: asked about 50 times a second
            before = thread_cpu(main)
            began = time.monotonic()
            with urllib.request.urlopen(server.url + "/status", timeout=60) as answer:
                assert answer.status == 200 and json.loads(answer.read())
            latencies.append(time.monotonic() - began)
            after = thread_cpu(main)
            others = sum(after[t] - before.get(t, 0) for t in after if t != main)
            during += others >= 1_000_000  # another thread ran 1 ms or more meanwhile
            spent = {t: after[t] - start.get(t, 0) for t in after}
            off_loop = sum(ns for t, ns in spent.items() if t != main)
            if off_loop >= 1_000_000_000:  # a second of decoding, at least, off the loop
                break
            assert time.monotonic() < deadline, (
                f"the decoding ran on the event loop's thread: {spent[main] / 1e9:.2f} s on it, "
                f"{off_loop / 1e9:.2f} s on the others"
            )
        print(
            f"decoding {LIMIT - 64} bytes every 2 s, {kubelet.answered - answered} answers: "
            f"{len(latencies)} /status, slowest {max(latencies) * 1000:.0f} ms, median "
            f"{sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms; {during} answered while "
            f"another thread ran; loop thread {spent[main] / 1e9:.2f} s, others "
            f"{off_loop / 1e9:.2f} s"
        )
        assert during >= 1
    finally:
        server.stop(signal.SIGKILL)
        kubelet.stop()


@async_test
async def test_newlines_in_device_ids_and_pod_names_stay_in_their_log_line(tmp_path, caplog):
    """Before: a device id `x\\nFORGED` wrote a log line of its own. And many ids that match
    no GPU are logged a few by name, the rest counted."""
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    forged = "GPU-x\n2030-01-01 00:00:00 WARNING patroller: FORGED"
    try:
        with caplog.at_level(logging.INFO):
            async with running(kubelet_socket=kubelet.path, kubelet_every=0.05) as h:
                uuid = h.uuids()[0]
                strays = [f"GPU-z-{i}" for i in range(25)]  # after the forged one
                kubelet.pods = [
                    pod(
                        "ml\nFORGED",
                        "train\x1b[2J",
                        [("main\r", [("nvidia.com/gpu", [uuid, forged, *strays])])],
                    )
                ]
                await until(lambda: h.services.leases.state(uuid) == "allocated")
                [claimed] = (await h.ok("/status"))[uuid]["claim"]["pods"]
                assert claimed == {
                    "namespace": "ml\\nFORGED",
                    "name": "train\\x1b[2J",
                    "containers": ["main\\r"],
                }
        said = [r.getMessage() for r in caplog.records]
        assert not [m for m in said if "\n" in m or "\r" in m or "\x1b" in m], said
        ids = [m for m in said if "the kubelet assigns" in m]
        assert len(ids) == Config.kubelet_ids_logged + 1, ids
        assert any("GPU-x\\n2030-01-01" in m for m in ids)
        assert "the kubelet assigns 16 more devices" in ids[-1]
        assert any("pod ml\\nFORGED/train\\x1b[2J" in m for m in said)
    finally:
        kubelet.stop()


def test_sigterm_ends_the_kubelets_call_in_flight(tmp_path):
    """The daemon as a process, the kubelet hanging in List: SIGTERM ends the call (the server
    sees it cancelled, its deadline far off) and the daemon in order (before: the call
    waited out to its 5 s timeout, 5.2 s)."""
    hang = Hang()
    kubelet = Kubelet(str(tmp_path / "kubelet.sock"), hang=hang).start()
    server = ServerProcess("--test", "--kubelet-socket", kubelet.path).start()
    try:
        assert hang.started.wait(30), server.log
        began = time.monotonic()
        assert server.stop(signal.SIGTERM, timeout=30) == 0, server.log
        took = time.monotonic() - began
        deadline = time.monotonic() + 10
        while not hang.ended:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        print(f"stopped {took:.2f} s after SIGTERM; the call had {hang.ended[0]:.2f} s left")
        assert hang.ended[0] > Config.kubelet_timeout / 2  # ended by the daemon, not waited out
        assert "stopped" in server.log and "cannot read" not in server.log, server.log
    finally:
        hang.release.set()
        server.stop(signal.SIGKILL)
        kubelet.stop()


# -- containerd: a spec, names, size, a hang --------------------------------------------------


def container(cid, labels, spec=None):
    """A GetContainerResponse: Container {id 1, labels 2, image 3, spec 5 (an Any)}."""
    body = pw.string(1, cid) + pw.string_map(2, labels) + pw.string(3, "example/image:1")
    if spec is not None:
        body += pw.delimited(
            5,
            pw.string(1, "types.containerd.io/opencontainers/runtime-spec/1/Spec")
            + pw.delimited(2, spec),
        )
    return pw.delimited(1, body)


DEEP = b'{"annotations": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def test_a_spec_nested_100000_deep_costs_only_its_annotations():
    found = ctrd.read_get(container("c" * 64, {"a": "1"}, DEEP))
    assert found.labels == {"a": "1"} and found.annotations == {}


@pytest.fixture
def fake_containerd(engine_sockets):
    """A gRPC server at containerd's socket answering Get with `.get` (a handler)."""

    class Fake:
        get = staticmethod(lambda request: b"")

    fake = Fake()
    path = os.path.join(engine_sockets, "containerd.sock")
    server = Server(path, {ctrd.GET: lambda request: fake.get(request)}).start()
    fake.server, fake.path = server, path
    yield fake
    server.stop()


SANDBOX_UID = "0f2c1e3a-1111-2222-3333-444455556666"


class AsContainer:
    """This test's own process, taken to be in containerd's container `cid` of a pod."""

    def __init__(self, config):
        self.identifier = ProcessIdentifier(config, ContainerDirectory(config))
        self.asked = 0

    async def identify(self, cid):
        self.asked += 1  # another start time each time: not the identity cached for the last
        facts = await self.identifier.facts(os.getpid())
        facts = replace(
            facts,
            start=facts.start + self.asked,
            container=ContainerRef("containerd", cid, pod=SANDBOX_UID),
        )
        return await self.identifier.identify(facts)


@async_test
async def test_newlines_in_labels_and_error_details_stay_in_their_log_line(
    fake_containerd, engine_sockets, caplog
):
    me = AsContainer(replace(Config(), **engines_in(engine_sockets, containerd_retry_after=0)))
    cid = secrets.token_hex(32)
    fake_containerd.get = lambda request: container(
        cid,
        {
            "io.kubernetes.pod.namespace": "ml",
            "io.kubernetes.pod.name": "p",
            "io.kubernetes.pod.uid": "other\nFORGED line",
        },
    )
    identity = await me.identify(cid)
    assert identity.user == f"container:{cid[:12]}"  # labelled as another pod: not taken

    def refuse(request):
        raise Abort(grpc.StatusCode.INTERNAL, "boom\nFORGED line")

    fake_containerd.get = refuse
    assert (await me.identify(secrets.token_hex(32))).degraded
    me.identifier.close()
    said = warnings(caplog)
    assert not [m for m in said if "\n" in m], said
    assert any("pod other\\nFORGED line" in m for m in said)
    assert any("boom\\nFORGED line" in m for m in said)


@async_test
async def test_an_answer_over_the_limit_degrades_until_answers_are_sane(
    fake_containerd, engine_sockets, caplog
):
    me = AsContainer(replace(Config(), **engines_in(engine_sockets, containerd_retry_after=0)))
    cid = secrets.token_hex(32)
    fake_containerd.get = lambda request: container(
        cid, {"user.email": "erin@example.org"}, b" " * LIMIT
    )
    identity = await me.identify(cid)
    assert identity.degraded and identity.user == "unknown"
    [said] = warnings(caplog)
    assert f"larger than {LIMIT} bytes, the most taken" in said, said
    fake_containerd.get = lambda request: container(cid, {"user.email": "erin@example.org"})
    assert (await me.identify(cid)).user == "erin@example.org"
    me.identifier.close()


CONTAINERD_SCOPE = "/system.slice/ptg{}/cri-containerd-{}.scope"  # no other engine's


@async_test
async def test_a_spec_nested_100000_deep_leaves_the_labels_owner(fake_containerd, engine_sockets):
    """Before: a RecursionError reached the tracker, and the process stayed `unknown` for good
    (an error logged, never asked again)."""
    cid = secrets.token_hex(32)
    fake_containerd.get = lambda request: container(cid, {"user.email": "erin@example.org"}, DEEP)
    scenario = ScenarioFile(os.path.join(engine_sockets, "scenario.json"), devices=[{}, {}])
    with process_in_cgroup(CONTAINERD_SCOPE.format(os.getpid(), cid)) as pid:
        async with gpu_running(scenario, **engines_in(engine_sockets)) as h:
            scenario.write(processes=[{"pid": pid, "gpu": 1, "name": "python"}])
            gpu = h.uuids()[1]
            await until(
                lambda: (
                    (claims(h.services.leases)[gpu]["user"] or {}).get("user")
                    == "erin@example.org"
                )
            )
            owner = (await h.ok("/status"))[gpu]["claim"]["user"]
            assert owner["degraded"] is False and owner["container"]["id"] == cid[:12]


@async_test
async def test_a_hung_containerd_holds_the_gpu_for_an_owner_not_known_yet(engine_sockets):
    """containerd takes the call and answers nothing (its timeout here 60 s): from the moment
    the process is seen, its GPU is held by `unknown` (degraded, in its container), never free
    and never granted, and nobody's claim; once containerd answers, the labels' user claims it
    (before: free for the whole timeout, 5 s by default; then for 1 s)."""
    hang = Hang()
    cid = secrets.token_hex(32)
    hang.answer = lambda request: container(cid, {"user.email": "erin@example.org"})
    server = Server(os.path.join(engine_sockets, "containerd.sock"), {ctrd.GET: hang}).start()
    scenario = ScenarioFile(os.path.join(engine_sockets, "scenario.json"), devices=[{}, {}])
    try:
        with process_in_cgroup(CONTAINERD_SCOPE.format(os.getpid(), cid)) as pid:
            async with gpu_running(
                scenario, **engines_in(engine_sockets, containerd_timeout=60)
            ) as h:
                leases, gpu = h.services.leases, h.uuids()[1]
                seen, claimed = [], []  # the GPU's state at every change while pid is on it
                leases.on_change(
                    lambda: (
                        seen.append(leases.state(gpu))
                        if pid in leases.holds[gpu].processes
                        else None
                    )
                )
                leases.on_event(lambda e: claimed.append(e.user) if e.kind == "claim" else None)
                scenario.write(processes=[{"pid": pid, "gpu": 1, "name": "python"}])
                await until(lambda: hang.in_flight == 1, timeout=20)
                assert not hang.ended and seen and set(seen) == {"claimed"}
                owner = (await h.ok("/status"))[gpu]["claim"]["user"]
                assert owner["user"] == "unknown" and owner["degraded"] is True
                assert owner["container"]["id"] == cid[:12]  # /proc told that much
                assert owner["identifying"] is True
                status, _ = await h.call("/request?gpu=2")
                assert status == 409  # not handed out meanwhile
                assert claimed == []  # nobody's claim yet
                hang.release.set()
                await until(
                    lambda: (claims(leases)[gpu]["user"] or {}).get("user") == "erin@example.org"
                )
                owner = (await h.ok("/status"))[gpu]["claim"]["user"]
                assert owner["degraded"] is False and owner["container"]["id"] == cid[:12]
                assert "identifying" not in owner
                assert claimed == ["erin@example.org"] and "free" not in seen
    finally:
        hang.release.set()
        server.stop()


def test_sigterm_ends_containerds_call_in_flight(engine_sockets):
    """The daemon as a process, containerd hanging in Get for a GPU process: SIGTERM ends the
    call (the server sees it cancelled, its deadline far off) and the daemon in order."""
    hang = Hang()
    server = Server(os.path.join(engine_sockets, "containerd.sock"), {ctrd.GET: hang}).start()
    scenario = ScenarioFile(os.path.join(engine_sockets, "scenario.json"), devices=[{}, {}])
    cid = secrets.token_hex(32)
    daemon = None
    try:
        with process_in_cgroup(CONTAINERD_SCOPE.format(os.getpid(), cid)) as pid:
            scenario.write(processes=[{"pid": pid, "gpu": 1, "name": "python"}])
            daemon = ServerProcess(
                "--nvidia-smi",
                scenario.command,
                "--podman-socket",
                "none",
                "--containerd-socket",
                f"unix://{engine_sockets}/containerd.sock",
                "--docker-host",
                f"unix://{engine_sockets}/docker.sock",
            ).start()
            assert hang.started.wait(30), daemon.log
            began = time.monotonic()
            assert daemon.stop(signal.SIGTERM, timeout=30) == 0, daemon.log
            took = time.monotonic() - began
            deadline = time.monotonic() + 10
            while not hang.ended:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            print(f"stopped {took:.2f} s after SIGTERM; the call had {hang.ended[0]:.2f} s left")
            assert hang.ended[0] > Config.containerd_timeout / 2
            assert "stopped" in daemon.log and "cannot read" not in daemon.log, daemon.log
    finally:
        hang.release.set()
        if daemon is not None:
            daemon.stop(signal.SIGKILL)
        server.stop()
