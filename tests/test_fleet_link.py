"""One fleet host's connection (http/fleetlink.Link) against scripted hosts on loopback: what
it sends, what it hands back, when it keeps the connection and when it opens another, and what
it raises for a host that is silent, refuses, or stops halfway, each as the fleet view says it.
The hosts are asyncio servers that answer each request with the next of their scripted answers
and record every connection and request; no daemon, so each asking is milliseconds."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from helpers import async_test
from test_fleet_polling import unconnectable
from tornado.iostream import StreamClosedError
from tornado.tcpclient import TCPClient

from patroller.http.fleetlink import Cut, Link, Reply, Silent

HANG = b""  # an answer that never comes (the host holds the connection open till the link ends it)


class Host:
    """A fleet host on a loopback port: each request is answered with the next of `answers`
    (raw bytes; HANG: none, the connection held open), after which the connection is kept, or
    closed by the host where `closes` says so (by the answer's index). Records each connection
    and the head of each request."""

    def __init__(self, *answers: bytes, closes: tuple[int, ...] = (), address: str = "127.0.0.1"):
        self.answers = list(answers)
        self.closes = closes
        self.address = address
        self.connections = 0
        self.heads: list[list[str]] = []
        self.server: asyncio.AbstractServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while len(self.heads) < len(self.answers):
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                self.heads.append(head.split("\r\n")[:-2])
                answer = self.answers[len(self.heads) - 1]
                if answer == HANG:
                    await reader.read()  # until the link closes it
                    break
                writer.write(answer)
                await writer.drain()
                if len(self.heads) - 1 in self.closes:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def hosting(host: Host, max_bytes: int = 1 << 20) -> AsyncIterator[Link]:
    host.server = await asyncio.start_server(host.serve, host.address, 0)
    tcp = TCPClient()
    link = Link(host.url, tcp, 5.0, 3.0, max_bytes, "patroller/9.9")
    try:
        yield link
    finally:
        link.close()
        tcp.close()
        host.server.close()


async def ask(link: Link, path: str = "/status", headers: dict[str, str] | None = None) -> Reply:
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(link.get(path, loop.time() + 3.0, headers), 10)


def answer(body: bytes, *headers: str, status: str = "HTTP/1.1 200 OK") -> bytes:
    head = "".join(f"{line}\r\n" for line in (status, *headers))
    return (head + "\r\n").encode() + body


def sized(body: bytes, *headers: str) -> bytes:
    return answer(body, *headers, f"Content-Length: {len(body)}")


@async_test
async def test_the_request_names_the_host_and_asks_for_json_and_the_reply_is_whole():
    host = Host(sized(b'{"a": 1}', "X-Devices-ETag: 7"), sized(b"{}"))
    async with hosting(host) as link:
        reply = await ask(link, "/devices", {"If-None-Match": '"7"'})
        assert reply.code == 200
        assert reply.headers["X-Devices-ETag"] == "7"
        assert reply.body == b'{"a": 1}'
        reply = await ask(link)  # the caller's own field was for that request alone
        assert (reply.code, reply.body) == (200, b"{}")
        netloc = f"127.0.0.1:{host.port}"
    assert host.heads == [
        [
            "GET /devices HTTP/1.1",
            f"Host: {netloc}",
            "Accept: application/json",
            "User-Agent: patroller/9.9",
            'If-None-Match: "7"',
        ],
        [
            "GET /status HTTP/1.1",
            f"Host: {netloc}",
            "Accept: application/json",
            "User-Agent: patroller/9.9",
        ],
    ]


@async_test
async def test_the_host_asked_is_the_one_the_url_names():
    """On 127.0.0.2, where nothing listens on 127.0.0.1's port: a link that asked the
    loopback's default address instead would be refused."""
    host = Host(sized(b"{}"), address="127.0.0.2")
    async with hosting(host) as link:
        assert (await ask(link)).body == b"{}"
    assert host.connections == 1


@async_test
async def test_one_connection_carries_every_request_and_a_closed_link_opens_another():
    host = Host(sized(b"1"), answer(b"2\r\n", "Transfer-Encoding: chunked"), sized(b"3"))
    host.answers[1] = answer(b"1\r\na\r\n2\r\nbc\r\n0\r\n\r\n", "Transfer-Encoding: chunked")
    async with hosting(host) as link:
        assert (await ask(link)).body == b"1"
        assert (await ask(link)).body == b"abc"  # chunked, read whole
        assert (host.connections, link.opened) == (1, 1)
        link.close()
        assert (await ask(link)).body == b"3"
        assert (host.connections, link.opened) == (2, 2)


@async_test
async def test_an_answer_that_ends_the_connection_is_read_and_the_next_goes_on_a_new_one():
    for ending in (
        answer(b"12", "Content-Length: 2", status="HTTP/1.0 200 OK"),
        answer(b"12", "Content-Length: 2", "Connection: close"),
        answer(b"12"),  # no length: the body ends with the connection
    ):
        host = Host(ending, sized(b"3"), closes=(0,))
        async with hosting(host) as link:
            assert (await ask(link)).body == b"12"
            assert (await ask(link)).body == b"3"
            assert (host.connections, link.opened) == (2, 2), ending


@async_test
async def test_a_kept_connection_the_host_closed_while_idle_is_asked_again_on_a_new_one():
    host = Host(sized(b"1"), sized(b"2"), closes=(0,))  # closed after a keep-alive answer
    async with hosting(host) as link:
        assert (await ask(link)).body == b"1"
        # the link reads nothing while idle: it learns of the close by asking
        reply = await ask(link, "/devices", {"If-None-Match": '"7"'})
        assert reply.body == b"2"
        assert link.opened == 2
    assert host.connections == 2
    assert [head[0] for head in host.heads] == ["GET /status HTTP/1.1", "GET /devices HTTP/1.1"]
    assert host.heads[1][-1] == 'If-None-Match: "7"'  # the same request, asked again whole


@async_test
async def test_a_new_connection_closed_without_an_answer_is_not_asked_again():
    host = Host(HANG, HANG)
    host.answers = []  # closes every connection at once, unanswered
    async with hosting(host) as link:
        with pytest.raises(StreamClosedError):
            await ask(link)
    assert host.connections == 1


@async_test
async def test_an_answer_cut_short_is_a_cut_with_its_head_and_the_connection_dropped():
    host = Host(answer(b"12", "Content-Length: 10"), sized(b"3"), closes=(0,))
    async with hosting(host) as link:
        with pytest.raises(Cut) as cut:
            await ask(link)
        assert cut.value.head == ["HTTP/1.1 200 OK\r\n", "Content-Length: 10\r\n", "\r\n"]
        assert str(cut.value) == "the connection closed before the answer ended"
        assert (await ask(link)).body == b"3"
    assert host.connections == 2


@async_test
async def test_a_body_of_the_bound_is_whole_and_one_byte_more_is_cut():
    for body in (b"x" * 100, b"y" * 101):
        for ending in (sized(body), answer(body, "Connection: close")):
            host = Host(ending, closes=(0,))
            async with hosting(host, max_bytes=100) as link:
                if len(body) == 100:
                    assert (await ask(link)).body == body
                else:
                    with pytest.raises(Cut) as cut:
                        await ask(link)
                    assert cut.value.head[0] == "HTTP/1.1 200 OK\r\n"


@async_test
async def test_a_body_longer_than_one_read_is_handed_over_whole():
    body = bytes(range(256)) * 300  # 76,800 bytes: Tornado hands them over 64 KiB at a time
    for ending in (sized(body), answer(body, "Connection: close")):
        async with hosting(Host(ending, closes=(0,))) as link:
            assert (await ask(link)).body == body


@async_test
async def test_a_compressed_body_is_handed_over_as_it_came():
    packed = gzip.compress(b'{"gpus": []}')
    host = Host(sized(packed, "Content-Encoding: gzip"))
    async with hosting(host) as link:
        reply = await ask(link)
    assert reply.body == packed
    assert reply.headers["Content-Encoding"] == "gzip"


@async_test
async def test_a_host_that_does_not_answer_in_time_is_silent_and_its_connection_dropped():
    host = Host(HANG, sized(b"2"))
    async with hosting(host) as link:
        loop = asyncio.get_running_loop()
        with pytest.raises(Silent) as silent:
            await asyncio.wait_for(link.get("/status", loop.time() + 0.2), 10)
        assert str(silent.value) == "no answer within 3s"  # the caller's timeout, said
        assert link.stream is None
        assert (await ask(link)).body == b"2"  # the next asking is on time, on a new one
    assert host.connections == 2


@async_test
async def test_a_host_that_does_not_connect_is_silent_saying_which_timeout_passed():
    listener, filling = unconnectable()
    tcp = TCPClient()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    link = Link(url, tcp, 0.2, 3.0, 1 << 20, "t")
    loop = asyncio.get_running_loop()
    try:
        with pytest.raises(Silent) as silent:  # the connect timeout first
            await asyncio.wait_for(link.get("/status", loop.time() + 5.0), 10)
        assert str(silent.value) == "no connection within 0.2s"
        # the answer's deadline first: given up at it, not at the connect timeout (60 s, past
        # the bound of the test's own wait)
        link.connect_timeout = 60.0
        with pytest.raises(Silent) as silent:
            await asyncio.wait_for(link.get("/status", loop.time() + 0.2), 10)
        assert str(silent.value) == "no answer within 3s"
        assert link.opened == 0
    finally:
        link.close()
        tcp.close()
        listener.close()
        for sock in filling:
            sock.close()


@async_test
async def test_a_refused_connection_is_the_systems_error():
    free = socket.socket()
    free.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused
    tcp = TCPClient()
    link = Link(f"http://127.0.0.1:{free.getsockname()[1]}", tcp, 5.0, 3.0, 1 << 20, "t")
    try:
        with pytest.raises(ConnectionRefusedError):
            await ask(link)
    finally:
        link.close()
        tcp.close()
        free.close()


@async_test
async def test_an_https_host_is_spoken_to_in_tls_and_an_http_one_in_the_clear():
    first: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first.append(await reader.read(3))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tcp = TCPClient()
    try:
        for scheme in ("https", "http"):
            link = Link(f"{scheme}://127.0.0.1:{port}", tcp, 5.0, 3.0, 1 << 20, "t")
            with pytest.raises((OSError, StreamClosedError)):  # the host hung up
                await ask(link)
            link.close()
    finally:
        tcp.close()
        server.close()
    assert first[0][:2] == b"\x16\x03"  # a TLS handshake record
    assert first[1] == b"GET"
