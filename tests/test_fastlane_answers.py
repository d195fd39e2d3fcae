"""The fast lane's answers to the heads it takes, byte for byte (the status line, the headers a
handler would send, `Connection: close` only when asked, the length), what it counts, when it
builds an answer again (a new body or new header lines, never a stale one), and a connection
that reads heads through it over a real socket pair: the heads it answers are written to the
peer and the next one is handed on, a head asking to close ends the connection after its
answer, and Tornado's bound on a head is kept with the lane and without it. Pure but for the
socket pair; tests/test_views.py has which heads it takes."""

from __future__ import annotations

import asyncio
import socket

import pytest
from helpers import async_test
from tornado.iostream import StreamClosedError, UnsatisfiableReadError

from patroller.http.fastlane import HEAD_END, Connection, FastLane

STATUS = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n"
DEVICES = b"GET /devices HTTP/1.1\r\nHost: x\r\n\r\n"
CLOSING = b"GET /status HTTP/1.1\r\nHost: x\r\nConnection:  Close \r\n\r\n"
KEEPING = b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: Keep-Alive\r\n\r\n"
HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=UTF-8\r\n"
    b"Cache-Control: no-store\r\nServer: patroller\r\n"
)


class Routes:
    """The bodies and header lines a lane answers with, changed by the test as the views' caches
    change: the same object while nothing changed."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes | None] = {"/status": b'{"a": 1}', "/devices": b"[]"}
        self.tag = b"X-Devices-ETag: 7\r\n"
        self.counted: list[tuple[str, int]] = []

    def lane(self, hand_back_after: float = 60.0) -> FastLane:
        return FastLane(
            {path: (lambda c, path=path: self.bodies[path]) for path in self.bodies},
            lambda path, status: self.counted.append((path, status)),
            hand_back_after,
            {"/status": lambda: self.tag},
        )


def test_each_answer_is_what_a_handler_sends_closing_only_when_asked():
    routes = Routes()
    lane = routes.lane()
    kept = HEAD + b"X-Devices-ETag: 7\r\nContent-Length: 8\r\n\r\n" + b'{"a": 1}'
    assert lane.answer(STATUS) == (kept, False)
    assert lane.answer(KEEPING) == (kept, False)
    closing = HEAD + b"X-Devices-ETag: 7\r\nConnection: close\r\nContent-Length: 8\r\n\r\n"
    assert lane.answer(CLOSING) == (closing + b'{"a": 1}', True)
    # a path without header lines of its own has none
    assert lane.answer(DEVICES) == (HEAD + b"Content-Length: 2\r\n\r\n[]", False)
    assert routes.counted == [("/status", 200)] * 3 + [("/devices", 200)]
    bare = FastLane({"/status": lambda c: b"{}"}, lambda path, status: None, 60.0)
    assert bare.answer(STATUS) == (HEAD + b"Content-Length: 2\r\n\r\n{}", False)


def test_a_head_asked_again_is_answered_again_with_what_changed_since():
    routes = Routes()
    lane = routes.lane()
    first = lane.answer(STATUS)
    again = lane.answer(STATUS)
    # remembered whole while nothing changed: the same bytes, not built again for each poll
    assert first is not None and again is not None and again[0] is first[0]
    routes.bodies["/status"] = b'{"a": 22}'  # a new body, the same header lines
    answered = lane.answer(STATUS)
    assert answered is not None and answered[0].endswith(b'Content-Length: 9\r\n\r\n{"a": 22}')
    routes.tag = b"X-Devices-ETag: 8\r\n"  # new header lines, the same body
    answered = lane.answer(STATUS)
    assert answered is not None and b"X-Devices-ETag: 8\r\n" in answered[0]
    assert b"X-Devices-ETag: 7" not in answered[0]
    assert len(routes.counted) == 4


def test_a_route_decides_by_the_connection_it_is_asked_on():
    known = object()
    lane = FastLane(
        {"/status": lambda connection: b"{}" if connection is known else None},
        lambda path, status: None,
        60.0,
    )
    assert lane.answer(STATUS, object()) is None  # its answer depends on who asks
    assert lane.answer(STATUS, known) == (HEAD + b"Content-Length: 2\r\n\r\n{}", False)


def test_a_route_that_declines_or_a_head_that_is_not_plain_goes_to_tornado_uncounted():
    routes = Routes()
    routes.bodies["/status"] = None  # the answer depends on who asks
    lane = routes.lane()
    assert lane.answer(STATUS) is None
    for head in (
        b"GET /devices HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b'GET /devices HTTP/1.1\r\nHost: x\r\nIf-None-Match: "7"\r\n\r\n',
        b"GET /devices HTTP/1.1\r\nHost: x\r\nNo Colon\r\n\r\n",
        b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n",  # no route of the lane's
        b"GET /devices?x=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /devices HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\n\r\n",
    ):
        assert lane.answer(head) is None, head
    assert routes.counted == []


async def pair(lane: FastLane | None) -> tuple[Connection, socket.socket]:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    return Connection(ours, lane), theirs


async def received(theirs: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < size:
        chunk = await asyncio.wait_for(loop.sock_recv(theirs, size - len(data)), 5)
        if not chunk:
            break
        data += chunk
    return data


@async_test
async def test_the_heads_the_lane_answers_are_written_and_the_next_one_handed_on():
    routes = Routes()
    connection, theirs = await pair(routes.lane())
    other = b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n"
    theirs.send(DEVICES + DEVICES + other)
    try:
        head = await asyncio.wait_for(connection.read_until_regex(HEAD_END, 1024), 5)
        assert head == other
        answer = HEAD + b"Content-Length: 2\r\n\r\n[]"
        assert await received(theirs, 2 * len(answer)) == answer * 2
    finally:
        connection.close()
        theirs.close()


@async_test
async def test_answers_the_socket_cannot_take_at_once_are_queued_whole_and_in_order():
    """Answers larger than the socket's buffer while the peer reads nothing: the first goes
    partly to the socket and the rest through the stream, the next all through the stream
    behind it; the route is asked with the connection itself."""
    big = [bytes([65 + n]) * (1 << 20) for n in range(2)]
    asked = []

    def route(connection: object) -> bytes:
        asked.append(connection)
        return big[len(asked) - 1]

    lane = FastLane({"/status": route}, lambda path, status: None, 60.0)
    connection, theirs = await pair(lane)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    other = b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n"
    theirs.send(STATUS + STATUS + other)
    try:
        head = await asyncio.wait_for(connection.read_until_regex(HEAD_END, 1024), 5)
        assert head == other and asked == [connection, connection]
        answers = [HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body for body in big]
        assert await received(theirs, sum(map(len, answers))) == b"".join(answers)
    finally:
        connection.close()
        theirs.close()


@async_test
async def test_a_head_asking_to_close_ends_the_connection_after_its_answer():
    routes = Routes()
    connection, theirs = await pair(routes.lane())
    told = []
    connection.on_close = lambda: told.append(True)
    theirs.send(CLOSING)
    try:
        with pytest.raises(StreamClosedError):
            await asyncio.wait_for(connection.read_until_regex(HEAD_END, 1024), 5)
        answer = await received(theirs, 4096)
        assert answer.startswith(HEAD) and answer.endswith(
            b'Connection: close\r\nContent-Length: 8\r\n\r\n{"a": 1}'
        )
        assert connection.closed() and told == [True]
        connection.close()
        assert told == [True]  # told once
    finally:
        theirs.close()


@async_test
async def test_a_connection_served_here_long_enough_hands_its_next_head_to_tornado():
    routes = Routes()
    connection, theirs = await pair(routes.lane(hand_back_after=-1.0))
    theirs.send(STATUS)
    try:
        assert await asyncio.wait_for(connection.read_until_regex(HEAD_END, 1024), 5) == STATUS
        assert routes.counted == []
    finally:
        connection.close()
        theirs.close()


@pytest.mark.parametrize("lane", [True, False])
@async_test
async def test_a_head_over_the_bound_is_refused_with_the_lane_or_without(lane):
    connection, theirs = await pair(Routes().lane() if lane else None)
    theirs.send(b"GET /status HTTP/1.1\r\nHost: " + b"x" * 200)
    try:
        with pytest.raises((UnsatisfiableReadError, StreamClosedError)):
            await asyncio.wait_for(connection.read_until_regex(HEAD_END, 64), 5)
    finally:
        connection.close()
        theirs.close()


@async_test
async def test_another_pattern_is_read_as_tornado_reads_it_bounded_too():
    connection, theirs = await pair(Routes().lane())
    theirs.send(b"GET /status HTTP/1.1\r\n")
    try:
        line = await asyncio.wait_for(connection.read_until_regex(b"\r\n", 64), 5)
        assert line == b"GET /status HTTP/1.1\r\n"  # not taken by the lane: a line, not a head
        theirs.send(b"y" * 200)
        with pytest.raises((UnsatisfiableReadError, StreamClosedError)):
            await asyncio.wait_for(connection.read_until_regex(b"\r\n", 64), 5)
    finally:
        connection.close()
        theirs.close()
