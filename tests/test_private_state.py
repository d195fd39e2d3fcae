"""Nothing the daemon keeps can be read by another local user, whatever the umask and whatever
mode its directory came with: the attack of the trust review run for real.

A state directory made 0755 (as systemd's StateDirectory= without a mode makes it) in a folder
every user reaches, a daemon with --hide-users, a usage store and an audit record in it, started
under the umask 0 a careless service manager could hand it; then a throwaway user (useradd)
tries what the review did: open the store read-only with SQLite, take a lock on its -shm (which
stalled every write of the history), and grep the audit record for a name."""

import errno
import json
import logging
import os
import shutil
import signal
import sqlite3
import stat
import tempfile
import time
import urllib.request

import pytest
from helpers import ServerProcess, forked_as

from patroller.config import Config
from patroller.doctor.privacy import check_privacy, probe_privacy
from patroller.state.audit import AuditLog
from patroller.state.directory import BookError, lock, make_private
from patroller.state.private import (
    Tightened,
    create,
    replace,
    tighten,
    tighten_directory,
    touch,
)
from patroller.state.usage.files import FILE
from patroller.state.usage.store import UsageStore


@pytest.fixture
def reachable():
    """A folder of root's that every user may enter (pytest's own are 0700, which would hide
    the files whatever their modes)."""
    path = tempfile.mkdtemp(prefix="ppriv", dir="/tmp")
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def umask_zero():
    """The umask 0: any mode the daemon does not ask for itself would be 0666 or 0777."""
    before = os.umask(0)
    try:
        yield
    finally:
        os.umask(before)


def get(server, path):
    with urllib.request.urlopen(server.url + path, timeout=20) as answer:
        return json.loads(answer.read())


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def modes_in(directory):
    """The mode of each file in `directory`, links left out (the lease book's name is a link
    to its latest). A file gone between the listing and its look (SQLite's journal of a
    transaction just ended) is left out: what is there is judged, each file as it is."""
    found = {}
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        try:
            if not os.path.islink(path):
                found[path] = mode(path)
        except FileNotFoundError:
            continue
    return found


def what_a_stranger_gets(stranger, state, audit):
    """What the review's three attacks give, as the throwaway user: each a word."""

    def attacks():
        found = {}
        try:
            db = sqlite3.connect(f"file:{state}/{FILE}?mode=ro", uri=True)
            found["store"] = repr(db.execute("SELECT * FROM parties").fetchall())
        except sqlite3.Error as exc:
            found["store"] = f"refused: {exc}"
        try:
            fd = os.open(f"{state}/{FILE}-shm", os.O_RDWR)
            os.close(fd)
            found["shm"] = "opened"
        except OSError as exc:
            found["shm"] = f"refused: {exc.strerror}"
        for name, path in (("audit", audit), ("listing", state)):
            try:
                if name == "listing":
                    found[name] = repr(os.listdir(path))
                else:
                    with open(path, encoding="utf-8") as f:
                        found[name] = f.read()
            except OSError as exc:
                found[name] = f"refused: {exc.strerror}"
        return found

    return forked_as(stranger, attacks)


def test_another_user_can_read_nothing_of_the_history_the_audit_or_the_book(
    stranger, reachable, umask_zero
):
    state = os.path.join(reachable, "state")
    os.mkdir(state, 0o755)
    audit = os.path.join(reachable, "audit.jsonl")  # in a folder others may enter: its own mode
    server = ServerProcess(
        "--test",
        "--hide-users",
        "--state-dir",
        state,
        "--audit-log",
        audit,
        "--usage-interval",
        "0.2",
    ).start()
    try:
        get(server, "/request?gpu=1&user=alice")
        deadline = time.monotonic() + 30
        while get(server, "/metrics.json")["usage"]["intervals"] < 3:
            assert time.monotonic() < deadline, server.log
            time.sleep(0.05)
        assert os.path.exists(f"{state}/{FILE}-shm")  # the store is open, in WAL mode
        assert mode(state) == 0o700, "the daemon makes its state directory private"
        assert len(modes_in(state)) >= 5  # lock, book, key, store and its WAL's files
        for path, found in modes_in(state).items():
            assert found == 0o600, path
        assert mode(audit) == 0o600
        with open(audit, encoding="utf-8") as f:
            assert "alice" in f.read()  # the record is there, to be kept from others
        # And the directory hides them too: the files alone are private even when it is
        # opened again (an operator's chmod) while the daemon runs.
        os.chmod(state, 0o755)
        got = what_a_stranger_gets(stranger, state, audit)
        assert got["store"].startswith("refused: unable to open database file"), got
        assert got["shm"] == "refused: Permission denied", got
        assert got["audit"] == "refused: Permission denied", got
        assert "alice" not in json.dumps(got)
    finally:
        assert server.stop(signal.SIGTERM) == 0, server.log
    for path, found in modes_in(state).items():  # the stop wrote no file others may read
        assert found == 0o600, path


def test_a_state_directory_an_older_version_left_open_is_made_private_at_start(
    reachable, umask_zero
):
    """Its store (and the WAL's files) 0644, the directory 0755: all closed at start, the
    warning names what was open and the unit's settings that keep it so."""
    state = os.path.join(reachable, "state")
    os.mkdir(state, 0o755)
    for name in (FILE, f"{FILE}-wal", f"{FILE}-shm", "usage.sqlite3.corrupt-20261201T000000Z"):
        with open(os.path.join(state, name), "w") as f:
            f.write("")
        os.chmod(os.path.join(state, name), 0o644)
    elsewhere = os.path.join(reachable, "elsewhere")
    with open(elsewhere, "w") as f:
        f.write("")
    os.chmod(elsewhere, 0o644)
    os.symlink(elsewhere, os.path.join(state, "a-link"))  # not followed, not changed
    server = ServerProcess("--test", "--state-dir", state).start()
    try:
        assert mode(state) == 0o700
        modes = modes_in(state)
        assert len(modes) >= 6, modes  # those four, the lock and the pseudonyms' key
        assert all(found == 0o600 for found in modes.values()), modes
        assert mode(elsewhere) == 0o644
        said = [line for line in server.log.splitlines() if "is private now" in line]
        assert len(said) == 1, server.log
        assert f"{state} was mode 755; 4 file(s) in it were open to others" in said[0]
        assert "StateDirectoryMode=0700" in said[0]
    finally:
        assert server.stop() == 0, server.log
    server = ServerProcess("--test", "--state-dir", state).start()  # nothing to say again
    try:
        assert "is private now" not in server.log
    finally:
        server.stop()


def test_every_file_is_made_0600_whatever_the_umask(tmp_path, umask_zero):
    """The pieces the daemon writes through, each under the umask 0."""
    fd = create(str(tmp_path / "new"))
    os.close(fd)
    assert mode(tmp_path / "new") == 0o600
    touch(str(tmp_path / "store"))
    assert mode(tmp_path / "store") == 0o600
    old = tmp_path / "old"
    old.write_text("")
    os.chmod(old, 0o640)  # group-readable is open to others too
    assert tighten(str(old)) and mode(old) == 0o600
    assert not tighten(str(old))  # private already: nothing done
    os.chmod(old, 0o604)
    os.close(create(str(old)))
    assert mode(old) == 0o600
    log = AuditLog(str(tmp_path / "audit.jsonl"), 10, 60)
    log.open()
    log.close()
    assert mode(tmp_path / "audit.jsonl") == 0o600
    store = UsageStore(str(tmp_path / "usage"), Config(test=True))
    store.open()
    store.put(time.time(), ())
    deadline = time.monotonic() + 20
    while store.metrics()["intervals"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    store.close(10)
    assert mode(tmp_path / "usage") == 0o700
    for name in os.listdir(tmp_path / "usage"):
        assert mode(tmp_path / "usage" / name) == 0o600, name


def test_a_file_replaced_in_parts_is_whole_and_private_or_left_as_it_was(tmp_path, umask_zero):
    path = tmp_path / "journal"
    replace(str(path), (f"line {n}\n".encode() for n in range(3000)))
    assert path.read_text().splitlines() == [f"line {n}" for n in range(3000)]
    assert mode(path) == 0o600

    def broken():  # a part cannot be made (a full disk, say): the old file stays whole
        yield b"half\n"
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        replace(str(path), broken())
    assert path.read_text().splitlines()[-1] == "line 2999"
    assert os.listdir(tmp_path) == ["journal"]  # no temporary file left


def test_a_directory_is_tightened_through_its_descriptor_and_says_what(tmp_path):
    where = tmp_path / "d"
    where.mkdir()
    os.chmod(where, 0o751)
    (where / "a").write_text("")
    os.chmod(where / "a", 0o644)
    (where / "b").write_text("")
    os.chmod(where / "b", 0o600)
    (where / "sub").mkdir()
    os.chmod(where / "sub", 0o755)  # not entered, not changed: the daemon makes none
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        done = tighten_directory(fd)
    finally:
        os.close(fd)
    assert done.directory_mode == 0o751 and done.files == ["a"]
    assert done.words("/x") == "/x was mode 751; 1 file(s) in it were open to others (a)"
    assert mode(where) == 0o700 and mode(where / "a") == 0o600 and mode(where / "sub") == 0o755
    assert not Tightened() and Tightened(files=["a"])
    held = lock(str(where))  # already private: nothing to tell
    try:
        assert not held.tightened
    finally:
        os.close(held.fd)


def test_the_doctor_fails_what_others_may_read_and_says_how_to_close_it(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o755)
    (state / FILE).write_text("")
    os.chmod(state / FILE, 0o644)
    (state / "pseudonyms.key").write_text("")
    os.chmod(state / "pseudonyms.key", 0o600)
    audit = tmp_path / "audit.jsonl"
    audit.write_text("")
    os.chmod(audit, 0o640)
    result = check_privacy(probe_privacy(str(state), str(audit)))
    assert result.status == "failed", result
    assert f"{state} is mode 755; {state}/{FILE} is mode 644; {audit} is mode 640" in result.detail
    assert "pseudonyms.key" not in result.detail
    assert result.fix.startswith(f"chmod 700 {state}; chmod 600 {state}/{FILE} {audit}")
    assert "StateDirectoryMode=0700" in result.fix and "UMask=0077" in result.fix
    os.chmod(state, 0o700)  # the directory alone closed: the files are still open
    assert check_privacy(probe_privacy(str(state), str(audit))).status == "failed"
    os.chmod(state / FILE, 0o600)
    os.chmod(audit, 0o600)
    result = check_privacy(probe_privacy(str(state), str(audit)))
    assert result.status == "ok", result
    assert (
        result.detail == "the state directory and the audit record: 3 file(s), none open "
        "to other users"
    )
    assert check_privacy(probe_privacy(str(tmp_path / "not-yet"), "-")).status == "ok"
    assert check_privacy(probe_privacy(None, None)).status == "ok"


def test_in_a_private_directory_open_files_are_closed_without_a_word(tmp_path, caplog):
    """A file of ours open to others in a directory nobody else may enter was never exposed:
    it is made 0600 all the same, and nothing is said (a warning is for a directory that was
    open)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / FILE).write_text("")
    os.chmod(state / FILE, 0o644)
    from patroller.state.book import LeaseBook

    book = LeaseBook(str(state), Config())
    with caplog.at_level(logging.INFO, logger="patroller"):
        book.open()
    try:
        assert mode(state / FILE) == 0o600
        assert not [r for r in caplog.records if "private" in r.getMessage()]
    finally:
        book.close()


def test_a_state_directory_reached_through_a_link_or_no_directory_is_not_made_private(tmp_path):
    """make_private opens the directory itself: a link to one is refused, not followed (its
    target keeps its mode), and so is a file."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    os.symlink(target, tmp_path / "state")
    with pytest.raises(BookError) as linked:
        make_private(str(tmp_path / "state"))
    assert str(linked.value) == (
        f"cannot make the state directory {tmp_path}/state private: "
        f"{os.strerror(errno.ENOTDIR)}; make it ours and private (chmod 700), or choose "
        "another --state-dir"
    )
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755
    (tmp_path / "file").write_text("")
    with pytest.raises(BookError, match=os.strerror(errno.ENOTDIR)):
        make_private(str(tmp_path / "file"))
