"""The tally of a device's users (core/leases/tally.py): what it keeps as processes come and go
is what a pass over the processes says, after every change, in any order of changes."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from patroller.core.identity import IDENTIFYING, Identity, named_user
from patroller.core.jobs import Allocation, Job
from patroller.core.leases import Hold

ALICE, BOB, CAROL = named_user("alice"), named_user("bob"), named_user("carol")
# alice again, from a container of hers: the same user, another identity
ALICE_BOX = Identity(user="alice", source="container", container=("c0ffee", "train"))
OWNERS = (ALICE, BOB, CAROL, ALICE_BOX, IDENTIFYING)
# A Slurm job's processes (carol's job 4242, two of its steps), and one of another job of hers
JOB = Allocation((Job(id="4242", uid=1001, user="carol"),))
STEPS = tuple(
    Identity(user="carol", source="slurm", uid=1001, job=(("id", job), ("step", step)))
    for job, step in (("4242", "0"), ("4242", "1"), ("9999", "0"))
)


def users_by_pass(hold: Hold) -> list[Identity]:
    """The holder, then each other user in the order of their first process, named by it."""
    users: dict[str, Identity] = {hold.holder.user: hold.holder} if hold.holder else {}
    for owner in hold.processes.values():
        users.setdefault(owner.user, owner)
    return list(users.values())


def state_by_pass(hold: Hold) -> str:
    if hold.lost:
        return "lost"
    if hold.holder is None:
        return "free"
    if hold.holder.identifying:
        return "claimed"
    known = [owner for owner in hold.processes.values() if not owner.identifying]
    if hold.allocation is not None:
        if any(hold.allocation.member_of(owner) is None for owner in known):
            return "shared"
        return "claimed" if known else "allocated"
    if {owner.user for owner in known} - {hold.holder.user}:
        return "shared"
    return "claimed" if known else "reserved"


def check(hold: Hold) -> None:
    owners = list(hold.processes.values())
    assert hold.tally.every == Counter(o.user for o in owners)
    assert hold.tally.known == Counter(o.user for o in owners if not o.identifying)
    assert hold.tally.owners == Counter(owners)
    assert hold.users() == users_by_pass(hold)
    assert hold.state == state_by_pass(hold)
    held = [pid for pid, o in hold.processes.items() if hold.belongs(o)]
    assert hold.held_by_processes() is bool(held)


@pytest.mark.parametrize("seed", range(40))
def test_the_tally_is_what_a_pass_says_after_every_change(seed: int) -> None:
    rng = random.Random(seed)
    hold = Hold(since=0.0, uuid="GPU-0")
    now = 0.0
    for _ in range(300):
        now += 1.0
        pids = list(hold.processes)
        move = rng.random()
        if move < 0.05:
            holder = rng.choice((ALICE, BOB, None))
            if holder is None:
                hold.end(now)
            else:
                hold.take(holder, now, deadline=now + 60)
        elif move < 0.45 or not pids:
            hold.add(rng.randrange(40), rng.choice(OWNERS), "python")  # a pid seen again too
        elif move < 0.6:
            hold.rename(rng.choice(pids), rng.choice(OWNERS))
        elif move < 0.8:
            hold.forget(pids[0], now, lease=60.0)  # the oldest first, as a pool of workers
        else:
            hold.forget(rng.choice(pids), now, lease=60.0)
        check(hold)


@pytest.mark.parametrize("seed", range(20))
def test_on_a_jobs_gpu_each_distinct_owner_is_asked_once_and_says_what_a_pass_says(seed: int):
    rng = random.Random(seed)
    hold = Hold(since=0.0, uuid="GPU-0", holder=named_user("carol"), allocation=JOB)
    owners = (*STEPS, BOB, IDENTIFYING)
    trespassers = []
    for n in range(300):
        pids = list(hold.processes)
        if rng.random() < 0.5 or not pids:
            pid, owner = 1000 + n, rng.choice(owners)  # a new pid (one seen again: above)
            hold.add(pid, owner, "python")
            hold.place(owner, float(n))
        else:
            hold.forget(rng.choice(pids), float(n), lease=60.0)
        check(hold)
        keys = {hold.key(o) for o in hold.processes.values() if not o.identifying}
        trespassers.append(hold.trespassers <= keys)  # a key leaves with its last process
    assert all(trespassers)


def test_the_oldest_ending_first_keeps_the_order_without_a_pass() -> None:
    hold = Hold(since=0.0, uuid="GPU-0")
    for pid in range(10):
        hold.add(pid, ALICE if pid % 3 else BOB, None)
    assert [u.user for u in hold.users()] == ["bob", "alice"]
    hold.forget(0, 1.0, 60.0)  # bob's first: his next is pid 3, after alice's first (1)
    assert [u.user for u in hold.users()] == ["alice", "bob"]
    hold.forget(1, 2.0, 60.0)
    hold.forget(2, 3.0, 60.0)
    assert [u.user for u in hold.users()] == ["bob", "alice"]  # pid 3 is the oldest now
    check(hold)


def test_a_user_is_named_by_their_first_process_still_running() -> None:
    hold = Hold(since=0.0, uuid="GPU-0")
    hold.add(1, ALICE_BOX, "python")
    hold.add(2, ALICE, "python")
    assert hold.users() == [ALICE_BOX]
    hold.forget(1, 1.0, 60.0)
    assert hold.users() == [ALICE]
    hold.rename(2, ALICE_BOX)  # better known: the same user, in her container
    assert hold.users() == [ALICE_BOX]
    check(hold)
