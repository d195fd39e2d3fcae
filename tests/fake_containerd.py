"""containerd's Containers service (Get and List) on a unix socket, a real gRPC server
(tests/grpc_server.py) answering as a real containerd did (tests/fixtures/containerd/answers.json,
captured by tests/capture_containerd.py): for the identity tests that must run where no
containerd can (the engine-free suite).

It holds containers by namespace. Those it is given are made from the captured ones: the same
message, field for field (the runtime, the snapshot, the times, the OCI spec), with the id, the
labels and the spec's annotations given (containerd's own `io.containerd.` labels kept). Get
answers the container of the request's `containerd-namespace`, or NOT_FOUND, or
FAILED_PRECONDITION without a namespace, in containerd's words; List answers those matching any
of its filters (`labels."k"==v` joined by commas, the filters Patroller sends). It can be told
to fail a method's calls with a status, to answer given bytes instead, to hold its calls
unanswered (a grpc_server.Hang), to list every container of the namespace whatever the filters,
and to crash (its socket file stays, nobody answers on it) and come back.

The real containerd stays in tests/test_containerd.py; this one checks what Patroller does with
its answers."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
from collections.abc import Mapping

import grpc
from grpc_server import Abort, Hang, Server

from patroller.identify import containerd as ctrd
from patroller.observe import protowire as pw

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "containerd", "answers.json")
_CLAUSE = re.compile(
    r'^labels\.(?:"((?:[^"\\]|\\.)*)"|([\w./-]+))==(?:"((?:[^"\\]|\\.)*)"|'
    r'([^",]*))$'
)


def recorded() -> dict:
    """The captured calls: {"ids": ..., "calls": {name: call}}, each answer in bytes."""
    with open(FIXTURE, encoding="utf-8") as f:
        fixture = json.load(f)
    calls = {}
    for call in fixture["calls"]:
        call = dict(
            call,
            request=base64.b64decode(call["request"]),
            answer=base64.b64decode(call["answer"]),
        )
        calls[call["name"]] = call
    return {"ids": fixture["ids"], "calls": calls}


def captured_container(name: str) -> bytes:
    """The Container message of a captured Get answer ("plain", "sandbox", "container")."""
    return pw.Message(recorded()["calls"][name]["answer"]).raw(1)


def encode(fields: list[tuple[int, object]]) -> bytes:
    """A message of these (number, value) fields, as protowire.fields reads them."""
    return b"".join(
        pw.integer(n, v) if isinstance(v, int) else pw.delimited(n, v) for n, v in fields
    )  # type: ignore[arg-type]


def made_like(
    template: bytes,
    cid: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
) -> bytes:
    """The captured Container `template` as containerd would give another container: its id
    (and snapshot key, which ctr names after it), labels and OCI annotations these."""
    old = pw.Message(template)
    old_id = old.text(1)
    kept = {k: v for k, v in old.string_map(2).items() if k.startswith("io.containerd.")}
    out: list[tuple[int, object]] = []
    for number, value in pw.fields(template):
        if number == 1:
            out.append((1, cid.encode()))
        elif number == 2:
            if not any(n == 2 for n, _ in out):
                out += [
                    (2, encode([(1, k.encode()), (2, v.encode())]))
                    for k, v in {**kept, **labels}.items()
                ]
        elif number == 5:
            spec_any = pw.Message(value)  # type: ignore[arg-type]
            spec = json.loads(spec_any.raw(2).decode().replace(old_id, cid))
            spec["annotations"] = dict(annotations or {})
            out.append(
                (
                    5,
                    encode(
                        [
                            (1, spec_any.raw(1)),
                            (2, json.dumps(spec, separators=(",", ":")).encode()),
                        ]
                    ),
                )
            )
        elif number == 7 and value == old_id.encode():
            out.append((7, cid.encode()))
        else:
            out.append((number, value))
    return encode(out)


def matches(labels: Mapping[str, str], filters: list[str]) -> bool:
    """Whether containerd's filters (any of them; each clause of one) select these labels.
    Raises ValueError for a filter it does not read."""
    if not filters:
        return True
    for one in filters:
        clauses = re.findall(r'(?:"(?:[^"\\]|\\.)*"|[^,"])+', one)
        wanted = []
        for clause in clauses:
            found = _CLAUSE.match(clause)
            if found is None:
                raise ValueError(f"a filter this fake does not read: {clause!r}")
            key, value = found.group(1) or found.group(2), found.group(3)
            wanted.append((key, value if value is not None else found.group(4)))
        if all(labels.get(k) == v for k, v in wanted):
            return True
    return False


class FakeContainerd:
    """containerd's Containers service at `path`, answering as the captured containerd did."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.answers = recorded()
        self.containers: dict[tuple[str, str], bytes] = {}  # (namespace, id) -> Container
        self.failing: dict[str, tuple[grpc.StatusCode, str]] = {}  # method -> its status
        self.answer: bytes | None = None  # answered instead, when set
        self.hang: Hang | None = None  # holds every call, when set
        self.filtering = True  # False: List answers every container of the namespace
        self.asked: list[tuple[str, str | None, bytes]] = []  # (method, namespace, request)
        self._server: Server | None = None
        self._dead: socket.socket | None = None

    # -- what it holds ---------------------------------------------------------------------

    def add(
        self,
        namespace: str,
        cid: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
        like: str = "container",
    ) -> bytes:
        """A container made as the captured `like` ("plain", "sandbox", "container")."""
        message = made_like(captured_container(like), cid, labels, annotations)
        self.containers[(namespace, cid)] = message
        return message

    def add_captured(self) -> None:
        """The captured containers themselves, each in the namespace it was found in."""
        for name in ("plain", "sandbox", "container"):
            call = self.answers["calls"][name]
            message = pw.Message(call["answer"]).raw(1)
            self.containers[(call["namespace"], pw.Message(message).text(1))] = message

    # -- its answers -----------------------------------------------------------------------

    def get(self, request: bytes, namespace: str | None) -> bytes:
        cid = pw.Message(request).text(1)
        message = self.containers.get((namespace, cid))  # type: ignore[arg-type]
        if message is None:
            raise Abort(
                grpc.StatusCode.NOT_FOUND,
                f'container "{cid}" in namespace "{namespace}": not found',
            )
        return pw.delimited(1, message)

    def list(self, request: bytes, namespace: str | None) -> bytes:
        try:
            filters = pw.Message(request).texts(1)
            chosen = [
                message
                for (ns, _), message in self.containers.items()
                if ns == namespace
                and (not self.filtering or matches(pw.Message(message).string_map(2), filters))
            ]
        except ValueError as exc:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        return b"".join(pw.delimited(1, message) for message in chosen)

    def _method(self, method: str):
        fake = self

        class Handler:
            def serve(self, request: bytes, context: grpc.ServicerContext) -> bytes:
                namespace = dict(context.invocation_metadata()).get(ctrd.NAMESPACE_HEADER)
                fake.asked.append((method, namespace, request))
                if fake.hang is not None:
                    fake.hang.serve(request, context)
                if method in fake.failing:
                    raise Abort(*fake.failing[method])
                if fake.answer is not None:
                    return fake.answer
                if namespace is None:  # as containerd words it
                    raise Abort(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        "namespace is required: failed precondition",
                    )
                return (fake.get if method == ctrd.GET else fake.list)(request, namespace)

        return Handler()

    # -- up and down -----------------------------------------------------------------------

    def fail(
        self, code: grpc.StatusCode, details: str, methods: tuple[str, ...] = (ctrd.GET, ctrd.LIST)
    ) -> None:
        """Fail the calls of these methods with this status (until `failing` is cleared)."""
        self.failing.update({method: (code, details) for method in methods})

    def start(self) -> FakeContainerd:
        if self._dead is not None:
            self._dead.close()
            self._dead = None
        self._server = Server(
            self.path, {ctrd.GET: self._method(ctrd.GET), ctrd.LIST: self._method(ctrd.LIST)}
        ).start()
        return self

    def crash(self) -> None:
        """Stop answering as a killed containerd does: its socket file stays, and a connection
        to it is refused."""
        self.stop()
        self._dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._dead.bind(self.path)  # bound, never listening: ECONNREFUSED

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._dead is not None:
            self._dead.close()
            self._dead = None
            os.unlink(self.path)
