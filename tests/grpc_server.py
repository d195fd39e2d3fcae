"""A real gRPC server on a unix socket for the tests, answering encoded messages by method: the
stand-in for servers that cannot run here (the kubelet), built from their public .proto files'
field numbers with observe/protowire.py."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent import futures

import grpc

Handler = Callable[[bytes], bytes]  # the encoded request -> the encoded answer


class Server:
    """Serves `methods` ({"/pkg.Service/Method": handler}) on a unix socket at `path`; a handler
    that raises grpc's RpcError-like `Abort` answers with that status."""

    def __init__(self, path: str, methods: dict[str, Handler]) -> None:
        self.path = path
        self.methods = methods
        self.calls: dict[str, int] = {}
        self._server = None

    def start(self) -> Server:
        if os.path.exists(self.path):
            os.unlink(self.path)

        def behavior(name: str) -> Callable:
            def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
                self.calls[name] = self.calls.get(name, 0) + 1
                handler = self.methods[name]
                try:
                    if hasattr(handler, "serve"):  # a Hang (of either import of this module)
                        return handler.serve(request, context)
                    return handler(request)
                except Abort as abort:
                    context.abort(abort.code, abort.details)

            return answer

        class Generic(grpc.GenericRpcHandler):
            def service(inner, details):
                if details.method not in self.methods:
                    return None  # UNIMPLEMENTED
                return grpc.unary_unary_rpc_method_handler(behavior(details.method))

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((Generic(),))
        self._server.add_insecure_port(f"unix:{self.path}")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None


class Abort(Exception):
    """Raised by a handler: answer with this gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Hang:
    """A handler that accepts a call and answers nothing (a server that hangs) until `release`
    is set, then answers with `answer`; it sees the call end if the client ends it first."""

    def __init__(self, answer: Handler = lambda request: b"") -> None:
        self.answer = answer
        self.release = threading.Event()
        self.in_flight = 0  # calls held now
        self.started = threading.Event()  # a call came
        # For each call ended unanswered by its client: the seconds its deadline still had
        # (a client that gave up or closed its channel), about 0 (it ran out), None (none).
        self.ended: list[float | None] = []

    def serve(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.in_flight += 1
        self.started.set()
        try:
            while not self.release.wait(0.01):
                if not context.is_active():
                    self.ended.append(context.time_remaining())
                    return b""
            return self.answer(request)
        finally:
            self.in_flight -= 1
