"""A state directory at start, in-process: one open to others made private and said; one on a
read-only filesystem (patroller/state/directory.py
`lock`, patroller/state/book.py `LeaseBook.open`): read, locked where a lock file is there,
and said once at start, with the mode of one open to others, which cannot be made private.
test_read_only_state.py runs the daemon on one; the mutation suite runs this file."""

from __future__ import annotations

import logging
import os

import pytest
from test_read_only_state import read_only_view

from patroller.config import Config
from patroller.state.book import LeaseBook
from patroller.state.directory import LOCK, lock

READ_ONLY = (
    "the state directory {} is on a read-only filesystem: the lease book is read, never "
    "written; reservations made from now on do not survive a restart (mount it read-write to "
    "keep them)"
)
OPEN = (
    "the state directory {} (mode 755) is open to other users and on a read-only filesystem, "
    "so it cannot be made private: they may read the usage history and the lease book there "
    "(chmod 700 it where it is writable)"
)


def source(tmp_path, mode, with_lock=True):
    made = tmp_path / "source"
    made.mkdir()
    if with_lock:
        (made / LOCK).write_text("")
        os.chmod(made / LOCK, 0o600)
    os.chmod(made, mode)
    return made


def errors(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


@pytest.mark.errors_expected
def test_one_open_to_others_is_locked_read_only_and_its_mode_said(tmp_path, caplog):
    with read_only_view(source(tmp_path, 0o755), tmp_path / "ro") as where:
        locked = lock(str(where))
        try:
            assert locked.read_only and locked.fd is not None and locked.open_mode == 0o755
            assert not locked.tightened
        finally:
            os.close(locked.fd)
        book = LeaseBook(str(where), Config())
        book.open()
        try:
            assert book.read_only
        finally:
            book.close()
    assert errors(caplog) == [READ_ONLY.format(where), OPEN.format(where)]


@pytest.mark.errors_expected
def test_a_private_one_is_said_read_only_and_nothing_more(tmp_path, caplog):
    with read_only_view(source(tmp_path, 0o700), tmp_path / "ro") as where:
        locked = lock(str(where))
        try:
            assert locked.read_only and locked.fd is not None and locked.open_mode is None
        finally:
            os.close(locked.fd)
        book = LeaseBook(str(where), Config())
        book.open()
        book.close()
    assert errors(caplog) == [READ_ONLY.format(where)]


def test_one_without_a_lock_file_is_read_only_and_holds_no_lock(tmp_path):
    with read_only_view(source(tmp_path, 0o755, with_lock=False), tmp_path / "ro") as where:
        locked = lock(str(where))
        assert locked.read_only and locked.fd is None and locked.open_mode is None


def test_a_writable_one_open_to_others_is_made_private_and_said(tmp_path, caplog):
    where = tmp_path / "state"
    where.mkdir()
    (where / "leases.json").write_text("{}")
    os.chmod(where / "leases.json", 0o644)
    os.chmod(where, 0o755)
    book = LeaseBook(str(where), Config())
    book.open()
    try:
        assert not book.read_only
    finally:
        book.close()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"the state directory was open to other users, and is private now: {where} was mode "
        "755; 1 file(s) in it were open to others (leases.json) (under systemd: "
        "StateDirectoryMode=0700 and UMask=0077, as `patroller systemd-unit` prints)"
    ]
    assert errors(caplog) == []
    assert os.stat(where).st_mode & 0o777 == 0o700
    assert os.stat(where / "leases.json").st_mode & 0o777 == 0o600
