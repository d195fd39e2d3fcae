"""Fleet hosts that lie: a real HTTP server on a loopback port (the standard library's, in a
thread) that answers /status and /devices with what a test hands it, to run the attacks one fleet
host can make on the fleet view (tests/test_fleet_lying.py).

`hostile()` builds each attack from a real daemon's own answers with one thing changed, so the
rest of each answer is what Patroller says."""

from __future__ import annotations

import copy
import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

Answer = bytes | Callable[["Handler"], None]  # a body, or a writer of the whole answer


class Handler(http.server.BaseHTTPRequestHandler):
    server: LyingServer
    protocol_version = "HTTP/1.0"  # the connection ends with the answer: a body may too

    def do_GET(self) -> None:
        answer = self.server.answers.get(self.path.split("?")[0])
        self.server.asked[self.path] = self.server.asked.get(self.path, 0) + 1
        if answer is None:
            self.send_error(404)
        elif callable(answer):
            answer(self)
        else:
            self.send(answer)

    def send(self, body: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:  # quiet: a test reads what it needs
        pass


class LyingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a reader that hangs up mid-answer is what the attacks expect

    def __init__(self, answers: dict[str, Answer]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answers = answers
        self.asked: dict[str, int] = {}
        self.sent_endless = 0  # bytes an endless answer got out before its reader hung up
        self.thread = threading.Thread(target=self.serve_forever, name="lying host", daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def start(self) -> LyingServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def endless(handler: Handler) -> None:
    """An answer with no length that never ends: JSON that grows until the reader hangs up."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.end_headers()
    piece = b'"' + b"x" * 65000 + b'",'
    try:
        handler.wfile.write(b"[")
        while True:
            handler.wfile.write(piece)
            handler.server.sent_endless += len(piece)
    except OSError:  # the reader stopped reading and closed
        pass


def trickle(handler: Handler) -> None:
    """An answer that never ends, a byte at a time, each well within the reader's timeout."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.end_headers()
    try:
        while True:
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.2)
    except OSError:  # the reader hung up
        pass


def served(body: bytes, kind: str) -> Callable[[Handler], None]:
    """An answer of another type than JSON (a page, its script)."""
    return lambda handler: handler.send(body, kind)


def huge(entries: int = 600_000) -> bytes:
    """About 7 MB of one JSON object of `entries` entries, as the audit sent."""
    return b"{" + b",".join(b'"%07d":{}' % i for i in range(entries)) + b"}"


def many_gpus(devices: dict[str, Any], status: dict[str, Any], count: int) -> dict[str, bytes]:
    """/devices and /status of `count` GPUs, each a copy of the real first one."""
    uuid = next(iter(devices))
    fake_devices, fake_status = {}, {}
    for number in range(count):
        name = f"GPU-{number:08d}-0000-0000-0000-000000000000"
        fake_devices[name] = dict(devices[uuid], number=number)
        fake_status[name] = copy.deepcopy(status[uuid])
    return {
        "/devices": json.dumps(fake_devices).encode(),
        "/status": json.dumps(fake_status).encode(),
    }


def with_claim(
    devices: dict[str, Any], status: dict[str, Any], **changes: Any
) -> dict[str, bytes]:
    """The real answers, the first GPU's claim changed."""
    lied = copy.deepcopy(status)
    lied[next(iter(lied))]["claim"].update(changes)
    return {"/devices": json.dumps(devices).encode(), "/status": json.dumps(lied).encode()}


def heavy(devices: dict[str, Any], status: dict[str, Any], size: int) -> dict[str, bytes]:
    """The real answers, the first GPU with as many users as `size` bytes hold, each an empty
    identity: true to the schema (an identity's fields may be left out), and the dearest answer
    of that size to decode and check."""
    base = len(json.dumps(status, separators=(",", ":")))
    users = [{}] * ((size - base - 64) // 3)
    answers = with_claim(devices, status, users=users)
    answers["/status"] = json.dumps(json.loads(answers["/status"]), separators=(",", ":")).encode()
    assert len(answers["/status"]) <= size
    return answers


def hostile(
    devices: dict[str, Any], status: dict[str, Any], max_gpus: int
) -> Iterator[tuple[str, dict[str, Answer], str | None]]:
    """(name, answers, what the fleet view must say of it) for every attack: the words a host's
    `error` must hold."""
    real_status = json.dumps(status).encode()
    yield "huge", {"/devices": huge(), "/status": real_status}, "more than"
    yield "endless", {"/devices": endless, "/status": real_status}, "more than"
    yield "state object", with_claim(devices, status, state={"free": True}), "claim.state"
    yield "users string", with_claim(devices, status, users="alice@example.org"), "claim.users"
    yield "users [null]", with_claim(devices, status, users=[None]), "claim.users[0]"
    yield "too many GPUs", many_gpus(devices, status, max_gpus + 1), f"more than {max_gpus}"
