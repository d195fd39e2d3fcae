"""The lease rules, with a fake clock and no I/O."""

import logging
import random
from typing import Any

import pytest
from helpers import lease_manager

from patroller.config import Config
from patroller.core.devices import Device, Inventory
from patroller.core.errors import Busy, NotYours, TooManyWaiting, Unavailable, Unsatisfiable
from patroller.core.identity import UNKNOWN, named_user
from patroller.core.leases.holds import Hold
from patroller.http.views import claims

LEASE = Config().lease  # the lease of the shared `leases` fixture (conftest.py)
alice, bob, carol = named_user("alice"), named_user("bob"), named_user("carol")


def uuid(leases, number):
    return leases.inventory.by_number(number).uuid


def states(leases):
    return [leases.state(d.uuid) for d in leases.inventory]


def test_grants_free_devices_in_order_until_none_is_free(leases):
    numbers = [leases.request(alice, {"gpu": 1})[0].number for _ in range(8)]
    assert numbers == list(range(8))
    with pytest.raises(Busy) as busy:
        leases.request(alice, {"gpu": 1})
    assert busy.value.data == {"requested": {"gpu": 1}, "free": {"gpu": 0}}
    assert states(leases) == ["reserved"] * 8


def test_busy_says_how_many_are_free(leases):
    leases.request(alice, {"gpu": 6})
    with pytest.raises(Busy) as busy:
        leases.request(bob, {"gpu": 3})
    assert busy.value.data["free"] == {"gpu": 2}
    assert "3 gpu requested, 2 free" in busy.value.message
    assert states(leases).count("free") == 2  # all or nothing: bob got none


def test_unknown_group_and_too_many_can_never_be_satisfied(leases):
    with pytest.raises(Unsatisfiable) as unknown:
        leases.request(alice, {"tpu": 1})
    assert unknown.value.data["groups"] == ["gpu"]
    with pytest.raises(Unsatisfiable) as too_many:
        leases.request(alice, {"gpu": 9})
    assert too_many.value.data["exist"] == {"gpu": 8}
    assert "only 8 exist" in too_many.value.message


def test_all_or_nothing_across_groups(clock):
    inventory = Inventory([Device("G0", 0), Device("G1", 1), Device("F0", 2, group="fpga")])
    leases = lease_manager(clock, inventory)
    leases.request(bob, {"fpga": 1})
    with pytest.raises(Busy):
        leases.request(alice, {"gpu": 2, "fpga": 1})
    assert [leases.state(u) for u in ("G0", "G1")] == ["free", "free"]
    leases.release(bob)
    granted = leases.request(alice, {"fpga": 1, "gpu": 2})
    assert [d.uuid for d in granted] == ["G0", "G1", "F0"]  # in device order


def test_reservation_expires_after_the_lease(leases, clock):
    [device] = leases.request(alice, {"gpu": 1})
    assert leases.next_deadline() == clock() + LEASE
    clock.advance(LEASE - 0.01)
    assert leases.expire() == []
    assert leases.state(device.uuid) == "reserved"
    assert claims(leases)[device.uuid]["expires"] == pytest.approx(0.01)
    clock.advance(0.01)
    assert leases.expire() == [device]
    assert leases.state(device.uuid) == "free"
    assert leases.next_deadline() is None


def test_own_process_claims_a_reservation_and_stops_the_lease(leases, clock):
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 4242, alice)
    assert leases.state(device.uuid) == "claimed"
    assert leases.next_deadline() is None
    clock.advance(LEASE * 5)
    assert leases.expire() == []
    claim = claims(leases)[device.uuid]
    assert claim["processes"] == [4242]
    assert claim["expires"] is None
    assert claim["user"]["user"] == "alice"


def test_last_process_ending_restarts_the_lease(leases, clock):
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 1, alice)
    leases.process_started(device.uuid, 2, alice)
    clock.advance(100)
    leases.process_ended(device.uuid, 1)
    assert leases.state(device.uuid) == "claimed"
    leases.process_ended(device.uuid, 2)
    assert leases.state(device.uuid) == "reserved"
    assert leases.next_deadline() == clock() + LEASE
    clock.advance(LEASE)
    assert leases.expire() == [device]


def test_process_on_a_free_device_claims_it_for_its_owner(leases):
    target = uuid(leases, 3)
    leases.process_started(target, 77, bob)
    assert leases.state(target) == "claimed"
    assert claims(leases)[target]["user"]["user"] == "bob"
    leases.process_started(uuid(leases, 4), 78, UNKNOWN)
    assert claims(leases)[uuid(leases, 4)]["user"]["user"] == "unknown"
    # a claimed device is not free: a request skips it
    assert 3 not in [d.number for d in leases.request(alice, {"gpu": 6})]


def test_another_users_process_makes_it_shared_and_is_logged_once(leases, caplog):
    [device] = leases.request(alice, {"gpu": 1})
    with caplog.at_level(logging.WARNING, logger="patroller.core.leases"):
        leases.process_started(device.uuid, 10, bob)
        leases.process_started(device.uuid, 11, bob)
    assert leases.state(device.uuid) == "shared"
    claim = claims(leases)[device.uuid]
    assert [u["user"] for u in claim["users"]] == ["alice", "bob"]
    assert claim["user"]["user"] == "alice"
    assert claim["processes"] == [10, 11]
    trespass = [r for r in caplog.records if "trespassing" in r.getMessage()]
    assert len(trespass) == 1
    assert "bob" in trespass[0].getMessage() and "alice" in trespass[0].getMessage()


def test_shared_device_passes_to_the_trespasser_when_the_lease_ends(leases, clock):
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 10, bob)
    clock.advance(LEASE)
    assert leases.expire() == [device]
    assert leases.state(device.uuid) == "claimed"
    assert claims(leases)[device.uuid]["user"]["user"] == "bob"


def test_trespasser_leaving_turns_shared_back(leases):
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 1, alice)
    leases.process_started(device.uuid, 2, bob)
    assert leases.state(device.uuid) == "shared"
    leases.process_ended(device.uuid, 2)
    assert leases.state(device.uuid) == "claimed"


def test_release_gives_back_only_the_callers_own(leases):
    a = leases.request(alice, {"gpu": 2})
    b = leases.request(bob, {"gpu": 1})
    with pytest.raises(NotYours):
        leases.release(alice, b[0].uuid)
    now, later = leases.release(alice)
    assert now == a and later == []
    assert leases.state(b[0].uuid) == "reserved"
    assert [leases.state(d.uuid) for d in a] == ["free", "free"]
    assert leases.release(alice) == ([], [])  # nothing left: not an error


def test_release_of_one_named_device(leases):
    a = leases.request(alice, {"gpu": 2})
    assert leases.release(alice, a[1].uuid) == ([a[1]], [])
    assert leases.state(a[0].uuid) == "reserved"
    with pytest.raises(Unsatisfiable) as unknown:
        leases.release(alice, "GPU-no-such-device")
    # the answer names the device asked for, for programs as for people
    assert unknown.value.message == "there is no device 'GPU-no-such-device'"
    assert unknown.value.data == {"uuid": "GPU-no-such-device"}


def test_release_with_running_processes_frees_when_they_end_without_a_lease(leases):
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 5, alice)
    assert leases.release(alice) == ([], [device])
    assert leases.state(device.uuid) == "claimed"
    leases.process_ended(device.uuid, 5)
    assert leases.state(device.uuid) == "free"
    assert leases.next_deadline() is None


def test_waiters_are_served_in_arrival_order_on_release(leases):
    leases.request(alice, {"gpu": 8})
    got = []
    leases.wait(bob, {"gpu": 1}, lambda d: got.append(("bob", d)))
    leases.wait(named_user("carol"), {"gpu": 1}, lambda d: got.append(("carol", d)))
    assert got == [] and len(leases.waiters) == 2
    leases.release(alice, uuid(leases, 5))
    assert [(who, [d.number for d in devices]) for who, devices in got] == [("bob", [5])]
    assert claims(leases)[uuid(leases, 5)]["user"]["user"] == "bob"
    leases.release(alice, uuid(leases, 2))
    assert got[1][0] == "carol" and len(leases.waiters) == 0


def test_a_waiter_that_cannot_be_served_does_not_block_a_later_one(leases):
    leases.request(alice, {"gpu": 8})
    got = []
    leases.wait(bob, {"gpu": 2}, lambda d: got.append("bob"))
    leases.wait(named_user("carol"), {"gpu": 1}, lambda d: got.append("carol"))
    leases.release(alice, uuid(leases, 0))
    assert got == ["carol"]
    leases.release(alice, uuid(leases, 1))
    leases.release(alice, uuid(leases, 2))
    assert got == ["carol", "bob"]


def test_waiters_are_woken_by_expiry_and_by_a_process_ending(leases, clock):
    leases.request(alice, {"gpu": 7})
    leases.process_started(uuid(leases, 7), 99, bob)
    leases.release(bob, uuid(leases, 7))  # bob is done: free when pid 99 ends
    got = []
    leases.wait(named_user("carol"), {"gpu": 1}, lambda d: got.append(d[0].number))
    leases.process_ended(uuid(leases, 7), 99)
    assert got == [7]
    leases.wait(named_user("dave"), {"gpu": 1}, lambda d: got.append(d[0].number))
    clock.advance(LEASE)
    leases.expire()
    assert got == [7, 0]


def test_a_waiter_granted_at_once_and_the_state_seen_by_the_callback(leases):
    seen = []
    leases.wait(alice, {"gpu": 1}, lambda d: seen.append(leases.state(d[0].uuid)))
    assert seen == ["reserved"]
    assert len(leases.waiters) == 0


def test_cancelled_waiter_gets_nothing(leases):
    leases.request(alice, {"gpu": 8})
    got = []
    waiter = leases.wait(bob, {"gpu": 1}, got.append)
    assert leases.cancel(waiter) is True
    assert leases.cancel(waiter) is False
    leases.release(alice)
    assert got == [] and states(leases) == ["free"] * 8


def test_an_unsatisfiable_wait_is_refused_at_once(leases):
    with pytest.raises(Unsatisfiable):
        leases.wait(alice, {"gpu": 9}, lambda d: None)
    assert len(leases.waiters) == 0


def test_close_aborts_waiters_and_refuses_new_requests(leases):
    leases.request(alice, {"gpu": 8})
    errors = []
    leases.wait(bob, {"gpu": 1}, lambda d: None, errors.append)
    leases.close()
    assert len(errors) == 1 and isinstance(errors[0], Unavailable)
    with pytest.raises(Unavailable):
        leases.request(bob, {"gpu": 1})


def test_too_many_waiters(clock):
    leases = lease_manager(clock, max_waiters=2)
    leases.request(alice, {"gpu": 8})
    leases.wait(bob, {"gpu": 1}, lambda d: None)
    leases.wait(bob, {"gpu": 1}, lambda d: None)
    with pytest.raises(Unavailable):
        leases.wait(bob, {"gpu": 1}, lambda d: None)


def test_age_counts_from_the_last_change_of_state(leases, clock):
    [device] = leases.request(alice, {"gpu": 1})
    clock.advance(3)
    assert claims(leases)[device.uuid]["age"] == 3
    leases.process_started(device.uuid, 1, alice)
    clock.advance(2)
    assert claims(leases)[device.uuid]["age"] == 2
    leases.process_started(device.uuid, 2, alice)  # still claimed: the age goes on
    clock.advance(1)
    assert claims(leases)[device.uuid]["age"] == 3


def test_on_change_callbacks_hear_every_change(leases, clock):
    calls = []
    leases.on_change(lambda: calls.append(1))
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 1, alice)
    leases.process_ended(device.uuid, 1)
    clock.advance(LEASE)
    leases.expire()
    assert len(calls) == 4


@pytest.mark.errors_expected
def test_a_failing_change_callback_does_not_break_the_leases(leases, caplog):
    leases.on_change(lambda: 1 / 0)
    [device] = leases.request(alice, {"gpu": 1})
    assert leases.state(device.uuid) == "reserved"
    assert "lease change callback failed" in caplog.text


def test_a_degraded_owner_that_becomes_known_takes_over_its_claim(leases):
    target = uuid(leases, 0)
    leases.process_started(target, 5, UNKNOWN)
    assert claims(leases)[target]["user"]["user"] == "unknown"
    leases.update_owner(target, 5, alice)
    assert leases.state(target) == "claimed"
    assert claims(leases)[target]["user"]["user"] == "alice"


def test_the_holder_stays_while_one_of_its_processes_is_still_unnamed(leases):
    """Two processes of a degraded owner hold a device: the first named alice's does not make
    alice the holder while the other still computes there as the old owner."""
    target = uuid(leases, 0)
    leases.process_started(target, 5, UNKNOWN)
    leases.process_started(target, 6, UNKNOWN)
    leases.update_owner(target, 5, alice)
    assert leases.holder(target) == UNKNOWN and leases.state(target) == "shared"
    leases.update_owner(target, 6, alice)
    assert leases.holder(target) == alice and leases.state(target) == "claimed"


def test_trespassers_already_told_are_not_told_again_when_the_hold_passes_on(leases):
    """alice's reservation has carol's and bob's processes on it (each told once); when alice
    lets go, the oldest, carol's, holds it, and bob, already told, is not told again."""
    events = []
    leases.on_event(events.append)
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 1, carol)
    leases.process_started(device.uuid, 2, bob)
    leases.release(alice, device.uuid)
    assert leases.holder(device.uuid) == carol and leases.state(device.uuid) == "shared"
    leases.process_started(device.uuid, 3, bob)  # another of bob's
    told = [(e.user, e.details["pid"]) for e in events if e.kind == "trespass"]
    assert told == [("carol", 1), ("bob", 2)]


def test_a_degraded_owner_on_a_reservation_turns_shared_into_claimed(leases, caplog):
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 5, UNKNOWN)
    assert leases.state(device.uuid) == "shared"
    leases.update_owner(device.uuid, 5, alice)
    assert leases.state(device.uuid) == "claimed"
    assert leases.next_deadline() is None
    leases.update_owner(device.uuid, 99, bob)  # not on the device: ignored
    assert leases.state(device.uuid) == "claimed"


# -- waiters: per-user cap and the queue's order ------------------------------------------------


def test_one_user_may_have_only_so_many_waiting(clock):
    leases = lease_manager(clock, max_waiting_per_user=2)
    leases.request(alice, {"gpu": 8})
    first = leases.wait(bob, {"gpu": 1}, lambda d: None)
    leases.wait(bob, {"gpu": 2}, lambda d: None)
    with pytest.raises(TooManyWaiting) as refused:
        leases.wait(bob, {"gpu": 1}, lambda d: None)
    assert refused.value.data == {"limit": 2, "waiting": 2}
    assert "bob already has 2 requests waiting" in refused.value.message
    leases.wait(named_user("carol"), {"gpu": 1}, lambda d: None)  # others still queue
    assert (len(leases.waiters), leases.waiters.count_of("bob")) == (3, 2)
    leases.cancel(first)
    leases.wait(bob, {"gpu": 1}, lambda d: None)  # a cancelled one frees a place
    leases.release(alice, uuid(leases, 0))  # carol's
    leases.release(alice, uuid(leases, 1))  # bob's {"gpu": 1}: a granted one frees a place too
    assert (
        len(leases.waiters),
        leases.waiters.count_of("bob"),
        leases.waiters.count_of("carol"),
    ) == (1, 1, 0)


def test_a_user_at_the_cap_is_still_granted_what_is_free_now(clock):
    leases = lease_manager(clock, max_waiting_per_user=1)
    leases.request(alice, {"gpu": 7})
    leases.wait(bob, {"gpu": 2}, lambda d: None)
    got = []
    leases.wait(bob, {"gpu": 1}, got.append)  # the one free device: nothing to queue
    assert len(got) == 1 and leases.waiters.count_of("bob") == 1
    with pytest.raises(TooManyWaiting):
        leases.wait(bob, {"gpu": 1}, got.append)


def test_a_newcomer_that_fits_what_is_free_is_granted_past_one_that_does_not(leases):
    leases.request(alice, {"gpu": 7})
    got = []
    leases.wait(bob, {"gpu": 2}, lambda d: got.append("bob"))
    leases.wait(named_user("carol"), {"gpu": 1}, lambda d: got.append("carol"))
    assert got == ["carol"] and len(leases.waiters) == 1


def test_arrival_order_holds_across_groups_and_sizes(clock):
    inventory = Inventory(
        [
            Device("G0", 0),
            Device("G1", 1),
            Device("G2", 2),
            Device("F0", 3, group="fpga"),
            Device("F1", 4, group="fpga"),
        ]
    )
    leases = lease_manager(clock, inventory)
    leases.request(alice, {"gpu": 3, "fpga": 2})
    got = []
    for name, wants in (
        ("w0", {"gpu": 1, "fpga": 1}),
        ("w1", {"gpu": 2}),
        ("w2", {"fpga": 1}),
        ("w3", {"gpu": 1}),
        ("w4", {"fpga": 1}),
    ):
        leases.wait(
            named_user(name), wants, lambda d, name=name: got.append((name, [x.uuid for x in d]))
        )
    leases.release(alice, "F1")  # w0 needs a gpu too: w2 is the first that fits
    leases.release(alice, "G2")  # w0 still needs an fpga; w1 two gpus: w3
    assert got == [("w2", ["F1"]), ("w3", ["G2"])]
    leases.release(alice)  # G0, G1, F0 free: w0 first, then w1 cannot, then w4
    assert got[2:] == [("w0", ["G0", "F0"])]
    assert len(leases.waiters) == 2
    leases.release(named_user("w3"))
    assert got[3:] == [("w1", ["G1", "G2"])]


def test_close_aborts_every_waiter_in_arrival_order(leases):
    leases.request(alice, {"gpu": 8})
    aborted = []
    for n, count in enumerate((2, 1, 3, 1)):
        leases.wait(
            named_user(f"w{n}"), {"gpu": count}, lambda d: None, lambda e, n=n: aborted.append(n)
        )
    leases.close()
    assert aborted == [0, 1, 2, 3] and len(leases.waiters) == 0


def test_the_queue_serves_exactly_as_a_scan_of_every_waiter_would(clock):
    """Random requests, waits, cancels and releases, against the rule written the plain way."""
    uuids = ["G0", "G1", "G2", "G3", "F0", "F1"]
    inventory = Inventory(
        [Device(u, n, group="fpga" if u[0] == "F" else "gpu") for n, u in enumerate(uuids)]
    )
    shapes = [
        {"gpu": 1},
        {"gpu": 2},
        {"gpu": 3},
        {"fpga": 1},
        {"fpga": 2},
        {"gpu": 1, "fpga": 1},
        {"gpu": 2, "fpga": 1},
    ]
    for seed in range(30):
        rng = random.Random(seed)
        leases = lease_manager(clock, inventory, max_waiting_per_user=1000)
        holders: dict[str, str | None] = {u: None for u in uuids}
        queue: list[tuple[Any, str, dict[str, int]]] = []  # the model: (waiter, user, wants)
        grants: list[tuple[str, list[str]]] = []

        def fit(wants: dict[str, int]) -> list[str] | None:
            picked = []
            for group, count in wants.items():
                free = [u for u in uuids if holders[u] is None and inventory.get(u).group == group]
                if len(free) < count:
                    return None
                picked += free[:count]
            return sorted(picked, key=uuids.index)

        def scan() -> list[tuple[str, list[str]]]:
            served = []
            for entry in list(queue):
                picked = fit(entry[2])
                if picked is not None:
                    queue.remove(entry)
                    holders.update({u: entry[1] for u in picked})
                    served.append((entry[1], picked))
            return served

        for step in range(200):
            action = rng.random()
            user = f"u{rng.randrange(6)}"
            if action < 0.45:
                wants = rng.choice(shapes)
                waiter = leases.wait(
                    named_user(user),
                    wants,
                    lambda d, user=user: grants.append((user, [x.uuid for x in d])),
                )
                queue.append((waiter, user, wants))
                expected = scan()
            elif action < 0.6 and queue:
                entry = rng.choice(queue)
                queue.remove(entry)
                assert leases.cancel(entry[0]) is True
                expected = []
            elif action < 0.75:
                wants = rng.choice(shapes)
                picked = fit(wants)
                try:
                    granted = leases.request(named_user(user), wants)
                except Busy:
                    granted = None
                assert (granted and [d.uuid for d in granted]) == (picked or None), (seed, step)
                holders.update({u: user for u in picked or []})
                expected = []
            else:
                held = [u for u in uuids if holders[u] is not None]
                if not held:
                    continue
                target = rng.choice(held)
                leases.release(named_user(holders[target]), target)
                holders[target] = None
                expected = scan()
            assert grants == expected, (seed, step)
            grants.clear()
            assert {u: (c["user"] or {}).get("user") for u, c in claims(leases).items()} == holders
            assert len(leases.waiters) == len(queue)


# -- an expiry and an idle release, each one line and one event ---------------------------------


def test_each_expiry_says_which_hold_ran_out_at_its_very_deadline(clock, caplog):
    from helpers import recorded

    leases = lease_manager(clock)
    events = recorded(leases)
    lease = Config().lease
    [leased] = leases.request(alice, {"gpu": 1})  # deadline: now + lease
    [timed] = leases.request(bob, {"gpu": 1}, duration=lease)  # until: now + lease
    [kept] = leases.request(carol, {"gpu": 1}, duration=lease)
    leases.process_started(kept.uuid, 42, carol)  # her process: the device stays hers
    clock.advance(lease - 0.001)  # each end is EARLY ahead: due now (<=)
    with caplog.at_level(logging.INFO, logger="patroller.core.leases"):
        assert leases.expire() == [leased, timed]
    assert [r.getMessage() for r in caplog.records] == [
        f"lease of alice on {leased.uuid} expired",
        f"the reservation of bob on {timed.uuid} ended",
        f"the reservation of carol on {kept.uuid} ended; their processes hold it",
    ]
    expiries = [(e.user, e.devices, dict(e.details)) for e in events if e.kind == "expire"]
    assert expiries == [
        ("alice", ((leased.uuid, leased.number),), {"hold": "lease"}),
        ("bob", ((timed.uuid, timed.number),), {"hold": "duration"}),
    ]
    assert leases.holder(kept.uuid) == carol and leases.holds[kept.uuid].until is None


def test_a_hold_ends_no_sooner_than_early_before_its_end(clock):
    leases = lease_manager(clock)
    lease = Config().lease
    leases.request(alice, {"gpu": 1})
    leases.request(bob, {"gpu": 1}, duration=lease)
    clock.advance(lease - 0.0011)
    assert leases.expire() == []


def test_an_idle_release_is_one_line_and_one_event(clock, caplog):
    from helpers import recorded

    leases = lease_manager(clock)
    events = recorded(leases)
    [idle] = leases.request(alice, {"gpu": 1})
    with caplog.at_level(logging.WARNING, logger="patroller.core.leases"):
        assert leases.release_idle(idle.uuid, 612.345) is True
    assert [r.getMessage() for r in caplog.records] == [
        f"alice on {idle.uuid} was idle for 10m12s with no process: released"
    ]
    [event] = [e for e in events if e.kind == "idle_release"]
    assert (event.user, event.devices, dict(event.details)) == (
        "alice",
        ((idle.uuid, idle.number),),
        {"idle": 612.3},
    )
    assert leases.state(idle.uuid) == "free" and leases.holds[idle.uuid].since == clock()


@pytest.mark.parametrize("how", ["free", "process", "lost", "duration", "unknown"])
def test_what_is_not_an_idle_reservation_is_not_released(clock, how):
    devices = [Device(f"GPU-{n}", n) for n in range(2)]
    inventory = Inventory(devices)
    leases = lease_manager(clock, inventory)
    uuid = "GPU-0"
    if how == "process":
        leases.request(alice, {"gpu": 1})
        leases.process_started(uuid, 42, alice)
    elif how == "lost":
        leases.request(alice, {"gpu": 1})
        inventory.update([devices[1]])
        leases.devices_changed()
    elif how == "duration":
        leases.request(alice, {"gpu": 1}, duration=600.0)
    elif how == "unknown":
        uuid = "GPU-9"
    held = leases.holder(uuid) if how != "unknown" else None
    assert leases.release_idle(uuid, 900.0) is False
    assert how == "unknown" or leases.holder(uuid) == held


def test_a_device_lost_and_back_is_one_line_and_one_event_each(clock, caplog):
    from helpers import recorded

    devices = [Device(f"GPU-{n}", n) for n in range(3)]
    inventory = Inventory(devices)
    leases = lease_manager(clock, inventory)
    events = recorded(leases)
    leases.request(alice, {"gpu": 1})  # GPU-0
    with caplog.at_level(logging.WARNING, logger="patroller.core.leases"):
        change = inventory.update([devices[2]])  # GPU-0 and GPU-1 fall off the bus
        assert change.lost == ("GPU-0", "GPU-1") and change.renumbered == ()
        assert change and not inventory.update([devices[2]])  # nothing new: no change
        leases.devices_changed()
        clock.advance(5)
        assert inventory.update([devices[2]]).lost == ()  # still lost: nothing new
        back = inventory.update(devices[:2] + [Device("GPU-2", 2, name="renamed")])
        assert back.added == ("GPU-0", "GPU-1") and back.updated == ("GPU-2",)
        leases.devices_changed()
    assert [r.getMessage() for r in caplog.records] == [
        "GPU-0 is lost",
        "GPU-1 is lost",
        "GPU-0 is back",
        "GPU-1 is back",
    ]
    assert [(e.kind, e.user, e.devices) for e in events if e.kind in ("lost", "back")] == [
        ("lost", "alice", (("GPU-0", 0),)),
        ("lost", None, (("GPU-1", 1),)),
        ("back", "alice", (("GPU-0", 0),)),
        ("back", None, (("GPU-1", 1),)),
    ]
    assert [leases.state(f"GPU-{n}") for n in range(3)] == ["reserved", "free", "free"]


# -- refusals: the message and the data, whole --------------------------------------------------


def test_renewing_what_one_does_not_hold_says_why_with_the_device(leases):
    from patroller.core.errors import NotHeld

    free, theirs, released = (uuid(leases, n) for n in range(3))
    leases.request(bob, {"gpu": 1})  # device 0... then handed back below
    leases.release(bob)
    leases.request(bob, {"gpu": 1})  # device 0 again
    leases.request(alice, {"gpu": 2})  # devices 1 and 2
    leases.process_started(released, 42, alice)
    leases.release(alice, released)  # releasing: free once her process ends
    with pytest.raises(NotYours) as refused:
        leases.renew(alice, free)  # bob's
    assert (refused.value.message, refused.value.data) == (
        f"device {free} is held by another user",
        {"uuid": free},
    )
    with pytest.raises(NotHeld) as refused:
        leases.renew(alice, released)
    assert (refused.value.message, refused.value.data) == (
        f"device {released} was released: it is free once your processes on it end",
        {"uuid": released, "state": "claimed"},
    )
    leases.release(bob)
    with pytest.raises(NotHeld) as refused:
        leases.renew(bob, free)
    assert (refused.value.message, refused.value.data) == (
        f"device {free} is not held by you: its lease ran out or it was released",
        {"uuid": free, "state": "free"},
    )
    assert [d.uuid for d in leases.renew(alice, theirs)] == [theirs]


def test_busy_says_how_many_of_each_group_asked_for_are_free():
    from patroller.core.leases.refusals import busy

    error = busy({"gpu": 3, "mig": 2}, {"gpu": 1})
    assert error.message == "busy: 3 gpu requested, 1 free; 2 mig requested, 0 free"
    assert error.data == {"requested": {"gpu": 3, "mig": 2}, "free": {"gpu": 1}}


def test_a_waiter_is_in_the_queue_until_served_or_cancelled(leases):
    leases.request(alice, {"gpu": 8})
    first = leases.wait(bob, {"gpu": 1}, lambda devices: None)
    other = leases.wait(carol, {"gpu": 2}, lambda devices: None)
    assert first in leases.waiters and other in leases.waiters
    assert leases.cancel(first)
    assert first not in leases.waiters and other in leases.waiters


def test_a_trespasser_with_a_process_left_is_not_told_again(leases):
    from helpers import recorded

    events = recorded(leases)
    [held] = leases.request(alice, {"gpu": 1})
    leases.process_started(held.uuid, 1, bob)
    leases.process_started(held.uuid, 2, bob)
    leases.process_ended(held.uuid, 1)  # bob is still on it
    leases.process_started(held.uuid, 3, bob)
    assert [e.details["pid"] for e in events if e.kind == "trespass"] == [1]
    leases.process_ended(held.uuid, 2)
    leases.process_ended(held.uuid, 3)  # gone: told again when he comes back
    leases.process_started(held.uuid, 4, bob)
    assert [e.details["pid"] for e in events if e.kind == "trespass"] == [1, 4]
    assert {e.devices for e in events if e.kind == "trespass"} == {((held.uuid, held.number),)}
    assert list(leases.holds[held.uuid].commands) == [4]  # what ended is forgotten


def test_a_released_device_whose_last_process_ends_is_free_from_then(leases, clock):
    [held] = leases.request(alice, {"gpu": 1})
    leases.process_started(held.uuid, 42, alice)
    leases.release(alice)
    clock.advance(7)
    leases.process_ended(held.uuid, 42)
    assert leases.state(held.uuid) == "free" and leases.holds[held.uuid].since == clock()


def test_a_process_claim_and_the_end_of_a_process_hold_are_told_whole(clock, caplog):
    from helpers import recorded

    from patroller.core.identity import ProcessRef

    leases = lease_manager(clock)
    events = recorded(leases)
    first, second = uuid(leases, 0), uuid(leases, 1)
    with caplog.at_level(logging.DEBUG, logger="patroller.core.leases"):
        leases.process_started(first, 42, alice, "python")  # a free device: claimed
        leases.process_started(first, 42, alice, "python")  # seen again: nothing new
        leases.request(bob, {"gpu": 1}, held_for=ProcessRef(7, 100))  # device 1, for pid 7
        leases.process_started(second, 7, bob, "train")
        leases.process_started(second, 8, bob, "train")  # his other process stays on it
        assert leases.process_exited(ProcessRef(7, 100))[0].uuid == second
        leases.process_ended(second, 8)
        [third] = leases.request(carol, {"gpu": 1}, held_for=ProcessRef(9, 100))
        assert leases.process_exited(ProcessRef(9, 100)) == [third]
    assert [r.getMessage() for r in caplog.records] == [
        f"pid 42 of alice on {first}",
        f"pid 7 of bob on {second}",
        f"pid 8 of bob on {second}",
        f"pid 7 of bob left {second}",
        f"pid 7 of bob ended; that user's processes still run on {second}",
        f"pid 8 of bob left {second}",
        f"pid 9 of carol ended: {third.uuid} is free",
    ]
    told = [
        (e.kind, e.user, e.devices, dict(e.details))
        for e in events
        if e.kind in ("claim", "ended")
    ]
    assert told == [
        ("claim", "alice", ((first, 0),), {"pid": 42, "command": "python"}),
        ("ended", "carol", ((third.uuid, third.number),), {"pid": 9}),
    ]
    assert leases.state(third.uuid) == "free" and leases.holds[third.uuid].since == clock()
    assert leases.holder(second) == bob and leases.holds[second].held_for is None


def test_an_administrators_release_is_one_line_and_one_event_with_the_reason(leases, caplog):
    from helpers import recorded

    from patroller.core.identity import Identity

    root = Identity(user="root", source="host", account="root", uid=0)
    events = recorded(leases)
    first, second = (d.uuid for d in leases.request(alice, {"gpu": 2}))
    with caplog.at_level(logging.WARNING, logger="patroller.core.leases"):
        assert leases.release(root, first, reason="maintenance")[0][0].uuid == first
        assert leases.release(root, second)[0][0].uuid == second
    assert [r.getMessage() for r in caplog.records] == [
        f"root released {first}, held by alice: maintenance",
        f"root released {second}, held by alice: no reason given",
    ]
    assert [(e.kind, e.user, dict(e.details)) for e in events if e.kind == "admin_release"] == [
        ("admin_release", "alice", {"by": "root", "reason": "maintenance"}),
        ("admin_release", "alice", {"by": "root", "reason": "released by the administrator"}),
    ]


def test_releasing_all_leaves_what_a_process_or_a_job_holds_and_goes_on_past_it(leases, clock):
    from patroller.core.identity import ProcessRef

    held = leases.request(alice, {"gpu": 1}, held_for=ProcessRef(7, 100))  # device 0
    plain = leases.request(alice, {"gpu": 1})  # device 1, after it
    freed, _ = leases.release(alice)
    assert freed == plain and leases.holder(held[0].uuid) == alice


def test_a_waiter_served_at_once_is_held_for_its_duration(leases, clock):
    granted = []
    waiter = leases.wait(alice, {"gpu": 1}, granted.append, duration=600.0)
    assert waiter.granted == granted[0] and waiter not in leases.waiters
    assert leases.holds[granted[0][0].uuid].until == clock() + 600.0
    leases.request(bob, {"gpu": 7})
    later = leases.wait(carol, {"gpu": 1}, granted.append, duration=300.0)
    assert later.duration == 300.0 and later in leases.waiters
    leases.release(bob, uuid(leases, 3))
    assert leases.holds[uuid(leases, 3)].until == clock() + 300.0


def test_releasing_another_users_device_is_refused_naming_it(leases):
    [theirs] = leases.request(bob, {"gpu": 1})
    with pytest.raises(NotYours) as refused:
        leases.release(alice, theirs.uuid)
    assert (refused.value.message, refused.value.data) == (
        f"device {theirs.uuid} is held by another user",
        {"uuid": theirs.uuid},
    )


def test_an_account_whose_devices_are_all_others_is_told_how_many_not_which():
    from patroller.core.identity import Identity
    from patroller.core.leases.limits import Count
    from patroller.core.leases.refusals import over_limit

    asker = Identity(user="zoe", source="host", account="lab", uid=1001)
    count = Count(
        "account", "lab", 1001, 2, [Device("GPU-0", 0), Device("GPU-1", 1)], ["xavier", "yann"]
    )
    error = over_limit(asker, {"gpu": 1}, count)
    assert error.private.users == ("xavier", "yann")
    assert error.private.message == (
        "account lab (uid 1001), which zoe runs as, holds 2 device(s) (2 under other "
        "identities) and asks for 1: the most one host account may hold is 2; release some "
        "first (/release?uuid=..., or patroller release NUMBER)"
    )
    assert error.private.data["held"] == [None, None]


@pytest.mark.parametrize("lost", [False, True])
@pytest.mark.parametrize("holder", [None, "alice"])
@pytest.mark.parametrize("running", [(), ("alice",), ("bob",)])
def test_free_is_the_free_state_read_without_the_processes(lost, holder, running):
    """The free devices are found by `Hold.free`, which never walks the processes (thousands
    on a busy host): it says what `state` says."""
    hold = Hold(since=0.0, uuid="GPU-1", lost=lost, holder=named_user(holder) if holder else None)
    for pid, user in enumerate(running, 100):
        hold.add(pid, named_user(user), "python")
    assert hold.free == (hold.state == "free")
    assert hold.process_version == len(running)


def test_the_age_restarts_when_the_holder_changes_though_the_state_does_not():
    hold = Hold(since=0.0, uuid="GPU-1")
    hold.take(named_user("alice"), now=1.0, deadline=100.0)
    assert (hold.state, hold.since) == ("reserved", 1.0)
    hold.take(named_user("alice"), now=2.0, deadline=100.0)
    assert hold.since == 1.0  # the same state, the same holder: the same age
    hold.take(named_user("bob"), now=5.0, deadline=100.0)
    assert (hold.state, hold.since) == ("reserved", 5.0)
