"""Patroller's protobuf (observe/protowire.py, read by field number) against the real protobuf
package, both ways, on the messages of the kubelet's and containerd's public .proto files
(tests/fixtures/proto, compiled with protoc here, at test time):

- what real protobuf serializes, Patroller's readers (observe/podresources.py's `parse_list` and
  `decode`, identify/containerd.py's `read_get` and `read_list`, and the identity
  identify/pods.py makes of them) read to the right pods, devices, containers and labels;
- what Patroller writes (its requests) and what the tests' own encoders send in its place
  (tests/kubelet.py, test_containerd.py's containers) real protobuf parses to the fields meant.

Repeated fields, nested messages, maps, unknown fields (a newer peer's), empty messages, and a
message that comes in pieces, which protobuf merges."""

import importlib.util
import json
import os
import subprocess
import sys
import uuid

import pytest
from google.protobuf import (
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    unknown_fields,
)
from helpers import ROOT
from kubelet import LIST as KUBELET_LIST
from kubelet import Kubelet, gpu_pod, pod
from test_containerd import container_message

from patroller.config import Config
from patroller.core.pods import Pod, PodAllocation
from patroller.identify import containerd as ctrd
from patroller.identify.cgroups import ContainerRef
from patroller.identify.pods import containerd_identity
from patroller.observe import podresources
from patroller.observe.grpcunix import UnixCaller
from patroller.observe.protowire import WireError
from patroller.observe.testmode import synthetic_inventory

PROTOS = os.path.join(ROOT, "tests", "fixtures", "proto")
GPUS = Config.kubelet_resources
SPEC_URL = "types.containerd.io/opencontainers/runtime-spec/1/Spec"
UID = "0f2c1e3a-1111-2222-3333-444455556666"


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """The generated modules: `pb.kubelet` (package v1), `pb.containerd`."""
    out = tmp_path_factory.mktemp("pb2")
    names = sorted(n for n in os.listdir(PROTOS) if n.endswith(".proto"))
    compiled = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}", f"--python_out={out}", *names],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert compiled.returncode == 0, compiled.stderr

    def load(name):
        spec = importlib.util.spec_from_file_location(name, out / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    class Modules:
        kubelet = load("podresources_v1_pb2")
        containerd = load("containerd_containers_v1_pb2")

    return Modules


def newer(module, message, *added):
    """The classes of `module`'s file as a newer peer has them: `message` with the fields
    `added` ((name, number, label, type, type name)), in a pool of their own."""
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    pool = descriptor_pool.DescriptorPool()
    for dependency in module.DESCRIPTOR.dependencies:  # google/protobuf/any.proto and the like
        found = descriptor_pb2.FileDescriptorProto()
        dependency.CopyToProto(found)
        pool.Add(found)
    target = next(m for m in proto.message_type if m.name == message)
    for name, number, label, kind, type_name in added:
        field = target.field.add(name=name, number=number, label=label, type=kind)
        if type_name:
            field.type_name = type_name
    pool.Add(proto)
    return lambda name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{proto.package}.{name}")
    )


F = descriptor_pb2.FieldDescriptorProto


def unknown(message):
    """The numbers of the fields protobuf did not know, in a message and all it nests."""
    found = [f.field_number for f in unknown_fields.UnknownFieldSet(message)]
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:  # a map: its values, if messages
            entry_value = field.message_type.fields_by_name["value"]
            value = value.values() if entry_value.message_type is not None else ()
        elif hasattr(value, "ListFields"):  # a singular message (else a repeated one)
            value = [value]
        for nested in value:
            found += unknown(nested)
    return found


# -- the kubelet: real protobuf -> Patroller -------------------------------------------------


def test_a_list_built_by_protobuf_reads_to_each_pods_gpus(pb):
    k = pb.kubelet
    numa = k.TopologyInfo(nodes=[k.NUMANode(ID=0), k.NUMANode(ID=1)])
    answer = k.ListPodResourcesResponse(
        pod_resources=[
            k.PodResources(
                name="train-0",
                namespace="ml",
                containers=[
                    k.ContainerResources(
                        name="trainer",
                        cpu_ids=[2, 3, 2**40],
                        devices=[
                            k.ContainerDevices(
                                resource_name="nvidia.com/gpu",
                                device_ids=["GPU-a", "GPU-b::1"],
                                topology=numa,
                            ),
                            k.ContainerDevices(
                                resource_name="example.com/nic", device_ids=["nic0"]
                            ),
                        ],
                        memory=[
                            k.ContainerMemory(
                                memory_type="hugepages-1Gi", size=2**33, topology=numa
                            )
                        ],
                        dynamic_resources=[
                            k.DynamicResource(
                                claim_name="c",
                                claim_namespace="ml",
                                claim_resources=[
                                    k.ClaimResource(
                                        cdi_devices=[k.CDIDevice(name="nvidia.com/gpu=0")],
                                        driver_name="gpu.nvidia.com",
                                        pool_name="p",
                                        device_name="gpu-0",
                                        share_id="s",
                                    )
                                ],
                            )
                        ],
                    ),
                    k.ContainerResources(name="sidecar"),
                    k.ContainerResources(
                        name="logger",
                        devices=[
                            k.ContainerDevices(
                                resource_name="nvidia.com/mig-1g.10gb",
                                device_ids=["MIG-c", "GPU-a"],
                            )
                        ],
                    ),
                ],
            ),
            k.PodResources(
                name="web",
                namespace="default",
                containers=[k.ContainerResources(name="nginx", cpu_ids=[1])],
            ),
            k.PodResources(),
            k.PodResources(
                name="é-ü",
                namespace="ns",
                containers=[
                    k.ContainerResources(
                        name="c",
                        devices=[
                            k.ContainerDevices(
                                resource_name="nvidia.com/gpu.shared", device_ids=["nvidia1"]
                            )
                        ],
                    )
                ],
            ),
        ]
    ).SerializeToString()
    assert podresources.parse_list(answer, GPUS) == [
        (Pod("ml", "train-0", ("trainer", "logger")), ("GPU-a", "GPU-b::1", "MIG-c")),
        (Pod("ns", "é-ü", ("c",)), ("nvidia1",)),
    ]


def test_the_pods_of_each_host_gpu_from_a_protobuf_answer(pb):
    k = pb.kubelet
    inventory = synthetic_inventory(3)
    first, second, third = (d.uuid for d in inventory)
    answer = k.ListPodResourcesResponse(
        pod_resources=[
            k.PodResources(
                name="a",
                namespace="ml",
                containers=[
                    k.ContainerResources(
                        name="main",
                        devices=[
                            k.ContainerDevices(
                                resource_name="nvidia.com/gpu", device_ids=[first, f"{second}::2"]
                            )
                        ],
                    )
                ],
            ),
            k.PodResources(
                name="b",
                namespace="ml",
                containers=[
                    k.ContainerResources(
                        name="main",
                        devices=[
                            k.ContainerDevices(
                                resource_name="nvidia.com/gpu",
                                device_ids=[f"{second}::3", "GPU-x"],
                            )
                        ],
                    )
                ],
            ),
        ]
    ).SerializeToString()
    wanted, unknown = podresources.decode(answer, GPUS, inventory.devices)
    a, b = Pod("ml", "a", ("main",)), Pod("ml", "b", ("main",))
    assert wanted == {first: PodAllocation((a,)), second: PodAllocation((a, b))}
    assert unknown == {"GPU-x"} and third not in wanted


def test_a_newer_kubelets_fields_are_skipped(pb):
    # The kubelet's main branch adds PodResources.cpu_ids = 4 and memory = 5.
    cls = newer(
        pb.kubelet,
        "PodResources",
        ("cpu_ids", 4, F.LABEL_REPEATED, F.TYPE_INT64, ""),
        ("memory", 5, F.LABEL_REPEATED, F.TYPE_MESSAGE, ".v1.ContainerMemory"),
        ("future_fixed", 6, F.LABEL_OPTIONAL, F.TYPE_FIXED64, ""),
        ("future_float", 7, F.LABEL_OPTIONAL, F.TYPE_FLOAT, ""),
    )
    answer = cls("ListPodResourcesResponse")(
        pod_resources=[
            cls("PodResources")(
                name="p",
                namespace="ns",
                cpu_ids=[0, 1],
                future_fixed=2**63,
                future_float=1.5,
                memory=[cls("ContainerMemory")(memory_type="memory", size=1 << 30)],
                containers=[
                    cls("ContainerResources")(
                        name="c",
                        devices=[
                            cls("ContainerDevices")(
                                resource_name="nvidia.com/gpu", device_ids=["GPU-a"]
                            )
                        ],
                    )
                ],
            )
        ]
    ).SerializeToString()
    older = pb.kubelet.ListPodResourcesResponse.FromString(answer)  # as protobuf sees them
    assert older.pod_resources[0].name == "p" and sorted(unknown(older)) == [4, 5, 6, 7]
    assert podresources.parse_list(answer, GPUS) == [(Pod("ns", "p", ("c",)), ("GPU-a",))]


def test_a_list_in_two_pieces_is_both_pieces(pb):
    k = pb.kubelet

    def one(name, device):
        return k.ListPodResourcesResponse(
            pod_resources=[
                k.PodResources(
                    name=name,
                    namespace="ml",
                    containers=[
                        k.ContainerResources(
                            name="c",
                            devices=[
                                k.ContainerDevices(
                                    resource_name="nvidia.com/gpu", device_ids=[device]
                                )
                            ],
                        )
                    ],
                )
            ]
        )

    data = one("a", "GPU-a").SerializeToString() + one("b", "GPU-b").SerializeToString()
    merged = k.ListPodResourcesResponse.FromString(data)
    assert [p.name for p in merged.pod_resources] == ["a", "b"]
    assert podresources.parse_list(data, GPUS) == [
        (Pod("ml", "a", ("c",)), ("GPU-a",)),
        (Pod("ml", "b", ("c",)), ("GPU-b",)),
    ]


def test_empty_messages(pb):
    k = pb.kubelet
    assert podresources.parse_list(k.ListPodResourcesResponse().SerializeToString(), GPUS) == []
    empty = k.ListPodResourcesResponse(
        pod_resources=[
            k.PodResources(),
            k.PodResources(name="p", containers=[k.ContainerResources()]),
        ]
    )
    assert podresources.parse_list(empty.SerializeToString(), GPUS) == []
    assert podresources.decode(None, GPUS, ()) == ({}, set())


# -- the kubelet: what stands in for it -> real protobuf ----------------------------------------


def test_the_tests_kubelet_answers_what_protobuf_reads(pb, tmp_path):
    k = pb.kubelet
    method = k.DESCRIPTOR.services_by_name["PodResourcesLister"].methods_by_name["List"]
    assert f"/{method.containing_service.full_name}/{method.name}" == podresources.LIST
    assert KUBELET_LIST == podresources.LIST
    assert method.input_type.full_name == "v1.ListPodResourcesRequest"
    # The request Patroller sends is an empty ListPodResourcesRequest.
    assert k.ListPodResourcesRequest().SerializeToString() == b""
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    caller = UnixCaller(kubelet.path, 10.0, Config.grpc_max_message)
    try:
        kubelet.pods = [
            gpu_pod("ml", "train-0", "GPU-a", "GPU-b::1", container="trainer"),
            pod(
                "ns",
                "two",
                [
                    ("x", [("nvidia.com/mig-1g.10gb", ["MIG-c"]), ("example.com/nic", ["nic0"])]),
                    ("y", []),
                ],
            ),
        ]
        answer = podresources.ask(caller)
    finally:
        caller.close()
        kubelet.stop()
    parsed = k.ListPodResourcesResponse.FromString(answer)
    first, second = parsed.pod_resources
    assert (first.name, first.namespace, [c.name for c in first.containers]) == (
        "train-0",
        "ml",
        ["trainer"],
    )
    trainer = first.containers[0]
    assert [(d.resource_name, list(d.device_ids)) for d in trainer.devices] == [
        ("nvidia.com/gpu", ["GPU-a", "GPU-b::1"])
    ]
    assert [n.ID for n in trainer.devices[0].topology.nodes] == [0]
    assert list(trainer.cpu_ids) == [2, 3]  # packed, as protobuf writes a repeated int64
    assert (second.name, second.namespace) == ("two", "ns")
    assert [
        (c.name, [(d.resource_name, list(d.device_ids)) for d in c.devices])
        for c in second.containers
    ] == [("x", [("nvidia.com/mig-1g.10gb", ["MIG-c"]), ("example.com/nic", ["nic0"])]), ("y", [])]
    assert podresources.parse_list(answer, GPUS) == [
        (Pod("ml", "train-0", ("trainer",)), ("GPU-a", "GPU-b::1")),
        (Pod("ns", "two", ("x",)), ("MIG-c",)),
    ]
    assert unknown(parsed) == []  # every field of it is one the .proto has


# -- containerd: real protobuf -> Patroller ---------------------------------------------------


def spec_any(annotations=None, raw=None):
    """An OCI spec as containerd keeps it in a Container: JSON in a google.protobuf.Any."""
    value = (
        raw
        if raw is not None
        else json.dumps({"ociVersion": "1.2.0", "annotations": annotations or {}}).encode()
    )
    return any_pb2.Any(type_url=SPEC_URL, value=value)


def a_container(pb, cid, labels, annotations=None):
    """A Container with every field set, most of which Patroller does not read."""
    c = pb.containerd
    options = any_pb2.Any(type_url="x/runc.Options", value=b"\x08\x01")
    return c.Container(
        id=cid,
        labels=labels,
        image="docker.io/library/python:3.12",
        runtime=c.Container.Runtime(name="io.containerd.runc.v2", options=options),
        spec=spec_any(annotations),
        snapshotter="overlayfs",
        snapshot_key=cid,
        created_at={"seconds": 1_700_000_000, "nanos": 5},
        updated_at={"seconds": 1_700_000_001},
        extensions={"ext": any_pb2.Any(type_url="x/y", value=b"\x0a\x01z")},
        sandbox="s" * 64,
    )


POD = {
    "io.kubernetes.pod.namespace": "ml",
    "io.kubernetes.pod.name": "train-0",
    "io.kubernetes.pod.uid": UID,
    "io.kubernetes.container.name": "trainer",
    "io.cri-containerd.kind": "container",
}
SANDBOX = {
    "io.kubernetes.pod.namespace": "ml",
    "io.kubernetes.pod.name": "train-0",
    "io.kubernetes.pod.uid": UID,
    "io.cri-containerd.kind": "sandbox",
    "patroller/user": "alice",
}


def test_a_container_built_by_protobuf_reads_to_its_labels_and_annotations(pb):
    c = pb.containerd
    got = c.GetContainerResponse(
        container=a_container(
            pb, "c" * 64, {**POD, "é": "ü"}, {"io.kubernetes.cri.sandbox-id": "s" * 64}
        )
    )
    found = ctrd.read_get(got.SerializeToString())
    assert found == ctrd.CtrContainer(
        "c" * 64,
        {**POD, "é": "ü"},
        {"io.kubernetes.cri.sandbox-id": "s" * 64},
        "docker.io/library/python:3.12",
    )
    listed = c.ListContainersResponse(
        containers=[
            a_container(pb, "s" * 64, SANDBOX, {"user.email": "Alice@Example.org"}),
            c.Container(id="b" * 64),
        ]
    ).SerializeToString()
    sandbox, bare = ctrd.read_list(listed)
    assert (sandbox.id, sandbox.labels, sandbox.annotations) == (
        "s" * 64,
        SANDBOX,
        {"user.email": "Alice@Example.org"},
    )
    assert (bare.id, bare.labels, bare.annotations, bare.image) == ("b" * 64, {}, {}, "")
    # The identity the resolver makes of them: the pod's, its user from the sandbox's label.
    identity = containerd_identity(
        ctrd.Found("k8s.io", found, sandbox),
        ContainerRef("containerd", "c" * 64, pod=UID),
        ("patroller/user",),
        Config.user_labels,
        (),
    )
    assert identity.user == "alice" and identity.source == "pod"
    assert dict(identity.pod) == {
        "namespace": "ml",
        "name": "train-0",
        "uid": UID,
        "container": "trainer",
    }


def test_a_newer_containerds_fields_are_skipped(pb):
    cls = newer(
        pb.containerd,
        "Container",
        ("future", 12, F.LABEL_OPTIONAL, F.TYPE_MESSAGE, ".google.protobuf.Any"),
        ("future_fixed", 13, F.LABEL_OPTIONAL, F.TYPE_FIXED32, ""),
        ("future_ids", 14, F.LABEL_REPEATED, F.TYPE_UINT64, ""),
    )
    container = cls("Container")(
        id="c" * 64,
        labels={"a": "1"},
        future_fixed=7,
        future_ids=[1, 2**64 - 1],
        future={"type_url": "x", "value": b"y"},
    )
    data = cls("GetContainerResponse")(container=container).SerializeToString()
    assert ctrd.read_get(data) == ctrd.CtrContainer("c" * 64, {"a": "1"})


def test_empty_containerd_messages(pb):
    c = pb.containerd
    assert ctrd.read_list(c.ListContainersResponse().SerializeToString()) == []
    assert not c.GetContainerResponse.FromString(b"").HasField("container")
    with pytest.raises(WireError, match="without a container"):
        ctrd.read_get(c.GetContainerResponse().SerializeToString())
    # A container with nothing set: protobuf sees one, with no id; Patroller refuses it.
    data = c.GetContainerResponse(container=c.Container()).SerializeToString()
    assert c.GetContainerResponse.FromString(data).HasField("container")
    with pytest.raises(WireError, match="without an id"):
        ctrd.read_get(data)
    bare = c.Container(id="c" * 64, spec=any_pb2.Any())  # an empty spec: no annotations
    assert ctrd.read_get(
        c.GetContainerResponse(container=bare).SerializeToString()
    ) == ctrd.CtrContainer("c" * 64, {})


# -- a message in pieces: protobuf merges a singular embedded message --------------------------


def test_a_container_in_two_pieces_is_merged_as_protobuf_merges_it(pb):
    c = pb.containerd
    # The first piece has the id, some labels and the spec's value; the second more labels
    # (one of them again, with another value), the image and the spec's type URL only.
    first = c.GetContainerResponse(
        container=c.Container(
            id="c" * 64,
            labels={"a": "1", "same": "old"},
            spec=any_pb2.Any(value=json.dumps({"annotations": {"x": "y"}}).encode()),
        )
    )
    second = c.GetContainerResponse(
        container=c.Container(
            labels={"b": "2", "same": "new"},
            image="example/image:2",
            spec=any_pb2.Any(type_url=SPEC_URL),
        )
    )
    data = first.SerializeToString() + second.SerializeToString()
    merged = c.GetContainerResponse.FromString(data).container
    assert (merged.id, dict(merged.labels), merged.image, merged.spec.type_url) == (
        "c" * 64,
        {"a": "1", "b": "2", "same": "new"},
        "example/image:2",
        SPEC_URL,
    )
    assert json.loads(merged.spec.value) == {"annotations": {"x": "y"}}
    assert ctrd.read_get(data) == ctrd.CtrContainer(
        "c" * 64, {"a": "1", "b": "2", "same": "new"}, {"x": "y"}, "example/image:2"
    )


def test_a_scalar_given_twice_is_the_last_and_a_spec_given_twice_is_merged(pb):
    c = pb.containerd
    one = c.Container(
        id="a" * 64,
        image="one",
        spec=spec_any(raw=json.dumps({"annotations": {"k": "1"}}).encode()),
    )
    two = c.Container(id="b" * 64, image="two", spec=any_pb2.Any(type_url=SPEC_URL))
    three = c.Container(spec=any_pb2.Any(value=json.dumps({"annotations": {"k": "3"}}).encode()))
    data = b"".join(
        c.GetContainerResponse(container=m).SerializeToString() for m in (one, two, three)
    )
    merged = c.GetContainerResponse.FromString(data).container
    assert (merged.id, merged.image) == ("b" * 64, "two")
    assert ctrd.read_get(data) == ctrd.CtrContainer("b" * 64, {}, {"k": "3"}, "two")


def test_containers_listed_in_two_pieces_are_all_there(pb):
    c = pb.containerd
    data = (
        c.ListContainersResponse(containers=[c.Container(id="a" * 64)]).SerializeToString()
        + c.ListContainersResponse(containers=[c.Container(id="b" * 64)]).SerializeToString()
    )
    assert [x.id for x in c.ListContainersResponse.FromString(data).containers] == [
        "a" * 64,
        "b" * 64,
    ]
    assert [x.id for x in ctrd.read_list(data)] == ["a" * 64, "b" * 64]


# -- containerd: what Patroller and the tests write -> real protobuf ----------------------------


def test_patrollers_requests_are_what_containerds_proto_says(pb):
    c = pb.containerd
    service = c.DESCRIPTOR.services_by_name["Containers"]
    paths = {name: f"/{service.full_name}/{name}" for name in ("Get", "List")}
    assert (paths["Get"], paths["List"]) == (ctrd.GET, ctrd.LIST)
    assert service.methods_by_name["Get"].input_type.full_name.endswith("GetContainerRequest")
    assert c.GetContainerRequest.FromString(ctrd.get_request("c" * 64)).id == "c" * 64
    uid = str(uuid.uuid4())
    request = c.ListContainersRequest.FromString(
        ctrd.list_request([ctrd.sandbox_filter(uid), "labels.a==b"])
    )
    assert list(request.filters) == [ctrd.sandbox_filter(uid), "labels.a==b"]
    assert ctrd.list_request([]) == c.ListContainersRequest().SerializeToString() == b""
    assert ctrd.get_request("x") == c.GetContainerRequest(id="x").SerializeToString()


def test_the_tests_containers_are_what_containerds_proto_says(pb):
    c = pb.containerd
    spec = {"ociVersion": "1.0.2", "annotations": {"x": "y"}}
    data = container_message("c" * 64, {"a": "1", "é": "ü"}, spec)
    container = c.Container.FromString(data)
    assert (container.id, dict(container.labels), container.image) == (
        "c" * 64,
        {"a": "1", "é": "ü"},
        "example/image:1",
    )
    assert container.runtime.name == "io.containerd.runc.v2"
    assert (container.spec.type_url, json.loads(container.spec.value)) == (SPEC_URL, spec)
    assert (container.created_at.seconds, container.created_at.nanos) == (1_700_000_000, 5)
    assert unknown(container) == []  # every field of it is one the .proto has
