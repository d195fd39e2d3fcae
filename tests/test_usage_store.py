"""The usage store against real SQLite files: what it writes and reads back, the migrations,
files set aside, retention folding, a broken file, a full disk and a read-only filesystem
(real tmpfs mounts, as root), and the report's use of the indexes."""

import asyncio
import ctypes
import errno
import logging
import os
import resource
import sqlite3
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from datetime import timezone

import pytest
from helpers import need_root

from patroller import background
from patroller.config import Config
from patroller.core.errors import Unavailable
from patroller.core.usage import GpuSample, Party, Present
from patroller.state.usage import queries, schema, tables
from patroller.state.usage.files import FILE, damaged
from patroller.state.usage.store import UsageStore

ALICE = Party(user="alice", account="alice")
BOB = Party(user="bob", account="bob")
DAY = 86400


def interval(seconds=60.0):
    """One interval of two GPUs: alice computes on hers half the time, bob's is free."""
    return [
        GpuSample(
            uuid="GPU-a",
            number=0,
            seconds=seconds,
            state="claimed",
            hold="lease",
            holder=ALICE,
            reserved=True,
            readings=10,
            busy=5,
            sm_mean=48.0,
            sm_max=97.0,
            fb_mean=4000.0,
            fb_max=4100.0,
            name="A100",
            present=(Present(ALICE, own=True, pids=(42,), containers=("train",)),),
        ),
        GpuSample(uuid="GPU-b", number=1, seconds=seconds, state="free", name="A100"),
    ]


def config(**changes):
    return replace(Config(), usage_retry=0.05, **changes)


def wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@contextmanager
def store_in(directory, wall=time.time, **changes):
    store = UsageStore(str(directory), config(**changes), wall=wall)
    store.open()
    try:
        yield store
    finally:
        store.close(10)


def report(store, since, until, by="user"):
    async def read():
        return await store.report(since, until, by)

    return asyncio.run(read())


def by_category(totals):
    found = {}
    for key, _, category, seconds in totals.rows:
        found[(key, category)] = round(found.get((key, category), 0.0) + seconds, 6)
    return found


def test_an_interval_is_one_row_per_gpu_and_its_categories_are_what_reports_read(tmp_path):
    now = time.time()
    with store_in(tmp_path) as store:
        for n in range(3):
            store.put(now - 180 + 60 * n, interval())
        wait(lambda: store.intervals == 3)
        assert store.rows == 6 and store.state == "writable"
        totals = report(store, now - 3600, now)
        by_gpu = report(store, now - 3600, now, "gpu")
    assert by_category(totals) == {
        ("alice", "active"): 90.0,
        ("alice", "idle_held"): 90.0,
        (None, "free"): 180.0,
    }
    assert {key for key, *_ in by_gpu.rows} == {"GPU-a", "GPU-b"}
    assert by_gpu.numbers == {"GPU-a": 0, "GPU-b": 1}
    db = sqlite3.connect(tmp_path / FILE)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    row = db.execute(
        "SELECT s.state, s.hold, p.user, s.readings, s.busy, s.sm_max, s.fb_mean, "
        "s.processes FROM samples s JOIN parties p ON p.id = s.holder "
        "ORDER BY s.at LIMIT 1"
    ).fetchone()
    assert row[:7] == ("claimed", "lease", "alice", 10, 5, 97.0, 4000.0)
    assert '"pids":[42]' in row[7] and '"containers":["train"]' in row[7]


@pytest.mark.errors_expected  # the interval that cannot be written is logged as an error
def test_an_interval_is_written_whole_or_not_at_all(tmp_path, caplog):
    bobs = [replace(s, holder=BOB, present=()) for s in interval()]  # bob is new
    broken = [bobs[0], replace(bobs[1], state=None)]  # the second GPU's row breaks a rule
    now = time.time()
    with store_in(tmp_path) as store:
        store.put(now, broken)
        store.put(now + 60, bobs)
        wait(lambda: store.intervals == 1 and store.dropped == 1)
        assert store.state == "writable" and store.rows == 2
        # the good interval alone, bob's too (not under the id the broken one gave him)
        assert by_category(report(store, now - 3600, now + 60)) == {
            ("bob", "reserved_unused"): 120.0
        }
    db = sqlite3.connect(tmp_path / FILE)
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (2,)
    assert "could not be written and is dropped" in caplog.text


def test_a_new_file_is_made_at_the_latest_version_and_a_later_step_migrates_it_in_a_transaction(
    tmp_path,
):
    latest, later = schema.LATEST, schema.LATEST + 1
    db = sqlite3.connect(tmp_path / "u.sqlite3", isolation_level=None)
    assert schema.migrate(db) == 0 and schema.version(db) == latest
    db.execute("INSERT INTO gpus (uuid, number) VALUES ('GPU-a', 0)")

    def step(conn):
        conn.execute("ALTER TABLE gpus ADD COLUMN serial TEXT")

    def broken(conn):
        conn.execute("ALTER TABLE gpus ADD COLUMN half TEXT")
        raise sqlite3.OperationalError("the step fails half-way")

    with pytest.raises(sqlite3.OperationalError):
        schema.migrate(db, latest=later, steps={**schema.STEPS, later: broken})
    assert schema.version(db) == latest  # rolled back, the half-made column too
    assert "half" not in [c[1] for c in db.execute("PRAGMA table_info(gpus)")]
    assert schema.migrate(db, latest=later, steps={**schema.STEPS, later: step}) == latest
    assert schema.version(db) == later
    assert db.execute("SELECT uuid, serial FROM gpus").fetchall() == [("GPU-a", None)]
    assert schema.migrate(db, latest=later, steps={**schema.STEPS, later: step}) == later


def test_the_store_migrates_an_older_file_at_start(tmp_path, monkeypatch, caplog):
    with store_in(tmp_path) as store:
        store.put(time.time(), interval())
        wait(lambda: store.intervals == 1)
    later = schema.LATEST + 1
    monkeypatch.setattr(schema, "LATEST", later)
    monkeypatch.setitem(schema.STEPS, later, lambda db: db.execute("CREATE TABLE notes (x)"))
    with (
        caplog.at_level(logging.INFO, logger="patroller.state.usage.store"),
        store_in(tmp_path) as store,
    ):
        wait(lambda: store.state == "writable")
    assert f"schema version {later} made from {later - 1}" in caplog.text
    db = sqlite3.connect(tmp_path / FILE)
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(later,)]
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (2,)


def newer_file(path):
    db = sqlite3.connect(path, isolation_level=None)
    schema.migrate(db)
    db.execute("UPDATE schema_version SET version = 7")
    db.close()


@pytest.mark.parametrize(
    "kind,make",
    [
        ("corrupt", lambda path: path.write_bytes(b"not a database at all\n" * 100)),
        ("corrupt", lambda path: sqlite3.connect(path).execute("CREATE TABLE other (x)")),
        ("newer", newer_file),
    ],
)
def test_a_file_it_cannot_use_is_set_aside_with_one_line_and_a_fresh_store_starts(
    tmp_path, caplog, kind, make
):
    path = tmp_path / FILE
    make(path)
    (tmp_path / (FILE + "-wal")).write_bytes(b"a write-ahead log of that file")
    before = path.read_bytes()
    with (
        caplog.at_level(logging.INFO, logger="patroller.state.usage.store"),
        store_in(tmp_path) as store,
    ):
        store.put(time.time(), interval())
        wait(lambda: store.intervals == 1)
        assert store.set_aside == 1 and store.failures == 0
    aside = sorted(p.name for p in tmp_path.iterdir() if f".{kind}-" in p.name)
    assert aside[0] + "-wal" in aside  # its WAL went with it (and SQLite's -shm, if made)
    assert set(aside) <= {aside[0], aside[0] + "-wal", aside[0] + "-shm"}
    assert (tmp_path / aside[0]).read_bytes() == before  # kept, as it was
    lines = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and f"set aside as {aside[0]}" in lines[0].getMessage()
    assert ("newer Patroller" in lines[0].getMessage()) == (kind == "newer")
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM samples").fetchone() == (2,)


def test_samples_past_the_retention_are_folded_into_daily_totals_not_dropped(tmp_path, caplog):
    now = time.time()
    old = now - 500 * DAY
    with store_in(tmp_path) as store:
        for n in range(4):  # four intervals, 500 days ago
            store.put(old + 60 * n, interval())
        store.put(now, interval())
        wait(lambda: store.intervals == 5)
        before = by_category(report(store, old - DAY, now))
        days = report(store, old - DAY, now, "day")
    assert before[("alice", "active")] == 150.0
    with (
        caplog.at_level(logging.INFO, logger="patroller.state.usage.store"),
        store_in(tmp_path, usage_days=400) as store,
    ):
        wait(lambda: store.state == "writable")
        assert by_category(report(store, old - DAY, now)) == before
        assert report(store, old - DAY, now, "day").rows == days.rows
        first = report(store, now - 3600, now).first
    assert "8 sample(s) and" in caplog.text and "folded into daily totals" in caplog.text
    db = sqlite3.connect(tmp_path / FILE)
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (2,)
    assert db.execute("SELECT MIN(at) FROM samples").fetchone()[0] > now - 400 * DAY
    assert db.execute("SELECT COUNT(*) FROM daily").fetchone()[0] > 0
    assert first == float(int(old - 60) // DAY * DAY)  # the day of the oldest figures


def test_a_report_reads_the_totals_by_their_keys(tmp_path):
    """A range is one range scan of each table's primary key, whatever it is grouped by."""
    db = sqlite3.connect(tmp_path / "u.sqlite3", isolation_level=None)
    db.execute("PRAGMA synchronous = OFF")
    schema.migrate(db)
    keys, start = tables.Keys(), time.time() // DAY * DAY - 30 * DAY
    for n in range(30 * 24):  # an interval of 8 GPUs each hour for 30 days
        samples = [replace(s, uuid=f"{s.uuid}{m}") for m in range(4) for s in interval()]
        tables.write_interval(db, keys, start + 3600 * n + 60, samples)
    since, until = start + 10 * DAY, start + 20 * DAY
    found = queries.ranges(int(since), int(since), until, queries.kept_from(db))
    for by in queries.KEYS:
        plan = [
            row[-1]
            for row in db.execute(
                "EXPLAIN QUERY PLAN " + queries.statement(by), queries.bounds(found)
            )
        ]
        assert any("hourly USING PRIMARY KEY (hour>? AND hour<?)" in p for p in plan), plan
        assert any("daily USING PRIMARY KEY (day>? AND day<?)" in p for p in plan), plan
    totals = queries.totals(db, since, until, "user")
    assert round(sum(s for *_, s in totals.rows)) == 10 * 24 * 8 * 60  # ten days of 8 GPUs


def test_reports_are_read_in_a_thread_that_yields_the_cpu_to_serving(tmp_path):
    """The reader thread runs at Config.usage_report_nice (a report is background work);
    the daemon's other threads keep their priority."""
    with store_in(tmp_path, usage_report_nice=13) as store:
        store.put(time.time(), interval())
        wait(lambda: store.intervals == 1)
        report(store, time.time() - DAY, time.time())
        nice = {
            t.name: os.getpriority(os.PRIO_PROCESS, t.native_id)
            for t in threading.enumerate()
            if t.native_id is not None
        }
        readers = [value for name, value in nice.items() if name.startswith("usage-reader")]
        assert readers == [max(13, nice["MainThread"])], nice
        assert nice["MainThread"] == os.getpriority(os.PRIO_PROCESS, 0)
        assert all(
            value != 13 for name, value in nice.items() if not name.startswith("usage-reader")
        ), nice


def test_a_report_by_two_keys_asked_first_is_read_in_the_same_thread_at_the_same_priority(
    tmp_path,
):
    """The first report may be a grouped one (`by=day,user`, `tz=`): the reader it makes is
    the one thread every report is read in, at Config.usage_report_nice."""
    now = time.time()

    def started():  # the threads started since, and their niceness
        return {
            t.name: os.getpriority(os.PRIO_PROCESS, t.native_id)
            for t in threading.enumerate()
            if t not in before
        }

    async def both(store):
        grouped = await asyncio.gather(
            *(
                store.grouped(now - 3600, now + 3600, ("user", "gpu"), timezone.utc)
                for _ in range(8)
            )
        )
        threads = started()  # the loop's own executor, if it had read, would be running still
        return grouped, threads, await store.report(now - 3600, now + 3600, "user")

    with store_in(tmp_path, usage_report_nice=13) as store:
        store.put(now, interval())
        wait(lambda: store.intervals == 1)
        before = set(threading.enumerate())
        grouped, threads, plain = asyncio.run(both(store))
        assert threads == {"usage-reader_0": max(13, os.getpriority(os.PRIO_PROCESS, 0))}
        assert {n: v for n, v in started().items() if n.startswith("usage")} == threads
    for totals in grouped:
        assert {(keys, category): seconds for keys, _, category, seconds in totals.rows} == {
            ((None, "GPU-b"), "free"): 60.0,
            (("alice", "GPU-a"), "active"): 30.0,
            (("alice", "GPU-a"), "idle_held"): 30.0,
        }
    assert by_category(plain)[("alice", "active")] == 30.0


CAP_SYS_NICE = 23


def without_cap_sys_nice():
    """Drop CAP_SYS_NICE from the calling thread alone (capabilities are a thread's own, and
    the threads it starts inherit them): it may raise its niceness, never lower it again."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    assert libc.capget(ctypes.byref(header), data) == 0, os.strerror(ctypes.get_errno())
    data[0].effective &= ~(1 << CAP_SYS_NICE)
    assert libc.capset(ctypes.byref(header), data) == 0, os.strerror(ctypes.get_errno())


def test_a_daemon_started_nicer_keeps_its_reader_there_and_reads(tmp_path, caplog):
    """A daemon started at niceness 19 (without CAP_SYS_NICE, nor RLIMIT_NICE room, as a user
    would start it) asks its reports' thread for 13: the thread keeps the daemon's 19, never
    above it, reads, and has nothing to say."""
    now, found = time.time(), {}
    soft, hard = resource.getrlimit(resource.RLIMIT_NICE)

    def daemon(store):
        without_cap_sys_nice()
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        found["totals"] = report(store, now - 3600, now + 3600)
        found["nice"] = {
            t.name: os.getpriority(os.PRIO_PROCESS, t.native_id)
            for t in threading.enumerate()
            if t.name.startswith("usage-reader")
        }

    resource.setrlimit(resource.RLIMIT_NICE, (0, hard))
    try:
        with store_in(tmp_path, usage_report_nice=13) as store:
            store.put(now, interval())
            wait(lambda: store.intervals == 1)
            with caplog.at_level(logging.INFO, logger="patroller.background"):
                thread = threading.Thread(target=daemon, args=(store,))
                thread.start()
                thread.join(30)
    finally:
        resource.setrlimit(resource.RLIMIT_NICE, (soft, hard))
    assert found["nice"] == {"usage-reader_0": 19}
    assert by_category(found["totals"])[("alice", "active")] == 30.0
    assert records(caplog, logging.INFO, "priority") == []


def test_a_thread_whose_priority_cannot_be_lowered_says_so_once_and_goes_on(monkeypatch, caplog):
    """Linux always lets a thread lower its own priority; where the system refuses (another
    kernel, a seccomp profile: refused here by hand, as it cannot be for real), the thread keeps
    the daemon's, and each kind of thread says so once."""

    def refused(*args):
        raise PermissionError(13, "Permission denied")

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    monkeypatch.setattr(os, "setpriority", refused)
    monkeypatch.setattr(os, "getpriority", lambda which, who: 0)  # a daemon at 0
    with caplog.at_level(logging.INFO, logger="patroller.background"):
        for _ in range(3):
            assert not background.lower_priority(19, "the test's thread")
        assert not background.lower_priority(0, "another thread")  # there already: not tried
    monkeypatch.undo()
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    assert records(caplog, logging.INFO, "priority") == [
        "the test's thread keeps the daemon's priority: [Errno 13] Permission denied"
    ]


@pytest.mark.errors_expected  # the failing writes are logged as an error
def test_a_broken_file_degrades_the_store_and_it_recovers_by_itself(tmp_path, caplog):
    (tmp_path / FILE).mkdir()  # a directory where the file should be: it cannot be opened
    with store_in(tmp_path, usage_backlog=3) as store:
        for n in range(5):
            store.put(time.time() + n, interval())
        wait(lambda: store.state == "failing" and store.failures >= 3)
        wait(lambda: store.dropped == 2)  # five kept in a backlog of three
        assert store.metrics()["pending"] == 3
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "cannot write the usage store" in errors[0].getMessage()
        (tmp_path / FILE).rmdir()
        wait(lambda: store.state == "writable")
        assert store.intervals == 3 and store.metrics()["pending"] == 0
    assert "is written again" in caplog.text


@contextmanager
def tmpfs(where, size="256k", options=""):
    """A real tmpfs of `size` mounted at `where` (root only); unmounted after."""
    need_root("it mounts a filesystem")
    os.makedirs(where, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700{options}", "tmpfs", str(where)],
        check=True,
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(directory):
    """A file that takes every free block of the filesystem: its path."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return path


@pytest.mark.errors_expected
def test_a_full_disk_degrades_the_store_and_it_catches_up_when_there_is_room(tmp_path):
    with (
        tmpfs(tmp_path / "small", "1m") as where,
        store_in(where, usage_reserve=0) as store,
    ):  # no room kept: the disk fills
        store.put(time.time(), interval())
        wait(lambda: store.intervals == 1)
        filler = fill(where)
        now = time.time()
        for n in range(30):  # enough for the write-ahead log to need another block; bob
            # is new: the ids of the failed transactions must not be taken for his
            store.put(now + n, [replace(s, holder=BOB, present=()) for s in interval()])
        wait(lambda: store.state == "failing")
        assert "full" in store.why or "No space" in store.why, store.why
        os.unlink(filler)
        wait(lambda: store.state == "writable" and store.intervals == 31)
        assert store.dropped == 0
        totals = by_category(report(store, now - 3600, now + 60))
        assert totals[("bob", "reserved_unused")] == 2 * 30 * 60.0  # two GPUs each


def test_a_read_only_filesystem_runs_without_a_store_and_says_so(tmp_path, caplog):
    with tmpfs(tmp_path / "ro", options=",ro") as where, store_in(where) as store:
        assert store.state == "read_only" and store.metrics()["state"] == "read_only"
        store.put(time.time(), interval())  # taken, and nothing is done with it
        assert store.metrics()["pending"] == 0  # nor kept
        said = f"the usage store's directory {store.directory} is on a read-only filesystem"
    assert said + ": running without a usage store (no usage history is kept)" in caplog.messages


# -- edges the mutation run found unchecked (docs/development.md, "Mutation testing") -------

WALL = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
STAMP = "20270115T080000Z"
NOT_A_DATABASE = b"not a database at all\n" * 100


def test_a_file_set_aside_is_named_by_the_time_and_takes_the_first_free_number(tmp_path, caplog):
    (tmp_path / FILE).write_bytes(NOT_A_DATABASE)
    for name in (f"{FILE}.corrupt-{STAMP}", f"{FILE}.corrupt-{STAMP}-3"):  # set aside before
        (tmp_path / name).write_bytes(name.encode())
    with (
        caplog.at_level(logging.INFO, logger="patroller.state.usage.store"),
        store_in(tmp_path, wall=lambda: WALL) as store,
    ):
        store.put(WALL, interval())
        wait(lambda: store.intervals == 1)
        assert store.set_aside == 1
    aside = f"{FILE}.corrupt-{STAMP}-2"
    assert (tmp_path / aside).read_bytes() == NOT_A_DATABASE
    for name in (f"{FILE}.corrupt-{STAMP}", f"{FILE}.corrupt-{STAMP}-3"):  # left as they were
        assert (tmp_path / name).read_bytes() == name.encode()
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line == (
        f"usage store {tmp_path / FILE} is not a usable usage store (file is not a "
        f"database); set aside as {aside}, and a fresh store starts"
    )


def test_a_newer_file_says_its_version_and_what_this_patroller_knows(tmp_path):
    newer_file(tmp_path / "u.sqlite3")
    db = sqlite3.connect(tmp_path / "u.sqlite3", isolation_level=None)
    with pytest.raises(schema.Newer) as raised:
        schema.migrate(db)
    assert raised.value.version == 7
    assert (
        str(raised.value) == f"holds schema version 7 (this Patroller knows up to {schema.LATEST})"
    )


def records(caplog, level, words):
    return [
        r.getMessage() for r in caplog.records if r.levelno == level and words in r.getMessage()
    ]


@pytest.mark.errors_expected  # the file that cannot be set aside, and the failing store
def test_a_file_that_cannot_be_set_aside_fails_the_store_until_it_can_be_used(tmp_path, caplog):
    need_root("it bind-mounts a file over the store's")
    path, garbage = tmp_path / FILE, tmp_path / "garbage"
    garbage.write_bytes(NOT_A_DATABASE)
    path.write_bytes(b"")  # where the garbage is mounted: renaming a mount point fails (EBUSY)
    subprocess.run(["mount", "--bind", str(garbage), str(path)], check=True)
    mounted = True
    try:
        with store_in(tmp_path) as store:
            wait(lambda: records(caplog, logging.ERROR, "cannot write the usage store"))
            assert records(caplog, logging.ERROR, "cannot be set aside")[0] == (
                f"usage store {path} is not a usable usage store (file is not a database) and "
                "cannot be set aside: Device or resource busy"
            )
            # usage_retry is 0.05 s here, said to a tenth of a second
            assert records(caplog, logging.ERROR, "cannot write the usage store") == [
                f"cannot write the usage store {path}: file is not a database (1 failure(s) so "
                "far); serving goes on, 0 interval(s) kept in memory, tried again every 0.1s"
            ]
            assert store.state == "failing" and store.why == "file is not a database"
            wait(lambda: store.failures >= 4)  # tried again every 0.05 s: said once
            assert len(records(caplog, logging.ERROR, "cannot be set aside")) == 1
            store.put(time.time(), interval())
            subprocess.run(["umount", str(path)], check=True)
            mounted = False  # the empty file under it is a database: the store uses it
            wait(lambda: store.state == "writable" and store.intervals == 1)
            assert store.set_aside == 0 and store.why == ""
    finally:
        if mounted:  # lazily: a store that failed the test may hold it open still
            subprocess.run(["umount", "-l", str(path)], check=True)
    assert garbage.read_bytes() == NOT_A_DATABASE


def replaced_while_running(store, path):
    """Have the running store set its file aside: another connection makes the file a newer
    Patroller's, holding the write lock until the store's write has failed; the store opens the
    file again, finds it newer, sets it aside and starts a fresh one."""
    before = store.set_aside
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("UPDATE schema_version SET version = 7")
    store.put(time.time(), interval())
    wait(lambda: store.state == "failing")  # locked: the write failed, the file is let go
    other.execute("COMMIT")
    other.close()
    wait(lambda: store.set_aside == before + 1 and store.state == "writable")


@pytest.mark.errors_expected  # the write that fails while the other connection holds the lock
def test_reports_follow_the_file_each_time_it_is_set_aside(tmp_path):
    now = time.time()
    with store_in(tmp_path, usage_busy_timeout=0.05) as store:
        store.put(now, interval())
        wait(lambda: store.intervals == 1)
        assert by_category(report(store, now - 3600, now + 3600))[("alice", "active")] == 30.0
        for n in (1, 2):
            replaced_while_running(store, tmp_path / FILE)
            wait(lambda: store.intervals == 1 + n)
            # the fresh file holds the one interval written since, not the one before
            assert by_category(report(store, now - 3600, now + 3600)) == {
                ("alice", "active"): 30.0,
                ("alice", "idle_held"): 30.0,
                (None, "free"): 60.0,
            }
        assert store.set_aside == 2
    assert (
        len(
            [
                p
                for p in tmp_path.iterdir()
                if ".newer-" in p.name and "-wal" not in p.name and "-shm" not in p.name
            ]
        )
        == 2
    )


def test_a_report_that_cannot_be_read_says_so_and_the_next_one_reads_again(tmp_path):
    now = time.time()
    with store_in(tmp_path) as store:
        store.put(now, interval())
        wait(lambda: store.intervals == 1)
        assert by_category(report(store, now - 3600, now + 3600))[("alice", "active")] == 30.0
        other = sqlite3.connect(tmp_path / FILE, isolation_level=None)
        other.execute("DROP TABLE schema_version")  # under the reader's open connection
        with pytest.raises(Unavailable) as raised:
            report(store, now - 3600, now + 3600)
        assert raised.value.message == (
            f"the usage store {tmp_path / FILE} cannot be read now (holds tables (daily, gpus, "
            "hourly, parties, samples) but no schema version: not a usage store); try again "
            "shortly"
        )
        other.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        other.execute("INSERT INTO schema_version VALUES (?)", (schema.LATEST,))
        other.close()
        assert by_category(report(store, now - 3600, now + 3600))[("alice", "active")] == 30.0


def test_reports_are_read_in_one_thread_of_their_own(tmp_path):
    """One connection for reports, used by one thread: the store's `usage-reader`, never the
    event loop's executor, and one at a time however many reports are asked at once."""
    now = time.time()

    async def many(store):
        return await asyncio.gather(
            *(store.report(now - 3600, now + 3600, "user") for _ in range(8))
        )

    before = set(threading.enumerate())
    with store_in(tmp_path) as store:
        store.put(now, interval())
        wait(lambda: store.intervals == 1)
        totals = asyncio.run(many(store))
        readers = [
            t.name
            for t in threading.enumerate()
            if t not in before and t.name.startswith("usage-reader")
        ]
        assert readers == ["usage-reader_0"]
    assert all(by_category(t)[("alice", "active")] == 30.0 for t in totals)


def test_a_range_counts_the_whole_hour_and_day_it_begins_in(tmp_path):
    db = sqlite3.connect(tmp_path / "u.sqlite3", isolation_level=None)
    schema.migrate(db)
    keys = tables.Keys()
    day = WALL // DAY * DAY - 10 * DAY
    tables.write_interval(db, keys, day + 3600 + 660, interval())  # 10:00 to 11:00 past 1 a.m.
    tables.write_interval(db, keys, day - DAY + 660, interval())  # the day before, folded:
    tables.fold(db, int(day))
    # from half past one: the hour from one o'clock counts whole; from 2 a.m. the day before:
    # the day counts whole (only daily totals are left of it)
    for since in (day + 3600 + 1800, day - DAY + 7200):
        totals = queries.totals(db, since, WALL, "user")
        assert by_category(totals)[("alice", "active")] == (30.0 if since > day else 60.0)
    assert queries.totals(db, day + 7200, WALL, "user").rows == []
    by_gpu = queries.totals(db, day, WALL, "gpu")
    assert sorted(by_gpu.rows) == [
        ("GPU-a", "alice", "active", 30.0),
        ("GPU-a", "alice", "idle_held", 30.0),
        ("GPU-b", None, "free", 60.0),
    ]
    assert by_gpu.first == day - DAY  # the day folded


def test_an_empty_store_reports_nothing_and_no_first_time(tmp_path):
    with store_in(tmp_path) as store:
        wait(lambda: store.state == "writable")
        totals = report(store, WALL - DAY, WALL)
    assert (totals.rows, totals.numbers, totals.first) == ([], {}, None)


def error(kind, message, name=None):
    """An error as SQLite raises it: with its name on Python 3.11 and later (`name`), with its
    message alone before."""
    exc = kind(message)
    if name is not None:
        exc.sqlite_errorname = name
    return exc


@pytest.mark.parametrize(
    "exc, is_damaged",
    [
        (error(sqlite3.DatabaseError, "file is not a database"), True),  # Python 3.10
        (error(sqlite3.DatabaseError, "database disk image is malformed"), True),
        (error(sqlite3.DatabaseError, "a damaged file", "SQLITE_CORRUPT"), True),  # 3.11: by name
        (error(sqlite3.DatabaseError, "not a file of ours", "SQLITE_NOTADB"), True),
        (error(sqlite3.OperationalError, "database is locked", "SQLITE_BUSY"), False),
        (error(sqlite3.OperationalError, "disk I/O error"), False),
    ],
)
def test_a_file_is_damaged_when_sqlite_says_so_by_name_or_by_its_message(exc, is_damaged):
    assert damaged(exc) is is_damaged


def test_the_metrics_count_what_the_store_did_and_what_waits(tmp_path):
    """A wall clock the test holds back holds the writer in its first write (its folding asks
    the time): what is put meanwhile waits, and counts as pending."""
    let_go = threading.Event()

    def wall():
        let_go.wait(20)
        return time.time()

    with store_in(tmp_path, wall=wall) as store:
        for n in range(3):
            store.put(WALL + 60 * n, interval())
        assert store.metrics()["pending"] == 3
        let_go.set()
        wait(lambda: store.intervals == 3)
        found, disk = store.metrics(), os.statvfs(tmp_path)
        assert 0 < found.pop("free") <= disk.f_blocks * disk.f_frsize
        assert found == {
            "path": str(tmp_path / FILE),
            "state": "writable",
            "rows": 6,
            "intervals": 3,
            "failures": 0,
            "set_aside": 0,
            "pending": 0,
            "dropped": 0,
            "answered_again": 0,
            "saving_room": False,
            "parties_overflow": 0,
            "reports_running": 0,
            "reports_waiting": 0,
            "reports_busy": 0,
            "reports_too_large": 0,
        }


def test_folding_takes_whole_days_only(tmp_path):
    db = sqlite3.connect(tmp_path / "u.sqlite3", isolation_level=None)
    schema.migrate(db)
    keys = tables.Keys()
    day = WALL // DAY * DAY - 20 * DAY
    for hour in (1, 23):  # the first and the last hour of a day
        tables.write_interval(db, keys, day + hour * 3600 + 660, interval())
    now = day + 10 * DAY + 12 * 3600  # noon, ten days after
    assert tables.cutoff(now, 10) == day
    assert tables.fold(db, tables.cutoff(now, 10)) == (0, 0)  # the day is not over ten days ago
    assert tables.fold(db, tables.cutoff(now + DAY, 10)) == (4, 6)  # now it is, whole


def test_a_fold_that_fails_changes_nothing_and_ends_its_transaction(tmp_path):
    db = sqlite3.connect(tmp_path / "u.sqlite3", isolation_level=None)
    schema.migrate(db)
    day = WALL // DAY * DAY - 20 * DAY
    tables.write_interval(db, tables.Keys(), day + 660, interval())
    db.execute("ALTER TABLE samples RENAME TO kept")  # removed after the hourly totals
    with pytest.raises(sqlite3.OperationalError, match="no such table: samples"):
        tables.fold(db, int(day + DAY))
    assert not db.in_transaction
    assert db.execute("SELECT COUNT(*) FROM hourly").fetchone() == (3,)
    assert db.execute("SELECT COUNT(*) FROM kept").fetchone() == (2,)
