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

The watch asks every `kubelet_every` seconds, in an executor (never on the event loop), and
tells of every GPU whose pods changed (`job_allocation`, source "kubernetes"). A socket that is
not there (no kubelet on this host) costs a stat: nothing is logged and no GPU is allocated.
One that answers no more (the kubelet restarts, and removes its socket meanwhile; an answer that
is not a well-formed message) keeps the last allocations known, and the watch is failing until
it reads again: a GPU a pod holds is never handed out because a call failed.
"""
from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.core.pods import Pod, PodAllocation
from patroller.core.protowire import Message, WireError
from patroller.observe.allocwatch import AllocationWatch
from patroller.observe.grpcunix import GrpcUnavailable, UnixCaller
from patroller.observe.monitor import IDLE, UP
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
_MINOR = re.compile(r"^nvidia([0-9]+)$")

Listed = List[Tuple[Pod, Tuple[str, ...]]]  # each pod with a GPU, and its GPU device ids


def is_gpu(resource: str, patterns: Sequence[str]) -> bool:
    """Whether a resource name is one of the GPU resources (shell patterns)."""
    return any(fnmatch.fnmatchcase(resource, pattern) for pattern in patterns)


def parse_list(data: bytes, patterns: Sequence[str]) -> Listed:
    """The pods with GPU devices in a ListPodResourcesResponse, each with the containers that
    have them and their device ids, in order, each once. WireError if it is not one."""
    listed: Listed = []
    for pod in Message(data).messages(RESPONSE_PODS):
        containers: List[str] = []
        ids: Dict[str, None] = {}
        for container in pod.messages(POD_CONTAINERS):
            found = [i for device in container.messages(CONTAINER_DEVICES)
                     if is_gpu(device.text(DEVICE_RESOURCE), patterns)
                     for i in device.texts(DEVICE_IDS)]
            if found:
                containers.append(container.text(CONTAINER_NAME))
                ids.update(dict.fromkeys(found))
        if ids:
            listed.append((Pod(pod.text(POD_NAMESPACE), pod.text(POD_NAME), tuple(containers)),
                           tuple(ids)))
    return listed


def gpu_of(device_id: str, inventory: Inventory) -> Optional[str]:
    """The uuid of the host's GPU a device id names (see above), or None."""
    base = device_id.split("::", 1)[0]  # a time-slicing replica: its GPU (or MIG device)
    old = _OLD_MIG.match(base)
    if old:
        base = old.group(1)
    minor = _MINOR.match(base)
    mig = base.startswith("MIG-")
    for device in inventory:
        if device.lost:
            continue
        if device.uuid == base or minor and device.minor_number == int(minor.group(1)):
            return device.uuid
        if mig and any(m.uuid == base for m in device.mig_instances):
            return device.uuid
    return None


def allocations(listed: Listed, inventory: Inventory) -> Tuple[Dict[str, PodAllocation], Set[str]]:
    """The pods of each GPU (by uuid), and the device ids that match no GPU."""
    pods: Dict[str, List[Pod]] = {}
    unknown: Set[str] = set()
    for pod, ids in listed:
        for device_id in ids:
            uuid = gpu_of(device_id, inventory)
            if uuid is None:
                unknown.add(device_id)
            elif pod not in pods.setdefault(uuid, []):
                pods[uuid].append(pod)
    return {uuid: PodAllocation(tuple(found)) for uuid, found in pods.items()}, unknown


def ask(caller: UnixCaller) -> Optional[bytes]:
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
        super().__init__(inventory, signals, config.kubelet_every,
                         "the kubelet's pod-resources", state=IDLE)
        self.caller = UnixCaller(config.kubelet_socket, config.kubelet_timeout)
        self.patterns = config.kubelet_resources
        self._seen = False  # the socket was there once: its going away is a failure
        self._unknown: Set[str] = set()  # device ids that match no GPU: told once

    def closed(self) -> None:
        self.caller.close()

    def apply(self, listed: Listed) -> None:
        """Tell of every GPU whose pods are not what was last told."""
        wanted, unknown = allocations(listed, self.inventory)
        for device_id in sorted(unknown - self._unknown):
            log.warning("the kubelet assigns device %s, which is no GPU of this host that "
                        "Patroller can tell: ignored (a MIG device nvidia-smi -L did not list, "
                        "or another host's?)", device_id)
        self._unknown = unknown  # one that comes back after it went is told again
        self.tell(wanted)

    async def read(self) -> None:
        """Ask the kubelet now, and tell of what changed."""
        loop = asyncio.get_running_loop()
        try:
            answer = await loop.run_in_executor(None, ask, self.caller)
            if answer is None and self._seen:
                raise GrpcUnavailable(f"{self.caller.path} is gone")
            listed = [] if answer is None else parse_list(answer, self.patterns)
        except (GrpcUnavailable, WireError) as exc:
            self.failed(exc)
            return
        self._seen = self._seen or answer is not None
        self.read_well(UP if answer is not None else IDLE)
        self.apply(listed)
