"""What `tighten` and `tighten_directory` (patroller/state/private.py) leave alone: a link
(its target is not ours to change), a FIFO (opening it must not wait for a writer), a
directory, a file that is gone; and that they close every file open to others, whatever
else the directory holds. In-process and fast: the mutation suite runs this file."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from patroller.state.private import tighten, tighten_directory


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def returns(call, *args):
    """What call(*args) returns, in a thread; a call that hangs (an open of a FIFO that waits
    for a writer) fails the test, and is let go by opening the FIFO's other end."""
    got = []
    thread = threading.Thread(target=lambda: got.append(call(*args)), daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        for fifo in args[1:]:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"{call.__name__} waited on a FIFO")
    return got[0]


def test_a_file_open_to_others_is_closed_and_said_and_a_private_one_is_not(tmp_path):
    open_one = tmp_path / "open"
    open_one.write_text("x")
    os.chmod(open_one, 0o644)
    private = tmp_path / "private"
    private.write_text("x")
    os.chmod(private, 0o600)
    assert tighten(str(open_one)) is True
    assert mode(open_one) == 0o600
    assert tighten(str(private)) is False
    assert mode(private) == 0o600


def test_a_link_a_directory_and_a_missing_file_are_left_as_they_are(tmp_path):
    target = tmp_path / "target"
    target.write_text("x")
    os.chmod(target, 0o644)
    link = tmp_path / "link"
    link.symlink_to(target)
    sub = tmp_path / "sub"
    sub.mkdir()
    os.chmod(sub, 0o755)
    assert tighten(str(link)) is False
    assert mode(target) == 0o644
    assert tighten(str(sub)) is False
    assert mode(sub) == 0o755
    assert tighten(str(tmp_path / "gone")) is False


def test_a_fifo_is_left_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o666)
    os.chmod(fifo, 0o666)
    assert returns(lambda path, _: tighten(path), str(fifo), str(fifo)) is False
    assert mode(fifo) == 0o666


def test_a_directory_closes_each_file_past_links_fifos_and_subdirectories(tmp_path):
    where = tmp_path / "d"
    where.mkdir()
    os.chmod(where, 0o700)  # private already: only its files are said
    target = tmp_path / "outside"
    target.write_text("x")
    os.chmod(target, 0o644)
    names = []
    for n in range(6):
        (where / f"f{n}").write_text("x")
        os.chmod(where / f"f{n}", 0o640)
        names.append(f"f{n}")
        (where / f"link{n}").symlink_to(target)
    (where / "ours").write_text("x")
    os.chmod(where / "ours", 0o600)
    os.mkfifo(where / "fifo", 0o666)
    os.chmod(where / "fifo", 0o666)
    (where / "sub").mkdir()
    os.chmod(where / "sub", 0o755)
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        done = returns(lambda fd, _: tighten_directory(fd), fd, str(where / "fifo"))
    finally:
        os.close(fd)
    assert done.directory_mode is None
    assert sorted(done.files) == names
    assert done.words("/s") == ("6 file(s) in it were open to others (f0, f1, f2, f3, f4, ...)")
    assert all(mode(where / name) == 0o600 for name in names)
    assert mode(target) == 0o644
    assert mode(where / "fifo") == 0o666
    assert mode(where / "sub") == 0o755
    assert mode(where) == 0o700


def test_a_terminal_is_left_and_does_not_become_the_daemons_terminal():
    """A daemon is a session leader without a terminal (systemd starts it so): a terminal it
    opens without O_NOCTTY would become its controlling terminal, its signals the daemon's."""
    leader, follower = os.openpty()
    try:
        pid = os.fork()
        if pid == 0:  # the child: a session of its own, no terminal
            code = 2
            try:
                os.setsid()
                code = 1 if tighten(os.ttyname(follower)) else 0
                os.close(os.open("/dev/tty", os.O_RDONLY))  # ENXIO: it has no terminal
                code = 3
            except OSError:
                pass
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(leader)
        os.close(follower)


def test_a_directory_open_to_others_is_closed_and_says_its_mode(tmp_path):
    where = tmp_path / "d"
    where.mkdir()
    os.chmod(where, 0o755)
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        done = tighten_directory(fd)
    finally:
        os.close(fd)
    assert done.directory_mode == 0o755 and done.files == []
    assert done.words("/s") == "/s was mode 755"
    assert mode(where) == 0o700
