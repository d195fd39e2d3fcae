"""Unary gRPC calls on a unix socket, with messages already encoded (observe/protowire.py): what
containerd's API and the kubelet's pod-resources need, and nothing more.

grpcio is optional (the `kubernetes` extra). Without it a caller says so once, when first used,
and every call fails with GrpcUnavailable: the daemon goes on without that source. The calls
block (run them in an executor, never on the event loop). One channel per socket is kept while
the server answers; one that could not reach it is dropped, so that the next call connects
afresh as soon as the server is back (rather than after gRPC's reconnection backoff, which
grows to minutes).

An answer larger than `max_message` bytes (Config.grpc_max_message) is refused by gRPC before it
is decoded: the call fails, saying so. Closing the caller ends a call in flight at once (its
thread is not held until the call's timeout) and every later one; the server's error details
go into the log escaped (core/text.py).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from patroller.config import Config
from patroller.core.text import printable

log = logging.getLogger(__name__)

INSTALL = "pip install 'patroller[kubernetes]'"
_missing_told = threading.Event()


class GrpcUnavailable(Exception):
    """The call could not be made or failed; the message says why, in words for the log."""

    def __init__(self, why: str, code: str | None = None) -> None:
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
            log.warning(
                "grpcio is not installed: containerd and the kubelet cannot be asked (%s)", INSTALL
            )
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

    def __init__(
        self,
        path: str,
        timeout: float,
        max_message: int = Config.grpc_max_message,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.path = path
        self.timeout = timeout
        self.max_message = max_message  # bytes: the largest answer taken
        self.metadata = tuple(metadata)  # sent with every call (containerd's namespace)
        self.closed = False  # for good: every call fails at once
        self._channel: Any = None
        self._lock = threading.Lock()

    def call(self, method: str, request: bytes, metadata: Sequence[tuple[str, str]] = ()) -> bytes:
        """Blocking: the encoded answer of `method` (`/package.Service/Method`) to `request`."""
        grpc = _grpc()
        with self._lock:
            if self.closed:
                raise GrpcUnavailable(f"{method} on {self.path}: closed", "CANCELLED")
            if self._channel is None:  # unix:<absolute path>
                self._channel = grpc.insecure_channel(
                    f"unix:{self.path}",
                    options=[("grpc.max_receive_message_length", self.max_message)],
                )
            channel = self._channel
        stub = channel.unary_unary(method)  # no (de)serializers: bytes in, bytes out
        try:
            reply: bytes = stub(
                request, timeout=self.timeout, metadata=self.metadata + tuple(metadata) or None
            )
            return reply
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = printable(str(exc.details() if hasattr(exc, "details") else exc))
            name = getattr(code, "name", None)
            if name == "UNAVAILABLE":
                self._drop(channel)
            if name == "RESOURCE_EXHAUSTED" and "larger than max" in details:
                details = (
                    f"an answer larger than {self.max_message} bytes, the most taken "
                    f"(grpc_max_message), refused ({details})"
                )
            raise GrpcUnavailable(
                f"{method} on {self.path}: {name or 'error'}: {details}", name
            ) from None
        except ValueError as exc:  # a closed channel
            raise GrpcUnavailable(f"{method} on {self.path}: {exc}", "CANCELLED") from None

    def _drop(self, channel: Any) -> None:
        with self._lock:
            if self._channel is channel:
                self._channel = None
        channel.close()

    def close(self) -> None:
        """Close for good: a call in flight ends now (CANCELLED), later ones fail at once."""
        with self._lock:
            self.closed = True
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
