"""What the doctor says of the port and the unix socket, for each thing it may have found, word
for word (the checks are pure: the facts are given as the probes would find them; the probes
themselves meet real sockets in tests/test_doctor_listening.py)."""

import errno
import os
import socket
import stat

import pytest

from patroller.doctor.listening import (
    PortFacts,
    SocketFacts,
    check_port,
    check_socket,
    probe_port,
    probe_socket,
)
from patroller.doctor.results import Result

PORT = "address and port"
OTHER = "stop it, or choose another --port or --address"


@pytest.mark.parametrize(
    "facts, status, detail, fix",
    [
        (PortFacts(8080, "127.0.0.1"), "ok", "port 8080 on 127.0.0.1: free", ""),
        (PortFacts(0, ""), "ok", "port 0: the kernel chooses a free one at start", ""),
        (
            PortFacts(8080, "", errno.EADDRINUSE, "Address already in use", "patroller"),
            "ok",
            "port 8080 on every interface: a Patroller serves there (this one, or the one this "
            "doctor is checking for)",
            "",
        ),
        (
            PortFacts(8080, "", errno.EADDRINUSE, "Address already in use", "nginx/1.2"),
            "failed",
            "port 8080 on every interface is taken: `nginx/1.2` answers there",
            OTHER,
        ),
        (
            PortFacts(8080, "::1", errno.EADDRINUSE, "Address already in use", ""),
            "failed",
            "port 8080 on ::1 is taken: something that does not answer as Patroller does holds it",
            OTHER,
        ),
        (
            PortFacts(80, "", errno.EACCES, "Permission denied"),
            "failed",
            "port 80 on every interface: Permission denied: only root may listen below port 1024",
            "run as root, choose a --port from 1024 up, or give the daemon CAP_NET_BIND_SERVICE",
        ),
        (
            PortFacts(8080, "10.9.9.9", errno.EADDRNOTAVAIL, "Cannot assign requested address"),
            "failed",
            "port 8080 on 10.9.9.9: Cannot assign requested address: no interface of this host "
            "has that address",
            "choose an --address this host has (ip addr), or none for every one",
        ),
        (
            PortFacts(8080, "", errno.EINVAL, "Invalid argument"),
            "failed",
            "port 8080 on every interface: Invalid argument",
            "choose another --port or --address",
        ),
    ],
)
def test_what_is_said_of_the_port(facts, status, detail, fix):
    assert check_port(facts) == Result(PORT, status, detail, fix)


def test_an_address_this_host_lacks_is_said_in_the_systems_words():
    facts = probe_port(8080, "192.0.2.1", 0.5)  # TEST-NET-1: no interface has it
    assert facts == PortFacts(
        8080, "192.0.2.1", errno.EADDRNOTAVAIL, os.strerror(errno.EADDRNOTAVAIL), None
    )


SOCK = "unix socket"


@pytest.mark.parametrize(
    "facts, status, detail, fix",
    [
        (
            SocketFacts(None),
            "ok",
            "none (--socket): callers are identified over TCP, from this host only",
            "",
        ),
        (
            SocketFacts("/run/p/s.sock", folder_missing=True),
            "failed",
            "/run/p does not exist: /run/p/s.sock cannot be made",
            "make the folder (under systemd: RuntimeDirectory=patroller), or choose another "
            "--socket",
        ),
        (
            SocketFacts("/run/p/s.sock", folder_unwritable="/run/p is not writable by uid 7"),
            "failed",
            "/run/p/s.sock cannot be made: /run/p is not writable by uid 7",
            "choose a --socket in a folder the daemon's user may write to",
        ),
        (
            SocketFacts("/run/p/s.sock", "directory", 0o755),
            "failed",
            "/run/p/s.sock is a directory, not a socket",
            "remove it, or choose another --socket",
        ),
        (
            SocketFacts("/run/p/s.sock", "file", 0o644),
            "failed",
            "/run/p/s.sock is a file, not a socket",
            "remove it, or choose another --socket",
        ),
        (SocketFacts("/run/p/s.sock"), "ok", "/run/p/s.sock: made at start (mode 666)", ""),
        (
            SocketFacts("/run/p/s.sock", "socket", 0o666, True),
            "ok",
            "/run/p/s.sock: a server answers there (mode 666)",
            "",
        ),
        (
            SocketFacts("/run/p/s.sock", "socket", 0o660, True),
            "degraded",
            "/run/p/s.sock: a server answers there (mode 660): not every user may connect",
            "the daemon makes it 666: is another program serving there?",
        ),
        (
            SocketFacts("/run/p/s.sock", "socket", 0o666, False),
            "ok",
            "/run/p/s.sock: a stale socket nobody answers on, replaced at start",
            "",
        ),
        (
            SocketFacts("/run/p/s.sock", closed_by="/run/p", closed_mode=0o750),
            "degraded",
            "/run/p/s.sock: made at start (mode 666); but /run/p (mode 750) lets no other "
            "user through",
            "chmod o+x /run/p (under systemd: RuntimeDirectoryMode=0755)",
        ),
        (
            SocketFacts(
                "/run/p/s.sock", "socket", 0o777, True, closed_by="/run", closed_mode=0o700
            ),
            "degraded",
            "/run/p/s.sock: a server answers there (mode 777); but /run (mode 700) lets no "
            "other user through",
            "chmod o+x /run (under systemd: RuntimeDirectoryMode=0755)",
        ),
    ],
)
def test_what_is_said_of_the_socket(facts, status, detail, fix):
    assert check_socket(facts) == Result(SOCK, status, detail, fix)


def test_a_socket_folder_the_doctor_may_not_write_to_is_named():
    """/proc/sys: the kernel refuses a write there to every user, root too."""
    facts = probe_socket("/proc/sys/patroller.sock", 5.0)
    assert facts.folder_unwritable == f"/proc/sys is not writable by uid {os.geteuid()}"
    assert check_socket(facts).status == "failed"


def test_a_datagram_socket_at_the_path_is_no_server(tmp_path):
    """The daemon serves a stream socket: one of another type there answers no connection."""
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as other:
        other.bind(path)
        os.chmod(path, 0o666)
        facts = probe_socket(path, 5.0)
    assert (facts.kind, facts.live, facts.mode) == ("socket", False, 0o666)
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_what_is_at_the_socket_path_is_told_apart(tmp_path):
    """Nothing, a directory, a file, a live socket, a stale one; the folder's closed parent
    (pytest's base folder is 0700) named each time."""
    parent = str(tmp_path.parent.parent)  # /tmp/pytest-of-<user>, 0700
    closed = (parent, stat.S_IMODE(os.stat(parent).st_mode))
    path = tmp_path / "s.sock"
    facts = probe_socket(str(path), 5.0)
    assert facts == SocketFacts(str(path), None, None, False, False, None, *closed)
    path.mkdir()
    assert probe_socket(str(path), 5.0) == SocketFacts(
        str(path), "directory", stat.S_IMODE(path.stat().st_mode), False, False, None, *closed
    )
    path.rmdir()
    path.write_text("")
    path.chmod(0o640)
    assert probe_socket(str(path), 5.0) == SocketFacts(
        str(path), "file", 0o640, False, False, None, *closed
    )
    path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        os.chmod(path, 0o666)
        server.listen(1)
        assert probe_socket(str(path), 5.0) == SocketFacts(
            str(path), "socket", 0o666, True, False, None, *closed
        )
    # the server gone, its socket file stays: stale
    assert probe_socket(str(path), 5.0) == SocketFacts(
        str(path), "socket", 0o666, False, False, None, *closed
    )
