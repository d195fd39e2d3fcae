"""The kubelet's pod-resources: which pods each GPU is assigned to, asked of the kubelet's
socket (`--kubelet-socket`, by default /var/lib/kubelet/pod-resources/kubelet.sock).

`/v1.PodResourcesLister/List` answers every pod of the node with the devices each container was
given, by resource name. Only GPU resources count (Config.kubelet_resources: `nvidia.com/gpu`,
the NVIDIA device plugin's MIG resources `nvidia.com/mig-<profile>` of its mixed strategy, and
time-slicing's renamed `<resource>.shared`). Device ids map to the host's GPUs:

  GPU-<uuid>             the GPU itself (the device plugin's ids are uuids);
  <id>::<n>              a time-slicing replica of <id>: that GPU (several pods may share it);
  MIG-<uuid>             a MIG device (R470 and later): the GPU that holds it;
  MIG-GPU-<uuid>/<gi>/<ci>  a MIG device in the form of drivers before R470: its GPU;
  nvidia<N>              /dev/nvidiaN (some device plugins name GPUs so): the GPU of that minor.

`nvidia-smi -q -x` lists no MIG device's uuid: the inventory learns them from `nvidia-smi -L`
(observe/miguuids.py), read with it while a GPU has MIG on. A MIG uuid that `-L` never listed
(it failed, or it has not been read again since the MIG devices were made), like any id that
matches no GPU, is logged once and otherwise ignored.

The watch asks every `kubelet_every` seconds and decodes the answer in an executor (never on
the event loop: an answer may be megabytes, and decoding costs time in proportion to its size),
and tells of every GPU whose pods changed (`scheduler_allocation`, source "kubernetes"). A
socket that is not there (no kubelet on this host) costs a stat: nothing is logged and no GPU
is allocated. One that answers no more (the kubelet restarts, and removes its socket meanwhile;
an answer that is not a well-formed message, or larger than Config.grpc_max_message) keeps the
last allocations known, and the watch is failing until it reads again: a GPU a pod holds is
never handed out because a call failed. Stopping the watch ends a call in flight at once. Pod
names and device ids are the kubelet's to choose: they reach the log escaped (core/text.py).
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import re
from collections.abc import Iterable, Sequence

from patroller.config import Config
from patroller.core.devices import Device, Inventory
from patroller.core.pods import NAME_CHARS, Pod, PodAllocation
from patroller.core.text import printable
from patroller.observe.allocwatch import AllocationWatch
from patroller.observe.grpcunix import GrpcUnavailable, UnixCaller
from patroller.observe.monitor import IDLE, UP
from patroller.observe.protowire import Message, WireError
from patroller.observe.signals import Signals

log = logging.getLogger(__name__)

LIST = "/v1.PodResourcesLister/List"
SOURCE = "kubernetes"  # the lease manager's name of this source (core/leases/sources.py)

# The public api.proto (k8s.io/kubelet/pkg/apis/podresources/v1): field numbers.
RESPONSE_PODS = 1  # ListPodResourcesResponse.pod_resources (repeated PodResources)
POD_NAME, POD_NAMESPACE, POD_CONTAINERS = 1, 2, 3  # PodResources
CONTAINER_NAME, CONTAINER_DEVICES = 1, 2  # ContainerResources
DEVICE_RESOURCE, DEVICE_IDS = 1, 2  # ContainerDevices

_OLD_MIG = re.compile(r"^MIG-(GPU-[0-9A-Fa-f-]+)/[0-9]+/[0-9]+$")
_MINOR = re.compile(r"^nvidia([0-9]{1,9})$")  # more digits are no minor (nor an int() to make)

Listed = list[tuple[Pod, tuple[str, ...]]]  # each pod with a GPU, and its GPU device ids


def is_gpu(resource: str, patterns: Sequence[str]) -> bool:
    """Whether a resource name is one of the GPU resources (shell patterns)."""
    return any(fnmatch.fnmatchcase(resource, pattern) for pattern in patterns)


def parse_list(data: bytes, patterns: Sequence[str]) -> Listed:
    """The pods with GPU devices in a ListPodResourcesResponse, each with the containers that
    have them and their device ids, in order, each once. WireError if it is not one."""
    listed: Listed = []
    for pod in Message(data).messages(RESPONSE_PODS):
        containers: list[str] = []
        ids: dict[str, None] = {}
        for container in pod.messages(POD_CONTAINERS):
            found = [
                i
                for device in container.messages(CONTAINER_DEVICES)
                if is_gpu(device.text(DEVICE_RESOURCE), patterns)
                for i in device.texts(DEVICE_IDS)
            ]
            if found:
                containers.append(_name(container.text(CONTAINER_NAME)))
                ids.update(dict.fromkeys(found))
        if ids:
            listed.append(
                (
                    Pod(
                        _name(pod.text(POD_NAMESPACE)),
                        _name(pod.text(POD_NAME)),
                        tuple(containers),
                    ),
                    tuple(ids),
                )
            )
    return listed


def _name(text: str) -> str:
    """A name as the kubelet gave it, printable (a name Kubernetes allows is left as it is)."""
    return printable(text, NAME_CHARS)


Index = tuple[dict[str, str], dict[int, str]]  # GPU and MIG uuids, and minor numbers -> uuid


def index(devices: Iterable[Device]) -> Index:
    """What device ids can name each present GPU: its uuid, its MIG devices', its minor."""
    uuids: dict[str, str] = {}
    minors: dict[int, str] = {}
    for device in devices:
        if device.lost:
            continue
        uuids.setdefault(device.uuid, device.uuid)
        if device.minor_number is not None:
            minors.setdefault(device.minor_number, device.uuid)
        for mig in device.mig_instances:
            if mig.uuid:
                uuids.setdefault(mig.uuid, device.uuid)
    return uuids, minors


def gpu_of(device_id: str, devices: Iterable[Device], known: Index | None = None) -> str | None:
    """The uuid of the host's GPU a device id names (see above), or None (`known`: the
    devices' index, made once for many ids)."""
    uuids, minors = known if known is not None else index(devices)
    base = device_id.split("::", 1)[0]  # a time-slicing replica: its GPU (or MIG device)
    old = _OLD_MIG.match(base)
    if old:
        base = old.group(1)
    minor = _MINOR.match(base)
    if minor:
        return minors.get(int(minor.group(1)))
    return uuids.get(base)


def allocations(
    listed: Listed, devices: Iterable[Device]
) -> tuple[dict[str, PodAllocation], set[str]]:
    """The pods of each GPU (by uuid), and the device ids that match no GPU. Linear in the
    pods and ids (a pod once per GPU through a dict, not a search of a list)."""
    known = index(devices)
    pods: dict[str, dict[Pod, None]] = {}
    unknown: set[str] = set()
    for pod, ids in listed:
        for device_id in ids:
            uuid = gpu_of(device_id, (), known)
            if uuid is None:
                unknown.add(device_id)
            else:
                pods.setdefault(uuid, {})[pod] = None
    return {uuid: PodAllocation(tuple(found)) for uuid, found in pods.items()}, unknown


Decoded = tuple[dict[str, PodAllocation], set[str]]


def decode(answer: bytes | None, patterns: Sequence[str], devices: Sequence[Device]) -> Decoded:
    """Blocking (in the executor): the pods of each GPU the answer lists, and the device ids
    that match none. WireError if it is no ListPodResourcesResponse."""
    return allocations([] if answer is None else parse_list(answer, patterns), devices)


def ask(caller: UnixCaller) -> bytes | None:
    """Blocking: the kubelet's encoded answer, or None when its socket is not there.
    GrpcUnavailable if it does not answer."""
    if not os.path.exists(caller.path):
        return None
    return caller.call(LIST, b"")


class PodResourcesWatch(AllocationWatch):
    """Asks the kubelet and tells of each GPU whose pods changed (see above)."""

    name = "kubelet_pod_resources"
    source = SOURCE

    def __init__(self, inventory: Inventory, signals: Signals, config: Config) -> None:
        assert config.kubelet_socket is not None
        super().__init__(
            inventory, signals, config.kubelet_every, "the kubelet's pod-resources", state=IDLE
        )
        self.caller = UnixCaller(
            config.kubelet_socket, config.kubelet_timeout, config.grpc_max_message
        )
        self.patterns = config.kubelet_resources
        self.ids_logged = config.kubelet_ids_logged
        self._seen = False  # the socket was there once: its going away is a failure
        self._unknown: set[str] = set()  # device ids that match no GPU: told once

    async def stop(self, grace: float) -> None:
        self.caller.close()  # a call in flight ends now, not at its timeout
        await super().stop(grace)

    def apply(self, wanted: dict[str, PodAllocation], unknown: set[str]) -> None:
        """Tell of every GPU whose pods are not what was last told; log the new ids that match
        no GPU (so many one by one at most, then their count)."""
        new = sorted(unknown - self._unknown)
        for device_id in new[: self.ids_logged]:
            log.warning(
                "the kubelet assigns device %s, which is no GPU of this host that "
                "Patroller can tell: ignored (a MIG device nvidia-smi -L did not list, "
                "or another host's?)",
                printable(device_id),
            )
        if len(new) > self.ids_logged:
            log.warning(
                "the kubelet assigns %d more devices that are no GPU of this host: ignored",
                len(new) - self.ids_logged,
            )
        self._unknown = unknown  # one that comes back after it went is told again
        self.tell(wanted)

    async def read(self) -> None:
        """Ask the kubelet now, and tell of what changed."""
        loop = asyncio.get_running_loop()
        devices = self.inventory.devices  # as they are now: the inventory may change meanwhile
        try:
            answer = await loop.run_in_executor(None, ask, self.caller)
            if answer is None and self._seen:
                raise GrpcUnavailable(f"{self.caller.path} is gone")
            wanted, unknown = await loop.run_in_executor(
                None, decode, answer, self.patterns, devices
            )
        except (GrpcUnavailable, WireError) as exc:
            if not self.caller.closed:  # closed: the watch is stopping, nothing failed
                self.failed(exc)
            return
        self._seen = self._seen or answer is not None
        self.read_well(UP if answer is not None else IDLE)
        self.apply(wanted, unknown)
