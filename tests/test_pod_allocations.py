"""Kubernetes pods in the lease rules: a GPU the kubelet assigns to a pod is the pod's, never
granted, never released by Patroller; a process outside the pod trespasses; when the kubelet
lets go, the usual rules go on. The Slurm job map and the kubelet are kept apart. A fake clock
and no I/O (the leases fixture: conftest.py)."""

import pytest
from helpers import host_user as host
from helpers import recorded
from helpers import uuid_of as uuid

from patroller.config import Config
from patroller.core.errors import Busy, NotYours
from patroller.core.identity import Identity, named_user
from patroller.core.jobs import Allocation, Job
from patroller.core.pods import Pod, PodAllocation, pod_id
from patroller.http.views import claims, usage, users_view

alice, bob = named_user("alice"), named_user("bob")
ROOT = Identity(user="root", source="host", account="root", uid=0)
TRAIN = Pod("ml", "train-0", ("trainer",))
PODS = PodAllocation((TRAIN,))
JOBS = Allocation((Job(id="4242", uid=1001, user="carol"),))


def in_pod(user: str, namespace: str, name: str, container: str = "trainer") -> Identity:
    """A pod's process, as the container runtime's labels make its identity."""
    return Identity(
        user=user,
        source="pod",
        pod=(("namespace", namespace), ("name", name), ("uid", "0f1e"), ("container", container)),
    )


def test_a_pods_gpu_is_its_own_and_never_granted(leases):
    events = recorded(leases)
    leases.request(alice, {"gpu": 7})
    device = uuid(leases, 7)
    leases.allocate(device, PODS, "kubernetes")
    assert leases.state(device) == "allocated"
    holder = leases.holder(device)
    assert (holder.user, holder.source, dict(holder.pod)) == (
        "namespace:ml",
        "pod",
        {"namespace": "ml", "name": "train-0"},
    )
    with pytest.raises(Busy):
        leases.request(bob, {"gpu": 1})
    claim = claims(leases)[device]
    assert claim["hold"] == "kubernetes" and claim["expires"] is None and claim["jobs"] is None
    assert claim["pods"] == [{"namespace": "ml", "name": "train-0", "containers": ["trainer"]}]
    assert [(e.kind, e.user, e.details) for e in events if e.kind == "allocated"] == [
        ("allocated", "namespace:ml", {"pods": ["ml/train-0"]})
    ]


def test_no_lease_runs_and_the_pods_process_becomes_the_holder(leases, clock):
    device = uuid(leases, 2)
    leases.allocate(device, PODS, "kubernetes")
    clock.advance(Config().lease * 10)
    assert leases.expire() == [] and leases.next_deadline() is None
    assert users_view(leases, None)["namespace:ml"]["pods"] == ["ml/train-0"]
    leases.process_started(device, 500, in_pod("carol@example.org", "ml", "train-0"))
    assert leases.state(device) == "claimed"
    assert leases.holder(device).user == "carol@example.org"
    assert users_view(leases, None)["carol@example.org"]["pods"] == ["ml/train-0"]
    leases.process_ended(device, 500)
    clock.advance(Config().lease * 10)
    assert leases.expire() == [] and leases.state(device) == "allocated"


def test_other_pods_and_host_processes_trespass_once(leases):
    events = recorded(leases)
    device = uuid(leases, 3)
    leases.allocate(device, PODS, "kubernetes")
    leases.process_started(device, 100, in_pod("carol", "ml", "train-0"))
    leases.process_started(device, 101, in_pod("dave", "ml", "other-1"))  # another pod
    leases.process_started(device, 102, in_pod("dave", "ml", "other-1"))
    leases.process_started(device, 103, host("carol", 1001))  # the pod's user, outside it
    leases.process_started(device, 104, in_pod("carol", "prod", "train-0"))  # same name elsewhere
    assert leases.state(device) == "shared"
    trespasses = [e for e in events if e.kind == "trespass"]
    assert [(e.user, e.details["pid"], e.details.get("pod")) for e in trespasses] == [
        ("dave", 101, "ml/other-1"),
        ("carol", 103, None),
        ("carol", 104, "prod/train-0"),
    ]
    assert all(
        e.details["why"] == "outside_pod"
        and e.details["pods"] == ["ml/train-0"]
        and e.details["holder"] == "carol"
        and "jobs" not in e.details
        for e in trespasses
    )
    assert usage(leases)["dave"]["trespassing"] == 1
    assert leases.holder(device).user == "carol"


def test_a_reservation_ends_when_the_kubelet_assigns_the_gpu(leases):
    events = recorded(leases)
    device = leases.request(alice, {"gpu": 1})[0].uuid
    leases.allocate(device, PODS, "kubernetes")
    [preempted] = [e for e in events if e.kind == "preempted"]
    assert preempted.user == "alice" and preempted.details == {
        "pods": ["ml/train-0"],
        "hold": "lease",
    }
    assert leases.held_by("alice") == []


def test_nobody_releases_a_pods_gpu_not_even_root(leases):
    device = uuid(leases, 5)
    leases.allocate(device, PODS, "kubernetes")
    carol = in_pod("carol", "ml", "train-0")
    leases.process_started(device, 7, carol)
    for who in (carol, ROOT):
        with pytest.raises(NotYours) as refused:
            leases.release(who, device)
        assert "Kubernetes pod ml/train-0" in str(refused.value)
        assert refused.value.data["pods"] == ["ml/train-0"] and "jobs" not in refused.value.data
    assert leases.release(carol) == ([], [])
    assert leases.state(device) == "claimed"


def test_when_the_kubelet_lets_go_a_waiter_is_served(leases):
    events = recorded(leases)
    for _ in range(7):
        leases.request(alice, {"gpu": 1})
    last = uuid(leases, 7)
    leases.allocate(last, PODS, "kubernetes")
    granted = []
    leases.wait(bob, {"gpu": 1}, granted.append)
    assert granted == []
    leases.allocate(last, None, "kubernetes")
    assert [d.uuid for d in granted[0]] == [last] and leases.holder(last).user == "bob"
    assert ("deallocated", {"pods": ["ml/train-0"]}) in [(e.kind, e.details) for e in events]


def test_slurm_and_the_kubelet_never_clear_each_others(leases):
    slurm, pods = uuid(leases, 0), uuid(leases, 1)
    leases.allocate(slurm, JOBS)  # the job map's
    leases.allocate(pods, PODS, "kubernetes")
    # a reading of either that lists nothing of the other's clears only its own
    leases.allocate(pods, None)  # Slurm does not list GPU 1
    leases.allocate(slurm, None, "kubernetes")  # the kubelet does not list GPU 0
    assert leases.holds[slurm].allocation == JOBS and leases.holds[pods].allocation == PODS


def test_a_gpu_both_list_is_slurms_then_the_pods(leases):
    events = recorded(leases)
    device = uuid(leases, 4)
    leases.allocate(device, PODS, "kubernetes")
    leases.allocate(device, JOBS)  # Slurm's comes first, whoever told first
    assert leases.holds[device].allocation == JOBS and claims(leases)[device]["hold"] == "slurm"
    leases.process_started(device, 9, in_pod("dave", "ml", "train-0"))
    assert [e.details["why"] for e in events if e.kind == "trespass"] == ["outside_job"]
    leases.allocate(device, None)  # the job ends: the pod holds it, nobody was preempted
    assert leases.holds[device].allocation == PODS and leases.state(device) == "claimed"
    assert [(e.kind, e.details) for e in events if e.kind != "trespass"] == [
        ("allocated", {"pods": ["ml/train-0"]}),
        ("deallocated", {"pods": ["ml/train-0"]}),
        ("allocated", {"jobs": ["4242"]}),
        ("deallocated", {"jobs": ["4242"]}),
        ("allocated", {"pods": ["ml/train-0"]}),
    ]
    leases.allocate(device, None, "kubernetes")
    assert leases.holds[device].allocation is None and leases.holder(device).user == "dave"


def test_a_gpu_of_two_pods_is_both_pods(leases):
    device = uuid(leases, 6)
    leases.allocate(device, PodAllocation((TRAIN, Pod("ml", "eval-0"))), "kubernetes")
    leases.process_started(device, 1, in_pod("carol", "ml", "train-0"))
    leases.process_started(device, 2, in_pod("erin", "ml", "eval-0"))
    assert leases.state(device) == "claimed"


def test_the_same_pods_told_again_change_nothing(leases):
    events = recorded(leases)
    device = uuid(leases, 0)
    leases.allocate(device, PODS, "kubernetes")
    leases.allocate(device, PodAllocation((Pod("ml", "train-0", ("trainer",)),)), "kubernetes")
    leases.allocate(uuid(leases, 1), None, "kubernetes")
    assert [e.kind for e in events] == ["allocated"]


@pytest.mark.parametrize(
    "pod,named",
    [
        ((("namespace", "vision"), ("name", "trainer-0")), "vision/trainer-0"),
        ((("namespace", "vision"),), None),  # half a name is no pod
        ((("name", "trainer-0"),), None),
        ((), None),
        (None, None),
    ],
)
def test_a_pod_is_named_only_by_its_namespace_and_name_both(pod, named):
    owner = Identity(user="alice", source="container", pod=pod)
    assert pod_id(owner) == named


@pytest.mark.parametrize("kind", [Allocation, PodAllocation])
def test_both_kinds_of_allocation_answer_the_whole_protocol(kind):
    """core/scheduled.py's SchedulerAllocation, read from the protocol itself: every class
    attribute it names and every method, with the same parameters."""
    import inspect
    import typing

    from patroller.core.scheduled import SchedulerAllocation

    for name in typing.get_type_hints(SchedulerAllocation, include_extras=True):
        assert isinstance(getattr(kind, name, None), str), f"{kind.__name__}.{name}"
    for name, method in inspect.getmembers(SchedulerAllocation, inspect.isfunction):
        if name.startswith("_"):
            continue
        theirs = getattr(kind, name, None)
        assert callable(theirs), f"{kind.__name__}.{name}"
        assert list(inspect.signature(theirs).parameters) == list(
            inspect.signature(method).parameters
        ), f"{kind.__name__}.{name}"


def test_a_pods_own_process_on_its_gpu_is_not_use_without_asking(leases):
    """The pod asked Kubernetes for the GPU: its process there is neither unreserved nor a
    trespass, and the claim says it was asked for; a host process there is both."""
    from patroller.http.views import claims as claims_of

    device = uuid(leases, 3)
    pod = Pod("vision", "trainer-0", ("main",))
    leases.allocate(device, PodAllocation((pod,)))
    alice = Identity(user="alice", source="pod", pod=pod.fields())
    leases.process_started(device, 300, alice)
    counted = usage(leases)["alice"]
    assert counted["unreserved"] == 0 and counted["trespassing"] == 0 and counted["held"] == 1
    assert claims_of(leases)[device]["asked"] is True
    leases.process_started(device, 301, host("root", 0))
    assert usage(leases)["root"]["unreserved"] == 1 and usage(leases)["root"]["trespassing"] == 1
    assert usage(leases)["alice"]["unreserved"] == 0


def test_a_device_both_schedulers_list_is_said_once_and_slurm_holds_it(caplog):
    import logging

    from patroller.core.leases.sources import Sources

    sources = Sources()
    slurm = Allocation((Job(id="4242", uid=1001, user="carol"),))
    other = PodAllocation((TRAIN, Pod(namespace="ml", name="eval-1")))
    with caplog.at_level(logging.WARNING, logger="patroller.core.leases.sources"):
        assert sources.tell("kubernetes", "GPU-1", PODS) is PODS  # alone: no clash
        assert sources.tell("slurm", "GPU-1", slurm) is slurm
        assert sources.tell("kubernetes", "GPU-1", other) is slurm  # still the same clash
        assert sources.tell("slurm", "GPU-1", None) is other
        assert sources.tell("slurm", "GPU-1", slurm) is slurm  # a clash again: said again
        assert sources.tell("slurm", "GPU-2", slurm) is slurm  # another device, one source
    line = "GPU-1 is allocated both to Slurm job 4242 and to Kubernetes {}: Slurm holds it"
    assert [r.getMessage() for r in caplog.records] == [
        line.format("pod ml/train-0"),
        line.format("pods ml/train-0, ml/eval-1"),
    ]
    with pytest.raises(ValueError) as refused:
        sources.tell("lsf", "GPU-1", None)
    assert str(refused.value) == "no such allocation source: 'lsf'"
