"""A real gRPC server on a unix socket for the tests, answering encoded messages by method: the
stand-in for servers that cannot run here (the kubelet), built from their public .proto files'
field numbers with core/protowire.py."""
from __future__ import annotations

import os
from concurrent import futures
from typing import Callable, Dict

import grpc

Handler = Callable[[bytes], bytes]  # the encoded request -> the encoded answer


class Server:
    """Serves `methods` ({"/pkg.Service/Method": handler}) on a unix socket at `path`; a handler
    that raises grpc's RpcError-like `Abort` answers with that status."""

    def __init__(self, path: str, methods: Dict[str, Handler]) -> None:
        self.path = path
        self.methods = methods
        self.calls: Dict[str, int] = {}
        self._server = None

    def start(self) -> "Server":
        if os.path.exists(self.path):
            os.unlink(self.path)

        def behavior(name: str) -> Callable:
            def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
                self.calls[name] = self.calls.get(name, 0) + 1
                try:
                    return self.methods[name](request)
                except Abort as abort:
                    context.abort(abort.code, abort.details)
            return answer

        class Generic(grpc.GenericRpcHandler):
            def service(inner, details):  # noqa: N805 (grpc's signature)
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
