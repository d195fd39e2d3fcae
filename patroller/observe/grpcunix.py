"""Unary gRPC calls on a unix socket, with messages already encoded (core/protowire.py): what
containerd's API and the kubelet's pod-resources need, and nothing more.

grpcio is optional (the `kubernetes` extra). Without it a caller says so once, when first used,
and every call fails with GrpcUnavailable: the daemon goes on without that source. The calls
block (run them in an executor, never on the event loop). One channel per socket is kept while
the server answers; one that could not reach it is dropped, so that the next call connects
afresh as soon as the server is back (rather than after gRPC's reconnection backoff, which
grows to minutes).
"""
from __future__ import annotations

import importlib
import logging
import os
import threading
from typing import Any, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

INSTALL = "pip install 'patroller[kubernetes]'"
_missing_told = threading.Event()


class GrpcUnavailable(Exception):
    """The call could not be made or failed; the message says why, in words for the log."""

    def __init__(self, why: str, code: Optional[str] = None) -> None:
        super().__init__(why)
        self.code = code  # gRPC's status code name (UNAVAILABLE, NOT_FOUND, ...), when it has one


def _grpc() -> Any:
    """The grpc module, or GrpcUnavailable when it is not installed (told once in the log)."""
    try:
        # The daemon forks only to exec its nvidia-smi children. gRPC's fork support restarts
        # its poller in a forked child, whose closing of descriptors before exec then makes it
        # abort (grpcio 1.85: 7 of 200 children started with a preexec_fn died of SIGABRT).
        # Off, before gRPC first reads it; fork-then-exec needs none of it.
        os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
        return importlib.import_module("grpc")
    except ImportError:
        if not _missing_told.is_set():
            _missing_told.set()
            log.warning("grpcio is not installed: containerd and the kubelet cannot be asked "
                        "(%s)", INSTALL)
        raise GrpcUnavailable(f"grpcio is not installed ({INSTALL})") from None


def installed() -> bool:
    """Whether grpcio can be imported (blocking: the first time imports it); said once in the
    log when it cannot."""
    try:
        _grpc()
    except GrpcUnavailable:
        return False
    return True


class UnixCaller:
    """Unary calls to one gRPC server on a unix socket."""

    def __init__(self, path: str, timeout: float,
                 metadata: Sequence[Tuple[str, str]] = ()) -> None:
        self.path = path
        self.timeout = timeout
        self.metadata = tuple(metadata)  # sent with every call (containerd's namespace)
        self._channel: Any = None
        self._lock = threading.Lock()

    def call(self, method: str, request: bytes,
             metadata: Sequence[Tuple[str, str]] = ()) -> bytes:
        """Blocking: the encoded answer of `method` (`/package.Service/Method`) to `request`."""
        grpc = _grpc()
        with self._lock:
            if self._channel is None:
                # unix:<absolute path>; one message may be large (every pod of a node)
                self._channel = grpc.insecure_channel(
                    f"unix:{self.path}", options=[("grpc.max_receive_message_length", 64 << 20)])
            channel = self._channel
        stub = channel.unary_unary(method)  # no (de)serializers: bytes in, bytes out
        try:
            return stub(request, timeout=self.timeout,
                        metadata=self.metadata + tuple(metadata) or None)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            name = getattr(code, "name", None)
            if name == "UNAVAILABLE":
                self._drop(channel)
            raise GrpcUnavailable(f"{method} on {self.path}: {name or 'error'}: {details}",
                                  name) from None
        except ValueError as exc:  # a closed channel
            raise GrpcUnavailable(f"{method} on {self.path}: {exc}") from None

    def _drop(self, channel: Any) -> None:
        with self._lock:
            if self._channel is channel:
                self._channel = None
        channel.close()

    def close(self) -> None:
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
