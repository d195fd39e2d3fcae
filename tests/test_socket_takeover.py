"""--socket with real daemons: a live one is never taken over, a stale file is replaced, and a
daemon removes only its own socket file when it stops."""

import os
import signal
import socket
import subprocess
import sys
import tempfile

import pytest
from helpers import ROOT, ServerProcess


@pytest.fixture
def path():
    # Short, so that the socket path stays far below the 107-byte limit.
    folder = tempfile.mkdtemp(prefix="pts", dir="/tmp")
    yield os.path.join(folder, "api.sock")
    subprocess.run(["rm", "-rf", folder])


def answer_on(path):
    """The status line of a GET /devices over the unix socket."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(b"GET /devices HTTP/1.0\r\n\r\n")
        head = b""
        while b"\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    return head.split(b"\r\n", 1)[0].decode()


def daemon(path):
    return ServerProcess("--test", "--socket", path)


def refused_start(path):
    """Start a daemon that must refuse: (exit status, the lines it printed)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "patroller",
            "--test",
            "--port",
            "0",
            "--address",
            "127.0.0.1",
            "--socket",
            path,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    return result.returncode, (result.stdout + result.stderr).strip().splitlines()


def test_a_second_daemon_refuses_a_live_socket_and_leaves_it_alone(path):
    first = daemon(path).start()
    try:
        served = os.stat(path).st_ino
        status, lines = refused_start(path)
        assert status == 1
        assert lines == [
            f"patroller: another Patroller is serving on {path}: stop it first, "
            "or choose another --socket"
        ]
        assert os.stat(path).st_ino == served and answer_on(path) == "HTTP/1.1 200 OK"
    finally:
        assert first.stop() == 0
    assert not os.path.exists(path)  # its own, removed at stop


def test_a_stale_socket_left_by_a_killed_daemon_is_replaced(path):
    killed = daemon(path).start()
    killed.stop(signal.SIGKILL)
    assert os.path.exists(path)  # nobody removed it
    with pytest.raises(ConnectionRefusedError):
        answer_on(path)
    second = daemon(path).start()
    try:
        assert answer_on(path) == "HTTP/1.1 200 OK"
        assert f"replacing the stale socket file {path}" in second.log
    finally:
        assert second.stop() == 0
    assert not os.path.exists(path)


def test_a_stopping_daemon_leaves_a_newer_daemons_socket(path):
    first = daemon(path).start()
    second = None
    try:
        os.unlink(path)  # someone removes it, and another daemon binds the path afresh
        second = daemon(path).start()
        theirs = os.stat(path).st_ino
        assert first.stop() == 0
        assert os.stat(path).st_ino == theirs and answer_on(path) == "HTTP/1.1 200 OK"
    finally:
        first.stop()
        if second is not None:
            assert second.stop() == 0
    assert not os.path.exists(path)


def test_a_regular_file_at_the_socket_path_is_one_line_and_kept(path):
    with open(path, "w") as f:
        f.write("precious\n")
    status, lines = refused_start(path)
    assert status == 1
    assert lines == [
        f"patroller: --socket {path} exists and is not a socket: remove it, or "
        "choose another --socket"
    ]
    with open(path) as f:
        assert f.read() == "precious\n"


def test_a_directory_at_the_socket_path_is_one_line(path):
    os.mkdir(path)
    status, lines = refused_start(path)
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"patroller: --socket {path} is a directory") and os.path.isdir(
        path
    )
