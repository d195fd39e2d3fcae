"""Pure parsing of `nvidia-smi -L`: the GPUs and their uuids, and under each GPU in MIG mode its
MIG devices with their uuids, which `-q -x` does not print. One line each:

  GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-7fdaf0a5-...)
    MIG 1g.10gb     Device  0: (UUID: MIG-feb88891-0321-5fef-...)       R470 and later
    MIG 1g.5gb Device 0: (UUID: MIG-GPU-5c89852c-.../7/0)               R450 to R465

Older drivers print `GPU 0: Tesla P100-PCIE-16GB (UUID: GPU-...)` and no MIG line. The spacing
differs between drivers, so lines are matched on their words, not their columns. A line that is
neither (damaged, cut short, a MIG device before any GPU or naming another GPU, an index seen
twice) is skipped and counted, never fatal; after a line that is no MIG device's, the MIG lines
that follow belong to no GPU until the next GPU line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from patroller.core.devices import Device

_GPU = re.compile(r"GPU\s+(\d+)\s*:\s*(.*?)\s*\(\s*UUID\s*:\s*(GPU-[0-9A-Za-z-]+)\s*\)")
_MIG = re.compile(r"MIG\s+(.*?)\s*Device\s+(\d+)\s*:\s*\(\s*UUID\s*:\s*(MIG-[0-9A-Za-z/-]+)\s*\)")
_OLD_MIG = re.compile(r"MIG-(GPU-[0-9A-Za-z-]+)/(\d+)/(\d+)")  # R450-R465: GPU, GI and CI
# Control characters (a tab aside) and an echoed `^C`: a line damaged by a terminal or a pipe.
_DAMAGE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]|\^C")


class ListedMig(NamedTuple):
    """A MIG device as `nvidia-smi -L` lists it under its GPU."""

    # `Device  N`: the MIG device's index within its GPU, as -q -x numbers it (it hides
    # tuple.index, which nothing calls on it)
    index: int  # type: ignore[assignment]
    uuid: str  # `MIG-<uuid>`, or `MIG-GPU-<gpu uuid>/<gi>/<ci>` from drivers before R470
    profile: str | None  # `1g.10gb`, `1g.10gb+me`, `1c.3g.20gb`, ...
    gpu_instance_id: int | None = None  # only where the uuid carries them (the old form)
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class GpuListing:
    """What `nvidia-smi -L` says: the GPUs' uuids in order, the MIG devices of each (by the
    GPU's uuid, in listed order; a GPU without MIG devices has no entry), the lines skipped."""

    gpus: tuple[str, ...] = ()
    mig: dict[str, tuple[ListedMig, ...]] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()


def parse_list_gpus(text: str) -> GpuListing:
    """The GPUs and MIG devices of `nvidia-smi -L`. Never raises."""
    gpus: list[str] = []
    mig: dict[str, dict[int, ListedMig]] = {}
    skipped: list[str] = []
    current: str | None = None  # the uuid of the GPU the MIG lines that follow belong to
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        gpu = _GPU.fullmatch(line) if not _DAMAGE.search(line) else None
        if gpu is None and not line.startswith("MIG"):
            current = None  # an unreadable GPU line: the MIG lines after it are not its
            skipped.append(line)
            continue
        if gpu is not None:
            current = gpu.group(3) if gpu.group(3) not in gpus else None
            if current is None:
                skipped.append(line)  # a GPU listed twice: its MIG lines are not trusted
            else:
                gpus.append(current)
            continue
        listed = _mig_line(line, current)
        if listed is None or listed.index in mig.get(str(current), {}):
            skipped.append(line)
            continue
        mig.setdefault(str(current), {})[listed.index] = listed
    return GpuListing(
        tuple(gpus), {uuid: tuple(found.values()) for uuid, found in mig.items()}, tuple(skipped)
    )


def _mig_line(line: str, gpu: str | None) -> ListedMig | None:
    """The MIG device a line lists under GPU `gpu`, or None."""
    found = _MIG.fullmatch(line) if gpu is not None and not _DAMAGE.search(line) else None
    if found is None:
        return None
    profile, index, uuid = found.group(1) or None, int(found.group(2)), found.group(3)
    if uuid.startswith("MIG-GPU-"):
        old = _OLD_MIG.fullmatch(uuid)
        if old is None or old.group(1) != gpu:
            return None  # cut short, or another GPU's
        return ListedMig(index, uuid, profile, int(old.group(2)), int(old.group(3)))
    if "/" in uuid:
        return None
    return ListedMig(index, uuid, profile)


def with_mig_uuids(
    devices: Sequence[Device], listed: Mapping[str, Sequence[ListedMig]]
) -> list[Device]:
    """The devices, each MIG instance given the uuid `-L` lists for it: by its GPU and its
    index; a uuid of the old form must also carry the instance's GPU and compute instance ids.
    An instance that `-L` does not list has none."""
    out = []
    for device in devices:
        if not device.mig_instances:
            out.append(device)
            continue
        by_index = {m.index: m for m in listed.get(device.uuid, ())}
        instances = []
        for instance in device.mig_instances:
            match = by_index.get(instance.index) if instance.index is not None else None
            if (
                match is not None
                and match.gpu_instance_id is not None
                and (
                    (match.gpu_instance_id, match.compute_instance_id)
                    != (instance.gpu_instance_id, instance.compute_instance_id)
                )
            ):
                match = None
            instances.append(replace(instance, uuid=match.uuid if match else None))
        out.append(replace(device, mig_instances=tuple(instances)))
    return out
