"""A bounded socket, on a real TCP connection over loopback: it is the same connection (its
address, its peer), it passes every byte each way as the plain socket would, it counts what
came, and past its point on the clock it says how long it waited and how much came."""

import socket
import time

import pytest

from patroller.doctor.deadline import Overdue, bounded, deadline, left


@pytest.fixture
def connection():
    """(ours, theirs): the two ends of a TCP connection on loopback."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        ours = socket.create_connection(server.getsockname())
        theirs, _ = server.accept()
    with ours, theirs:
        yield ours, theirs


def everything(sock):
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    return got


def test_a_deadline_is_a_point_ahead_and_what_is_left_never_under_a_millisecond():
    now = time.monotonic()
    ahead = deadline(30)
    assert now + 30 <= ahead <= time.monotonic() + 30
    assert 29 < left(ahead) <= 30
    assert left(now - 10) == 0.001


def test_the_bounded_socket_is_the_same_connection_and_takes_its_descriptor(connection):
    ours, theirs = connection
    peer, name = ours.getpeername(), ours.getsockname()
    sock = bounded(ours, deadline(30), 30)
    with sock:
        assert ours.fileno() == -1  # moved, not copied
        assert (sock.family, sock.type) == (socket.AF_INET, socket.SOCK_STREAM)
        assert sock.proto in (0, socket.IPPROTO_TCP)
        assert sock.getpeername() == peer and sock.getsockname() == name


def test_what_is_sent_comes_whole_to_the_other_end(connection):
    ours, theirs = connection
    with bounded(ours, deadline(30), 30) as sock:
        assert sock.send(b"GET / HTTP/1.0\r\n") == 16
        sock.sendall(b"Host: here\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        assert everything(theirs) == b"GET / HTTP/1.0\r\nHost: here\r\n\r\n"


def test_what_comes_is_read_and_counted_both_ways_of_reading(connection):
    ours, theirs = connection
    theirs.sendall(b"HTTP/1.0 200 OK\r\n")
    theirs.shutdown(socket.SHUT_WR)
    with bounded(ours, deadline(30), 30) as sock:
        assert sock.recv(4) == b"HTTP"
        assert sock.came == 4
        buffer = bytearray(64)
        count = sock.recv_into(buffer)
        assert count == 13 and bytes(buffer[:count]) == b"/1.0 200 OK\r\n"
        assert sock.came == 17
        assert sock.recv(4) == b"" and sock.recv_into(buffer) == 0
        assert sock.came == 17


@pytest.mark.timeout(10)
def test_a_read_inside_the_last_second_is_let_through_and_one_past_the_bound_is_overdue(
    connection,
):
    ours, theirs = connection
    theirs.sendall(b"abc")
    sock = bounded(ours, deadline(0.5), 0.5)
    with sock:
        assert sock.recv(3) == b"abc"  # inside the bound, though less than a second is left
        with pytest.raises(Overdue) as overdue:
            sock.recv(3)  # nothing more comes: the bound ends the wait
        assert str(overdue.value) == "no whole answer within 0.5s (3 byte(s) came)"
        with pytest.raises(Overdue) as overdue:
            sock.sendall(b"more")  # past the bound, nothing is tried
        assert str(overdue.value) == "no whole answer within 0.5s (3 byte(s) came)"


@pytest.mark.timeout(10)
def test_a_read_into_a_buffer_is_bounded_too(connection):
    ours, theirs = connection
    with bounded(ours, deadline(0.3), 0.3) as sock:
        with pytest.raises(Overdue) as overdue:
            sock.recv_into(bytearray(8))
        assert str(overdue.value) == "no whole answer within 0.3s (0 byte(s) came)"


def test_the_flags_of_a_read_or_a_write_reach_the_connection(connection):
    """Whatever reads or writes through it (http.client, a caller peeking) gets the plain
    socket's meaning of its flags: a peek leaves the bytes to read, urgent data is urgent."""
    ours, theirs = connection
    theirs.sendall(b"HTTP/1.0")
    with bounded(ours, deadline(30), 30) as sock:
        assert sock.recv(4, socket.MSG_PEEK) == b"HTTP"
        buffer = bytearray(8)
        assert sock.recv_into(buffer, 0, socket.MSG_PEEK) == 8 and bytes(buffer) == b"HTTP/1.0"
        assert sock.recv(8) == b"HTTP/1.0"
        assert sock.send(b"a", socket.MSG_OOB) == 1
        assert theirs.recv(1, socket.MSG_OOB) == b"a"
        sock.sendall(b"b", socket.MSG_OOB)
        assert theirs.recv(1, socket.MSG_OOB) == b"b"
