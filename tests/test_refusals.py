"""Why a request is refused (core/leases/refusals.py), as the client reads it: each error's
message and data, word for word, for a request that could never be met, one over a limit, one
that must wait, a renewal or a release that is not the caller's, and a link no set meets."""

import pytest

from patroller.core.devices import Device, Inventory
from patroller.core.errors import Busy, NotHeld, NotYours, OverLimit, Unsatisfiable
from patroller.core.identity import Identity, named_user
from patroller.core.jobs import Allocation, Job
from patroller.core.leases.holds import Hold
from patroller.core.leases.limits import Count
from patroller.core.leases.refusals import (
    busy,
    check_admin,
    check_exists,
    check_release,
    check_renew,
    never_linked,
    over_limit,
    topology_unknown,
)
from patroller.core.topology import Topology

alice, bob = named_user("alice"), named_user("bob")
ROOT = Identity(user="root", source="host", account="root", uid=0)
GPUS = [Device(uuid=f"GPU-{n}", number=n) for n in range(2)]
MIGS = [Device(uuid="GPU-m", number=2, group="mig", mig_mode="Enabled")]


def test_a_group_the_host_lacks_or_more_than_it_has_is_unsatisfiable():
    inventory = Inventory(GPUS + MIGS)
    check_exists(inventory, {"gpu": 2, "mig": 1})
    with pytest.raises(Unsatisfiable) as nogroup:
        check_exists(inventory, {"gpu": 1, "tpu": 1})
    assert nogroup.value.message == "there is no device group 'tpu'"
    assert nogroup.value.data == {"requested": {"gpu": 1, "tpu": 1}, "groups": ["gpu", "mig"]}
    with pytest.raises(Unsatisfiable) as toomany:
        check_exists(inventory, {"gpu": 3})
    assert toomany.value.message == "3 gpu requested but only 2 exist on this host"
    assert toomany.value.data == {"requested": {"gpu": 3}, "exist": {"gpu": 2, "mig": 1}}


def count(kind, held, holders, limit=2):
    devices = [Device(uuid=f"GPU-{n}", number=n) for n in held]
    name, uid = ("alice", None) if kind == "user" else ("lab", 1001)
    return Count(kind=kind, name=name, uid=uid, limit=limit, held=devices, holders=holders)


def test_a_request_alone_over_the_limit_says_the_most_one_user_may_hold():
    error = over_limit(alice, {"gpu": 3}, count("user", [], []))
    assert isinstance(error, OverLimit)
    assert error.message == "alice asks for 3: the most one user may hold is 2"
    assert error.data == {"limit": 2, "held": [], "requested": {"gpu": 3}}
    assert error.private is None


def test_a_request_over_the_limit_names_the_devices_held_and_how_to_release():
    error = over_limit(alice, {"gpu": 1, "mig": 1}, count("user", [0, 3], ["alice", "alice"]))
    assert error.message == (
        "alice holds 2 device(s) (0, 3) and asks for 2: the most one user may hold is 2; "
        "release some first (/release?uuid=..., or patroller release NUMBER)"
    )
    assert error.data["held"] == [0, 3] and error.private is None


def test_an_accounts_limit_hides_the_devices_others_hold_under_it_from_who_may_not_see():
    error = over_limit(
        alice, {"gpu": 1}, count("account", [0, 1, 4], ["alice", "bob", "carol"], 3)
    )
    said = "account lab (uid 1001), which alice runs as,"
    assert error.message == (
        f"{said} holds 3 device(s) (0, 1, 4) and asks for 1: the most one host account may "
        "hold is 3; release some first (/release?uuid=..., or patroller release NUMBER)"
    )
    assert error.data == {
        "limit": 3,
        "held": [0, 1, 4],
        "requested": {"gpu": 1},
        "account": "lab",
        "uid": 1001,
    }
    assert error.private is not None
    assert error.private.users == ("bob", "carol")
    assert error.private.message == (
        f"{said} holds 3 device(s) (0, and 2 under other identities) and asks for 1: the most "
        "one host account may hold is 3; release some first (/release?uuid=..., or patroller "
        "release NUMBER)"
    )
    assert error.private.data["held"] == [0, None, None]
    assert error.private.data["account"] == "lab" and error.private.data["limit"] == 3
    hidden = over_limit(alice, {"gpu": 1}, count("account", [1], ["bob"], 1)).private
    assert hidden is not None
    assert hidden.message.startswith(f"{said} holds 1 device(s) (1 under other identities) ")


def test_busy_says_how_many_are_free_of_each_group():
    error = busy({"gpu": 2, "mig": 1}, {"gpu": 1})
    assert isinstance(error, Busy)
    assert error.message == "busy: 2 gpu requested, 1 free; 1 mig requested, 0 free"
    assert error.data == {"requested": {"gpu": 2, "mig": 1}, "free": {"gpu": 1}}


def test_busy_names_the_link_asked_for_and_why_each_device_is_granted_to_nobody():
    error = busy({"gpu": 2}, {"gpu": 3}, "nvlink", {3: "it is unhealthy", 1: None})
    assert error.message == (
        "busy: 2 gpu requested, 3 free, but none all linked to each other by NVLink "
        "(link=nvlink); GPU 1 is granted to nobody: None; GPU 3 is granted to nobody: it is "
        "unhealthy"
    )
    assert error.data == {
        "requested": {"gpu": 2},
        "free": {"gpu": 3},
        "link": "nvlink",
        "withheld": {"3": "it is unhealthy", "1": None},
    }
    linked = busy({"gpu": 2, "mig": 1}, {"gpu": 2}, "numa")
    assert linked.message == (
        "busy: 2 gpu requested, 2 free; 1 mig requested, 0 free, but none all in one NUMA node "
        "(one CPU affinity) (link=numa)"
    )
    plain = busy({"gpu": 1}, {"gpu": 0}, withheld={0: "silent"})
    assert plain.message == "busy: 1 gpu requested, 0 free; GPU 0 is granted to nobody: silent"
    assert plain.data["withheld"] == {"0": "silent"} and "link" not in plain.data


def test_a_renewal_of_a_device_not_held_released_or_anothers_is_refused():
    free = Hold(since=0.0, uuid="GPU-0")
    with pytest.raises(NotHeld) as ran_out:
        check_renew(alice, free)
    assert ran_out.value.message == (
        "device GPU-0 is not held by you: its lease ran out or it was released"
    )
    assert ran_out.value.data == {"uuid": "GPU-0", "state": "free"}
    released = Hold(since=0.0, uuid="GPU-0", holder=alice, releasing=True)
    with pytest.raises(NotHeld) as going:
        check_renew(alice, released)
    assert going.value.message == (
        "device GPU-0 was released: it is free once your processes on it end"
    )
    assert going.value.data == {"uuid": "GPU-0", "state": "reserved"}
    with pytest.raises(NotYours) as other:
        check_renew(bob, Hold(since=0.0, uuid="GPU-0", holder=alice))
    assert other.value.message == "device GPU-0 is held by another user"
    assert other.value.data == {"uuid": "GPU-0"}
    check_renew(alice, Hold(since=0.0, uuid="GPU-0", holder=alice))


def test_only_root_releases_another_users_device():
    held = Hold(since=0.0, uuid="GPU-1", holder=alice)
    assert check_release(alice, held) is False
    assert check_release(alice, Hold(since=0.0, uuid="GPU-1")) is False
    with pytest.raises(NotYours) as other:
        check_release(bob, held)
    assert other.value.message == "device GPU-1 is held by another user"
    assert other.value.data == {"uuid": "GPU-1"}
    assert check_release(ROOT, held) is True
    with pytest.raises(NotYours) as named:  # a name a caller gives is never root
        check_release(named_user("root"), held)
    assert named.value.message == "device GPU-1 is held by another user"


def test_a_device_of_a_slurm_job_is_released_by_its_scheduler_for_root_too():
    job = Allocation((Job("4242", uid=1001, user="carol"),))
    held = Hold(since=0.0, uuid="GPU-1", holder=job.holder(), allocation=job)
    with pytest.raises(NotYours) as refused:
        check_release(ROOT, held)
    error = refused.value
    assert error.message == (
        "device GPU-1 is allocated to Slurm job 4242: it is released when the job ends (scancel)"
    )
    assert error.data == {"uuid": "GPU-1", "jobs": ["4242"]}
    assert error.private is not None and error.private.users == ("carol",)
    assert error.private.message == (
        "device GPU-1 is allocated to a Slurm job: it is released when the job ends (scancel)"
    )
    assert error.private.data == {"uuid": "GPU-1", "jobs": None}


def test_a_device_of_two_jobs_names_both_and_whose_they_are():
    jobs = Allocation((Job("7", user="dave"), Job("8")))
    held = Hold(since=0.0, uuid="GPU-0", holder=jobs.holder(), allocation=jobs)
    with pytest.raises(NotYours) as refused:
        check_release(jobs.holder(), held)
    error = refused.value
    assert error.message == (
        "device GPU-0 is allocated to Slurm jobs 7, 8: it is released when the job ends (scancel)"
    )
    assert error.data["jobs"] == ["7", "8"]
    assert error.private is not None and error.private.users == ("dave",)
    assert error.private.message.startswith("device GPU-0 is allocated to Slurm jobs: ")
    unnamed = Allocation((Job("9"),))
    nobody = Hold(since=0.0, uuid="GPU-0", allocation=unnamed)
    with pytest.raises(NotYours) as refused:
        check_release(ROOT, nobody)
    assert refused.value.private is not None and refused.value.private.users == ("job 9",)


def test_only_root_may_do_roots_work():
    check_admin(ROOT, "GPU-0", "declare a device healthy")
    with pytest.raises(NotYours) as refused:
        check_admin(alice, "GPU-0", "declare a device healthy")
    assert refused.value.message == "only the host's root may declare a device healthy"
    assert refused.value.data == {"uuid": "GPU-0"}


def test_a_link_on_devices_whose_links_are_unknown_says_why():
    unknown = topology_unknown(Topology(), GPUS, "nvlink")
    assert isinstance(unknown, Unsatisfiable)
    assert unknown.message == (
        "link=nvlink asks for devices all linked to each other by NVLink, but how this "
        "host's devices are linked is not known (`nvidia-smi topo -m` was not read)"
    )
    assert unknown.data == {"link": "nvlink"}
    told = topology_unknown(Topology(why="it timed out"), GPUS, "numa")
    assert told is not None
    assert told.message == (
        "link=numa asks for devices all in one NUMA node (one CPU affinity), but how this "
        "host's devices are linked is not known (it timed out)"
    )
    known = Topology(
        {("GPU-0", "GPU-1"): "NV2", ("GPU-0", "GPU-m"): "SYS", ("GPU-1", "GPU-m"): "SYS"}
    )
    assert topology_unknown(known, GPUS, "nvlink") is None
    mig = topology_unknown(known, GPUS + MIGS, "nvlink")
    assert mig is not None and mig.message.endswith(" is not known (some are in MIG mode)")


def test_a_link_no_set_of_the_host_meets_says_to_ask_without_it():
    error = never_linked("gpu", 3, "nvlink")
    assert error.message == (
        "no 3 gpu of this host are all linked to each other by NVLink (link=nvlink); ask "
        "without link, or for fewer"
    )
    assert error.data == {"requested": {"gpu": 3}, "link": "nvlink"}
