"""An engine that serves the Docker API with what a real one answered: for the identity rules'
tests that must run where no engine can (the engine-free suite). The answers are captured:
tests/fixtures/docker/engine.json from the tests' private dockerd, podman.json from a private
Podman service's Docker-compatible API (each file says how). It knows the containers it is given,
each with its labels, its addresses and its first process, and can be told to fail as engines
do: answer 500 with a message (or any status, as a proxy in front of a TCP engine does), take a
request and never answer, close the connection without answering (an engine that dies in the
middle of a request), die leaving its socket file behind, or stop in order (the socket removed).

It listens on a unix socket (`path`), or on loopback TCP (`FakeEngine.on_tcp`); `url` is the
address to give Patroller. A container's network addresses are set in the captured shape of an
endpoint (the captured engines ran their containers with no network, so the values are the
test's own). The real engines stay in the tests that need them (test_identity_docker,
test_engines_docker, test_podman, test_containerd); this one checks what Patroller does with
their answers."""

import copy
import json
import os
import socketserver
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "docker")
FIXTURE = os.path.join(FIXTURES, "engine.json")


def recorded(kind: str = "docker") -> dict:
    """The captured answers of the Docker Engine ("docker") or of Podman's service ("podman")."""
    with open(
        os.path.join(FIXTURES, "engine.json" if kind == "docker" else "podman.json"),
        encoding="utf-8",
    ) as f:
        return json.load(f)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


class FakeEngine:
    """The Docker API at `path`, answering as the captured engine (`kind`) did."""

    def __init__(self, path: str, kind: str = "docker") -> None:
        self.path = path
        self.kind = kind
        self.answers = recorded(kind)
        self.containers: dict[str, dict] = {}  # id -> labels, addresses, pid
        self.vanishing: set[str] = set()  # listed, but removed before they are asked about
        self.failing: str | None = None  # the message of a 500, while it fails
        self.answering: tuple[int, str] | None = None  # (status, plain text), while set
        self.hanging = False  # requests taken and never answered (until `stop`)
        # seconds between the bytes of an answer that never ends (until `stop`); 0: off
        self.dribbling = 0.0
        self.dropping = False  # connections closed without an answer
        self.requests = 0
        self.tcp: tuple[str, int] | None = None
        self._server: socketserver.BaseServer | None = None
        self._stopped = threading.Event()

    @classmethod
    def on_tcp(cls, kind: str = "docker") -> "FakeEngine":
        """One that will listen on an ephemeral loopback port."""
        engine = cls("", kind)
        engine.tcp = ("127.0.0.1", 0)
        return engine

    @property
    def url(self) -> str:
        if self.tcp is not None:
            return f"tcp://{self.tcp[0]}:{self.tcp[1]}"
        return f"unix://{self.path}"

    def add(
        self,
        cid: str,
        labels: dict[str, str],
        addresses: Sequence[str] = (),
        pid: int | None = None,
    ) -> None:
        """A container: its labels, its addresses on container networks (IPv4 or IPv6), and its
        first process's host pid (None: it has stopped)."""
        self.containers[cid] = {"labels": labels, "addresses": tuple(addresses), "pid": pid}

    def start(self) -> "FakeEngine":
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                engine.requests += 1
                if engine.hanging:
                    engine._stopped.wait(60)
                    self.close_connection = True
                    return
                if engine.dropping:
                    self.close_connection = True
                    return
                if engine.dribbling:  # each read answered in time, the whole never
                    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100000:
                        if engine._stopped.wait(engine.dribbling):
                            break
                        try:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                        except OSError:
                            break
                    self.close_connection = True
                    return
                status, body = engine.answer(self.path)
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header(
                    "Content-Type", "text/plain" if isinstance(body, str) else "application/json"
                )
                self.send_header("Content-Length", str(len(data)))
                for name, value in engine.answers.get("headers", {}).items():
                    self.send_header(name, value)
                if "headers" not in engine.answers:
                    self.send_header("Api-Version", engine.answers["version"]["ApiVersion"])
                self.end_headers()
                self.wfile.write(data)

            def address_string(self) -> str:
                return "unix"

            def log_message(self, *args: object) -> None:
                pass

        self._stopped.clear()
        if self.tcp is not None:
            self._server = _TcpServer(self.tcp, Handler)
            self.tcp = self._server.server_address[:2]
        else:
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
        if self.answering is not None:
            return self.answering
        parts = [p for p in path.split("?")[0].split("/") if p]
        if parts and parts[0].startswith("v") and parts[0][1:2].isdigit():
            parts = parts[1:]  # the API version prefix
        if parts == ["version"]:
            return 200, self.answers["version"]
        if parts == ["_ping"]:
            return 200, "OK"
        if parts == ["containers", "json"]:
            return 200, [self._summary(cid) for cid in self.containers]
        if len(parts) == 3 and parts[0] == "containers" and parts[2] == "json":
            cid = next(
                (c for c in self.containers if c.startswith(parts[1]) and c not in self.vanishing),
                None,
            )
            if cid is None:
                return 404, self._not_found(parts[1])
            return 200, self._inspect(cid)
        return 404, {"message": f"page not found: {path}"}

    def _not_found(self, cid: str) -> dict:
        return json.loads(json.dumps(self.answers["not_found"]).replace("{id}", cid))

    def _inspect(self, cid: str) -> dict:
        known = self.containers[cid]
        body = copy.deepcopy(self.answers["container"])
        body["Id"] = cid
        body["Name"] = "/" + "train-" + cid[:4]
        body["Config"]["Labels"] = dict(known["labels"])
        if known["pid"] is None:  # stopped: as the captured exited container's state
            body["State"] = copy.deepcopy(recorded("docker")["exited"])
        else:
            body["State"]["Pid"] = known["pid"]
        body["NetworkSettings"]["Networks"] = {
            f"net{n}": self._endpoint(address) for n, address in enumerate(known["addresses"])
        }
        return body

    @staticmethod
    def _endpoint(address: str) -> dict:
        endpoint = copy.deepcopy(
            recorded("docker")["container"]["NetworkSettings"]["Networks"]["none"]
        )
        endpoint["GlobalIPv6Address" if ":" in address else "IPAddress"] = address
        return endpoint

    def _summary(self, cid: str) -> dict:
        summary = copy.deepcopy(self.answers["list"][0])
        summary["Id"] = cid
        summary["Names"] = ["/" + "train-" + cid[:4]]
        summary["Labels"] = dict(self.containers[cid]["labels"])
        return summary

    def crash(self) -> None:
        """Stop answering, leaving the socket file behind (an engine killed): connecting to it
        is refused."""
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def stop(self) -> None:
        """Stop answering and remove the socket (as an engine stopped in order does)."""
        self.crash()
        if self.tcp is None and os.path.lexists(self.path):
            os.unlink(self.path)


class Engines(list):
    """The fake engines a test made: at a unix socket path (`engines(path, kind)`), or on
    loopback TCP (`engines.tcp(kind)`); stopped after it."""

    def __call__(self, path, kind="docker"):
        self.append(FakeEngine(path, kind))
        return self[-1]

    def tcp(self, kind="docker"):
        self.append(FakeEngine.on_tcp(kind))
        return self[-1]
