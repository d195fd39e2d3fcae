"""Real receivers of notifications, on loopback: an SMTP server (aiosmtpd) that keeps each
message, an HTTP server that keeps each JSON body posted to it (Apprise's json://), and a
destination that accepts connections and never answers. Each is a context manager."""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(predicate: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


class Smtp:
    """aiosmtpd on a port of its own; `messages`: (sender, recipients, parsed message)."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[Any] = []
        self.port = free_port()
        receiver = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
                receiver.messages.append((envelope.mail_from, list(envelope.rcpt_tos), parsed))
                return "250 OK"

        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def url(self, to: str = "admin@lab.example") -> str:
        return f"mailto://127.0.0.1:{self.port}?from=patroller@lab.example&to={to}"

    def texts(self) -> list[dict[str, str]]:
        """Each message's subject, recipients and plain text."""
        found = []
        for _, to, message in list(self.messages):
            part = message.get_body(preferencelist=("plain",))
            found.append(
                {
                    "subject": str(message["Subject"]),
                    "to": ",".join(to),
                    "text": part.get_content().strip() if part else "",
                }
            )
        return found

    def __enter__(self) -> Smtp:
        self._controller.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._controller.stop()


class Hooks:
    """An HTTP server keeping every JSON body posted to it, and the Authorization header.
    While `gate` is clear, a body is kept as it arrives and its answer waits for the gate
    (a destination that has a notice but has not said so yet)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.authorizations: list[str] = []
        self.paths: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                receiver.bodies.append(json.loads(self.rfile.read(size)))
                receiver.authorizations.append(self.headers.get("Authorization") or "")
                receiver.paths.append(self.path)
                receiver.gate.wait(60)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, secret: str = "") -> str:
        who = f"patroller:{secret}@" if secret else ""
        return f"json://{who}127.0.0.1:{self.port}/hook"

    def __enter__(self) -> Hooks:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()


class Silent:
    """Accepts each connection, reads what comes, and never answers: a destination that hangs.
    `open` counts the connections it holds now, `accepted` all it took."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.accepted = 0
        self.open = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def url(self) -> str:
        return f"json://127.0.0.1:{self.port}/never"

    def _run(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                self.open = sum(_alive(c) for c in self._held)
                continue
            self.accepted += 1
            self._held.append(conn)
            self.open = sum(_alive(c) for c in self._held)

    def __enter__(self) -> Silent:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self._held:
            conn.close()
        self._sock.close()


def _alive(conn: socket.socket) -> bool:
    """Whether the peer still holds the connection (reads what it sent meanwhile)."""
    conn.setblocking(False)
    try:
        while True:
            data = conn.recv(65536)
            if not data:
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False
