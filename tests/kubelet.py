"""The kubelet's pod-resources service for the tests: a real gRPC server on a unix socket
(tests/grpc_server.py) answering `/v1.PodResourcesLister/List` with the pods it is given,
encoded with observe/protowire.py from the field numbers of the kubelet's public api.proto
(k8s.io/kubelet/pkg/apis/podresources/v1), as the simulator stands in for nvidia-smi."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_server import Abort, Hang, Server

from patroller.observe import protowire as pw

LIST = "/v1.PodResourcesLister/List"

Devices = Sequence[tuple[str, Sequence[str]]]  # (resource name, device ids)
Containers = Sequence[tuple[str, Devices]]  # (container name, its devices)


def pod(namespace: str, name: str, containers: Containers) -> bytes:
    """A PodResources message: name 1, namespace 2, containers 3; a ContainerResources has
    name 1, devices 2, cpu_ids 3 (a packed repeated int64); a ContainerDevices has
    resource_name 1, device_ids 2, topology 3."""
    encoded = []
    for container, devices in containers:
        body = pw.string(1, container)
        for resource, ids in devices:
            topology = pw.delimited(1, pw.integer(1, 0))  # TopologyInfo{nodes: [NUMANode{ID 0}]}
            body += pw.delimited(
                2, pw.string(1, resource) + pw.strings(2, ids) + pw.delimited(3, topology)
            )
        body += pw.delimited(3, pw.varint(2) + pw.varint(3))  # cpu_ids [2, 3], packed
        encoded.append(pw.delimited(3, body))
    return pw.string(1, name) + pw.string(2, namespace) + b"".join(encoded)


def gpu_pod(
    namespace: str, name: str, *ids: str, resource: str = "nvidia.com/gpu", container: str = "main"
) -> bytes:
    """A pod with one container given these devices of one resource."""
    return pod(namespace, name, [(container, [(resource, ids)])])


class Kubelet:
    """The pod-resources service on `path`: `pods` (encoded PodResources) is what List answers,
    `broken` makes it answer UNAVAILABLE, `garbage` with bytes that are no message, `answer`
    (when not None) with those bytes as they are; `hang` makes List hang (tests/grpc_server.py)
    until `hang.release` is set."""

    def __init__(self, path: str, hang: Hang | None = None) -> None:
        self.path = path
        self.pods: list[bytes] = []
        self.broken = False
        self.garbage = False
        self.answer: bytes | None = None
        self.answered = 0  # answers sent
        self.hang = hang
        self.server = Server(path, {LIST: hang if hang is not None else self._list})
        if hang is not None:
            hang.answer = self._list

    def _list(self, request: bytes) -> bytes:
        if self.broken:
            raise Abort(grpc.StatusCode.UNAVAILABLE, "the kubelet is restarting")
        if self.garbage:
            return b"\x0a\xff"  # field 1, a length past the end
        self.answered += 1
        if self.answer is not None:
            return self.answer
        return b"".join(pw.delimited(1, p) for p in self.pods)

    @property
    def calls(self) -> dict[str, int]:
        return self.server.calls

    def start(self) -> Kubelet:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
