"""The device inventory: what GPUs the host has, in nvidia-smi index order."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence


@dataclass(frozen=True)
class Device:
    """One reservable device, as discovered at start."""

    uuid: str
    number: int  # nvidia-smi's index: PCI bus order, what dmon/pmon print and `-i` takes
    name: Optional[str] = None
    brand: Optional[str] = None
    arch: Optional[str] = None
    pci_address: Optional[str] = None
    total_mem: Optional[str] = None
    group: str = "gpu"
    minor_number: Optional[int] = None  # the N of /dev/nvidiaN: a different numbering
    mig_mode: Optional[str] = None

    def info(self) -> Dict[str, Any]:
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
        }


class Inventory:
    """An ordered, immutable set of devices with lookups by uuid, number and group."""

    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices = tuple(devices)
        self._by_uuid = {d.uuid: d for d in self.devices}
        self._by_number = {d.number: d for d in self.devices}
        if len(self._by_uuid) != len(self.devices):
            raise ValueError("device uuids must be unique")
        if len(self._by_number) != len(self.devices):
            raise ValueError("device numbers must be unique")
        self.groups: Dict[str, int] = {}
        for device in self.devices:
            self.groups[device.group] = self.groups.get(device.group, 0) + 1

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def get(self, uuid: str) -> Optional[Device]:
        """The device with this uuid, or None."""
        return self._by_uuid.get(uuid)

    def by_number(self, number: int) -> Optional[Device]:
        """The device with this nvidia-smi index, or None."""
        return self._by_number.get(number)

    def in_group(self, group: str) -> List[Device]:
        """The devices of one group, in device order."""
        return [d for d in self.devices if d.group == group]
