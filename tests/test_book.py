"""The lease book: its schema's snapshot and restore with fake clocks, and the file on disk
(atomic, locked, set aside when corrupt)."""

import json
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import FakeClock, lease_manager

from patroller.config import Config, ConfigError, default_state_dir, load
from patroller.core.identity import Identity, ProcessRef, named_user
from patroller.core.leases.holds import EARLY
from patroller.http.views import claims, free_counts, usage
from patroller.identify.procfs import boot_id
from patroller.state.book import LeaseBook
from patroller.state.directory import BookError
from patroller.state.schema import decode, encode, restore, snapshot

LEASE = Config().lease  # the shared factory's
alice, bob, carol = named_user("alice"), named_user("bob"), named_user("carol")
CONTAINER_USER = Identity(
    user="dana@example.org",
    source="container",
    email="dana@example.org",
    account="root",
    uid=0,
    container=("0123456789ab", "train"),
    info=(("team", "vision"), ("project", "x")),
)


def uuids(leases):
    return [d.uuid for d in leases.inventory]


def claim(leases, uuid):
    return claims(leases)[uuid]


# -- snapshot and restore, no I/O ---------------------------------------------------------------


def test_the_snapshot_holds_every_held_device_with_its_deadline_on_the_wall_clock():
    clock = FakeClock(1000.0)
    leases = lease_manager(clock)
    u = uuids(leases)
    leases.request(alice, {"gpu": 1})
    leases.process_started(u[1], 7, CONTAINER_USER)
    snap = snapshot(leases, offset=5000.0)
    assert list(snap) == [u[0], u[1]]  # free devices are not in the book
    assert snap[u[0]] == {
        "holder": alice.to_json(),
        "state": "reserved",
        "releasing": False,
        "asked": True,
        "deadline": 6010.0,
    }
    assert snap[u[1]] == {
        "holder": CONTAINER_USER.to_json(),
        "state": "claimed",
        "releasing": False,
        "asked": False,
        "deadline": None,
    }


def test_a_restart_gives_each_holder_back_its_device_and_the_remaining_time():
    before = FakeClock(1000.0)
    old = lease_manager(before)
    u = uuids(old)
    old.request(alice, {"gpu": 2})  # u0, u1: reserved until 1010 (wall 6010)
    before.advance(3)
    old.process_started(u[2], 7, CONTAINER_USER)  # claimed: no deadline
    old.process_started(u[3], 8, carol)
    old.release(carol)  # releasing: free once pid 8 ends
    book = json.loads(json.dumps(snapshot(old, offset=5000.0)))  # through JSON, as on disk

    after = FakeClock(20.0)  # a new process (or boot): the monotonic clock starts elsewhere
    new = lease_manager(after)
    restored = restore(new, book, offset=6005.0 - 20.0)  # the daemon was down 2 s (wall 6005)
    assert restored.held == [u[0], u[1], u[2], u[3]] and not restored.expired
    assert claim(new, u[0])["user"]["user"] == "alice"
    assert claim(new, u[0])["state"] == "reserved" and claim(new, u[0])["expires"] == 5.0
    # the claimed device comes back reserved with a fresh lease, for the same identity
    assert claim(new, u[2])["state"] == "reserved" and claim(new, u[2])["expires"] == LEASE
    assert claim(new, u[2])["user"] == CONTAINER_USER.to_json()
    # its holder's process, seen again by the monitors, claims it again
    new.process_started(u[2], 7, CONTAINER_USER)
    assert claim(new, u[2])["state"] == "claimed" and claim(new, u[2])["expires"] is None
    # the releasing flag is kept: once carol's process is seen again and ends, the device is free
    new.process_started(u[3], 8, carol)
    new.process_ended(u[3], 8)
    assert new.state(u[3]) == "free"
    assert [new.state(x) for x in u[4:]] == ["free"] * 4
    # another user cannot have the restored devices
    assert [d.uuid for d in new.request(bob, {"gpu": 5})] == u[3:]


def test_a_reservation_that_ran_out_during_the_downtime_comes_back_free(caplog):
    old = lease_manager(FakeClock(1000.0))
    u = uuids(old)
    old.request(alice, {"gpu": 1})  # wall deadline 6010
    old.request(bob, {"gpu": 1})
    book = snapshot(old, offset=5000.0)
    new = lease_manager(FakeClock(0.0))
    with caplog.at_level(logging.INFO, logger="patroller.state.schema"):
        restored = restore(new, book, offset=6010.5)  # down until after both deadlines
    assert restored.expired == [u[0], u[1]] and restored.held == []
    assert free_counts(new) == {"gpu": 8} and new.next_deadline() is None
    lines = [r.getMessage() for r in caplog.records if "ran out" in r.getMessage()]
    assert lines == [
        f"lease of alice on {u[0]} ran out while the daemon was down",
        f"lease of bob on {u[1]} ran out while the daemon was down",
    ]


def test_a_restored_reservation_expires_at_its_deadline():
    old = lease_manager(FakeClock(1000.0))
    [device] = old.request(alice, {"gpu": 1})
    clock = FakeClock(0.0)
    new = lease_manager(clock)
    restore(new, snapshot(old, offset=5000.0), offset=6004.0)  # wall 6004: 6 s left
    assert new.next_deadline() == 6.0
    clock.advance(5.9)
    assert new.expire() == [] and new.state(device.uuid) == "reserved"
    clock.advance(0.1)
    assert new.expire() == [device]


def test_a_restored_reservation_never_has_more_than_a_full_lease_left():
    old = lease_manager(FakeClock(1000.0))
    [device] = old.request(alice, {"gpu": 1})  # wall deadline 6010
    new = lease_manager(FakeClock(0.0))
    restore(new, snapshot(old, offset=5000.0), offset=4000.0)  # the wall clock went back 1000 s
    assert claims(new)[device.uuid]["expires"] == LEASE


def test_a_device_this_host_no_longer_has_is_dropped_and_logged(caplog):
    old = lease_manager(FakeClock(1000.0))
    old.request(alice, {"gpu": 1})
    book = {"GPU-gone": next(iter(snapshot(old, offset=0.0).values()))}
    new = lease_manager(FakeClock(1000.0))
    with caplog.at_level(logging.WARNING, logger="patroller.state.schema"):
        restored = restore(new, book, offset=0.0)
    assert restored.dropped == ["GPU-gone"] and free_counts(new) == {"gpu": 8}
    assert any("GPU-gone" in r.getMessage() and "alice" in r.getMessage() for r in caplog.records)


def test_a_hold_for_a_duration_and_one_for_a_process_are_kept_to_the_millisecond():
    old = lease_manager(FakeClock(1000.0))
    u = uuids(old)
    old.request(alice, {"gpu": 1}, duration=3600.0)
    old.request(bob, {"gpu": 1}, held_for=ProcessRef(4242, 0))
    book = snapshot(old, offset=5000.12345)
    assert book[u[0]] == {
        "holder": alice.to_json(),
        "state": "reserved",
        "releasing": False,
        "asked": True,
        "deadline": None,
        "until": 9600.123,
    }
    assert book[u[1]] == {
        "holder": bob.to_json(),
        "state": "reserved",
        "releasing": False,
        "asked": True,
        "deadline": None,
        "pid": 4242,
        "start": 0,
    }
    old.request(carol, {"gpu": 1})
    deadline = snapshot(old, offset=5000.12345)[u[2]]["deadline"]
    assert deadline == round(1000.0 + LEASE + 5000.12345, 3)
    new = lease_manager(FakeClock(0.0))
    restored = restore(new, json.loads(json.dumps(book)), offset=5000.0, alive=lambda ref: True)
    assert restored.held == [u[0], u[1]]
    assert new.holds[u[0]].until == pytest.approx(4600.123)
    assert new.holds[u[1]].held_for == ProcessRef(4242, 0) and new.holds[u[1]].until is None


def test_a_book_is_compact_json_saved_to_the_millisecond():
    assert (
        encode({}, 1234.56789, "boot-1")
        == b'{"version":1,"saved":1234.568,"boot":"boot-1","devices":{}}'
    )


@pytest.mark.parametrize(
    "data, message",
    [
        (b"[]", "not an object"),
        (b'{"devices": {}}', "version None, not 1"),
        (b'{"version": 2, "devices": {}}', "version 2, not 1"),
    ],
)
def test_a_book_of_another_kind_is_refused_saying_why(data, message):
    with pytest.raises(ValueError) as refused:
        decode(data)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "change, message",
    [
        ("alice", "device 'GPU-x' must be an object"),
        ({"deadline": "soon"}, "device 'GPU-x' has a deadline that is not a time"),
        ({"until": float("inf")}, "device 'GPU-x' has a end that is not a time"),
        ({"until": 10**400}, "device 'GPU-x' has a end that is not a time"),
        ({"releasing": "no"}, "device 'GPU-x' has a releasing flag that is not true or false"),
        ({"releasing": None}, "device 'GPU-x' has a releasing flag that is not true or false"),
        ({"asked": 1}, "device 'GPU-x' has an asked flag that is not true or false"),
        ({"pid": 4242}, "device 'GPU-x' has a process that is not a pid and a start time"),
        ({"start": 5}, "device 'GPU-x' has a process that is not a pid and a start time"),
        (
            {"pid": -1, "start": 5},
            "device 'GPU-x' has a process that is not a pid and a start time",
        ),
        (
            {"pid": True, "start": 5},
            "device 'GPU-x' has a process that is not a pid and a start time",
        ),
    ],
)
def test_a_malformed_entry_is_refused_naming_its_device(change, message):
    entry = change if isinstance(change, str) else {"holder": alice.to_json(), **change}
    with pytest.raises(ValueError) as refused:
        restore(lease_manager(FakeClock()), {"GPU-x": entry}, offset=0.0)
    assert str(refused.value) == message


def test_devices_that_are_no_object_are_refused():
    with pytest.raises(ValueError) as refused:
        restore(lease_manager(FakeClock()), [], offset=0.0)
    assert str(refused.value) == "devices must be an object"


def test_an_entry_that_says_only_its_holder_is_a_reservation_with_a_fresh_lease():
    new = lease_manager(FakeClock(0.0))
    u = uuids(new)
    restored = restore(new, {u[0]: {"holder": alice.to_json()}}, offset=0.0)
    assert restored.held == [u[0]]
    hold = new.holds[u[0]]
    assert hold.releasing is False and hold.asked is True and hold.deadline == LEASE
    assert hold.held_for is None and hold.until is None


def test_a_process_with_pid_and_start_time_zero_is_a_process():
    new = lease_manager(FakeClock(0.0))
    u = uuids(new)
    entry = {"holder": alice.to_json(), "deadline": None, "pid": 0, "start": 0}
    assert restore(new, {u[0]: entry}, offset=0.0, alive=lambda ref: True).held == [u[0]]
    assert new.holds[u[0]].held_for == ProcessRef(0, 0)


def test_each_entry_is_judged_alone_and_a_device_held_again_is_left_to_its_holder(caplog):
    clock = FakeClock(100.0)
    new = lease_manager(clock)
    u = uuids(new)
    [taken] = new.request(bob, {"gpu": 1})
    assert taken.uuid == u[0]
    book = {
        u[0]: {"holder": alice.to_json(), "deadline": None},  # bob holds it again
        u[1]: {"holder": alice.to_json(), "deadline": 100.0 + EARLY},  # ran out (<=)
        u[2]: {"holder": carol.to_json(), "deadline": None, "until": 100.0 + EARLY},
        u[3]: {"holder": carol.to_json(), "deadline": None, "until": 100.0 + EARLY / 2},
        u[4]: {"holder": bob.to_json(), "deadline": 100.0 + EARLY / 2},
        u[5]: {"holder": carol.to_json(), "deadline": None, "pid": 77, "start": 5},
        u[6]: {"holder": alice.to_json(), "deadline": 100.0 + 2 * EARLY},
    }
    with caplog.at_level(logging.INFO, logger="patroller.state.schema"):
        restored = restore(new, book, offset=0.0)
    assert new.holder(u[0]) == bob and new.holds[u[0]].deadline == 100.0 + LEASE
    assert restored.expired == [u[1], u[2], u[3], u[4]]
    assert restored.ended == [u[5]]
    assert restored.held == [u[6]] and new.holder(u[6]) == alice
    assert [r.getMessage() for r in caplog.records] == [
        f"lease of alice on {u[1]} ran out while the daemon was down",
        f"the reservation of carol on {u[2]} ended while the daemon was down",
        f"the reservation of carol on {u[3]} ended while the daemon was down",
        f"lease of bob on {u[4]} ran out while the daemon was down",
        f"pid 77 of carol, which held {u[5]}, ended while the daemon was down",
    ]


@pytest.mark.parametrize(
    "gone, shown",
    [
        (
            5,
            "GPU-gone-0 (alice), GPU-gone-1 (alice), GPU-gone-2 (alice), GPU-gone-3 (alice), "
            "GPU-gone-4 (alice)",
        ),
        (
            6,
            "GPU-gone-0 (alice), GPU-gone-1 (alice), GPU-gone-2 (alice), GPU-gone-3 (alice), "
            "GPU-gone-4 (alice), ...",
        ),
    ],
)
def test_devices_this_host_no_longer_has_are_one_line_naming_the_first_five(caplog, gone, shown):
    book = {f"GPU-gone-{n}": {"holder": alice.to_json(), "deadline": None} for n in range(gone)}
    with caplog.at_level(logging.WARNING, logger="patroller.state.schema"):
        restored = restore(lease_manager(FakeClock()), book, offset=0.0)
    assert restored.dropped == list(book)
    assert [r.getMessage() for r in caplog.records] == [
        f"the lease book holds {gone} device(s) this host no longer has: dropped: {shown}"
    ]


@pytest.mark.parametrize(
    "book",
    [
        [],
        {"X": "alice"},
        {"X": {"holder": {"user": "alice"}, "deadline": None}},  # no source
        {"X": {"holder": alice.to_json(), "deadline": "soon"}},
        {"X": {"holder": alice.to_json(), "deadline": True}},
        {"X": {"holder": alice.to_json(), "deadline": 10**400}},
        {"X": {"holder": alice.to_json(), "deadline": float("nan")}},
        {"X": {"holder": alice.to_json(), "deadline": None, "releasing": "yes"}},
        {"X": {"holder": {**alice.to_json(), "uid": "0"}, "deadline": None}},
        {"X": {"holder": {**alice.to_json(), "container": {"name": "x"}}, "deadline": None}},
        {
            "X": {"holder": {**alice.to_json(), "pod": {"name": "x"}}, "deadline": None}
        },  # no namespace
        {
            "X": {
                "holder": {**alice.to_json(), "pod": {"namespace": "a", "name": 3}},
                "deadline": None,
            }
        },
    ],
)
def test_a_malformed_book_changes_nothing(book):
    leases = lease_manager(FakeClock())
    good = {leases.inventory.by_number(0).uuid: {"holder": bob.to_json(), "deadline": None}}
    with pytest.raises(ValueError):
        restore(leases, {**good, **book} if isinstance(book, dict) else book, offset=0.0)
    assert free_counts(leases) == {"gpu": 8}


def test_an_identity_written_before_pods_reads_back_with_none():
    data = alice.to_json()
    del data["pod"]
    assert Identity.from_json(data) == alice


def test_a_claimed_identity_reads_back_claimed_and_one_written_before_claims_unclaimed():
    # A rootless container's: its labels' e-mail its user's own claim, its user the account.
    claimed = replace(CONTAINER_USER, user="dana", account="dana", uid=1001, claimed=True)
    assert claimed.to_json()["claimed"] is True and "claimed" not in CONTAINER_USER.to_json()
    assert Identity.from_json(json.loads(json.dumps(claimed.to_json()))) == claimed
    assert not Identity.from_json(CONTAINER_USER.to_json()).claimed


@pytest.mark.parametrize(
    "change, message",
    [
        ({"user": ""}, "an identity needs a user and a source"),
        ({"user": 3}, "an identity needs a user and a source"),
        ({"source": None}, "an identity needs a user and a source"),
        ({"email": 3}, "an identity's email must be a string"),
        ({"account": ["root"]}, "an identity's account must be a string"),
        ({"uid": "0"}, "an identity's uid must be an integer"),
        ({"uid": True}, "an identity's uid must be an integer"),
        ({"container": "abc"}, "an identity's container must have an id and a name"),
        (
            {"container": {"id": "abc", "name": 3}},
            "an identity's container must have an id and a name",
        ),
        ({"info": "team"}, "an identity's info must map strings to strings"),
        ({"info": {"team": 3}}, "an identity's info must map strings to strings"),
        ({"info": {3: "vision"}}, "an identity's info must map strings to strings"),
        ({"degraded": "yes"}, "an identity's degraded must be true or false"),
        ({"claimed": "yes"}, "an identity's claimed must be true or false"),
        ({"job": "42"}, "an identity's job must map strings to strings, with an id"),
        ({"job": {"step": "0"}}, "an identity's job must map strings to strings, with an id"),
        (
            {"job": {"id": "42", "step": 0}},
            "an identity's job must map strings to strings, with an id",
        ),
        (
            {"job": {"id": "42", 0: "step"}},
            "an identity's job must map strings to strings, with an id",
        ),
        (
            {"pod": {"namespace": "ml", "name": "a", "uid": 3}},
            "an identity's pod must map strings to strings, with a namespace and a name",
        ),
        (
            {"pod": {"namespace": "ml", "name": "a", 3: "uid"}},
            "an identity's pod must map strings to strings, with a namespace and a name",
        ),
        (
            {"pod": "ml/a"},
            "an identity's pod must map strings to strings, with a namespace and a name",
        ),
    ],
)
def test_a_malformed_identity_is_refused_saying_what_is_wrong(change, message):
    with pytest.raises(ValueError) as refused:
        Identity.from_json({**CONTAINER_USER.to_json(), **change})
    assert str(refused.value) == message


def test_an_identity_that_is_no_object_is_refused():
    with pytest.raises(ValueError) as refused:
        Identity.from_json(["alice", "test"])
    assert str(refused.value) == "an identity must be an object"


def test_an_identity_written_with_only_a_user_and_a_source_reads_back_whole():
    assert Identity.from_json({"user": "erin", "source": "host"}) == Identity(
        user="erin", source="host"
    )


def test_identities_survive_the_trip_through_json():
    for identity in (
        alice,
        CONTAINER_USER,
        Identity(user="unknown", source="unknown"),
        Identity(user="x", source="container", container=("abc", None), degraded=True),
        Identity(
            user="frank",
            source="slurm",
            account="frank",
            uid=1001,
            job=(("id", "42"), ("step", "0"), ("partition", "gpu")),
        ),
        Identity(
            user="namespace:ml",
            source="pod",
            container=("abc", "train"),
            pod=(("namespace", "ml"), ("name", "train-0"), ("uid", "u-1"), ("container", "train")),
        ),
    ):
        assert Identity.from_json(json.loads(json.dumps(identity.to_json()))) == identity


# -- the file -----------------------------------------------------------------------------------


@pytest.fixture
def wall():
    return FakeClock(1_800_000_000.0)  # the wall clock: 2027-01-15 08:00:00 UTC


def opened(directory, clock, wall):
    leases = lease_manager(clock)
    book = LeaseBook(str(directory), Config(), wall=wall)
    book.open()
    book.attach(leases)
    return book, leases


def on_disk(directory):
    with open(os.path.join(directory, "leases.json"), encoding="utf-8") as f:
        return json.load(f)


def test_every_change_is_on_disk_before_the_call_returns(tmp_path, clock, wall):
    book, leases = opened(tmp_path, clock, wall)
    assert on_disk(tmp_path) == {"version": 1, "saved": wall(), "boot": boot_id(), "devices": {}}
    [device] = leases.request(alice, {"gpu": 1})
    held = on_disk(tmp_path)["devices"]
    assert held == {
        device.uuid: {
            "holder": alice.to_json(),
            "state": "reserved",
            "releasing": False,
            "asked": True,
            "deadline": wall() + LEASE,
        }
    }
    leases.release(alice)
    assert on_disk(tmp_path)["devices"] == {}
    # one file, named by the link; no temporary, no earlier version left behind
    assert sorted(os.listdir(tmp_path)) == ["leases-3.json", "leases.json", "lock"]
    assert os.readlink(tmp_path / "leases.json") == "leases-3.json"
    assert oct(os.stat(tmp_path / "leases.json").st_mode & 0o777) == "0o600"
    book.close()


def test_changes_that_leave_the_book_as_it_was_are_not_written(tmp_path, clock, wall):
    book, leases = opened(tmp_path, clock, wall)
    [device] = leases.request(alice, {"gpu": 1})
    leases.process_started(device.uuid, 1, alice)  # claimed: the deadline goes
    leases.request(bob, {"gpu": 1})  # a deadline on the wall clock stays in the book
    writes = book.writes
    inode = os.stat(tmp_path / "leases.json").st_ino
    for pid in range(2, 50):  # churn of the holder's own processes: the book does not change
        clock.advance(0.1)
        wall.advance(0.1003)  # and the two clocks drift a little apart
        leases.process_started(device.uuid, pid, alice)
        leases.process_ended(device.uuid, pid)
    assert book.writes == writes and os.stat(tmp_path / "leases.json").st_ino == inode
    leases.process_ended(device.uuid, 1)  # reserved again: a new deadline, written
    assert book.writes == writes + 1
    # drift under a second is not followed (the offset stays put): off by that drift at most
    assert on_disk(tmp_path)["devices"][device.uuid]["deadline"] == pytest.approx(
        wall() + LEASE, abs=0.05
    )
    book.close()


def test_a_step_of_the_wall_clock_is_followed(tmp_path, clock, wall):
    book, leases = opened(tmp_path, clock, wall)
    [device] = leases.request(alice, {"gpu": 1})
    wall.advance(3600)  # the host's clock is set an hour ahead
    leases.request(bob, {"gpu": 1})
    held = on_disk(tmp_path)["devices"]
    assert held[device.uuid]["deadline"] == wall() + LEASE  # still LEASE from now
    book.close()


def test_the_wall_clock_is_followed_only_past_a_second(tmp_path, clock, wall):
    book, leases = opened(tmp_path, clock, wall)
    [device] = leases.request(alice, {"gpu": 1})
    written = wall() + LEASE
    wall.advance(1.0)  # exactly STEADY: the offset stays, the deadline too
    leases.request(bob, {"gpu": 1})
    assert on_disk(tmp_path)["devices"][device.uuid]["deadline"] == written
    wall.advance(0.5)  # 1.5 s in all: followed
    leases.request(carol, {"gpu": 1})
    assert on_disk(tmp_path)["devices"][device.uuid]["deadline"] == written + 1.5
    book.close()


@pytest.mark.errors_expected
def test_a_failing_write_is_logged_now_and_then_and_breaks_nothing(tmp_path, clock, wall, caplog):
    book, leases = opened(tmp_path, clock, wall)
    [first] = leases.request(alice, {"gpu": 1})
    os.mkdir(tmp_path / "leases.json.tmp")  # the temporary cannot be created: EISDIR
    with caplog.at_level(logging.WARNING, logger="patroller.state.book"):
        for _ in range(5):
            leases.request(bob, {"gpu": 1})  # the rules alone: the daemon gates them on the book
        assert book.failures == 5 and free_counts(leases) == {"gpu": 2}
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        path = tmp_path / "leases.json"
        assert [r.getMessage() for r in errors] == [
            f"cannot write the lease book {path}: Is a directory (1 failed write(s) so far); no "
            "reservation is handed out until it can be written"
        ]
        assert book.refusal() == (
            f"the lease book {path} cannot be written (Is a directory): no "
            "reservation is handed out until it can; try again shortly"
        )
        assert book.metrics() == {
            "path": str(path),
            "writes": 2,
            "failures": 5,
            "writable": False,
            "read_only": False,
        }
        clock.advance(Config().repeat_log_every)
        leases.request(bob, {"gpu": 1})
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 2 and "(6 failed write(s) so far)" in errors[1].getMessage()
        # the file on disk is the last one written whole
        assert list(on_disk(tmp_path)["devices"]) == [first.uuid]
        os.rmdir(tmp_path / "leases.json.tmp")
        leases.release(bob)
        assert list(on_disk(tmp_path)["devices"]) == [first.uuid]
        assert caplog.records[-1].getMessage() == (
            f"lease book {path} is written again (6 write(s) failed); reservations are handed "
            "out again"
        )
        assert book.metrics() == {
            "path": str(path),
            "writes": 3,
            "failures": 6,
            "writable": True,
            "read_only": False,
        }
    book.close()


@pytest.mark.errors_expected
def test_a_failing_book_whose_change_was_undone_opens_the_gate_at_the_next_write(
    tmp_path, clock, wall
):
    """A write fails; the change is undone meanwhile (what is held is what was last written):
    the next write still tries, and once it works the gate opens."""
    book, leases = opened(tmp_path, clock, wall)
    leases.request(alice, {"gpu": 1})
    os.mkdir(tmp_path / "leases.json.tmp")  # the temporary cannot be created: EISDIR
    leases.request(bob, {"gpu": 1})
    assert book.refusal() is not None and not book.metrics()["writable"]
    os.rmdir(tmp_path / "leases.json.tmp")
    leases.release(bob)  # as it was written; nothing else moved (neither clock)
    assert book.refusal() is None and book.metrics()["writable"]
    book.close()


def test_the_book_is_read_back_by_the_next_daemon(tmp_path, clock, wall):
    book, leases = opened(tmp_path, clock, wall)
    granted = leases.request(alice, {"gpu": 3})
    book.close()
    wall.advance(4)
    later = FakeClock(3.0)
    book, leases = opened(tmp_path, later, wall)
    assert [leases.state(d.uuid) for d in granted] == ["reserved"] * 3
    assert leases.next_deadline() == pytest.approx(3.0 + LEASE - 4)
    book.close()


def test_what_a_killed_daemon_left_is_tidied_away(tmp_path, clock, wall):
    book, leases = opened(tmp_path, clock, wall)
    [device] = leases.request(alice, {"gpu": 1})
    os.close(book._lock)  # as if killed: no close(), the lock goes with the process
    current = os.readlink(tmp_path / "leases.json")
    (tmp_path / "leases-7.json").write_text("{}")  # written, never linked
    os.symlink("leases-7.json", tmp_path / "leases.json.tmp")  # made, never swung
    book, leases = opened(tmp_path, clock, wall)
    assert leases.state(device.uuid) == "reserved"
    assert sorted(os.listdir(tmp_path)) == ["leases-8.json", "leases.json", "lock"]
    assert current != "leases-8.json" and os.readlink(tmp_path / "leases.json") == "leases-8.json"
    book.close()


def test_a_plain_file_is_read_and_replaced_by_the_link(tmp_path, clock, wall):
    old, leases = opened(tmp_path / "old", clock, wall)
    [device] = leases.request(alice, {"gpu": 1})
    old.close()
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "leases.json").write_bytes((tmp_path / "old" / "leases.json").read_bytes())
    book, leases = opened(tmp_path / "new", clock, wall)
    assert leases.state(device.uuid) == "reserved"
    assert os.path.islink(tmp_path / "new" / "leases.json")
    book.close()


def test_a_corrupt_file_behind_the_link_is_what_is_set_aside(tmp_path, clock, wall):
    book, leases = opened(tmp_path, clock, wall)
    leases.request(alice, {"gpu": 1})
    book.close()
    (tmp_path / os.readlink(tmp_path / "leases.json")).write_bytes(b"\0\0\0")
    book, leases = opened(tmp_path, clock, wall)
    aside = tmp_path / "leases.json.corrupt-20270115T080000Z"
    assert aside.read_bytes() == b"\0\0\0" and not aside.is_symlink()
    assert free_counts(leases) == {"gpu": 8} and on_disk(tmp_path)["devices"] == {}
    book.close()


def test_a_link_to_a_missing_file_is_set_aside(tmp_path, clock, wall, caplog):
    os.symlink("leases-3.json", tmp_path / "leases.json")
    with caplog.at_level(logging.WARNING, logger="patroller.state.book"):
        book, leases = opened(tmp_path, clock, wall)
    [line] = [r.getMessage() for r in caplog.records]
    assert "links to a missing file (leases-3.json)" in line and "set aside" in line
    assert free_counts(leases) == {"gpu": 8} and on_disk(tmp_path)["devices"] == {}
    book.close()


@pytest.mark.parametrize(
    "content",
    [
        b'{"version": 1, "devices": {"GPU-1": ',  # cut short
        b"\xff\xfe not even text",
        b"[1, 2, 3]",
        b'{"version": 99, "devices": {}}',
        b'{"version": 1, "devices": {"GPU-1": {"holder": {"user": 3}}}}',
        b"[" * 100000 + b"]" * 100000,
    ],
)
def test_a_corrupt_file_is_set_aside_with_one_line(tmp_path, clock, wall, caplog, content):
    (tmp_path / "leases.json").write_bytes(content)
    with caplog.at_level(logging.INFO, logger="patroller"):
        book, leases = opened(tmp_path, clock, wall)
    lines = [r for r in caplog.records if r.name == "patroller.state.book"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    message = lines[0].getMessage()
    aside = tmp_path / "leases.json.corrupt-20270115T080000Z"
    assert message.startswith(f"lease book {tmp_path / 'leases.json'} is not a lease book (")
    assert message.endswith(f"); set aside as {aside}, starting with no reservations")
    assert aside.read_bytes() == content and not aside.is_symlink()
    assert free_counts(leases) == {"gpu": 8}
    assert on_disk(tmp_path)["devices"] == {}  # a fresh book in its place
    book.close()


def test_an_unreadable_file_is_set_aside(tmp_path, clock, wall, caplog):
    (tmp_path / "leases.json").mkdir()  # reading it fails (root reads any plain file)
    with caplog.at_level(logging.WARNING, logger="patroller.state.book"):
        book, leases = opened(tmp_path, clock, wall)
    [line] = [r.getMessage() for r in caplog.records]
    aside = tmp_path / "leases.json.corrupt-20270115T080000Z"
    assert line == (
        f"lease book {tmp_path / 'leases.json'} cannot be read (Is a directory); set "
        f"aside as {aside}, starting with no reservations"
    )
    assert (tmp_path / "leases.json.corrupt-20270115T080000Z").is_dir()
    assert free_counts(leases) == {"gpu": 8} and on_disk(tmp_path)["devices"] == {}
    book.close()


def test_each_corrupt_file_set_aside_in_the_same_second_gets_the_next_number(
    tmp_path, clock, wall, caplog
):
    stamp = "leases.json.corrupt-20270115T080000Z"
    for n in range(3):
        (tmp_path / "leases.json").write_bytes(b"garbage %d" % n)
        book, leases = opened(tmp_path, clock, wall)
        book.close()
    assert (tmp_path / stamp).read_bytes() == b"garbage 0"
    assert (tmp_path / f"{stamp}-2").read_bytes() == b"garbage 1"
    assert (tmp_path / f"{stamp}-3").read_bytes() == b"garbage 2"


@pytest.mark.errors_expected  # and then no write works either
@pytest.mark.skipif(os.geteuid() != 0, reason="a directory root cannot write to takes root")
def test_a_corrupt_file_that_cannot_be_set_aside_is_one_line(tmp_path, clock, wall, caplog):
    (tmp_path / "leases.json").write_bytes(b"garbage")
    subprocess.run(["chattr", "+a", str(tmp_path)], check=True)  # nothing renamed, not by root
    try:
        with caplog.at_level(logging.WARNING, logger="patroller.state.book"):
            book, leases = opened(tmp_path, clock, wall)
        assert [r.getMessage() for r in caplog.records][:1] == [
            f"lease book {tmp_path / 'leases.json'} is not a lease book (Expecting value: line 1 "
            "column 1 (char 0)) and cannot be set aside (Operation not permitted); starting "
            "with no reservations"
        ]
        book.close()
    finally:
        subprocess.run(["chattr", "-a", str(tmp_path)], check=True)


def test_the_directory_is_created_private(tmp_path):
    book = LeaseBook(str(tmp_path / "a" / "state"), Config())
    book.open()
    assert oct(os.stat(tmp_path / "a" / "state").st_mode & 0o777) == "0o700"
    book.close()


def test_an_unusable_directory_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(BookError) as error:
        LeaseBook(str(tmp_path / "file" / "state"), Config()).open()
    assert str(error.value) == (
        f"cannot use the state directory {tmp_path / 'file' / 'state'}: "
        "Not a directory; choose another --state-dir"
    )


def test_one_directory_serves_one_daemon(tmp_path):
    first = LeaseBook(str(tmp_path), Config())
    first.open()
    with pytest.raises(BookError) as error:
        LeaseBook(str(tmp_path), Config()).open()
    assert str(error.value) == (
        f"another patroller (pid {os.getpid()}) uses the state directory "
        f"{tmp_path}; stop it, or give this one another --state-dir"
    )
    with open(tmp_path / "lock", encoding="ascii") as f:
        assert f.read() == f"{os.getpid()}\n"  # the holder's pid, and nothing after it
    assert os.stat(tmp_path / "lock").st_mode & 0o7777 == 0o600
    first.close()
    second = LeaseBook(str(tmp_path), Config())
    second.open()  # free again once the first let go
    second.close()


# -- the setting -------------------------------------------------------------------------------


def test_state_dir_flag_environment_and_off(tmp_path):
    assert load(["--state-dir", str(tmp_path)], {}).state_dir == str(tmp_path)
    assert load([], {"PATROLLER_STATE_DIR": str(tmp_path)}).state_dir == str(tmp_path)
    assert load(["--state-dir", "none"], {"PATROLLER_STATE_DIR": str(tmp_path)}).state_dir is None
    assert load([], {"PATROLLER_STATE_DIR": ""}).state_dir is None
    assert load(["--test"], {}).state_dir is None  # test daemons keep no book unless asked
    assert load(["--test", "--state-dir", str(tmp_path)], {}).state_dir == str(tmp_path)


def test_state_dir_defaults():
    assert default_state_dir(False, {}, 0) == "/var/lib/patroller"
    assert (
        default_state_dir(False, {"HOME": "/home/al"}, 1000) == "/home/al/.local/state/patroller"
    )
    assert (
        default_state_dir(False, {"HOME": "/home/al", "XDG_STATE_HOME": "/s"}, 1000)
        == "/s/patroller"
    )
    assert (
        default_state_dir(False, {"HOME": "/home/al", "XDG_STATE_HOME": "rel"}, 1000)
        == "/home/al/.local/state/patroller"
    )
    assert default_state_dir(True, {}, 0) is None


def test_a_state_dir_that_is_a_file_is_refused_naming_the_flag(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError) as error:
        load(["--state-dir", str(tmp_path / "file")], {})
    assert "--state-dir" in str(error.value) and "not a directory" in str(error.value)


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_directory_others_may_write_to_is_refused(tmp_path, mode):
    os.chmod(tmp_path, mode)
    with pytest.raises(BookError) as error:
        LeaseBook(str(tmp_path), Config()).open()
    assert str(error.value) == (
        f"the state directory {tmp_path} is writable by others (mode {mode:o}, uid "
        f"{os.geteuid()}); choose another --state-dir, or make it ours and private (chmod 700)"
    )
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away takes root")
def test_a_directory_of_another_user_is_refused(tmp_path):
    os.chmod(tmp_path, 0o700)
    os.chown(tmp_path, 4321, 4321)
    with pytest.raises(BookError) as error:
        LeaseBook(str(tmp_path), Config()).open()
    assert str(error.value) == (
        f"the state directory {tmp_path} is not ours (mode 700, uid 4321); choose another "
        "--state-dir, or make it ours and private (chmod 700)"
    )


def test_a_book_of_many_unknown_devices_costs_one_line_and_a_big_one_is_set_aside(
    tmp_path, clock, wall, caplog
):
    entry = {"holder": alice.to_json(), "releasing": False, "deadline": None}
    book = {
        "version": 1,
        "saved": wall(),
        "boot": boot_id(),
        "devices": {f"GPU-gone-{n}": entry for n in range(2000)},
    }
    (tmp_path / "leases.json").write_text(json.dumps(book))
    with caplog.at_level(logging.INFO, logger="patroller"):
        first, leases = opened(tmp_path, clock, wall)
    first.close()
    lines = [r.getMessage() for r in caplog.records if "no longer has" in r.getMessage()]
    assert len(lines) == 1 and "2000 device(s)" in lines[0] and "GPU-gone-0 (alice)" in lines[0]
    assert free_counts(leases) == {"gpu": 8}
    # A file far bigger than any book is not read as one.
    book["devices"] = {f"GPU-gone-{n}": entry for n in range(20000)}
    (tmp_path / "leases.json").unlink()
    (tmp_path / "leases.json").write_text(json.dumps(book))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="patroller"):
        second, leases = opened(tmp_path, clock, wall)
    second.close()
    assert [r.getMessage() for r in caplog.records if "no longer has" in r.getMessage()] == []
    assert any("is not a lease book (over" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's link and root's book take root")
def test_a_state_directory_reached_through_another_users_link_is_refused(tmp_path):
    # As found: a sticky, world-writable parent, where uid 65534 made `state` a link to a
    # directory of root's holding root's book. The daemon followed it, renamed root's
    # leases.json and deleted its leases-7.json.
    roots = tmp_path / "root-owned"
    roots.mkdir(mode=0o700)
    (roots / "leases.json").write_text("not a book of this daemon's")
    (roots / "leases-7.json").write_text("{}")
    shared = Path(tempfile.mkdtemp(prefix="pshared", dir="/tmp"))  # where uid 65534 reaches
    try:
        os.chmod(shared, 0o1777)
        subprocess.run(["ln", "-s", str(roots), str(shared / "state")], check=True, user=65534)
        with pytest.raises(BookError) as error:
            LeaseBook(str(shared / "state"), Config()).open()
        assert str(error.value) == (
            f"the state directory {shared / 'state'} is reached through {shared / 'state'}, a "
            "link another user (uid 65534) made; choose another --state-dir"
        )
        assert sorted(os.listdir(roots)) == ["leases-7.json", "leases.json"]  # untouched
        # Under a link, in any part of the path, the same.
        subprocess.run(["ln", "-s", str(roots), str(shared / "deeper")], check=True, user=65534)
        with pytest.raises(BookError):
            LeaseBook(str(shared / "deeper" / "state"), Config()).open()
        assert sorted(os.listdir(roots)) == ["leases-7.json", "leases.json"]
    finally:
        shutil.rmtree(shared)


def test_a_state_directory_in_a_directory_others_may_write_to_is_refused(tmp_path):
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)  # not sticky: anyone may replace what is in it at any time
    with pytest.raises(BookError) as error:
        LeaseBook(str(parent / "state"), Config()).open()
    assert str(error.value) == (
        f"the state directory {parent / 'state'} is in {parent}, which others may write to "
        "(mode 777, not sticky); choose a --state-dir in a directory only its owner writes to"
    )
    assert os.listdir(parent) == []
    os.chmod(parent, 0o1777)  # sticky: what we make there stays ours
    book = LeaseBook(str(parent / "state"), Config())
    book.open()
    book.close()


def test_a_lock_held_by_a_daemon_that_wrote_no_pid_names_none(tmp_path):
    first = LeaseBook(str(tmp_path), Config())
    first.open()
    os.truncate(tmp_path / "lock", 0)
    with pytest.raises(BookError) as error:
        LeaseBook(str(tmp_path), Config()).open()
    assert str(error.value) == (
        f"another patroller uses the state directory {tmp_path}; stop "
        "it, or give this one another --state-dir"
    )
    first.close()


@pytest.mark.parametrize("written", [b"\xff\xfe\n", b"12ab\n", b"9" * 40])
def test_a_lock_file_that_names_no_pid_names_none(tmp_path, written):
    first = LeaseBook(str(tmp_path), Config())
    first.open()
    with open(tmp_path / "lock", "wb") as f:  # not a pid: garbage, or longer than one
        f.write(written)
    with pytest.raises(BookError) as error:
        LeaseBook(str(tmp_path), Config()).open()
    owner = f" (pid {'9' * 32})" if written == b"9" * 40 else ""  # its first 32 bytes
    assert str(error.value) == (
        f"another patroller{owner} uses the state directory {tmp_path}; "
        "stop it, or give this one another --state-dir"
    )
    first.close()


def test_a_new_link_left_at_the_moment_of_a_write_is_replaced(tmp_path, clock, wall):
    book, leases = opened(tmp_path, clock, wall)
    os.symlink("leases-99.json", tmp_path / "leases.json.tmp")  # as a daemon killed just then
    [device] = leases.request(alice, {"gpu": 1})
    assert list(on_disk(tmp_path)["devices"]) == [device.uuid]
    assert sorted(os.listdir(tmp_path)) == ["leases-2.json", "leases.json", "lock"]
    book.close()


def test_use_without_asking_is_kept_across_a_restart():
    # As found: after a restart a GPU a user had taken by computing on it counted as asked for,
    # and "used without asking" (/users unreserved) dropped to 0.
    before = FakeClock(1000.0)
    old = lease_manager(before)
    u = uuids(old)
    old.request(alice, {"gpu": 1})  # u0: asked for
    old.process_started(u[1], 7, carol)  # u1: taken by computing on it
    book = json.loads(json.dumps(snapshot(old, offset=5000.0)))
    assert usage(old)["carol"]["unreserved"] == 1
    new = lease_manager(FakeClock(2000.0))
    restore(new, book, offset=4000.0)
    new.process_started(u[1], 7, carol)  # the monitors see it again
    assert usage(new)["carol"]["unreserved"] == 1 and usage(new)["alice"]["unreserved"] == 0
    # A book of the version before, which did not keep it: asked, as it was taken then.
    del book[u[1]]["asked"]
    older = lease_manager(FakeClock(2000.0))
    restore(older, book, offset=4000.0)
    assert older.holds[u[1]].asked
    with pytest.raises(ValueError):
        restore(lease_manager(FakeClock(2000.0)), {u[1]: {**book[u[1]], "asked": "no"}}, 0.0)
