"""Fair use counted by host account as well as by identity (issue: a container labelled
alice+2@example.org, or none, escaped alice's limit). The lease rules on the fake clock here;
the daemon with real containers of real uids in tests/test_identity_docker.py."""

from dataclasses import replace

import pytest
from helpers import lease_manager

from patroller.config import Config, policy_of
from patroller.core.errors import OverLimit
from patroller.core.identity import Identity
from patroller.http.hiding import NOBODY, Viewer, refusal
from patroller.http.views import users_view

ALICE_UID, BOB_UID = 1001, 1002


def container(user, uid, short="c0ffee000001", account=None):
    """A container's identity as the resolver makes it: its labels' user, and the host account
    its process runs as."""
    return Identity(
        user=user,
        source="container",
        email=user if "@" in user else None,
        container=(short, None),
        uid=uid,
        account=account or ("root" if uid == 0 else f"uid:{uid}"),
    )


alice = container("alice@example.org", ALICE_UID, "a11ce0000001")
alice2 = container("alice+2@example.org", ALICE_UID, "a11ce0000002")
anonymous = container("container:a11ce0000003", ALICE_UID, "a11ce0000003")
alice_host = Identity(user="uid:1001", source="host", account="uid:1001", uid=ALICE_UID)
bob = container("bob@example.org", BOB_UID, "b0b000000001")
carol = container("carol@example.org", 0, "ca10100000001")  # as root, Docker's default
dave = container("dave@example.org", 0, "da7e00000001")


def manager(clock, **policy):
    return lease_manager(clock, policy=replace(policy_of(Config()), **policy))


def number(leases, n):
    return leases.inventory.by_number(n).uuid


def test_a_new_identity_on_the_same_account_gets_no_more_than_the_limit(clock):
    leases = manager(clock, max_per_user=1)
    leases.request(alice, {"gpu": 1})
    for other in (alice2, anonymous, alice_host):
        with pytest.raises(OverLimit) as refused:
            leases.request(other, {"gpu": 1})
        assert refused.value.data == {
            "limit": 1,
            "held": [0],
            "requested": {"gpu": 1},
            "account": "uid:1001",
            "uid": ALICE_UID,
        }
        assert (
            f"account uid:1001 (uid {ALICE_UID}), which {other.user} runs as, holds 1 "
            "device(s) (0)"
        ) in refused.value.message
        assert "the most one host account may hold is 1" in refused.value.message
    assert [d.number for d in leases.request(bob, {"gpu": 1})] == [1]  # another account


def test_the_devices_others_hold_under_the_account_are_not_named_to_who_may_not_see_them(clock):
    # --hide-users: /status shows alice's device under a pseudonym, with no account; the
    # refusal must not say that its holder runs as alice+2's account.
    leases = manager(clock, max_per_user=2)
    leases.request(alice, {"gpu": 1})  # device 0
    leases.request(alice2, {"gpu": 1})  # device 1
    with pytest.raises(OverLimit) as refused:
        leases.request(alice2, {"gpu": 1})
    error = refused.value
    told = {"limit": 2, "requested": {"gpu": 1}, "account": "uid:1001", "uid": ALICE_UID}
    whole = refusal(error, Viewer(everything=True))
    assert whole == {"error": error.message, "held": [0, 1], **told}
    assert "holds 2 device(s) (0, 1) and asks for 1" in error.message
    for viewer in (Viewer(alice2.user), NOBODY):
        shown = refusal(error, viewer)
        assert shown == {"error": shown["error"], "held": [None, 1], **told}
        assert "holds 2 device(s) (1, and 1 under other identities) and asks" in shown["error"]
    # Devices of its own identity alone: nothing to hide
    leases = manager(clock, max_per_user=1)
    leases.request(alice2, {"gpu": 1})
    with pytest.raises(OverLimit) as refused:
        leases.request(alice2, {"gpu": 1})
    assert refused.value.private is None
    assert refusal(refused.value, NOBODY)["held"] == [0]


def test_root_is_counted_by_identity_alone(clock):
    # Containers run as root unless told otherwise, whoever starts them.
    leases = manager(clock, max_per_user=1)
    leases.request(carol, {"gpu": 1})
    leases.request(dave, {"gpu": 1})
    with pytest.raises(OverLimit) as refused:
        leases.request(carol, {"gpu": 1})
    assert "account" not in refused.value.data
    counted = manager(clock, max_per_user=1, uncounted_uids=frozenset())
    counted.request(carol, {"gpu": 1})
    with pytest.raises(OverLimit):
        counted.request(dave, {"gpu": 1})


def test_the_stricter_limit_decides(clock):
    # alice@example.org may hold 3, her account the default 1: the account's limit holds.
    leases = manager(clock, max_per_user=1, limits={"alice@example.org": 3})
    leases.request(alice, {"gpu": 1})
    with pytest.raises(OverLimit) as refused:
        leases.request(alice, {"gpu": 1})
    assert refused.value.data["account"] == "uid:1001"
    # Both raised: she may hold 3, from any of her containers together.
    leases = manager(clock, max_per_user=1, limits={"alice@example.org": 3, "uid:1001": 3})
    leases.request(alice, {"gpu": 2})
    leases.request(alice, {"gpu": 1})
    with pytest.raises(OverLimit):
        leases.request(alice, {"gpu": 1})
    # The identity's own limit is stricter than its account's: it decides.
    leases = manager(clock, max_per_user=4, limits={"alice+2@example.org": 1})
    leases.request(alice2, {"gpu": 1})
    with pytest.raises(OverLimit) as refused:
        leases.request(alice2, {"gpu": 1})
    assert "account" not in refused.value.data
    assert len(leases.request(alice, {"gpu": 3})) == 3  # the account allows 4 in all


def test_a_claim_beyond_the_accounts_limit_is_a_trespass_in_users_and_the_record(clock):
    leases = manager(clock, max_per_user=1)
    events = []
    leases.on_event(events.append)
    leases.request(alice, {"gpu": 1})
    leases.process_started(number(leases, 5), 4242, anonymous)  # computes on a free device
    assert leases.holder(number(leases, 5)) == anonymous  # it is held: the process runs there
    trespass = [e for e in events if e.kind == "trespass"]
    assert len(trespass) == 1 and trespass[0].user == anonymous.user
    assert trespass[0].details == {
        "pid": 4242,
        "why": "over_limit",
        "limit": 1,
        "held": [0],
        "account": "uid:1001",
    }
    users = users_view(leases, None)
    assert users[anonymous.user]["over_limit"] == 1 and users[alice.user]["over_limit"] == 0
    assert users[anonymous.user]["accounts"] == [
        {"account": "uid:1001", "uid": ALICE_UID, "held": 2, "devices": [0, 5], "limit": 1}
    ]
    # Within the limit, a claim is no trespass; and the flag goes with the hold.
    leases.process_started(number(leases, 6), 4343, bob)
    assert [e.kind for e in events].count("trespass") == 1
    leases.process_started(number(leases, 0), 4141, alice)  # alice's own: she keeps it
    leases.process_ended(number(leases, 5), 4242)
    clock.advance(Config().lease + 1)
    leases.expire()
    assert users_view(leases, None)[alice.user]["accounts"][0]["held"] == 1
    assert anonymous.user not in users_view(leases, None)
    assert not leases.holds[number(leases, 5)].over_limit


def test_a_claim_beyond_the_identitys_own_limit_is_a_trespass_too(clock):
    leases = manager(clock, max_per_user=1)
    events = []
    leases.on_event(events.append)
    leases.request(carol, {"gpu": 1})  # root: counted by identity alone
    leases.process_started(number(leases, 3), 77, carol)
    (trespass,) = [e for e in events if e.kind == "trespass"]
    assert trespass.details == {"pid": 77, "why": "over_limit", "limit": 1, "held": [0]}
    assert users_view(leases, None)[carol.user]["over_limit"] == 1
    assert users_view(leases, None)[carol.user]["accounts"] == []


def test_a_waiter_whose_account_grew_to_its_limit_waits_on(clock):
    leases = manager(clock, max_per_user=3)
    leases.request(alice, {"gpu": 1})  # device 0
    leases.process_started(number(leases, 0), 40, alice)
    for n in range(1, 8):  # every other device taken by other users' processes
        leases.process_started(number(leases, n), 100 + n, container(f"u{n}@x.org", 3000 + n))
    granted = []
    leases.wait(alice2, {"gpu": 2}, granted.append)  # the account holds 1: 1 + 2 is within 3

    def leave(n):
        leases.process_ended(number(leases, n), 100 + n)
        clock.advance(Config().lease + 1)
        leases.expire()

    leave(3)  # one free device: the waiter needs two
    leases.process_started(number(leases, 3), 55, anonymous)  # alice's account takes it
    leave(4)
    leave(5)  # two free, but the account holds 2 now: 2 + 2 is over 3
    assert granted == [] and len(leases.waiters) == 1
    leases.process_ended(number(leases, 0), 40)
    leases.release(alice)  # device 0 back: the account holds 1, the waiter is served
    assert len(granted) == 1 and [d.number for d in granted[0]] == [0, 4]
    assert leases.holder(number(leases, 0)) == alice2


def test_a_limit_set_by_the_accounts_name_applies_to_every_identity_on_it(clock):
    """A limits file names a host account by its name (`alice = 1`): every identity that runs
    as that account is counted under it, the container's labels whatever they say."""
    named = [
        container(user, ALICE_UID, short, account="alice")
        for user, short in (
            ("alice@example.org", "a11ce0000001"),
            ("alice+2@example.org", "a11ce0000002"),
        )
    ]
    leases = manager(clock, limits={"alice": 1})
    leases.request(named[0], {"gpu": 1})
    with pytest.raises(OverLimit) as refused:
        leases.request(named[1], {"gpu": 1})
    assert refused.value.data["account"] == "alice" and refused.value.data["limit"] == 1
    assert [d.number for d in leases.request(bob, {"gpu": 2})] == [1, 2]  # not alice's
