"""A process whose owner is still being looked up (an engine slow to answer), in the lease
rules: it keeps a free GPU from being free or granted, and is nobody's claim or trespass until
its owner is known (core/leases/holds.py). A fake clock and no I/O; the tracker that tells the
leases, and a daemon with a containerd that hangs, are tested in test_identity_rules.py and
test_grpc_answers.py."""

from dataclasses import replace

import pytest
from helpers import lease_manager

from patroller.config import Config, policy_of
from patroller.core.errors import Busy
from patroller.core.identity import IDENTIFYING, UNKNOWN, Identity, named_user
from patroller.core.jobs import Allocation, Job
from patroller.http.views import claims
from patroller.state.schema import snapshot

alice, bob, carol = named_user("alice"), named_user("bob"), named_user("carol")
# what the tracker shows once /proc has told the container and the host account
IN_CONTAINER = replace(
    IDENTIFYING, source="container", container=("0123456789ab", None), account="alice", uid=1001
)


@pytest.fixture
def told(leases):
    """Every event of the audit record, as (kind, user)."""
    events = []
    leases.on_event(lambda e: events.append((e.kind, e.user)))
    return events


def one(leases):
    return [d.uuid for d in leases.inventory]


def test_a_process_being_looked_up_holds_a_free_gpu_and_claims_nothing(leases, told):
    gpus = one(leases)
    leases.process_started(gpus[0], 5, IDENTIFYING)
    assert leases.state(gpus[0]) == "claimed" and leases.holder(gpus[0]) == IDENTIFYING
    assert claims(leases)[gpus[0]]["user"]["user"] == "unknown"
    assert gpus[0] not in [d.uuid for ds in leases.free().values() for d in ds]
    assert told == []  # nobody's claim yet
    granted = leases.request(bob, {"gpu": 7})
    assert gpus[0] not in [d.uuid for d in granted]  # never handed out meanwhile
    with pytest.raises(Busy):
        leases.request(carol, {"gpu": 1})
    leases.update_owner(gpus[0], 5, alice)
    assert leases.holder(gpus[0]) == alice and leases.state(gpus[0]) == "claimed"
    assert told == [("grant", "bob"), ("claim", "alice")]


def test_one_that_ends_before_it_is_known_leaves_the_gpu_free_and_untold(leases, told):
    gpu = one(leases)[0]
    leases.process_started(gpu, 5, IDENTIFYING)
    leases.update_owner(gpu, 5, IN_CONTAINER)  # /proc told its container
    assert leases.holder(gpu) == IN_CONTAINER
    leases.process_ended(gpu, 5)
    assert leases.state(gpu) == "free" and leases.holder(gpu) is None
    assert leases.next_deadline() is None and told == []  # no lease for nobody


def test_the_next_process_being_looked_up_holds_it_when_the_first_ends(leases, told):
    gpu = one(leases)[0]
    leases.process_started(gpu, 5, IDENTIFYING)
    leases.process_started(gpu, 6, IN_CONTAINER)
    leases.process_ended(gpu, 5)
    assert leases.state(gpu) == "claimed" and leases.holder(gpu) == IN_CONTAINER
    leases.update_owner(gpu, 6, carol)
    assert leases.holder(gpu) == carol and told == [("claim", "carol")]


def test_on_a_reservation_it_is_no_trespass_and_the_lease_runs_on(leases, told):
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 5, IDENTIFYING)
    assert leases.state(device.uuid) == "reserved" and leases.holder(device.uuid) == alice
    assert leases.next_deadline() is not None  # only alice's own process stops her lease
    assert told == [("grant", "alice")]
    leases.update_owner(device.uuid, 5, bob)
    assert leases.state(device.uuid) == "shared" and leases.holder(device.uuid) == alice
    assert told == [("grant", "alice"), ("trespass", "bob")]


def test_on_a_reservation_the_holders_own_process_stops_the_lease_once_known(leases, told):
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 5, IDENTIFYING)
    leases.update_owner(device.uuid, 5, alice)
    assert leases.state(device.uuid) == "claimed" and leases.next_deadline() is None
    assert told == [("grant", "alice")]  # her own grant: no claim, no trespass


def test_a_known_process_claims_a_gpu_held_only_by_one_being_looked_up(leases, told):
    gpu = one(leases)[0]
    leases.process_started(gpu, 5, IDENTIFYING)
    leases.process_started(gpu, 6, bob)
    assert leases.holder(gpu) == bob and leases.state(gpu) == "claimed"
    leases.update_owner(gpu, 5, carol)
    assert leases.state(gpu) == "shared"
    assert told == [("claim", "bob"), ("trespass", "carol")]


def test_a_claim_beyond_a_limit_is_told_once_the_owner_is_known(clock):
    leases = lease_manager(clock, policy=replace(policy_of(Config()), max_per_user=1))
    events = []
    leases.on_event(lambda e: events.append((e.kind, e.user, e.details.get("why"))))
    [held] = leases.request(alice, {"gpu": 1})
    gpu = next(uuid for uuid in one(leases) if uuid != held.uuid)
    leases.process_started(gpu, 5, IDENTIFYING)
    assert events == [("grant", "alice", None)]
    leases.update_owner(gpu, 5, alice)
    assert events[1:] == [("claim", "alice", None), ("trespass", "alice", "over_limit")]


def test_when_the_holder_lets_go_a_known_process_takes_it_before_one_being_looked_up(leases, told):
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 5, IDENTIFYING)
    leases.process_started(device.uuid, 6, bob)
    leases.release(alice, device.uuid)
    assert leases.holder(device.uuid) == bob and leases.state(device.uuid) == "claimed"
    leases.process_started(device.uuid, 7, UNKNOWN)  # a process whose owner is not known
    assert told[-1] == ("trespass", "unknown")  # nobody was taken for having been told of
    leases.update_owner(device.uuid, 5, carol)  # the one being looked up was carol's
    assert leases.state(device.uuid) == "shared" and told[-1] == ("trespass", "carol")


def test_on_a_jobs_gpu_it_is_no_trespass_until_known(leases, told):
    gpu = one(leases)[0]
    job = Job(id="4242", uid=1001, user="carol", account="physics", partition="gpu")
    leases.allocate(gpu, Allocation((job,)))
    leases.process_started(gpu, 5, IDENTIFYING)
    assert leases.state(gpu) == "allocated" and ("trespass", "unknown") not in told
    member = Identity(
        user="carol",
        source="slurm",
        account="carol",
        uid=1001,
        job=(("id", "4242"), ("step", "0")),
    )
    leases.update_owner(gpu, 5, member)
    assert leases.state(gpu) == "claimed" and not any(k == "trespass" for k, _ in told)


def test_a_better_known_look_up_keeps_holding_without_a_word(leases, told):
    gpu = one(leases)[0]
    leases.process_started(gpu, 5, IDENTIFYING)
    leases.update_owner(gpu, 5, IN_CONTAINER)
    status = claims(leases)[gpu]["user"]
    assert status["container"]["id"] == "0123456789ab" and status["degraded"] is True
    assert leases.state(gpu) == "claimed" and told == []


def test_the_book_never_keeps_a_holder_not_known_yet(leases):
    [device] = leases.request(alice, {"gpu": 1})
    gpu = next(uuid for uuid in one(leases) if uuid != device.uuid)
    leases.process_started(gpu, 5, IDENTIFYING)
    assert list(snapshot(leases, 0.0)) == [device.uuid]
