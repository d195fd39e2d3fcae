"""Lease books written by earlier versions, and by earlier boots, restore as they always did.

tests/fixtures/book/leases-v1.json is a book written, byte for byte, by the lease book of main at
a31d513 (before the book's schema moved out of the lease manager), on fake clocks: the manager's
clock at 1000.0 and the wall clock 1_779_999_000.0 ahead of it, one synthetic inventory, and

    alice   request gpu=1                       GPU 0: a lease (renewed 3 s later: wall +13)
    bob     request gpu=1, pid 11 on it, release  GPU 1: releasing, claimed by bob's process
    carol   request gpu=1 hold=process (pid 4242, start 123456)          GPU 2: held for it
    erin    request gpu=1 hold=2h               GPU 3: held until wall 1_780_007_200
    dana    (a container's user with info labels) computes on GPU 4     GPU 4: claimed

then the book closed at wall 1_780_000_003. Its `boot` is the boot id of the machine that wrote
it: the process entry is restored here through the `alive` hook, as LeaseBook does on the same
boot.
"""

import json
import os
import subprocess

import pytest
from helpers import ROOT, FakeClock, lease_manager

from patroller.config import Config
from patroller.core.errors import NotHeld
from patroller.core.identity import Identity, ProcessRef, named_user
from patroller.http.views import claims
from patroller.identify.procfs import boot_id, process_state
from patroller.state.book import LeaseBook
from patroller.state.schema import restore

LEASE = 10.0  # the lease the book was written under, and restored under here
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "book", "leases-v1.json")
SAVED = 1_780_000_003.0  # the wall clock when the book was written
CAROLS = ProcessRef(4242, 123456)
DANA = Identity(
    user="dana@example.org",
    source="container",
    email="dana@example.org",
    account="root",
    uid=0,
    container=("0123456789ab", "train"),
    info=(("team", "vision"), ("project", "x")),
)


def version_1():
    with open(FIXTURE, "rb") as f:
        return json.loads(f.read())


def test_a_book_of_version_1_restores_as_it_did_when_it_was_written():
    clock = FakeClock(500.0)
    leases = lease_manager(clock, lease=LEASE)
    u = [d.uuid for d in leases.inventory]
    book = version_1()
    offset = SAVED + 2.0 - clock()  # the daemon was down for 2 s
    restored = restore(leases, book["devices"], offset, alive=lambda ref: ref == CAROLS)
    assert restored.held == u[:5]
    assert restored.expired == restored.dropped == restored.ended == []
    shown = claims(leases)
    held = {
        uuid: (
            shown[uuid]["user"],
            shown[uuid]["state"],
            shown[uuid]["hold"],
            shown[uuid]["expires"],
            shown[uuid]["held_for_pid"],
        )
        for uuid in u
    }
    assert (
        held
        == {
            u[0]: (named_user("alice").to_json(), "reserved", "lease", 8.0, None),  # 13 - 3 - 2
            u[1]: (named_user("bob").to_json(), "reserved", "lease", LEASE, None),  # a fresh lease
            u[2]: (named_user("carol").to_json(), "reserved", "process", None, 4242),
            u[3]: (named_user("erin").to_json(), "reserved", "duration", 7195.0, None),
            u[4]: (
                DANA.to_json(),
                "reserved",
                "lease",
                LEASE,
                None,
            ),  # a fresh lease: it ran there
            **{uuid: (None, "free", None, None, None) for uuid in u[5:]},
        }
    )
    assert shown[u[4]]["user"]["info"] == {"team": "vision", "project": "x"}
    assert all(shown[uuid]["asked"] for uuid in u[:5])
    assert leases.processes_held_for() == {CAROLS}
    assert leases.next_deadline() == 508.0
    with pytest.raises(NotHeld, match="was released"):  # bob's device is still releasing
        leases.renew(named_user("bob"), u[1])
    leases.process_started(u[1], 11, named_user("bob"))
    leases.process_ended(u[1], 11)  # bob's process ends: released, so free, no new lease
    assert leases.state(u[1]) == "free"


def test_a_book_of_version_1_drops_the_process_entry_when_its_process_has_ended():
    clock = FakeClock(500.0)
    leases = lease_manager(clock, lease=LEASE)
    u = [d.uuid for d in leases.inventory]
    restored = restore(leases, version_1()["devices"], SAVED - clock(), alive=lambda ref: False)
    assert restored.ended == [u[2]] and restored.held == [u[0], u[1], u[3], u[4]]
    assert leases.state(u[2]) == "free" and leases.processes_held_for() == set()


@pytest.fixture
def live():
    """A process of the test that a book's entry is held for."""
    process = subprocess.Popen(["sleep", "120"])
    yield ProcessRef(process.pid, process_state(process.pid)[1])
    process.kill()
    process.wait()


@pytest.mark.parametrize(
    "boot, held", [(None, True), ("another boot", False)], ids=["this-boot", "another-boot"]
)
def test_a_process_entry_of_another_boot_is_dropped_not_held(tmp_path, live, boot, held):
    clock, wall = FakeClock(1000.0), FakeClock(1_800_000_000.0)
    leases = lease_manager(clock, lease=LEASE)
    book = LeaseBook(str(tmp_path), Config(), wall=wall)
    book.open()
    book.attach(leases)
    [device] = leases.request(named_user("carol"), {"gpu": 1}, held_for=live)
    [other] = leases.request(named_user("alice"), {"gpu": 1})
    book.close()
    path = tmp_path / "leases.json"
    written = json.loads(path.read_text())
    assert written["boot"] == boot_id() and written["devices"][device.uuid]["pid"] == live.pid
    os.unlink(path)  # the same book, as written in this boot or in another one
    path.write_text(json.dumps({**written, "boot": boot or written["boot"]}))
    again = lease_manager(clock, lease=LEASE)
    book = LeaseBook(str(tmp_path), Config(), wall=wall)
    book.open()
    restored = book.attach(again)
    assert again.state(other.uuid) == "reserved"  # a lease is held again either way
    if held:
        assert restored.held == [device.uuid, other.uuid] and restored.ended == []
        assert again.holder(device.uuid) == named_user("carol")
        assert again.processes_held_for() == {live}
    else:
        assert restored.held == [other.uuid] and restored.ended == [device.uuid]
        assert again.state(device.uuid) == "free" and again.processes_held_for() == set()
    book.close()
