"""The kubelet's pod-resources (--kubelet-socket): its answer decoded from the public api.proto's
field numbers, device ids mapped to the host's GPUs, and the daemon asking a real gRPC server on
a unix socket (tests/kubelet.py): a pod's GPU is allocated to it and never granted, a host
process on it trespasses, the GPU is granted again once the kubelet lets go; a socket that is
not there costs nothing, and a kubelet that fails keeps the pods' GPUs theirs until it is back."""

import asyncio
import json
import logging
import subprocess
from dataclasses import replace

import pytest
from grpc_server import Hang
from helpers import ScenarioFile, async_test, find, gpu_running, running, scrape, until
from kubelet import Kubelet, gpu_pod, pod

from patroller.config import Config
from patroller.config.flags import load
from patroller.core.devices import Inventory, MigInstance
from patroller.core.pods import Pod, PodAllocation
from patroller.observe.podresources import (
    PodResourcesWatch,
    allocations,
    gpu_of,
    is_gpu,
    parse_list,
)
from patroller.observe.protowire import WireError, delimited, integer, string
from patroller.observe.signals import Signals
from patroller.observe.testmode import synthetic_inventory

GPUS = Config().kubelet_resources


def listing(*pods: bytes) -> bytes:
    return b"".join(delimited(1, p) for p in pods)


def test_the_answer_gives_each_pods_gpu_containers_and_ids():
    answer = listing(
        pod(
            "ml",
            "train-0",
            [
                (
                    "trainer",
                    [("nvidia.com/gpu", ["GPU-a", "GPU-b"]), ("example.com/nic", ["eth1"])],
                ),
                ("sidecar", []),
                ("eval", [("nvidia.com/gpu.shared", ["GPU-c::3", "GPU-a"])]),
            ],
        ),
        pod("web", "nginx", [("nginx", [("example.com/nic", ["eth2"])])]),  # no GPU: left out
        gpu_pod("ml", "mig", "MIG-GPU-d/1/0", resource="nvidia.com/mig-1g.10gb"),
    )
    assert parse_list(answer, GPUS) == [
        (Pod("ml", "train-0", ("trainer", "eval")), ("GPU-a", "GPU-b", "GPU-c::3")),
        (Pod("ml", "mig", ("main",)), ("MIG-GPU-d/1/0",)),
    ]
    assert parse_list(b"", GPUS) == []  # no pod at all


@pytest.mark.parametrize(
    "resource,counts",
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("nvidia.com/mig-3g.40gb.shared", True),
        ("nvidia.com/gpus", False),
        ("amd.com/gpu", False),
        ("example.com/nic", False),
        ("", False),
    ],
)
def test_only_gpu_resources_count(resource, counts):
    assert is_gpu(resource, GPUS) is counts


@pytest.mark.parametrize(
    "answer",
    [
        b"\x0a\xff",
        b"\x08\x01",
        b"\x0f",  # past the end; pods as a number; wire type 7
        listing(integer(1, 5) + gpu_pod("ml", "a", "GPU-a")),  # a name that is a number
        listing(string(3, "\xff")),  # containers that are no message (a varint past the end)
        listing(gpu_pod("ml", "a", "GPU-a")[:-1]),
    ],
)  # cut short
def test_an_answer_that_is_no_such_message_is_a_wire_error(answer):
    with pytest.raises(WireError):
        parse_list(answer, GPUS)


def test_device_ids_map_to_the_gpu_they_are_or_are_on():
    inventory = synthetic_inventory(3)
    first, second, third = (d.uuid for d in inventory)
    lost = Inventory([replace(d, lost=True) if d.uuid == third else d for d in inventory])
    minor = inventory.by_number(1).minor_number
    assert gpu_of(first, lost) == first
    assert gpu_of(f"{second}::7", lost) == second  # a time-slicing replica
    assert gpu_of(f"MIG-{second}/1/0", lost) == second  # a MIG device, as drivers before R470
    assert gpu_of(f"MIG-{second}/1/0::2", lost) == second  # a replica of it
    assert gpu_of(f"nvidia{minor}", lost) == second
    for unknown in [
        "MIG-8e2b1c3a-0000-4000-8000-000000000001",
        "GPU-elsewhere",
        third,
        first.lower() + "x",
        "",
        "::1",
        "nvidia99",
    ]:
        assert gpu_of(unknown, lost) is None, unknown


def test_a_mig_uuid_maps_to_the_gpu_that_holds_it():
    inventory = synthetic_inventory(3)
    first, second, third = (d.uuid for d in inventory)
    mig = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"  # as nvidia-smi -L lists it (R470 on)
    other = "MIG-0929581a-2be6-549f-a016-ba1fd7359f23"
    instances = {
        second: (
            MigInstance(0, 1, 0, 9856, "MIG-3adbed3a-d03d-549f-a016-ba1fd7359f23"),
            MigInstance(1, 2, 0, 9856, mig),
            MigInstance(2, 3, 0, 9856),
        ),
        third: (MigInstance(0, 1, 0, 9856, other),),
    }
    found = Inventory(
        [
            replace(
                d,
                mig_mode="Enabled",
                mig_instances=instances.get(d.uuid, ()),
                lost=d.uuid == third,
            )
            for d in inventory
        ]
    )
    assert gpu_of(mig, found) == second
    assert gpu_of(f"{mig}::3", found) == second  # a time-slicing replica of it
    assert gpu_of(other, found) is None  # on a GPU that is lost
    for unknown in [
        "MIG-8e2b1c3a-0000-4000-8000-000000000001",
        mig[4:],
        mig.lower() + "0",
        "MIG-",
        f"GPU-{mig[4:]}",
    ]:
        assert gpu_of(unknown, found) is None, unknown
    assert gpu_of(first, found) == first


def test_the_pods_of_each_gpu_each_once_and_ids_that_match_nothing():
    inventory = synthetic_inventory(2)
    first, second = (d.uuid for d in inventory)
    a, b = Pod("ml", "a"), Pod("ml", "b")
    found, unknown = allocations(
        [(a, (f"{first}::0", f"{first}::1", second)), (b, (f"{first}::2", "MIG-x"))], inventory
    )
    assert found == {first: PodAllocation((a, b)), second: PodAllocation((a,))}
    assert unknown == {"MIG-x"}


def test_an_id_that_matches_nothing_is_logged_once(caplog):
    inventory = synthetic_inventory(1)
    signals, told = Signals(), []
    signals.scheduler_allocation.connect(lambda sender, record: told.append(record), weak=False)
    watch = PodResourcesWatch(inventory, signals, Config(kubelet_socket="/nonexistent.sock"))
    listed = [(Pod("ml", "a"), ("MIG-x", inventory.devices[0].uuid))]
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            watch.apply(*allocations(listed, inventory))
    assert sum("MIG-x" in r.getMessage() for r in caplog.records) == 1
    assert [(r.uuid, r.source) for r in told] == [(inventory.devices[0].uuid, "kubernetes")]


def test_the_flag_defaults_to_the_kubelets_socket_and_none_turns_it_off():
    assert load([], {}).kubelet_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert load(["--test"], {}).kubelet_socket is None
    assert load(["--kubelet-socket", "none"], {}).kubelet_socket is None
    assert load(["--kubelet-socket", ""], {}).kubelet_socket is None
    assert load([], {"PATROLLER_KUBELET_SOCKET": "/run/k.sock"}).kubelet_socket == "/run/k.sock"


def watch_of(h) -> PodResourcesWatch:
    return next(m for m in h.services.monitors if m.name == "kubelet_pod_resources")


@async_test
async def test_a_socket_that_is_not_there_costs_nothing(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="patroller.observe"):
        async with running(kubelet_socket=str(tmp_path / "kubelet.sock"), kubelet_every=0.02) as h:
            watch = watch_of(h)
            await until(lambda: watch.readings > 5)
            assert watch.failures == 0
            assert (await h.ok("/metrics.json"))["monitors"]["kubelet_pod_resources"] == {
                "state": "idle",
                "readings": watch.readings,
                "failures": 0,
                "allocated": 0,
            }
            assert len(await h.ok("/request?gpu=8&user=bob")) == 8
    assert not [r for r in caplog.records if "kubelet" in r.getMessage()]


@async_test
async def test_a_pods_gpu_is_its_own_while_the_kubelet_lists_it(tmp_path):
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    try:
        async with running(kubelet_socket=kubelet.path, kubelet_every=0.05) as h:
            uuid = h.uuids()[2]
            kubelet.pods = [gpu_pod("ml", "train-0", f"{uuid}::1", container="trainer")]
            await until(lambda: h.services.leases.state(uuid) == "allocated")
            claim = (await h.ok("/status"))[uuid]["claim"]
            assert claim["pods"] == [
                {"namespace": "ml", "name": "train-0", "containers": ["trainer"]}
            ]
            assert claim["hold"] == "kubernetes" and claim["user"]["user"] == "namespace:ml"
            samples, _, _ = await scrape(h)
            assert find(
                samples,
                "patroller_gpu_holder_info",
                uuid=uuid,
                state="allocated",
                user="namespace:ml",
                pod="ml/train-0",
            ) == [1]
            assert len(await h.ok("/request?gpu=7&user=bob")) == 7
            status, busy = await h.call("/request?gpu=1&user=carol")
            assert status == 409 and busy["free"] == {"gpu": 0}
            status, refused = await h.call(f"/release?uuid={uuid}&user=carol", "POST", b"")
            assert status == 403 and refused["pods"] == ["ml/train-0"]
            kubelet.pods = []  # the pod ended: a waiter gets the GPU
            [got] = await h.ok("/wait?gpu=1&user=carol&timeout=10")
            assert got["uuid"] == uuid
            events = [e for e in await h.ok("/history") if e["event"].endswith("allocated")]
            assert [(e["event"], e["pods"]) for e in events] == [
                ("allocated", ["ml/train-0"]),
                ("deallocated", ["ml/train-0"]),
            ]
    finally:
        kubelet.stop()


@async_test
async def test_a_failing_kubelet_keeps_the_pods_gpus_until_it_answers_again(tmp_path, caplog):
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    try:
        async with running(kubelet_socket=kubelet.path, kubelet_every=0.05) as h:
            uuid = h.uuids()[0]
            watch, state = watch_of(h), lambda: h.services.leases.state(uuid)
            kubelet.pods = [gpu_pod("ml", "train-0", uuid)]
            await until(lambda: state() == "allocated")
            for breaking in ("broken", "garbage"):
                setattr(kubelet, breaking, True)
                failures = watch.failures
                await until(lambda: watch.failures > failures + 2)
                assert state() == "allocated" and watch.metrics().state == "failing"
                setattr(kubelet, breaking, False)
                await until(lambda: watch.metrics().state == "up")
            kubelet.stop()  # the kubelet restarts: its socket goes, then comes back
            failures = watch.failures
            await until(lambda: watch.failures > failures + 2)
            assert state() == "allocated"
            assert (
                f"cannot read the kubelet's pod-resources: {kubelet.path} is gone; the "
                "allocations known are kept"
            ) in [r.getMessage() for r in caplog.records]
            kubelet = Kubelet(kubelet.path).start()  # and lists no pod on it now
            await until(lambda: state() == "free")
            assert watch.metrics().state == "up"
    finally:
        kubelet.stop()


@async_test
async def test_a_host_process_on_a_pods_gpu_trespasses(tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    outsider = subprocess.Popen(["sleep", "120"])  # root, on the host: in no pod
    try:
        async with gpu_running(scenario, kubelet_socket=kubelet.path, kubelet_every=0.05) as h:
            uuid = h.uuids()[1]
            state = lambda: h.services.leases.state(uuid)
            kubelet.pods = [gpu_pod("ml", "train-0", uuid)]
            await until(lambda: state() == "allocated", timeout=20)
            status, busy = await h.call("/request?gpu=2")
            assert status == 409 and busy["free"] == {"gpu": 1}
            scenario.write(processes=[{"pid": outsider.pid, "gpu": 1, "name": "sleep"}])
            await until(lambda: state() == "shared", timeout=20)
            [trespass] = [e for e in await h.ok("/history") if e["event"] == "trespass"]
            assert (trespass["user"], trespass["pid"], trespass["why"], trespass["pods"]) == (
                "root",
                outsider.pid,
                "outside_pod",
                ["ml/train-0"],
            )
            assert (await h.ok("/users"))["root"]["trespassing"] == 1
            # the trespasser leaves, then the pod ends: the GPU is granted again
            outsider.kill()
            scenario.write(processes=[])
            await until(lambda: state() == "allocated", timeout=20)
            kubelet.pods = []
            await until(lambda: state() == "free", timeout=20)
            granted = await h.ok("/request?gpu=2")
            assert uuid in {d["uuid"] for d in granted}
    finally:
        outsider.kill()
        outsider.wait()
        kubelet.stop()


@async_test
async def test_a_pods_name_is_hidden_with_its_holder(tmp_path):
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    try:
        async with running(hide_users=True, kubelet_socket=kubelet.path, kubelet_every=0.05) as h:
            uuid = h.uuids()[0]
            kubelet.pods = [gpu_pod("ml", "train-0", uuid, container="trainer")]
            await until(lambda: h.services.leases.state(uuid) == "allocated")
            theirs = (await h.ok("/status?user=bob"))[uuid]["claim"]
            assert theirs["user"]["user"] != "namespace:ml" and theirs["user"]["pod"] is None
            assert theirs["pods"] == [{"namespace": None, "name": None, "containers": []}]
            [allocated] = [e for e in await h.ok("/history?user=bob") if e["event"] == "allocated"]
            assert allocated["pods"] is None
            for path in ("/status?user=bob", "/history?user=bob", "/users?user=bob"):
                assert "train-0" not in json.dumps(await h.ok(path))
            mine = (await h.ok("/status?user=namespace:ml"))[uuid]["claim"]
            assert mine["pods"][0]["name"] == "train-0"
            assert (await h.ok("/users?user=namespace:ml"))["namespace:ml"]["pods"] == [
                "ml/train-0"
            ]
    finally:
        kubelet.stop()


@async_test
async def test_the_job_map_and_the_kubelet_never_clear_each_others(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    try:
        async with running(
            slurm_job_map=str(jobs),
            job_map_every=0.05,
            kubelet_socket=kubelet.path,
            kubelet_every=0.05,
        ) as h:
            uuid = h.uuids()[0]
            watch, hold = watch_of(h), lambda: h.services.leases.holds[uuid]
            kubelet.pods = [gpu_pod("ml", "train-0", uuid)]
            await until(lambda: hold().how == "kubernetes")
            (jobs / "0").write_text("4242 uid=1001 user=carol\n")
            await until(lambda: hold().how == "slurm")  # a GPU both list is the job's
            kubelet.pods = []  # the kubelet lets go: the job keeps it
            readings = watch.readings
            await until(lambda: watch.readings > readings + 3)
            assert hold().how == "slurm" and hold().state == "allocated"
            kubelet.pods = [gpu_pod("ml", "train-0", uuid)]
            await until(lambda: watch.metrics().allocated == 1)
            (jobs / "0").unlink()  # the job ends: the pod holds it
            await until(lambda: hold().how == "kubernetes")
            kubelet.pods = []
            await until(lambda: hold().state == "free")
    finally:
        kubelet.stop()


def test_a_name_as_long_as_kubernetes_allows_is_kept_whole():
    long = "n" * 63
    name = ".".join([long] * 4)[:253]  # a DNS subdomain name at its longest
    [(found, ids)] = parse_list(listing(gpu_pod(long, name, "GPU-a")), GPUS)
    assert (found.namespace, found.name, ids) == (long, name, ("GPU-a",))


def test_the_watch_is_idle_until_the_kubelet_answers():
    watch = PodResourcesWatch(
        synthetic_inventory(1), Signals(), Config(kubelet_socket="/nonexistent.sock")
    )
    assert watch.metrics().state == "idle"


@async_test
async def test_the_watch_asks_within_its_timeout_and_refuses_an_answer_over_its_limit(tmp_path):
    hang = Hang()
    kubelet = Kubelet(str(tmp_path / "kubelet.sock"), hang=hang).start()
    inventory = synthetic_inventory(1)
    try:
        watch = PodResourcesWatch(
            inventory,
            Signals(),
            Config(kubelet_socket=kubelet.path, kubelet_timeout=0.3, grpc_max_message=4096),
        )
        await asyncio.wait_for(watch.read(), 20)  # the call runs out after 0.3 s
        assert watch.metrics().state == "failing"
        await until(lambda: hang.ended)  # the kubelet saw the call end
        hang.answer = lambda request: listing(
            *(gpu_pod("ml", f"train-{n}", inventory.devices[0].uuid) for n in range(100))
        )
        hang.release.set()
        await asyncio.wait_for(watch.read(), 20)  # answered, but over 4 KiB
        assert watch.metrics().state == "failing" and watch.failures == 2
    finally:
        hang.release.set()
        kubelet.stop()


def test_ids_that_match_nothing_are_named_so_many_at_most_then_counted(caplog):
    inventory = synthetic_inventory(1)
    watch = PodResourcesWatch(
        inventory, Signals(), Config(kubelet_socket="/nonexistent.sock", kubelet_ids_logged=2)
    )
    with caplog.at_level(logging.WARNING):
        watch.apply({}, {"MIG-a", "MIG-b"})  # two: each named
        watch.apply({}, {"MIG-a", "MIG-b", "MIG-c", "MIG-d", "MIG-e"})  # three more
    assert [r.getMessage() for r in caplog.records] == [
        *(
            f"the kubelet assigns device {name}, which is no GPU of this host that Patroller can "
            "tell: ignored (a MIG device nvidia-smi -L did not list, or another host's?)"
            for name in ("MIG-a", "MIG-b", "MIG-c", "MIG-d")
        ),
        "the kubelet assigns 1 more devices that are no GPU of this host: ignored",
    ]


def test_a_lost_gpu_names_nothing_and_hides_no_other():
    first, second = synthetic_inventory(2).devices
    devices = [replace(first, lost=True), second]
    listed = [(Pod("ml", "a"), (first.uuid,)), (Pod("ml", "b"), (second.uuid, "nvidia1"))]
    found, unknown = allocations(listed, devices)
    assert found == {second.uuid: PodAllocation((Pod("ml", "b"),))}
    assert unknown == {first.uuid}
