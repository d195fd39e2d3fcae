"""An engine that serves the Docker API on a unix socket with what a real one answered
(tests/fixtures/docker/engine.json, captured from the tests' private dockerd): for the identity
rules' tests that must run where no engine can (the engine-free suite). It knows the containers
it is given, each with its labels, and can be told to fail (500) or to go away.

The real engines stay in the tests that need them (test_identity_docker, test_engines_docker,
test_podman, test_containerd); this one checks what Patroller does with their answers."""
import copy
import json
import os
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from typing import Dict, Optional

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "docker", "engine.json")


def recorded() -> dict:
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class FakeEngine:
    """The Docker API at `path`, answering as the captured engine did."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.answers = recorded()
        self.containers: Dict[str, Dict[str, str]] = {}  # id -> labels
        self.failing: Optional[str] = None  # the message of a 500, while it fails
        self.requests = 0
        self._server: Optional[_Server] = None

    def add(self, cid: str, labels: Dict[str, str]) -> None:
        self.containers[cid] = labels

    def start(self) -> "FakeEngine":
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                engine.requests += 1
                status, body = engine.answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Api-Version", engine.answers["version"]["ApiVersion"])
                self.end_headers()
                self.wfile.write(data)

            def address_string(self) -> str:
                return "unix"

            def log_message(self, *args: object) -> None:
                pass

        if os.path.lexists(self.path):
            os.unlink(self.path)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._server = _Server(self.path, Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def answer(self, path: str):
        """(status, body) for a GET of `path`, as the captured engine answers."""
        if self.failing is not None:
            return 500, {"message": self.failing}
        parts = [p for p in path.split("?")[0].split("/") if p]
        if parts and parts[0].startswith("v") and parts[0][1:2].isdigit():
            parts = parts[1:]  # the API version prefix
        if parts == ["version"]:
            return 200, self.answers["version"]
        if parts == ["_ping"]:
            return 200, "OK"
        if len(parts) == 3 and parts[0] == "containers" and parts[2] == "json":
            cid = next((c for c in self.containers if c.startswith(parts[1])), None)
            if cid is None:
                return 404, {"message": self.answers["not_found"]["message"].format(id=parts[1])}
            body = copy.deepcopy(self.answers["container"])
            body["Id"] = cid
            body["Name"] = "/" + "train-" + cid[:4]
            body["Config"]["Labels"] = dict(self.containers[cid])
            return 200, body
        return 404, {"message": f"page not found: {path}"}

    def stop(self) -> None:
        """Stop answering and remove the socket (as an engine stopped in order does)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if os.path.lexists(self.path):
            os.unlink(self.path)
