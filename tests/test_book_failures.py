"""The lease book's file when things go wrong: writes that fail and are tried again on the
event loop, a write cut short by a full disk (a real tmpfs), a name already taken, a start whose
first write fails, a book that could not be opened, the close, the limit on a book's size, a
read-only directory, what a start says it made of each device and the /proc it looks in (real
files; test_book.py has the rest)."""

import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import async_test, lease_manager, until
from test_book import alice, bob, carol, on_disk, opened, uuids, wall  # noqa: F401 (fixture)
from test_read_only_state import read_only_view
from test_usage_store import fill, tmpfs

from patroller.config import Config
from patroller.core.identity import named_user
from patroller.identify.procfs import boot_id
from patroller.state.book import MAX_SIZE, LeaseBook
from patroller.state.directory import BookError

W = 1_800_000_000.0  # the `wall` fixture's time


def book_in(directory, clock, wall, **settings):
    """A book opened on `directory` and attached to a fresh lease manager, on `settings`."""
    leases = lease_manager(clock)
    book = LeaseBook(str(directory), replace(Config(), **settings), wall=wall)
    book.open()
    book.attach(leases)
    return book, leases


def blocked(directory, on=True):
    """Writes fail while a directory stands where the new link is made (EISDIR)."""
    if on:
        os.mkdir(directory / "leases.json.tmp")
    else:
        os.rmdir(directory / "leases.json.tmp")


@pytest.mark.errors_expected  # the failing writes
@async_test
async def test_a_failing_write_is_tried_again_on_the_loop_until_it_works(tmp_path, clock, wall):
    book, leases = book_in(tmp_path, clock, wall, book_retry=0.01)
    leases.request(alice, {"gpu": 1})
    blocked(tmp_path)
    [bobs] = leases.request(bob, {"gpu": 1})  # fails: tried again once the loop turns
    blocked(tmp_path, False)
    [carols] = leases.request(carol, {"gpu": 1})  # written: the try to come is called off
    assert book.refusal() is None and bobs.uuid in on_disk(tmp_path)["devices"]
    blocked(tmp_path)
    leases.release(carol)  # fails again: tried again as the first time
    await until(lambda: book.failures >= 3)  # tried again, and failed again: tried once more
    assert book.refusal() is not None
    blocked(tmp_path, False)
    await until(lambda: book.refusal() is None)  # with no change meanwhile
    assert carols.uuid not in on_disk(tmp_path)["devices"] and book.metrics()["writable"]
    book.close()


@pytest.mark.errors_expected  # the failing write
@async_test
async def test_the_close_writes_what_a_failing_write_left_out_and_then_nothing(
    tmp_path, clock, wall, caplog
):
    book, leases = book_in(tmp_path, clock, wall, book_retry=3600.0)  # no try before the close
    leases.request(alice, {"gpu": 1})
    blocked(tmp_path)
    [bobs] = leases.request(bob, {"gpu": 1})
    assert book.refusal() is not None and bobs.uuid not in on_disk(tmp_path)["devices"]
    assert sorted(os.listdir(tmp_path)) == sorted(  # the new file, never linked, is removed
        [os.readlink(tmp_path / "leases.json"), "leases.json", "leases.json.tmp", "lock"]
    )
    blocked(tmp_path, False)
    with caplog.at_level(logging.WARNING, logger="patroller.state.book"):
        book.close()
    assert bobs.uuid in on_disk(tmp_path)["devices"]
    assert "is written again (1 write(s) failed)" in caplog.records[-1].getMessage()
    written = on_disk(tmp_path)
    leases.release(bob)  # after the close the book is no longer written, nor its link moved
    assert on_disk(tmp_path) == written
    book.close()  # a second close does nothing
    again, leases = book_in(tmp_path, clock, wall)  # the directory was let go
    assert leases.state(bobs.uuid) == "reserved"
    again.close()


@pytest.mark.errors_expected  # the last write fails
@async_test
async def test_a_close_whose_last_write_fails_leaves_no_try_behind(tmp_path, clock, wall):
    book, leases = book_in(tmp_path, clock, wall, book_retry=3600.0)
    leases.request(alice, {"gpu": 1})
    blocked(tmp_path)
    leases.request(bob, {"gpu": 1})  # fails: a try is set for later
    assert book._retry is not None
    book.close()  # its write fails again: nothing is left to try after the close
    assert book.failures == 2 and book._retry is None
    blocked(tmp_path, False)


def test_a_book_that_could_not_be_opened_refuses_nothing_and_its_close_frees_nothing(tmp_path):
    first = LeaseBook(str(tmp_path), Config())
    first.open()
    second = LeaseBook(str(tmp_path), Config())
    with pytest.raises(BookError):
        second.open()  # the first holds the directory
    assert second.refusal() is None
    assert second.metrics() == {
        "path": str(tmp_path / "leases.json"),
        "writes": 0,
        "failures": 0,
        "writable": True,
        "read_only": False,
    }
    second.close()
    with pytest.raises(BookError):  # the first's lock is still held
        LeaseBook(str(tmp_path), Config()).open()
    first.close()


def test_a_name_already_taken_is_skipped_and_left_as_it_is(tmp_path, clock, wall):
    book, leases = opened(tmp_path, clock, wall)
    assert os.readlink(tmp_path / "leases.json") == "leases-1.json"
    (tmp_path / "leases-2.json").write_bytes(b"x" * 5000)  # longer than the book
    [device] = leases.request(alice, {"gpu": 1})
    assert os.readlink(tmp_path / "leases.json") == "leases-3.json"
    assert list(on_disk(tmp_path)["devices"]) == [device.uuid]
    assert (tmp_path / "leases-2.json").read_bytes() == b"x" * 5000
    book.close()


@pytest.mark.errors_expected  # the write cut short
def test_a_write_cut_short_by_a_full_disk_leaves_the_last_book_whole_and_nothing_else(
    tmp_path, clock, wall
):
    with tmpfs(tmp_path / "small", "256k") as where:
        book, leases = opened(where, clock, wall)
        [first] = leases.request(alice, {"gpu": 1})
        filler = fill(where)
        os.truncate(filler, (os.stat(filler).st_size // 4096 - 1) * 4096)  # one page free
        long = named_user("x" * 3000)  # a book of some 9 kB: more than the page
        leases.request(long, {"gpu": 3})
        assert book.failures == 1 and book.refusal() is not None
        assert list(on_disk(where)["devices"]) == [first.uuid]  # the last book, whole
        assert sorted(os.listdir(where)) == sorted(
            ["filler", os.readlink(where / "leases.json"), "leases.json", "lock"]
        )
        os.unlink(filler)
        leases.release(alice)
        assert book.refusal() is None and len(on_disk(where)["devices"]) == 3
        book.close()
        # a start on a full disk: its first write fails, what a killed daemon left goes
        os.symlink(os.readlink(where / "leases.json"), where / "leases.json.tmp")
        fill(where)
        book, leases = opened(where, clock, wall)
        assert book.failures == 1 and not os.path.lexists(where / "leases.json.tmp")
        assert len(on_disk(where)["devices"]) == 3
        book.close()


@pytest.mark.errors_expected  # the first write fails
def test_a_start_whose_first_write_fails_keeps_the_book_it_read(tmp_path, clock, wall):
    book, leases = opened(tmp_path, clock, wall)
    [device] = leases.request(alice, {"gpu": 1})
    book.close()
    blocked(tmp_path)
    book, leases = opened(tmp_path, clock, wall)
    assert book.failures == 1 and leases.state(device.uuid) == "reserved"
    book.close()
    assert list(on_disk(tmp_path)["devices"]) == [device.uuid]  # still there, for the next
    blocked(tmp_path, False)
    book, leases = opened(tmp_path, clock, wall)
    assert leases.state(device.uuid) == "reserved"
    book.close()


@pytest.mark.parametrize("book", [None, b'{"version": 1, "devices": {}}'])
def test_a_start_with_no_link_tidies_what_a_killed_daemon_left(tmp_path, clock, wall, book):
    if book is not None:  # a plain file, as an older Patroller wrote
        (tmp_path / "leases.json").write_bytes(book)
    (tmp_path / "leases-5.json").write_text("{}")  # written, never linked
    os.symlink("leases-5.json", tmp_path / "leases.json.tmp")  # made, never swung
    book, leases = opened(tmp_path, clock, wall)
    assert sorted(os.listdir(tmp_path)) == ["leases-6.json", "leases.json", "lock"]
    book.close()


def test_the_start_says_what_came_of_each_device_in_the_book(tmp_path, clock, wall, caplog):
    u = uuids(lease_manager(clock))
    process = {"holder": carol.to_json(), "deadline": None, "pid": os.getpid()}
    devices = {
        u[0]: {"holder": alice.to_json(), "deadline": W + 300},
        u[1]: {"holder": bob.to_json(), "deadline": W - 10},  # ran out meanwhile
        u[2]: {"holder": bob.to_json(), "deadline": W - 1},
        # this process's pid, another start time: another process, which has ended
        **{u[n]: {**process, "start": n} for n in (3, 4, 5)},
        **{f"GPU-gone-{n}": {"holder": alice.to_json(), "deadline": None} for n in range(4)},
    }
    (tmp_path / "leases.json").write_text(
        json.dumps({"version": 1, "saved": W - 60, "boot": boot_id(), "devices": devices})
    )
    with caplog.at_level(logging.INFO, logger="patroller.state.book"):
        book, leases = opened(tmp_path, clock, wall)
    assert [r.getMessage() for r in caplog.records if r.name == "patroller.state.book"] == [
        f"lease book {tmp_path / 'leases.json'}: 1 device(s) held again, 2 expired during the "
        "downtime, 3 whose process ended, 4 no longer on this host"
    ]
    assert list(on_disk(tmp_path)["devices"]) == [u[0]]
    book.close()


def book_of_size(size):
    """A book holding one device for alice, padded with leading spaces to `size` bytes."""
    device = uuids(lease_manager())[0]
    body = json.dumps(
        {
            "version": 1,
            "saved": W,
            "boot": boot_id(),
            "devices": {device: {"holder": alice.to_json(), "deadline": None}},
        }
    ).encode()
    return device, b" " * (size - len(body)) + body


def test_a_book_of_exactly_the_limit_is_read_and_one_byte_more_is_not(tmp_path, clock, wall):
    device, data = book_of_size(MAX_SIZE)
    (tmp_path / "leases.json").write_bytes(data)
    book, leases = opened(tmp_path, clock, wall)
    assert leases.holder(device) == alice
    book.close()
    device, data = book_of_size(MAX_SIZE + 1)
    (tmp_path / "leases.json").unlink()
    (tmp_path / "leases.json").write_bytes(data)
    book, leases = opened(tmp_path, clock, wall)
    assert leases.state(device) == "free"
    assert (tmp_path / "leases.json.corrupt-20270115T080000Z").read_bytes() == data
    book.close()


@pytest.mark.errors_expected  # the read-only directory is said as an error
def test_a_read_only_state_directory_is_said_once_at_open(tmp_path, clock, wall, caplog):
    book, _ = opened(tmp_path / "state", clock, wall)
    book.close()
    with read_only_view(tmp_path / "state", tmp_path / "view") as view:
        with caplog.at_level(logging.WARNING, logger="patroller.state.book"):
            book = LeaseBook(str(view), Config(), wall=wall)
            book.open()
        assert book.read_only and book.metrics()["read_only"]
        leases = lease_manager(clock)
        book.attach(leases)
        leases.request(alice, {"gpu": 1})  # held, in no file: not a failing write
        assert book.failures == 0 and book.refusal() is None and book.writes == 0
        assert on_disk(view)["devices"] == {}
        assert [
            (r.levelno, r.getMessage()) for r in caplog.records if r.name == "patroller.state.book"
        ] == [
            (
                logging.ERROR,
                f"the state directory {view} is on a read-only filesystem: the lease "
                "book is read, never written; reservations made from now on do not survive a "
                "restart (mount it read-write to keep them)",
            )
        ]
        book.close()


def test_a_reason_is_cut_to_200_characters(tmp_path, clock, wall, caplog):
    (tmp_path / "leases.json").write_text(json.dumps({"version": "v" * 300, "devices": {}}))
    with caplog.at_level(logging.WARNING, logger="patroller.state.book"):
        book, _ = opened(tmp_path, clock, wall)
    reason = ("version '" + "v" * 300)[:200]
    assert caplog.records[0].getMessage() == (
        f"lease book {tmp_path / 'leases.json'} is not a lease book ({reason}); set aside as "
        f"{tmp_path / 'leases.json.corrupt-20270115T080000Z'}, starting with no reservations"
    )
    book.close()


def test_a_process_is_looked_for_in_the_proc_the_configuration_names(tmp_path, clock, wall):
    """A /proc of the test's own, where a pid that no process has here runs: its hold is given
    back; the host's /proc would say it ended."""
    pid = next(n for n in range(4_000_000, 4_100_000) if not os.path.exists(f"/proc/{n}"))
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    own = Path("/proc/self/stat").read_text()  # this process, running, under another pid
    (proc / str(pid) / "stat").write_text(own)
    start = int(own.rsplit(")", 1)[1].split()[19])
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("a-boot-of-its-own\n")
    u = uuids(lease_manager(clock))
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "leases.json").write_text(
        json.dumps(
            {
                "version": 1,
                "saved": W,
                "boot": "a-boot-of-its-own",
                "devices": {
                    u[0]: {"holder": carol.to_json(), "deadline": None, "pid": pid, "start": start}
                },
            }
        )
    )
    leases = lease_manager(clock)
    book = LeaseBook(str(tmp_path / "state"), replace(Config(), proc_root=str(proc)), wall=wall)
    book.open()
    restored = book.attach(leases)
    assert restored.held == [u[0]] and not restored.ended and leases.holder(u[0]) == carol
    book.close()
