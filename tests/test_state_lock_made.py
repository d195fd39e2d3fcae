"""A state directory that `lock` (patroller/state/directory.py) makes: private from the
start, its lock file 0600 whatever the umask, nothing to say; and one it cannot make, said
with the system's reason. In-process: the mutation suite runs this file."""

from __future__ import annotations

import errno
import os
import stat

import pytest
from test_usage_store import tmpfs

from patroller.state.directory import LOCK, BookError, lock


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_zero():
    old = os.umask(0)
    yield
    os.umask(old)


def test_a_state_directory_it_makes_is_private_with_its_lock_file(tmp_path, umask_zero):
    os.chmod(tmp_path, 0o700)
    where = tmp_path / "state"
    locked = lock(str(where))
    try:
        assert not locked.read_only and not locked.tightened
        assert mode(where) == 0o700 and mode(where / LOCK) == 0o600
    finally:
        os.close(locked.fd)


def test_one_it_cannot_make_says_the_systems_reason(tmp_path):
    """A filesystem with no inode left (a tmpfs of one): the directory cannot be made."""
    os.chmod(tmp_path, 0o700)
    with tmpfs(tmp_path / "full", options=",nr_inodes=1") as full:
        where = full / "state"
        with pytest.raises(BookError) as found:
            lock(str(where))
    assert str(found.value) == (
        f"cannot use the state directory {where}: {os.strerror(errno.ENOSPC)}; "
        "choose another --state-dir"
    )
