"""observe/grpcunix.py against a real gRPC server on a unix socket (tests/grpc_server.py)."""

import grpc
import pytest
from grpc_server import Abort, Server

from patroller.observe import protowire as pw
from patroller.observe.grpcunix import GrpcUnavailable, UnixCaller

ECHO = "/test.Echo/Say"


def _echo(request: bytes) -> bytes:
    return pw.string(1, "you said " + pw.Message(request).text(1))


@pytest.fixture
def socket_path(tmp_path):
    return str(tmp_path / "grpc.sock")


def test_a_call_sends_and_reads_encoded_messages(socket_path):
    server = Server(socket_path, {ECHO: _echo}).start()
    caller = UnixCaller(socket_path, timeout=5, metadata=[("containerd-namespace", "k8s.io")])
    try:
        answer = caller.call(ECHO, pw.string(1, "hello"))
        assert pw.Message(answer).text(1) == "you said hello"
        assert server.calls == {ECHO: 1}
    finally:
        caller.close()
        server.stop()


def test_statuses_and_a_missing_server_are_grpc_unavailable(socket_path):
    def refuse(request: bytes) -> bytes:
        raise Abort(grpc.StatusCode.NOT_FOUND, "no such container")

    caller = UnixCaller(socket_path, timeout=2)
    with pytest.raises(GrpcUnavailable) as missing:
        caller.call(ECHO, b"")
    assert missing.value.code == "UNAVAILABLE"
    server = Server(socket_path, {ECHO: refuse}).start()
    try:
        with pytest.raises(GrpcUnavailable, match="no such container") as refused:
            caller.call(ECHO, b"")
        assert refused.value.code == "NOT_FOUND"
        with pytest.raises(GrpcUnavailable) as unknown:
            caller.call("/test.Echo/Other", b"")
        assert unknown.value.code == "UNIMPLEMENTED"
    finally:
        caller.close()
        server.stop()


def test_the_channel_recovers_when_the_server_comes_back(socket_path):
    caller = UnixCaller(socket_path, timeout=5)
    server = Server(socket_path, {ECHO: _echo}).start()
    try:
        assert pw.Message(caller.call(ECHO, pw.string(1, "a"))).text(1) == "you said a"
        server.stop()
        with pytest.raises(GrpcUnavailable):
            caller.call(ECHO, pw.string(1, "b"))
        server = Server(socket_path, {ECHO: _echo}).start()
        # at once: not after gRPC's reconnection backoff
        assert pw.Message(caller.call(ECHO, pw.string(1, "c"))).text(1) == "you said c"
    finally:
        caller.close()
        server.stop()
