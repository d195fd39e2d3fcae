"""HTTP at its edges: framing errors in JSON, HEAD, POST, the Server header, bounded logs, SIGHUP.

A real daemon on a loopback port, spoken to over raw sockets where the framing matters. The
framing tests also pin the Tornado behaviour that patroller/framing.py replaces: an upgrade that
changes it fails here.
"""
import asyncio
import hashlib
import inspect
import json
import logging
import os
import signal
import socket
import tempfile
import time
import urllib.request
from typing import Dict, Tuple

import pytest
import tornado
from tornado.http1connection import HTTP1ServerConnection
from tornado.httpserver import HTTPServer
from tornado.tcpserver import TCPServer

from helpers import FakeClock, ServerProcess, async_test, running
from patroller.core.throttle import Throttle

Head = Tuple[str, Dict[str, str]]


async def read_answer(reader: asyncio.StreamReader, head_only: bool = False) -> Tuple[Head, bytes]:
    """One HTTP answer: (status line, headers), and the body its Content-Length announces."""
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = 0 if head_only else int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), 10)
    return (lines[0], headers), body


async def refused(h, data: bytes) -> Tuple[Head, dict]:
    """Send `data` on a fresh connection: the answer, which must be JSON and end the connection."""
    reader, writer = await h.raw(data)
    try:
        (status, headers), body = await read_answer(reader)
        assert await asyncio.wait_for(reader.read(), 10) == b"", "the connection stayed open"
    finally:
        writer.close()
    assert headers["content-type"].startswith("application/json")
    assert headers["connection"] == "close" and headers["server"] == "patroller"
    return (status, headers), json.loads(body)


BIG = 70 * 1024  # over Tornado's 64 KiB header limit
FRAMING = [
    ("request line", b"\x00\xff\r\n\r\n", 400, "malformed request"),
    ("HTTP version", b"GET /status HTTP/2.0\r\nHost: x\r\n\r\n", 400, "HTTP version"),
    ("header line", b"GET /status HTTP/1.1\r\nHost x\r\n\r\n", 400, "malformed request"),
    ("content length", b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400,
     "Content-Length"),
    ("unequal content lengths",
     b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 2\r\n\r\nab", 400, "Content-Length"),
    ("content length not in ASCII digits",
     b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n", 400, "Content-Length"),
    ("content length of 5,000 digits",
     b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", 413,
     "over 10^14 bytes"),
    ("body over the limit",
     b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"a" * 100000, 413,
     "at most 65536"),
    ("chunked body over the limit",
     b"POST /release HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + (b"8000\r\n" + b"a" * 0x8000 + b"\r\n") * 3 + b"0\r\n\r\n", 413, "longer than 65536"),
    ("bad chunk size",
     b"POST /release HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
     "chunk size"),
    ("URL over 64 KiB", b"GET /status?" + b"a" * BIG + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
     "request line is longer than 65536 bytes"),
    ("header block over 64 KiB", b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * BIG
     + b"\r\n\r\n", 431, "header block is longer than 65536 bytes"),
    ("header block of 1 MiB", b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (1 << 20)
     + b"\r\n\r\n", 431, "header block"),
]


@pytest.mark.parametrize("data,status,words", [f[1:] for f in FRAMING], ids=[f[0] for f in FRAMING])
@async_test
async def test_framing_errors_get_a_json_answer_then_the_connection_closes(data, status, words):
    async with running() as h:
        (line, _), body = await refused(h, data)
        assert line.startswith(f"HTTP/1.1 {status} "), (line, body)
        assert words in body["error"]
        assert len(body["error"]) < 300  # what the client sent is not echoed whole
        assert len(await h.ok("/devices")) == 8  # and the daemon goes on


# What framing.py and listeners.py replace, as found in the installed Tornado. A new Tornado
# that changes one of them fails here: compare it with our version, then update the digest.
REPLACED = {
    "HTTP1ServerConnection._server_request_loop": (HTTP1ServerConnection._server_request_loop,
                                                   "framing.FramedServerConnection"),
    "HTTPServer.handle_stream": (HTTPServer.handle_stream, "listeners.PeerServer.handle_stream"),
    "TCPServer.add_sockets": (TCPServer.add_sockets, "listeners.PeerServer.add_sockets"),
}
DIGESTS = {  # by Tornado release: the ones requirements.txt admits
    "6.5": {
        "HTTP1ServerConnection._server_request_loop": "3d66d7a731fbc3c3",
        "HTTPServer.handle_stream": "cfee5acf32843e5c",
        "TCPServer.add_sockets": "4cc159003c60dd83",
    },
    "6.6": {
        "HTTP1ServerConnection._server_request_loop": "878caf064d85d615",
        "HTTPServer.handle_stream": "164864e68f57d899",
        "TCPServer.add_sockets": "4cc159003c60dd83",
    },
}


@pytest.mark.parametrize("name", sorted(REPLACED))
def test_the_tornado_code_we_replace_is_the_code_we_copied(name):
    function, ours = REPLACED[name]
    digest = hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
    release = ".".join(tornado.version.split(".")[:2])
    assert release in DIGESTS, f"Tornado {tornado.version} is not one requirements.txt admits"
    assert digest == DIGESTS[release][name], f"Tornado's {name} changed: check patroller/{ours} against it"


@async_test
async def test_a_body_that_trickles_in_is_refused_after_the_body_timeout():
    async with running(body_timeout=1.0) as h:
        reader, writer = await h.raw(b"POST /release HTTP/1.1\r\nHost: x\r\n"
                                     b"Content-Length: 1000\r\n\r\n")
        answer = asyncio.ensure_future(read_answer(reader))
        sent = 0
        while not answer.done() and sent < 100:  # one byte each 0.1 s: 10 s to reach 100 of 1000
            writer.write(b"a")
            sent += 1
            await asyncio.sleep(0.1)
        (line, headers), body = await asyncio.wait_for(answer, 10)
        assert line.startswith("HTTP/1.1 408 ") and sent < 100
        assert json.loads(body) == {"error": "the request body did not arrive within 1 s"}
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and the connection is closed
        writer.close()
        assert len(h.services.leases.waiters) == 0


@pytest.mark.parametrize("path", ["/status", "/devices", "/", "/metrics", "/metrics.json",
                                  "/status?x=1"])
@async_test
async def test_head_is_answered_like_get_without_the_body(path):
    async with running() as h:
        reader, writer = await h.raw(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"
                                     f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n"
                                     "GET /devices HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        (got, got_headers), got_body = await read_answer(reader)
        (head, head_headers), nothing = await read_answer(reader, head_only=True)
        # had HEAD sent a body, it would be read here in place of the next answer's status line
        (after, _), after_body = await read_answer(reader)
        writer.close()
        assert got == head == after == "HTTP/1.1 200 OK"
        assert int(head_headers["content-length"]) > 0
        if not path.startswith("/metrics"):  # its figures may change the length between answers
            assert int(head_headers["content-length"]) == len(got_body)
        assert head_headers["content-type"] == got_headers["content-type"]
        assert json.loads(after_body) and nothing == b""


@async_test
async def test_head_is_not_taken_where_get_changes_state():
    async with running() as h:
        for path in ("/request?gpu=1", "/wait?gpu=1", "/release"):
            response = await h.http.fetch(h.url + path, method="HEAD", raise_error=False)
            assert response.code == 405 and response.headers["Allow"].startswith("GET, POST")
        assert {e["claim"]["state"] for e in (await h.ok("/status")).values()} == {"free"}


@async_test
async def test_request_and_wait_take_post_with_a_form_body():
    async with running() as h:
        status, body = await h.call("/request", method="POST", body=b"gpu=2&user=alice")
        assert status == 200 and len(body) == 2
        status, body = await h.call("/wait", method="POST", body=b"gpu=1&timeout=5&user=bob")
        assert status == 200 and len(body) == 1
        status, body = await h.call("/devices", method="POST", body=b"")
        assert status == 405 and body["allowed"] == ["GET", "HEAD"]
        status, body = await h.call("/request", method="PUT", body=b"")
        assert status == 405 and body["allowed"] == ["GET", "POST"]


@async_test
async def test_every_answer_says_server_patroller_and_no_framework_version():
    async with running() as h:
        for path, method in (("/status", "GET"), ("/devices", "HEAD"), ("/", "GET"),
                             ("/request?gpu=1", "GET"), ("/nowhere", "GET"), ("/status", "PUT")):
            response = await h.http.fetch(h.url + path, method=method, raise_error=False,
                                          allow_nonstandard_methods=True,
                                          body=b"" if method == "PUT" else None)
            assert response.headers["Server"] == "patroller", (path, method)
        (_, headers), _ = await refused(h, b"\x00\r\n\r\n")
        assert headers["server"] == "patroller"


@async_test
async def test_a_405_shows_the_method_cut_and_printable():
    async with running() as h:
        status, body = await h.call("/status", method="X" * 5000, body=b"")
        assert status == 405
        assert body["error"] == "XXXXXXXXXXXXXXXXXXXX... is not allowed on /status"


@async_test
async def test_a_bad_form_body_is_a_400_that_does_not_echo_it_whole():
    async with running() as h:
        reader, writer = await h.raw(b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                     b"Content-Type: application/x-www-form-urlencoded\r\n"
                                     b"Content-Encoding: " + b"z" * 60000 + b"\r\n\r\nuuid=")
        (line, _), body = await read_answer(reader)
        writer.close()
        assert line.startswith("HTTP/1.1 400 ")
        error = json.loads(body)["error"]
        assert error.startswith("Invalid body: Unsupported Content-Encoding: zzz")
        assert len(error) <= 303


@async_test
async def test_the_404_hint_names_every_endpoint():
    async with running() as h:
        status, body = await h.call("/gpus")
        assert status == 404
        for rule in h.api.app.wildcard_router.rules:
            pattern = rule.matcher.regex.pattern.rstrip("$")
            path = pattern.split("(")[0] + "<file>" if "(" in pattern else rule.matcher.reverse()
            assert path == "/" or path in body["error"]
        assert "/metrics" in body["error"]


class Volume(logging.Handler):
    """Counts the lines and bytes logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines = 0
        self.bytes = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += 1
        self.bytes += len(record.getMessage())


@async_test
async def test_a_thousand_bad_requests_with_60_kB_queries_make_a_small_log():
    volume = Volume()
    logger = logging.getLogger("patroller")
    level = logger.level
    logger.setLevel(logging.INFO)  # as the daemon logs by default
    logger.addHandler(volume)
    try:
        async with running() as h:
            request = b"GET /request?gpu=1&pad=" + b"x" * 60000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
            reader, writer = await h.raw(b"")
            started = time.monotonic()
            for _ in range(1000):
                writer.write(request)
                (line, _), body = await read_answer(reader)
                assert line.startswith("HTTP/1.1 400 ") and b"too long" in body
            took = time.monotonic() - started
            writer.close()
    finally:
        logger.removeHandler(volume)
        logger.setLevel(level)
    print(f"1000 bad requests of 60 kB in {took:.1f} s: {volume.lines} log lines, "
          f"{volume.bytes} bytes of log")
    assert volume.lines <= 25 and volume.bytes < 5000


def test_the_throttle_lets_a_few_through_per_window_and_counts_the_rest():
    clock = FakeClock()
    throttle = Throttle(2, 10.0, clock)
    assert [throttle.admit() for _ in range(5)] == [(True, 0), (True, 0), (False, 0), (False, 0),
                                                    (False, 0)]
    clock.advance(9.9)
    assert throttle.admit() == (False, 0)
    clock.advance(0.1)
    assert throttle.admit() == (True, 4)  # the first line of a new window tells the count
    assert throttle.admit() == (True, 0)
    clock.advance(60)
    assert throttle.admit() == (True, 0)


def test_sighup_logs_the_state_and_keeps_serving_then_sigterm_stops_cleanly():
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "api.sock")
        server = ServerProcess("--test", "--socket", path).start()
        try:
            with urllib.request.urlopen(server.url + "/request?gpu=2", timeout=10) as response:
                assert response.status == 200
            server.process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while "SIGHUP" not in server.log:
                assert time.monotonic() < deadline, server.log
                time.sleep(0.05)
            assert ("8 devices: 2 reserved, 0 claimed, 0 shared, 6 free; 0 requests waiting"
                    in server.log)
            with urllib.request.urlopen(server.url + "/status", timeout=10) as response:
                assert response.status == 200
            client = socket.socket(socket.AF_UNIX)
            client.connect(path)  # the socket file is still served
            client.close()
        finally:
            assert server.stop(signal.SIGTERM) == 0, server.log
        assert not os.path.exists(path)
        assert "Traceback" not in server.log
