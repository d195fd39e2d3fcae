"""Slurm allocations in the lease rules: a device the job map lists is its jobs', never granted,
no lease runs on it, a process outside the jobs trespasses; when the map lets go, the usual
rules go on. A fake clock and no I/O."""

import logging
from dataclasses import replace

import pytest
from helpers import host_user as host
from helpers import lease_manager, recorded
from helpers import uuid_of as uuid

from patroller.config import Config, policy_of
from patroller.core.devices import Device
from patroller.core.errors import Busy, NotYours
from patroller.core.identity import Identity, named_user
from patroller.core.jobs import Allocation, Job
from patroller.core.leases.holds import Hold, Notices
from patroller.core.leases.limits import Count
from patroller.core.leases.trespass import trespass
from patroller.http.views import claims, usage

alice, bob = named_user("alice"), named_user("bob")  # `clock` and `leases`: conftest.py
ROOT = Identity(user="root", source="host", account="root", uid=0)
JOB = Job(id="4242", uid=1001, user="carol", account="physics", partition="gpu")
ALLOCATION = Allocation((JOB,))


def in_job(user: str, uid: int, job: str, step: str = "0") -> Identity:
    """A process of a job, as identify/resolver.py makes its identity."""
    return Identity(
        user=user, source="slurm", account=user, uid=uid, job=(("id", job), ("step", step))
    )


def test_an_allocated_device_is_its_jobs_and_never_granted(leases):
    leases.request(alice, {"gpu": 6})  # GPUs 0-5; 6 and 7 are free, until Slurm allocates them
    leases.allocate(uuid(leases, 6), ALLOCATION)
    leases.allocate(uuid(leases, 7), ALLOCATION)
    assert leases.state(uuid(leases, 6)) == "allocated"
    holder = leases.holder(uuid(leases, 6))
    assert (holder.user, holder.source, holder.uid) == ("carol", "slurm", 1001)
    assert dict(holder.job) == {"id": "4242", "account": "physics", "partition": "gpu"}
    with pytest.raises(Busy):
        leases.request(bob, {"gpu": 1})
    waiter = leases.wait(bob, {"gpu": 1}, lambda devices: None)
    assert leases.cancel(waiter)  # it waited: nothing was free for it
    claim = claims(leases)[uuid(leases, 6)]
    assert claim["hold"] == "slurm" and claim["expires"] is None
    assert claim["jobs"] == [
        {"id": "4242", "user": "carol", "uid": 1001, "account": "physics", "partition": "gpu"}
    ]


def test_no_lease_runs_on_an_allocated_device(leases, clock):
    device = uuid(leases, 2)
    leases.allocate(device, ALLOCATION)
    clock.advance(Config().lease * 10)
    assert leases.expire() == []
    assert leases.next_deadline() is None
    leases.process_started(device, 500, in_job("carol", 1001, "4242"))
    leases.process_ended(device, 500)  # the job's last process left: still the job's
    clock.advance(Config().lease * 10)
    assert leases.expire() == [] and leases.state(device) == "allocated"


def test_a_waiter_gets_the_device_when_the_allocation_ends(leases):
    for _ in range(7):
        leases.request(alice, {"gpu": 1})
    last = uuid(leases, 7)
    leases.allocate(last, ALLOCATION)
    granted = []
    leases.wait(bob, {"gpu": 1}, granted.append)
    assert granted == []
    leases.allocate(last, None)
    assert [d.uuid for d in granted[0]] == [last]
    assert leases.holder(last).user == "bob"


def test_the_jobs_processes_claim_it_and_others_trespass_once(leases):
    events = recorded(leases)
    device = uuid(leases, 3)
    leases.allocate(device, ALLOCATION)
    leases.process_started(device, 100, in_job("carol", 1001, "4242"))
    assert leases.state(device) == "claimed"
    # the job's own user, from an SSH session the job did not adopt: not in the job
    leases.process_started(device, 101, host("carol", 1001))
    leases.process_started(device, 102, host("carol", 1001))
    # another job of another user
    leases.process_started(device, 103, in_job("dave", 1002, "4243"))
    assert leases.state(device) == "shared"
    trespasses = [e for e in events if e.kind == "trespass"]
    assert [(e.user, e.details["pid"], e.details.get("job")) for e in trespasses] == [
        ("carol", 101, None),
        ("dave", 103, "4243"),
    ]
    assert all(
        e.details["why"] == "outside_job"
        and e.details["jobs"] == ["4242"]
        and e.details["holder"] == "carol"
        for e in trespasses
    )
    counted = usage(leases)
    assert counted["carol"]["trespassing"] == 1 and counted["dave"]["trespassing"] == 1
    assert leases.holder(device).user == "carol"


def test_a_trespasser_who_leaves_and_comes_back_is_told_again(leases):
    events = recorded(leases)
    device = uuid(leases, 0)
    leases.allocate(device, ALLOCATION)
    leases.process_started(device, 101, host("bob", 1003))
    leases.process_ended(device, 101)
    leases.process_started(device, 102, host("bob", 1003))
    assert [e.details["pid"] for e in events if e.kind == "trespass"] == [101, 102]


def test_processes_there_before_the_allocation_are_judged_by_it(leases):
    events = recorded(leases)
    device = uuid(leases, 4)
    leases.process_started(device, 200, host("bob", 1003))  # bob took it by computing
    assert leases.holder(device).user == "bob"
    leases.allocate(device, ALLOCATION)
    assert leases.holder(device).user == "carol" and leases.state(device) == "shared"
    kinds = [(e.kind, e.user) for e in events]
    assert ("preempted", "bob") in kinds and ("allocated", "carol") in kinds
    assert ("trespass", "bob") in kinds
    # the allocation ends while bob still computes: his process holds it again
    leases.allocate(device, None)
    assert leases.holder(device).user == "bob" and leases.state(device) == "claimed"
    assert ("deallocated", "carol") in [(e.kind, e.user) for e in events]


def test_a_reservation_ends_when_slurm_allocates_the_device(leases):
    events = recorded(leases)
    device = leases.request(alice, {"gpu": 1})[0].uuid
    leases.allocate(device, ALLOCATION)
    assert leases.holder(device).user == "carol"
    preempted = [e for e in events if e.kind == "preempted"]
    assert (
        preempted
        and preempted[0].user == "alice"
        and preempted[0].details == {"jobs": ["4242"], "hold": "lease"}
    )
    assert leases.held_by("alice") == []


def test_nobody_releases_a_slurm_allocation_not_even_root(leases):
    device = uuid(leases, 5)
    leases.allocate(device, ALLOCATION)
    carol = in_job("carol", 1001, "4242")
    for who in (carol, ROOT):
        with pytest.raises(NotYours) as refused:
            leases.release(who, device)
        assert "Slurm job 4242" in str(refused.value) and refused.value.data["jobs"] == ["4242"]
    assert leases.release(carol) == ([], [])  # a bare release leaves it too
    assert leases.state(device) == "allocated"


def test_a_map_of_bare_ids_learns_the_user_from_the_jobs_process(leases):
    device = uuid(leases, 6)
    leases.allocate(device, Allocation((Job(id="77"),)))
    assert leases.holder(device).user == "job 77"
    leases.process_started(device, 300, in_job("erin", 1004, "77", "batch"))
    holder = leases.holder(device)
    assert (holder.user, holder.uid, dict(holder.job)["id"]) == ("erin", 1004, "77")
    assert leases.state(device) == "claimed"


def test_a_process_of_another_uid_is_no_part_of_a_job_whose_uid_the_map_gives(leases):
    """slurmd runs a job's processes as the job's uid: one of another uid that names the job
    (a cgroup made to look like the job's) trespasses, and never holds the device."""
    device = uuid(leases, 6)
    events = recorded(leases)
    leases.allocate(device, ALLOCATION)  # job 4242, uid 1001
    leases.process_started(device, 300, in_job("mallory", 2002, "4242"))
    assert leases.state(device) == "shared"
    assert leases.holder(device).user == "carol" and leases.holder(device).uid == 1001
    [told] = [e for e in events if e.kind == "trespass"]
    assert told.user == "mallory" and told.details["why"] == "outside_job"
    leases.process_started(device, 301, in_job("carol", 1001, "4242"))
    assert leases.holder(device).uid == 1001 and leases.state(device) == "shared"


def test_a_jobs_own_process_on_its_gpu_is_not_use_without_asking(leases):
    """The job asked Slurm: not `unreserved`, not a trespass, and asked; another job of the
    same user there is both, as its own job did not ask for this GPU."""
    device = uuid(leases, 5)
    leases.allocate(device, ALLOCATION)
    leases.process_started(device, 300, in_job("carol", 1001, "4242"))
    counted = usage(leases)["carol"]
    assert (counted["held"], counted["unreserved"], counted["trespassing"]) == (1, 0, 0)
    assert claims(leases)[device]["asked"] is True
    leases.process_started(device, 301, in_job("carol", 1001, "5151"))
    counted = usage(leases)["carol"]
    assert (counted["unreserved"], counted["trespassing"]) == (1, 1)


def test_a_job_named_by_its_sluid_in_the_cgroup_is_the_same_job(leases):
    device = uuid(leases, 6)
    leases.allocate(device, Allocation((Job(id="4242", sluid="sEKNKTV3WPV500", user="carol"),)))
    leases.process_started(device, 300, in_job("carol", 1001, "sEKNKTV3WPV500"))
    assert leases.state(device) == "claimed"


def test_a_job_is_called_by_its_id_and_its_sluid_where_it_has_one():
    assert Job(id="4242").names() == ("4242",)
    assert Job(id="4242", sluid="").names() == ("4242",)
    assert Job(id="4242", sluid="sEKNKTV3WPV500").names() == ("4242", "sEKNKTV3WPV500")


def test_a_device_shared_by_two_jobs_is_both_jobs(leases):
    device = uuid(leases, 1)
    leases.allocate(device, Allocation((JOB, Job(id="4243", user="dave"))))
    leases.process_started(device, 1, in_job("carol", 1001, "4242"))
    leases.process_started(device, 2, in_job("dave", 1002, "4243"))
    assert leases.state(device) == "claimed"
    assert claims(leases)[device]["hold"] == "slurm"


def test_allocated_devices_do_not_count_against_patroller_limits(clock):
    leases = lease_manager(clock, policy=replace(policy_of(Config()), max_per_user=1))
    carol = Identity(user="carol", source="host", account="carol", uid=1001)
    leases.allocate(uuid(leases, 0), ALLOCATION)
    leases.allocate(uuid(leases, 1), ALLOCATION)
    assert len(leases.request(carol, {"gpu": 1})) == 1


def test_the_same_allocation_told_again_changes_nothing(leases):
    events = recorded(leases)
    device = uuid(leases, 0)
    leases.allocate(device, ALLOCATION)
    leases.allocate(device, Allocation((JOB,)))
    leases.allocate(uuid(leases, 1), None)  # never allocated: nothing to end
    assert [e.kind for e in events] == ["allocated"]


# -- telling of a trespass, in one line (core/leases/trespass.py) ------------------------------


def _trespasses():
    """(hold's holder, allocated?, pid, owner, device?, count beyond) -> the line and event."""
    dave = in_job("dave", 1002, "4243")
    account = Identity(user="bob+2@example.org", source="host", account="bob", uid=1003)
    over_user = Count(
        "user", "bob", None, 2, [Device("GPU-0", 0), Device("GPU-1", 1)], ["bob", "bob"]
    )
    over_account = Count("account", "bob", 1003, 1, [Device("GPU-1", 1)], ["bob+2@example.org"])
    over_max = Count("user", "MAX", None, 1, [Device("GPU-0", 0)], ["MAX"])
    return [
        (
            None,
            False,
            7,
            bob,
            True,
            None,
            "trespassing: bob runs pid 7 on GPU-1, held by nobody",
            {"pid": 7},
        ),
        (
            None,
            False,
            7,
            bob,
            False,
            None,
            "trespassing: bob runs pid 7 on ?, held by nobody",
            {"pid": 7},
        ),
        (
            alice,
            False,
            8,
            bob,
            True,
            None,
            "trespassing: bob runs pid 8 on GPU-1, held by alice",
            {"pid": 8, "holder": "alice"},
        ),
        (
            alice,
            True,
            9,
            bob,
            True,
            None,
            "trespassing: bob runs pid 9 on GPU-1 (in no job), allocated to Slurm job 4242 of "
            "alice",
            {"pid": 9, "holder": "alice", "why": "outside_job", "jobs": ["4242"]},
        ),
        (
            alice,
            True,
            10,
            dave,
            True,
            None,
            "trespassing: dave runs pid 10 on GPU-1 (job 4243), allocated to Slurm job 4242 of "
            "alice",
            {"pid": 10, "holder": "alice", "why": "outside_job", "jobs": ["4242"], "job": "4243"},
        ),
        (
            None,
            True,
            11,
            dave,
            True,
            None,
            "trespassing: dave runs pid 11 on GPU-1 (job 4243), allocated to Slurm job 4242 of ?",
            {"pid": 11, "why": "outside_job", "jobs": ["4242"], "job": "4243"},
        ),
        (
            None,
            False,
            12,
            bob,
            True,
            over_user,
            "trespassing: bob runs pid 12 on GPU-1, beyond the limit of 2 of bob",
            {"pid": 12, "why": "over_limit", "limit": 2, "held": [0, 1]},
        ),
        (
            None,
            False,
            13,
            account,
            True,
            over_account,
            "trespassing: bob+2@example.org runs pid 13 on GPU-1, beyond the limit of 1 of "
            "account "
            "bob (uid 1003), which bob+2@example.org runs as",
            {"pid": 13, "why": "over_limit", "limit": 1, "held": [1], "account": "bob"},
        ),
        (
            None,
            False,
            14,
            named_user("MAX"),
            True,
            over_max,  # the name's end is kept whole
            "trespassing: MAX runs pid 14 on GPU-1, beyond the limit of 1 of MAX",
            {"pid": 14, "why": "over_limit", "limit": 1, "held": [0]},
        ),
    ]


@pytest.mark.parametrize(
    "holder, allocated, pid, owner, on_device, beyond, line, details", _trespasses()
)
def test_a_trespass_is_one_line_and_one_event(
    caplog, holder, allocated, pid, owner, on_device, beyond, line, details
):
    notices, events = Notices(), []
    notices.on_event(events.append)
    device = Device("GPU-1", 1)
    hold = None
    if holder is not None or allocated:
        hold = Hold(since=0.0, uuid=device.uuid)
        hold.holder = holder
        hold.allocation = ALLOCATION if allocated else None
    with caplog.at_level(logging.WARNING, logger="patroller.core.leases.trespass"):
        trespass(notices, device if on_device else None, pid, owner, hold=hold, beyond=beyond)
    assert [r.getMessage() for r in caplog.records] == [line]
    [event] = events
    assert (event.kind, event.user, event.details) == ("trespass", owner.user, details)


def test_a_trespasser_better_known_later_is_told_of_with_the_device_and_its_holder(leases):
    """bob's process on alice's GPU is a trespass; then its owner is known better (carol, as
    her container's labels say): carol is told of as well, on that GPU, held by alice."""
    events = recorded(leases)
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 5, bob)
    leases.update_owner(device.uuid, 5, named_user("carol"))
    told = [(e.user, e.devices, dict(e.details)) for e in events if e.kind == "trespass"]
    assert told == [
        ("bob", ((device.uuid, device.number),), {"pid": 5, "holder": "alice"}),
        ("carol", ((device.uuid, device.number),), {"pid": 5, "holder": "alice"}),
    ]


def test_one_users_two_jobs_are_two_trespassers_and_one_job_told_once(leases):
    events = recorded(leases)
    device = uuid(leases, 1)
    leases.allocate(device, ALLOCATION)
    leases.process_started(device, 100, in_job("dave", 1002, "4243"))
    leases.process_started(device, 101, in_job("dave", 1002, "4244"))  # another job of his
    leases.process_started(device, 102, in_job("dave", 1002, "4243"))  # the first again
    leases.process_ended(device, 100)  # 102 is still in job 4243: still trespassing
    leases.process_started(device, 103, in_job("dave", 1002, "4243"))
    assert [e.details["pid"] for e in events if e.kind == "trespass"] == [100, 101]


def test_a_map_of_bare_job_ids_is_held_by_the_user_its_processes_run_as():
    bare = Allocation((Job(id="1"), Job(id="2")))
    assert not bare.named() and Allocation((Job(id="3", uid=1005),)).named()
    assert Allocation((Job(id="4", user="erin"),)).named()
    nobody_yet = bare.holder()
    assert (nobody_yet.user, nobody_yet.account, nobody_yet.uid) == ("job 1", None, None)
    assert dict(nobody_yet.job) == {"id": "1"} and nobody_yet.source == "slurm"
    seen = in_job("carol", 1001, "2")
    holder = bare.holder(seen)  # her process, in the second job, names its user
    assert (holder.user, holder.account, holder.uid) == ("carol", "carol", 1001)
    assert dict(holder.job) == {"id": "2"}
    outside = bare.holder(in_job("dave", 1002, "9"))  # a process of no job of ours
    assert (outside.user, outside.account, outside.uid) == ("job 1", None, None)
    by_uid = Allocation((Job(id="3", uid=1005),)).holder()
    assert (by_uid.user, by_uid.account, by_uid.uid) == ("uid:1005", None, 1005)


def test_an_allocation_over_a_hold_and_its_end_are_told_whole(leases, caplog):
    events = recorded(leases)
    device = uuid(leases, 2)
    bare = Allocation((Job(id="4242"),))  # a map of bare ids: its process names the user
    leases.request(alice, {"gpu": 3})  # devices 0-2: alice's reservation ends on device 2
    leases.process_started(device, 500, in_job("carol", 1001, "4242"))  # on alice's: trespass
    leases.process_started(device, 501, host("dave", 1002))  # trespasses on alice's
    with caplog.at_level(logging.INFO, logger="patroller.core.leases.allocations"):
        leases.allocate(device, bare)
        leases.allocate(device, None)
    assert [
        r.getMessage() for r in caplog.records if r.name == "patroller.core.leases.allocations"
    ] == [
        f"Slurm allocated {device} to job 4242: the hold of alice on it ends",
        f"{device} is allocated to Slurm job 4242",
        f"{device} is no longer allocated to Slurm job 4242",
    ]
    told = [
        (e.kind, e.user, dict(e.details))
        for e in events
        if e.kind in ("preempted", "allocated", "deallocated")
    ]
    assert told == [
        ("preempted", "alice", {"jobs": ["4242"], "hold": "lease"}),
        ("allocated", "carol", {"jobs": ["4242"]}),
        ("deallocated", "carol", {"jobs": ["4242"]}),
    ]
    assert all(
        e.devices == ((device, 2),)
        for e in events
        if e.kind in ("preempted", "allocated", "deallocated")
    )
    # dave was told of trespassing on alice's; on the job's device he is told again, once
    assert [e.details["pid"] for e in events if e.kind == "trespass"] == [500, 501, 501]
