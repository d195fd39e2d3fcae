"""HTTP at its edges: framing errors, HEAD, POST, the Server header, bounded logs, SIGHUP.

A real daemon on a loopback port, spoken to over raw sockets where the framing matters. The
framing tests pin which refusals the daemon answers in JSON (patroller/http/framing.py) and
which Tornado answers itself, before the daemon sees the request: a Tornado release that
changes one of them fails here.
"""

import asyncio
import json
import logging
import os
import signal
import socket
import tempfile
import threading
import time
import urllib.request

import pytest
import tornado.web
from helpers import FakeClock, ScenarioFile, ServerProcess, async_test, gpu_running, running, until

from patroller.config import Config
from patroller.core.errors import PatrollerError, Unavailable
from patroller.core.throttle import Throttle
from patroller.http.fastlane import Connection
from patroller.identify import resolver
from patroller.identify.sockets import SocketEntry, find_client_in_tables

Head = tuple[str, dict[str, str]]


async def read_answer(reader: asyncio.StreamReader, head_only: bool = False) -> tuple[Head, bytes]:
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


async def refused(h, data: bytes) -> tuple[Head, dict]:
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


ZERO = SocketEntry(("", 0), ("", 0), 0, 0, 0)  # no socket
BIG = 70 * 1024  # over Tornado's 64 KiB header limit
JSON_FRAMING = [  # refused by the daemon, in JSON
    (
        "content length",
        b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        400,
        "Content-Length",
    ),
    (
        "unequal content lengths",
        b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 2\r\n\r\nab",
        400,
        "Content-Length",
    ),
    (
        "repeated content length lines",
        b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        400,
        "Content-Length",
    ),
    (
        "content length not in ASCII digits",
        b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n",
        400,
        "Content-Length",
    ),
    (
        "content length of 5,000 digits",
        b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
        413,
        "over 10^14 bytes",
    ),
    (
        "body over the limit",
        b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"a" * 100000,
        413,
        "at most 65536",
    ),
    (
        "body over the limit on the fast lane",
        b"GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"a" * 100000,
        413,
        "at most 65536",
    ),
    (
        "chunked body over the limit",
        b"POST /release HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + (b"8000\r\n" + b"a" * 0x8000 + b"\r\n") * 3
        + b"0\r\n\r\n",
        413,
        "longer than 65536",
    ),
    (
        "one chunk announcing 2^248 bytes",
        b"POST /release HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"f" * 62
        + b"\r\n"
        + b"a" * 100000,
        413,
        "longer than 65536",
    ),
    (
        "both content length and chunked",
        b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
        b"\r\n\r\nabc",
        400,
        "both Transfer-Encoding and Content-Length",
    ),
    (
        "transfer encoding other than chunked",
        b"POST /release HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        400,
        "Transfer-Encoding 'gzip' is not taken",
    ),
    ("no Host header", b"GET /queue HTTP/1.1\r\n\r\n", 400, "Missing Host header"),
    (
        "two Host headers",
        b"GET /queue HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        400,
        "Multiple host headers",
    ),
]
PLAIN_FRAMING = [  # parsed by Tornado before the daemon sees a request: its bare 400
    ("request line", b"\x00\xff\r\n\r\n"),
    ("HTTP version", b"GET /status HTTP/2.0\r\nHost: x\r\n\r\n"),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
    ("header line", b"GET /status HTTP/1.1\r\nHost x\r\n\r\n"),
    (
        "bad chunk size",
        b"POST /release HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ),
]
UNANSWERED = [  # over Tornado's limits on what it reads before the daemon sees it: closed
    ("URL over 64 KiB", b"GET /status?" + b"a" * BIG + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    (
        "header block over 64 KiB",
        b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * BIG + b"\r\n\r\n",
    ),
    (
        "header block of 1 MiB",
        b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (1 << 20) + b"\r\n\r\n",
    ),
    (
        "chunk-size line over 64 bytes",
        b"POST /release HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"0" * 100
        + b"1\r\n",
    ),
]


@pytest.mark.parametrize(
    "data,status,words", [f[1:] for f in JSON_FRAMING], ids=[f[0] for f in JSON_FRAMING]
)
@async_test
async def test_framing_errors_get_a_json_answer_then_the_connection_closes(data, status, words):
    async with running() as h:
        (line, _), body = await refused(h, data)
        assert line.startswith(f"HTTP/1.1 {status} "), (line, body)
        assert words in body["error"]
        assert len(body["error"]) < 300  # what the client sent is not echoed whole
        assert len(await h.ok("/devices")) == 8  # and the daemon goes on


async def everything(h, data: bytes) -> bytes:
    """Send `data` on a fresh connection: all it gets before the connection ends."""
    reader, writer = await h.raw(data)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:  # closed with what the client sent still unread
        return b""
    finally:
        writer.close()


@pytest.mark.parametrize("data", [f[1] for f in PLAIN_FRAMING], ids=[f[0] for f in PLAIN_FRAMING])
@async_test
async def test_what_tornado_parses_first_gets_its_bare_400_then_the_connection_closes(data):
    async with running() as h:
        assert await everything(h, data) == b"HTTP/1.1 400 Bad Request\r\n\r\n"
        assert len(await h.ok("/devices")) == 8


@pytest.mark.parametrize("data", [f[1] for f in UNANSWERED], ids=[f[0] for f in UNANSWERED])
@async_test
async def test_what_is_over_tornados_read_limits_closes_the_connection_unanswered(data):
    async with running() as h:
        assert await everything(h, data) == b""
        assert len(await h.ok("/devices")) == 8


LINGERED = [  # refused with more of the body still coming than the daemon had read
    (
        "by its content length",
        b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"a" * 100000,
        "at most 65536 are taken",
    ),
    (
        "as its chunks arrive",
        b"POST /release HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + (b"8000\r\n" + b"a" * 0x8000 + b"\r\n") * 8
        + b"0\r\n\r\n",
        "longer than 65536 bytes",
    ),
]


@pytest.mark.parametrize("request_,words", [f[1:] for f in LINGERED], ids=[f[0] for f in LINGERED])
@async_test
async def test_a_refused_connection_ends_with_a_clean_close_not_a_reset(request_, words):
    """The lingering close: what the client still sends is read and dropped before the close.
    Closing with unread data makes the kernel send a reset instead, which can destroy an answer
    the client has not read yet (here the client waits until the daemon has closed its end,
    then reads, and looks whether a reset came)."""
    async with running(linger=0.3) as h:
        loop = asyncio.get_running_loop()
        with socket.create_connection(("127.0.0.1", h.port)) as client:
            ours, theirs = client.getsockname(), client.getpeername()
            await loop.run_in_executor(None, client.sendall, request_)
            # not a byte read until the daemon has closed its end (its socket is gone, or
            # has no file any more)
            await until(lambda: (find_client_in_tables(theirs, ours) or ZERO).inode == 0)
            client.settimeout(10)
            answer = b""
            while True:
                chunk = await loop.run_in_executor(None, client.recv, 65536)
                if not chunk:
                    break
                answer += chunk
            reset = client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # kept past the end
        assert answer.startswith(b"HTTP/1.1 413 ") and answer.endswith(words.encode() + b'"}')
        assert reset == 0, os.strerror(reset)  # the daemon closed with nothing left unread


@async_test
async def test_a_refused_head_request_gets_the_headers_without_the_body():
    async with running() as h:
        reader, writer = await h.raw(
            b"HEAD /status HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
        )
        (line, headers), _ = await read_answer(reader, head_only=True)
        assert line.startswith("HTTP/1.1 413 ") and int(headers["content-length"]) > 0
        assert await asyncio.wait_for(reader.read(), 10) == b""  # no body, then the end
        writer.close()


@async_test
async def test_the_body_limit_and_the_log_bound_are_the_configured_ones():
    volume = Volume()
    logger = logging.getLogger("patroller.access")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(volume)
    try:
        async with running(max_body=100, framing_reports=2, framing_window=60.0) as h:
            status, body = await h.call("/release", method="POST", body=b"uuid=" + b"a" * 95)
            assert status == 422 and "no device" in body["error"]  # 100 bytes are taken
            for size in (101, 102, 103):
                request = (
                    b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size
                    + b"a" * size
                )
                (line, _), body = await refused(h, request)
                assert line.startswith("HTTP/1.1 413 ")
                assert body["error"] == f"the request body is {size} bytes; at most 100 are taken"
    finally:
        logger.removeHandler(volume)
        logger.setLevel(level)
    assert [m[:4] for m in volume.messages].count("413 ") == 2  # the third one is held back


@async_test
async def test_an_idle_keep_alive_connection_ends_after_the_configured_idle_timeout():
    async with running(header_timeout=0.5) as h:
        reader, writer = await h.raw(b"GET /devices HTTP/1.1\r\nHost: x\r\n\r\n")
        (line, _), _ = await read_answer(reader)
        assert line == "HTTP/1.1 200 OK"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the daemon
        writer.close()


@async_test
async def test_stopping_the_server_stops_accepting_and_closing_ends_the_open_connections():
    async with running() as h:
        reader, writer = await h.raw(b"GET /devices HTTP/1.1\r\nHost: x\r\n\r\n")
        (line, _), _ = await read_answer(reader)
        assert line == "HTTP/1.1 200 OK"
        h.daemon.server.stop()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", h.port)
        writer.write(b"GET /devices HTTP/1.1\r\nHost: x\r\n\r\n")  # still served
        (line, _), _ = await read_answer(reader)
        assert line == "HTTP/1.1 200 OK"
        await asyncio.wait_for(h.daemon.server.close_all_connections(), 10)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()


def test_an_accepted_tcp_connection_keeps_tcp_nodelay_on():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()):
            accepted, _ = server.accept()

            async def check() -> None:
                stream = Connection(accepted)
                try:
                    assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                    stream.set_nodelay(False)  # as Tornado does after each answer
                    assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                finally:
                    stream.close()

            asyncio.run(check())


@async_test
async def test_a_body_that_trickles_in_is_refused_after_the_body_timeout():
    async with running(body_timeout=1.0) as h:
        reader, writer = await h.raw(
            b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        )
        answer = asyncio.ensure_future(read_answer(reader))
        sent = 0
        while not answer.done() and sent < 100:  # one byte each 0.1 s: 10 s to reach 100 of 1000
            writer.write(b"a")
            sent += 1
            await asyncio.sleep(0.1)
        (line, headers), body = await asyncio.wait_for(answer, 10)
        assert line.startswith("HTTP/1.1 408 ") and sent < 100
        assert json.loads(body) == {"error": "the request body did not arrive within 1s"}
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and the connection is closed
        writer.close()
        assert len(h.services.leases.waiters) == 0


@pytest.mark.parametrize(
    "path", ["/status", "/devices", "/", "/metrics", "/metrics.json", "/status?x=1"]
)
@async_test
async def test_head_is_answered_like_get_without_the_body(path):
    async with running() as h:
        reader, writer = await h.raw(
            f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"
            f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n"
            "GET /devices HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
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
        for path, method in (
            ("/status", "GET"),
            ("/devices", "HEAD"),
            ("/", "GET"),
            ("/request?gpu=1", "GET"),
            ("/nowhere", "GET"),
            ("/status", "PUT"),
        ):
            response = await h.http.fetch(
                h.url + path,
                method=method,
                raise_error=False,
                allow_nonstandard_methods=True,
                body=b"" if method == "PUT" else None,
            )
            assert response.headers["Server"] == "patroller", (path, method)
        (_, headers), _ = await refused(
            h, b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"
        )
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
        reader, writer = await h.raw(
            b"POST /release HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Encoding: " + b"z" * 60000 + b"\r\n\r\nuuid="
        )
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
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += 1
        self.bytes += len(record.getMessage())
        self.messages.append(record.getMessage())


@async_test
async def test_a_thousand_bad_requests_with_60_kB_queries_make_a_small_log():
    volume = Volume()
    logger = logging.getLogger("patroller")
    level = logger.level
    logger.setLevel(logging.INFO)  # as the daemon logs by default
    logger.addHandler(volume)
    try:
        # One window for the whole run, however long a busy machine makes it: the bound is
        # then on the lines, not on the lines per second the run happened to take.
        async with running(
            framing_window=3600.0, client_errors_window=3600.0, repeat_log_every=3600.0
        ) as h:
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
    print(
        f"1000 bad requests of 60 kB in {took:.1f} s: {volume.lines} log lines, "
        f"{volume.bytes} bytes of log"
    )
    assert volume.lines <= 25 and volume.bytes < 5000


@async_test
async def test_tornados_own_lines_about_bad_requests_are_bounded_and_cut():
    volume = Volume()
    logger = logging.getLogger("tornado.general")  # where Tornado logs what it refuses itself
    level = logger.level
    logger.setLevel(logging.INFO)  # as the daemon logs by default
    logger.addHandler(volume)
    try:
        async with running() as h:
            request = b"GET /status HTTP/" + b"x" * 60000 + b"\r\nHost: x\r\n\r\n"
            for _ in range(300):
                assert await everything(h, request) == b"HTTP/1.1 400 Bad Request\r\n\r\n"
    finally:
        logger.removeHandler(volume)
        logger.setLevel(level)
    print(f"300 bad request lines of 60 kB: {volume.lines} log lines, {volume.bytes} bytes of log")
    assert 0 < volume.lines <= 25 and volume.bytes < 25 * 300
    assert all("Malformed HTTP" in m for m in volume.messages), volume.messages[:3]


def test_the_throttle_lets_a_few_through_per_window_and_counts_the_rest():
    clock = FakeClock()
    throttle = Throttle(2, 10.0, clock)
    assert [throttle.admit() for _ in range(5)] == [
        (True, 0),
        (True, 0),
        (False, 0),
        (False, 0),
        (False, 0),
    ]
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
            assert (
                "8 devices: 2 reserved, 0 claimed, 0 shared, 6 free; 0 requests waiting"
                in server.log
            )
            with urllib.request.urlopen(server.url + "/status", timeout=10) as response:
                assert response.status == 200
            client = socket.socket(socket.AF_UNIX)
            client.connect(path)  # the socket file is still served
            client.close()
        finally:
            assert server.stop(signal.SIGTERM) == 0, server.log
        assert not os.path.exists(path)
        assert "Traceback" not in server.log


@pytest.mark.parametrize("chunked", [False, True], ids=["Content-Length", "chunked"])
@async_test
async def test_a_body_exactly_at_the_size_limit_is_taken_and_one_byte_more_is_not(chunked):
    limit = Config().max_body
    async with running() as h:
        for size, status in ((limit, 200), (limit + 1, 413)):
            form = b"a" * size  # not a form: the body is taken, not read as arguments
            if chunked:
                framing = (
                    b"Transfer-Encoding: chunked\r\n\r\n"
                    + b"".join(
                        b"%x\r\n%s\r\n" % (len(piece), piece)
                        for piece in (form[i : i + 20000] for i in range(0, size, 20000))
                    )
                    + b"0\r\n\r\n"
                )
            else:
                framing = b"Content-Length: %d\r\n\r\n" % size + form
            reader, writer = await h.raw(
                b"POST /release?user=alice HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/octet-stream\r\n" + framing
            )
            (line, _), body = await read_answer(reader)
            writer.close()
            assert line.startswith(f"HTTP/1.1 {status} "), (size, line, body)
            if status == 200:
                assert json.loads(body) == {
                    "released": [],
                    "after_exit": [],
                    "kept": [],
                    "holder": None,
                }


@async_test
async def test_a_request_whose_client_half_closes_is_answered_or_not_carried_out(tmp_path):
    # As `nc -N` and socat do: the request, then shutdown(SHUT_WR). In GPU host mode the caller
    # is looked up in /proc off the loop, long enough for the end of its input to arrive.
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}])
    path = str(tmp_path / "api.sock")
    async with gpu_running(scenario, socket=path) as h:
        for _ in range(4):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"GET /request?gpu=1 HTTP/1.1\r\nHost: x\r\n\r\n")
            writer.write_eof()
            answered = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            held = [d for d in h.uuids() if h.services.leases.holder(d) is not None]
            # Either the client read its grant, or nothing was reserved for it.
            assert answered.startswith(b"HTTP/1.1 200 ") or held == [], (answered, held)
            if held:
                h.services.leases.release(h.services.leases.holder(held[0]))


def held_lookups(monkeypatch):
    """The unix callers' /proc lookups (off the loop) wait until `release` is set; `entered` is
    set when one has begun."""
    entered, release = threading.Event(), threading.Event()
    read_peer_facts = resolver.read_peer_facts

    def held(*args):
        entered.set()
        release.wait(30)
        return read_peer_facts(*args)

    monkeypatch.setattr(resolver, "read_peer_facts", held)
    return entered, release


@async_test
async def test_a_stop_answers_the_request_whose_client_half_closed_while_its_caller_is_looked_up(
    tmp_path, monkeypatch
):
    # The race behind the test above's rare 500, held open: the client's connection is ended
    # at the end of its input while its caller is still looked up in /proc (off the loop). A
    # stop that waited for the connections alone returned with that request still handled, and
    # the end of the loop cancelled it: Tornado's 500. Held past the stop's grace, the request
    # is now cut short by the stop itself and counted 499 (its client left), before it returns.
    entered, release = held_lookups(monkeypatch)
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    path = str(tmp_path / "api.sock")
    try:
        async with gpu_running(scenario, socket=path, shutdown_grace=0.5) as h:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"GET /request?gpu=1 HTTP/1.1\r\nHost: x\r\n\r\n")
            writer.write_eof()
            # Tornado ends the connection at the end of its input; the request is still handled
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            await until(entered.is_set)
            await until(lambda: len(h.api.inflight.tasks) == 1)
            assert not h.api.requests.answers
        answers = dict(h.api.requests.answers)
    finally:
        release.set()
    assert answers == {("/request", 499): 1}, answers
    assert all(h.services.leases.holder(d) is None for d in h.uuids())


@async_test
async def test_a_request_the_stop_cuts_short_is_answered_503_not_500(tmp_path, monkeypatch):
    # No grace at all: the stop closes no connection in time, and cancels the request still
    # handled (its caller's lookup held); its client, still connected, reads that the server
    # is shutting down, not Tornado's 500 for a cancelled handler.
    entered, release = held_lookups(monkeypatch)
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    path = str(tmp_path / "api.sock")
    try:
        async with gpu_running(scenario, socket=path, shutdown_grace=0.0) as h:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"GET /request?gpu=1 HTTP/1.1\r\nHost: x\r\n\r\n")
            await until(entered.is_set)
            await until(lambda: len(h.api.inflight.tasks) == 1)
        (status, _), body = await read_answer(reader)
        writer.close()
    finally:
        release.set()
    assert status.startswith("HTTP/1.1 503 "), (status, body)
    assert json.loads(body)["error"] == "the server is shutting down"
    assert dict(h.api.requests.answers) == {("/request", 503): 1}


@pytest.mark.errors_expected
@async_test
async def test_an_unexpected_5xx_from_an_error_the_daemon_raises_is_logged_with_its_traceback(
    monkeypatch, caplog
):
    # A domain error with no status of its own, or an HTTP error of 5xx other than 503, is a
    # fault of ours: logged with where it came from, not only as the access log's status. An
    # expected 503 (a part down, or the stop) adds no traceback.
    raised: list[Exception] = []

    def request(*args, **kwargs):
        raise raised[-1]

    async with running(repeat_log_every=1e-6) as h:  # each traceback, not one a minute
        monkeypatch.setattr(h.services.leases, "request", request)
        for error, status in [
            (PatrollerError("no status for this one"), 500),
            (tornado.web.HTTPError(502, "upstream broke"), 502),
            (Unavailable("a part is down"), 503),
        ]:
            raised.append(error)
            caplog.clear()
            assert (await h.call("/request?gpu=1"))[0] == status
            traced = [r for r in caplog.records if r.exc_info is not None]
            if status == 503:
                assert traced == [], [r.getMessage() for r in traced]
            else:
                assert [(r.levelno, r.exc_info[1]) for r in traced] == [(logging.ERROR, error)]
