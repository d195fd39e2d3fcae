"""The doctor's state directory, lease book and usage history, word for word in each case the
checks tell apart (pure, over the facts), and what `probe_state` finds in real folders in
tmp_path: a folder to be made and where, the lease book read as the daemon reads it (missing,
a dangling link, a folder, not JSON, too big), and the pid that holds the directory's lock as a
/proc/locks of the test's own says it. tests/test_doctor_places.py has the trust and the
read-only mounts."""

import json
import os
import time

from patroller.config import Config
from patroller.doctor.places import (
    READ_ONLY,
    StateFacts,
    check_book,
    check_state,
    check_usage,
    probe_state,
)
from patroller.doctor.results import Result
from patroller.state import schema
from patroller.state.book import MAX_SIZE
from patroller.state.bookfiles import FILE
from patroller.state.directory import LOCK

STATE = "state directory"
BOOK = "lease book"
MIB = 1 << 20


def test_no_state_directory_is_said_with_the_flag_that_gives_one():
    assert check_state(probe_state(None), Config()) == Result(
        STATE,
        "degraded",
        "none (--state-dir none): reservations do not survive a restart",
        "give --state-dir (the default as root: /var/lib/patroller)",
    )
    assert check_book(probe_state(None)) == Result(BOOK, "ok", "none (see the state directory)")


def test_a_state_directory_not_there_is_made_in_the_nearest_folder_that_is(tmp_path):
    missing = tmp_path / "a" / "b" / "state"
    facts = probe_state(str(missing))
    free = os.statvfs(tmp_path)
    assert facts == StateFacts(
        str(missing), made_in=str(tmp_path), free_mib=free.f_bavail * free.f_frsize // MIB
    )
    assert os.listdir(tmp_path) == []  # the folder made to try is gone
    said = check_state(StateFacts(str(missing), made_in=str(tmp_path), free_mib=100), Config())
    assert said == Result(
        STATE,
        "ok",
        f"{missing} is not there yet: it is made (private) at start, in {tmp_path}, 100 MiB free",
    )
    assert check_book(facts) == Result(BOOK, "ok", "none yet: made at start")


def test_a_state_directory_that_cannot_be_made_fails_saying_why():
    facts = probe_state("/proc/patroller-nope/state")
    assert (facts.exists, facts.made_in, facts.unwritable) == (False, "/proc", os.strerror(2))
    assert check_state(facts, Config()) == Result(
        STATE,
        "failed",
        f"/proc/patroller-nope/state cannot be made in /proc: {os.strerror(2)}",
        "choose another --state-dir, or make it writable (read-only mount? under systemd: "
        "StateDirectory=patroller)",
    )


def test_a_state_directory_not_trusted_or_not_writable_is_said_so():
    untrusted = StateFacts("/s", untrusted=("the state directory /s is a link", "do this"))
    assert check_state(untrusted, Config()) == Result(
        STATE, "failed", "the state directory /s is a link", "do this"
    )
    assert check_book(untrusted) == Result(BOOK, "ok", "none (see the state directory)")
    assert check_state(StateFacts("/s", exists=True, unwritable="No space"), Config()) == Result(
        STATE,
        "failed",
        "/s is not writable: No space",
        "choose another --state-dir, or make it writable (read-only mount? under systemd: "
        "StateDirectory=patroller)",
    )
    for facts, said in (
        (StateFacts("/s", exists=True, unwritable=READ_ONLY), "/s is not writable"),
        (StateFacts("/s/new", made_in="/s", unwritable=READ_ONLY), "/s/new cannot be made in /s"),
    ):
        assert check_state(facts, Config()) == Result(
            STATE,
            "degraded",
            f"{said}: {READ_ONLY}: the daemon reads the lease book at start and writes nothing "
            "there: reservations do not survive a restart, and no usage history is kept",
            "mount it read-write, or choose another --state-dir",
        )


def test_a_writable_state_directory_is_written_to_and_left_as_it_was(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    free = os.statvfs(state)
    assert probe_state(str(state)) == StateFacts(
        str(state), exists=True, free_mib=free.f_bavail * free.f_frsize // MIB
    )
    assert os.listdir(state) == []
    assert check_state(StateFacts(str(state), exists=True), Config()) == Result(
        STATE, "ok", f"{state} is writable"
    )


def test_room_under_the_usage_stores_reserve_or_the_doctors_floor_is_said():
    config = Config()  # the usage store in the state directory, 64 MiB kept for the book
    assert config.usage_reserve == 64 * MIB and config.doctor_min_free_mib == 64
    low = StateFacts("/s", exists=True, free_mib=63)
    assert check_state(low, config) == Result(
        STATE,
        "degraded",
        "/s is writable, 63 MiB free: under the 64 MiB the usage store leaves for the lease "
        "book: the usage store does not write (its history waits in memory, a day at most, "
        "then is dropped)",
        "free some room: the usage history resumes by itself",
    )
    floor = Result(
        STATE,
        "degraded",
        "/s is writable, 63 MiB free: under 64 MiB",
        "free some room: a lease book that cannot be written stops every grant",
    )
    assert check_state(low, Config(usage="none")) == floor
    assert check_state(low, Config(usage_dir="/elsewhere")) == floor
    enough = StateFacts("/s", exists=True, free_mib=64)
    assert check_state(enough, config) == Result(STATE, "ok", "/s is writable, 64 MiB free")
    roomy = Config(usage_reserve=32 * MIB, doctor_min_free_mib=16)
    assert check_state(StateFacts("/s", exists=True, free_mib=31), roomy).detail.startswith(
        "/s is writable, 31 MiB free: under the 32 MiB the usage store leaves"
    )
    floor_16 = Config(usage="none", doctor_min_free_mib=16)
    assert check_state(StateFacts("/s", exists=True, free_mib=16), floor_16).status == "ok"
    assert check_state(StateFacts("/s", exists=True, free_mib=15), floor_16) == Result(
        STATE,
        "degraded",
        "/s is writable, 15 MiB free: under 16 MiB",
        "free some room: a lease book that cannot be written stops every grant",
    )


def test_the_usage_history_is_named_where_and_how_often_or_off():
    assert check_usage(Config(usage="none")) == Result(
        "usage history",
        "ok",
        "off (--usage none): none is kept; `patroller report` has nothing here",
    )
    assert check_usage(Config(state_dir="/var/lib/p", usage_interval=90.0)) == Result(
        "usage history",
        "ok",
        "/var/lib/p/usage.sqlite3: a sample of every GPU every 1m30s, kept 400 days",
    )
    config = Config(state_dir="/var/lib/p", usage_dir="/srv/usage", usage_days=30)
    assert check_usage(config) == Result(
        "usage history",
        "ok",
        "/srv/usage/usage.sqlite3: a sample of every GPU every 1m, kept 30 days",
    )


def book_in(tmp_path, data: bytes | None = None):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    if data is not None:
        (state / FILE).write_bytes(data)
    return state


def test_a_lease_book_that_cannot_be_read_is_set_aside_saying_why(tmp_path):
    state = book_in(tmp_path, b"{not json")
    facts = probe_state(str(state))
    assert facts.book is None
    assert facts.bad_book is not None
    assert facts.bad_book.startswith(f"{state / FILE} is not a lease book ("), facts.bad_book
    assert check_book(facts) == Result(
        BOOK,
        "degraded",
        f"{facts.bad_book}: it is set aside at start, and the reservations in it are lost",
        "look at it; the daemon renames it *.corrupt-<time> and starts empty",
    )
    (state / FILE).write_bytes(b" " * (MAX_SIZE + 1))
    assert probe_state(str(state)).bad_book == (
        f"{state / FILE} is not a lease book (over {MAX_SIZE} bytes)"
    )
    (state / FILE).unlink()
    (state / FILE).mkdir()
    assert probe_state(str(state)).bad_book == f"{state / FILE} cannot be read ({os.strerror(21)})"
    (state / FILE).rmdir()
    os.symlink("leases-7.json", state / FILE)
    assert probe_state(str(state)).bad_book == f"{state / FILE} links to a missing file"


def test_no_lease_book_yet_and_one_without_a_time_are_said_so(tmp_path):
    state = book_in(tmp_path)
    assert check_book(probe_state(str(state))) == Result(
        BOOK, "ok", f"no {FILE} yet: written at the first change"
    )
    book = json.loads(schema.encode({}, time.time(), None))
    del book["saved"]
    (state / FILE).write_text(json.dumps(book))
    assert check_book(probe_state(str(state))) == Result(BOOK, "ok", "0 device(s) held")


def test_a_lease_book_is_said_by_the_devices_it_holds_and_its_age(tmp_path):
    held = {"state": "reserved", "releasing": False, "asked": 1, "deadline": None}
    held["holder"] = {"user": "alice"}
    data = schema.encode({"GPU-a": held, "GPU-b": held, "GPU-c": held}, time.time() - 7300, None)
    state = book_in(tmp_path, data)
    said = probe_state(str(state)).book
    assert said is not None and said.startswith("3 device(s) held, saved 2h01m"), said
    assert said.endswith("s ago"), said  # 2h01m40s or so: the seconds the test took
    assert check_book(probe_state(str(state))).detail.startswith("3 device(s) held, saved 2h")


def locks_at(tmp_path, state, *lines: str) -> str:
    """A /proc of the test's own whose locks file says `lines`, WHERE standing for the lock's
    device and inode."""
    info = os.stat(state / LOCK)
    where = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "locks").write_text("".join(line.replace("WHERE", where) + "\n" for line in lines))
    return str(proc)


def test_the_locks_holder_is_the_flock_on_the_lock_file_not_a_waiter_or_another_lock(tmp_path):
    state = book_in(tmp_path)
    (state / LOCK).write_text("")
    proc = locks_at(
        tmp_path,
        state,
        "1: POSIX  ADVISORY  WRITE 11 WHERE 0 EOF",
        "2: FLOCK  ADVISORY  WRITE 12 00:01:1 0 EOF",
        "2: -> FLOCK  ADVISORY  WRITE 14 00:01:1 0 EOF",  # another lock's waiter, before ours
        "3: FLOCK  ADVISORY  WRITE 4242 WHERE 0 EOF",
        "3: -> FLOCK  ADVISORY  WRITE 13 WHERE 0 EOF",
    )
    facts = probe_state(str(state), proc)
    assert facts.holder == 4242
    assert check_book(facts) == Result(
        BOOK,
        "ok",
        f"no {FILE} yet: written at the first change; patroller pid 4242 holds its directory "
        "(a second one there would not start)",
    )
    ours = StateFacts(str(state), exists=True, book="2 device(s) held", holder=os.getpid())
    assert check_book(ours) == Result(
        BOOK, "ok", "2 device(s) held; this daemon holds its directory"
    )
    bad = StateFacts(str(state), exists=True, bad_book="why", holder=4242)
    assert check_book(bad).detail == (
        "why: it is set aside at start, and the reservations in it are lost; patroller pid "
        "4242 holds its directory (a second one there would not start)"
    )


def test_a_waiter_alone_or_a_holder_not_named_by_a_number_holds_nothing(tmp_path):
    state = book_in(tmp_path)
    (state / LOCK).write_text("")
    proc = locks_at(tmp_path, state, "1: -> FLOCK  ADVISORY  WRITE 13 WHERE 0 EOF")
    assert probe_state(str(state), proc).holder is None
    (tmp_path / "proc" / "locks").unlink()
    (tmp_path / "proc").rmdir()
    proc = locks_at(tmp_path, state, "1: FLOCK  ADVISORY  WRITE <none> WHERE 0 EOF", "short")
    assert probe_state(str(state), proc).holder is None
