"""The device inventory: what GPUs the host has, in nvidia-smi index order.

The inventory changes when the host's GPUs do (one falls off the bus, one is added): `update`
takes a fresh discovery. A device that is gone stays known, marked lost, so that /status shows
it and nothing is ever granted on it; the others may be renumbered (nvidia-smi's index is the
position in PCI order among the GPUs present).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

_MIB = re.compile(r"\s*(\d+)\s*MiB\s*$")


@dataclass(frozen=True)
class MigInstance:
    """A MIG instance of a GPU (a GPU instance and a compute instance in it), as
    `nvidia-smi -q -x` lists it, with the uuid `nvidia-smi -L` gives it (`-q -x` has none).
    Each field is None where the driver printed no number (no uuid: `-L` was not read, failed,
    or did not list it)."""

    index: int | None  # the MIG device's index within its GPU
    gpu_instance_id: int | None  # the two instance ids: what processes on it carry in -q -x
    compute_instance_id: int | None
    memory_mib: int | None  # its share of the framebuffer
    uuid: str | None = None  # `MIG-<uuid>` (R470 on) or `MIG-GPU-<uuid>/<gi>/<ci>` (before)

    def info(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "gpu_instance_id": self.gpu_instance_id,
            "compute_instance_id": self.compute_instance_id,
            "memory_mib": self.memory_mib,
            "uuid": self.uuid,
        }


@dataclass(frozen=True)
class Device:
    """One reservable device, as discovered at start."""

    uuid: str
    number: int  # nvidia-smi's index: PCI bus order, what dmon/pmon print and `-i` takes
    name: str | None = None
    brand: str | None = None
    arch: str | None = None
    pci_address: str | None = None
    total_mem: str | None = None
    group: str = "gpu"
    minor_number: int | None = None  # the N of /dev/nvidiaN: a different numbering
    mig_mode: str | None = None
    mig_instances: tuple[MigInstance, ...] = field(default=())
    lost: bool = False  # gone from the host (fell off the bus, removed): never granted

    @property
    def memory_mib(self) -> int | None:
        """Total memory in MiB, from `total_mem` ("81920 MiB"), or None."""
        found = _MIB.match(self.total_mem or "")
        return int(found.group(1)) if found else None

    @property
    def mig(self) -> bool:
        """Whether MIG is enabled: its processes are not attributed by pmon."""
        return (self.mig_mode or "").strip().lower() == "enabled"

    def info(self) -> dict[str, Any]:
        """The inventory entry served by /devices and inside grants."""
        return {
            "name": self.name,
            "brand": self.brand,
            "arch": self.arch,
            "number": self.number,
            "pci_address": self.pci_address,
            "total_mem": self.total_mem,
            "group": self.group,
            "minor_number": self.minor_number,
            "mig_mode": self.mig_mode,
            "mig_instances": [m.info() for m in self.mig_instances],
            "lost": self.lost,
        }


@dataclass(frozen=True)
class InventoryChange:
    """What `Inventory.update` changed, by uuid."""

    added: tuple[str, ...] = ()  # new devices, and lost ones that came back
    lost: tuple[str, ...] = ()
    renumbered: tuple[str, ...] = ()  # present before and after, with another index
    updated: tuple[str, ...] = ()  # other facts changed (MIG mode, instances, memory)

    def __bool__(self) -> bool:
        return bool(self.added or self.lost or self.renumbered or self.updated)


class Inventory:
    """The devices the host has (present, in index order), then those it lost, with lookups by
    uuid (every device) and number (devices present only), and the count of each group."""

    def __init__(self, devices: Sequence[Device]) -> None:
        self._set(devices)

    def _set(self, devices: Sequence[Device]) -> None:
        present = sorted((d for d in devices if not d.lost), key=lambda d: d.number)
        self.devices = tuple(present + [d for d in devices if d.lost])
        self._by_uuid = {d.uuid: d for d in self.devices}
        self._by_number = {d.number: d for d in present}
        if len(self._by_uuid) != len(self.devices):
            raise ValueError("device uuids must be unique")
        if len(self._by_number) != len(present):
            raise ValueError("device numbers must be unique")
        self.groups: dict[str, int] = {}
        for device in present:
            self.groups[device.group] = self.groups.get(device.group, 0) + 1

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def present(self) -> list[Device]:
        """The devices the host has now, in index order."""
        return [d for d in self.devices if not d.lost]

    def get(self, uuid: str) -> Device | None:
        """The device with this uuid (present or lost), or None."""
        return self._by_uuid.get(uuid)

    def by_number(self, number: int) -> Device | None:
        """The present device with this nvidia-smi index, or None."""
        return self._by_number.get(number)

    def update(self, found: Sequence[Device]) -> InventoryChange:
        """Take a fresh discovery: new devices join, missing ones are lost, numbers follow."""
        fresh = {d.uuid: d for d in found}
        added, lost, renumbered, updated = [], [], [], []
        devices: list[Device] = []
        for old in self.devices:
            new = fresh.pop(old.uuid, None)
            if new is None:
                if not old.lost:
                    lost.append(old.uuid)
                devices.append(old if old.lost else replace(old, lost=True))
                continue
            if old.lost:
                added.append(old.uuid)
            elif new.number != old.number:
                renumbered.append(old.uuid)
            elif new != old:
                updated.append(old.uuid)
            devices.append(new)
        for new in found:
            if new.uuid in fresh:
                added.append(new.uuid)
                devices.append(new)
        self._set(devices)
        return InventoryChange(tuple(added), tuple(lost), tuple(renumbered), tuple(updated))
