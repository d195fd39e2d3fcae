"""state/directory.lock in-process, on real filesystems: a read-only bind mount (as a state
directory on a read-only root is), a path that cannot be a directory, and the pid it writes."""

import errno
import os
import subprocess
from contextlib import contextmanager

import pytest
from helpers import need_root

from patroller.state.directory import LOCK, BookError, LockedDirectory, lock


@contextmanager
def read_only(source, where):
    """`source` bind-mounted read-only at `where` (root only); unmounted after."""
    need_root("it mounts a filesystem")
    os.makedirs(where, mode=0o700, exist_ok=True)
    subprocess.run(["mount", "--bind", str(source), str(where)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(where)], check=True)
        yield str(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.fixture
def private(tmp_path):
    """A directory only its owner may write to, as the state directory's parent must be."""
    os.chmod(tmp_path, 0o700)
    return tmp_path


def test_a_state_directory_is_locked_and_names_its_holder(private):
    (private / "state").mkdir(mode=0o700)
    (private / "state" / LOCK).write_text("a longer line a daemon before left there\n")
    held = lock(str(private / "state"))
    try:
        assert held.read_only is False and held.fd is not None
        with open(private / "state" / LOCK) as f:
            assert f.read() == f"{os.getpid()}\n"
        assert oct(os.stat(private / "state").st_mode & 0o777) == "0o700"
    finally:
        os.close(held.fd)


def test_on_a_read_only_filesystem_a_lock_file_there_is_held_and_not_written(private):
    state = private / "state"
    state.mkdir(mode=0o700)
    (state / LOCK).write_text("12345\n")
    os.chmod(state / LOCK, 0o600)
    with read_only(state, private / "ro") as where:
        held = lock(where)
        try:
            assert held == LockedDirectory(held.fd, read_only=True) and held.fd is not None
            with open(os.path.join(where, LOCK)) as f:
                assert f.read() == "12345\n"  # nothing written
        finally:
            os.close(held.fd)


def test_on_a_read_only_filesystem_without_a_lock_file_nothing_is_held(private):
    state = private / "state"
    state.mkdir(mode=0o700)
    with read_only(state, private / "ro") as where:
        assert lock(where) == LockedDirectory(None, read_only=True)


def test_a_state_directory_that_cannot_be_made_on_a_read_only_filesystem_is_empty(private):
    empty = private / "empty"
    empty.mkdir(mode=0o700)
    with read_only(empty, private / "ro") as where:
        assert lock(os.path.join(where, "state")) == LockedDirectory(None, read_only=True)


def test_a_path_through_a_file_is_refused_saying_why(private):
    (private / "file").write_text("")
    with pytest.raises(BookError) as caught:
        lock(str(private / "file" / "state"))
    assert str(caught.value) == (
        f"cannot use the state directory {private}/file/state: "
        f"{os.strerror(errno.ENOTDIR)}; choose another --state-dir"
    )


def dangling_lock(private):
    """A state directory whose lock file is a link into a directory that does not exist (never
    followed; if it were, nothing would be made)."""
    state = private / "state"
    state.mkdir(mode=0o700)
    os.symlink(private / "missing" / "lock", state / LOCK)
    return state


def test_a_lock_file_that_cannot_be_opened_says_why(private):
    state = dangling_lock(private)
    with pytest.raises(BookError) as caught:
        lock(str(state))
    assert str(caught.value) == (
        f"cannot use the state directory {state}: "
        f"{os.strerror(errno.ELOOP)}; choose another --state-dir"
    )


def test_on_a_read_only_filesystem_a_lock_file_that_cannot_be_opened_is_refused(private):
    state = dangling_lock(private)
    with read_only(state, private / "ro") as where, pytest.raises(BookError) as caught:
        lock(where)
    assert str(caught.value) == (
        f"cannot use the state directory {where}: "
        f"{os.strerror(errno.ELOOP)}; choose another --state-dir"
    )
