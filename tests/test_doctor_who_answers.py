"""Who holds the port, as the doctor asks it: one HTTP request to a real server on loopback that
answers as scripted (in pieces, with or without a Server header, not HTTP at all, keeping the
connection open after its head), and what the doctor makes of each answer."""

import errno
import os
import socket
import threading

import pytest

from patroller.doctor.listening import HEAD_LIMIT, PortFacts, _who_answers, probe_port

REQUEST = b"GET /openapi.json HTTP/1.0\r\nHost: doctor\r\n\r\n"


class Scripted:
    """A TCP server on loopback that reads the request, sends `pieces`, and closes (or holds
    the connection open until the test ends)."""

    def __init__(self, pieces, hold=False, host="127.0.0.1"):
        self.pieces, self.hold = pieces, hold
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.request = b""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.listener.accept()
        with conn:
            while not self.request.endswith(b"\r\n\r\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                self.request += chunk
            for piece in self.pieces:
                conn.sendall(piece)
            if self.hold:
                self.done.wait(30)

    def close(self):
        self.done.set()
        self.thread.join(10)
        self.listener.close()


@pytest.fixture
def serving():
    made = []

    def serve(pieces, **kwargs):
        made.append(Scripted(pieces, **kwargs))
        return made[-1]

    yield serve
    for server in made:
        server.close()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("address", ["", "0.0.0.0", "::", "127.0.0.1"])
def test_the_server_header_is_said_the_head_read_in_pieces(serving, address):
    server = serving(
        [b"HTTP/1.0 200 OK\r\nServer: nginx/1.2 (a:b)\r\n", b"X-Other: 1\r\n\r\nbody"]
    )
    assert _who_answers(address, server.port, 5.0) == "nginx/1.2 (a:b)"
    assert server.request == REQUEST


@pytest.mark.timeout(20)
def test_a_header_named_in_capitals_is_found_after_others(serving):
    server = serving([b"HTTP/1.1 404 Not Found\r\nDate: today\r\nSERVER:  patroller \r\n\r\n"])
    assert _who_answers("127.0.0.1", server.port, 5.0) == "patroller"


@pytest.mark.timeout(20)
def test_an_http_answer_without_a_server_header_is_an_empty_name(serving):
    server = serving([b"HTTP/1.1 200 OK\r\nX-Server: no\r\nContent-Length: 0\r\n\r\n"])
    assert _who_answers("127.0.0.1", server.port, 5.0) == ""


@pytest.mark.timeout(20)
def test_what_does_not_answer_http_is_none(serving):
    server = serving([b"SSH-2.0-OpenSSH_9.6\r\nInvalid SSH identification string.\r\n"])
    assert _who_answers("127.0.0.1", server.port, 5.0) is None
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    assert _who_answers("127.0.0.1", port, 5.0) is None  # nothing listens: refused


@pytest.mark.timeout(20)
def test_the_head_is_read_to_its_end_not_to_the_connections(serving):
    """A server that keeps the connection open after its head is not waited on."""
    server = serving([b"HTTP/1.1 200 OK\r\nServer: keeper\r\n\r\n"], hold=True)
    assert _who_answers("127.0.0.1", server.port, 5.0) == "keeper"


@pytest.mark.timeout(20)
def test_a_port_taken_on_the_address_given_is_asked_there(serving):
    """127.0.0.2 is this host's (the loopback is 127/8), and only the server there answers."""
    server = serving([b"HTTP/1.1 200 OK\r\nServer: there\r\n\r\n"], host="127.0.0.2")
    assert _who_answers("127.0.0.2", server.port, 5.0) == "there"
    server = serving([b"HTTP/1.1 200 OK\r\nServer: there\r\n\r\n"], host="127.0.0.2")
    assert probe_port(server.port, "127.0.0.2", 5.0) == PortFacts(
        server.port, "127.0.0.2", errno.EADDRINUSE, os.strerror(errno.EADDRINUSE), "there"
    )


def test_a_free_port_is_said_free_on_its_address():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    assert probe_port(port, "127.0.0.1", 5.0) == PortFacts(port, "127.0.0.1")


@pytest.mark.timeout(20)
def test_a_holder_that_takes_no_more_connections_is_given_up_on_at_the_timeout():
    """Its accept queue full, the kernel drops the doctor's SYN: the connect is bounded too."""
    with socket.create_server(("127.0.0.1", 0), backlog=0) as full:
        port = full.getsockname()[1]
        queued = []
        try:
            while True:  # each connect lands in the queue at once, until it is full
                try:
                    queued.append(socket.create_connection(("127.0.0.1", port), timeout=0.3))
                except TimeoutError:
                    break
            assert _who_answers("127.0.0.1", port, 0.5) is None
        finally:
            for sock in queued:
                sock.close()


@pytest.mark.timeout(20)
def test_a_head_cut_short_by_the_close_is_read_as_far_as_it_came(serving):
    server = serving([b"HTTP/1.0 200 OK\r\nServer: short\r\n"])
    assert _who_answers("127.0.0.1", server.port, 5.0) == "short"


@pytest.mark.timeout(20)
def test_no_more_than_a_head_s_worth_is_read(serving):
    """A head that never ends, held open: the doctor stops at its limit, not at the timeout."""
    start = b"HTTP/1.1 200 OK\r\nServer: endless\r\nX-Pad: "
    server = serving([start + b"a" * (HEAD_LIMIT - len(start))], hold=True)
    assert _who_answers("127.0.0.1", server.port, 10.0) == "endless"


@pytest.mark.timeout(20)
def test_a_holder_whose_head_never_ends_is_given_up_on_at_the_bound(serving):
    server = serving([b"HTTP/1.1 200 OK\r\nServer: slow\r\n"], hold=True)
    assert _who_answers("127.0.0.1", server.port, 0.5) is None
