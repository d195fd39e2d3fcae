"""The events that monitors emit and the daemon reacts to, as blinker signals.

Each daemon builds its own `Signals` (a private blinker namespace), so that two daemons in
one process (as in tests) never hear each other. Receivers are called on the event loop and
must return quickly.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

import blinker

from patroller.core.scheduled import SchedulerAllocation

Value = float | int | str | None
NOTHING = frozenset([None])  # the figures of a process in an interval without a sample


@dataclass(frozen=True)
class Sample:
    """One statistics row for one device (a dmon line)."""

    uuid: str
    values: Mapping[str, Value]  # stable names: power, gtemp, mtemp, sm, mem, ...; None for '-'
    time: float  # wall clock, seconds since the epoch


@dataclass(frozen=True)
class GpuProcess:
    """A process seen on a device (a pmon row)."""

    uuid: str
    pid: int
    type: str | None = None  # C, G or C+G
    command: str | None = None  # as pmon prints it: cut at 15 characters


@dataclass(frozen=True)
class ProcessList:
    """The process lists of these devices are current: pmon completed an interval over them."""

    uuids: tuple[str, ...]
    time: float  # wall clock, seconds since the epoch


@dataclass(frozen=True)
class ProcessSamples:
    """Figures of processes in one sampling interval, by device: pmon's sm, mem, fb, ... per
    process, or the used memory the compute-apps cross-check lists. The receiver keeps the
    mappings: the sender makes new ones for the next interval."""

    values: Mapping[str, Mapping[int, Mapping[str, Value]]]  # uuid -> pid -> stable names
    time: float  # wall clock, seconds since the epoch
    # the devices whose processes have a figure in it (not `-` in every cell), where the sender
    # counted them as the rows came; None: not counted
    figured: Set[str] | None = None


@dataclass(frozen=True)
class Silence:
    """A device fell silent (`why`), or is heard again (None)."""

    uuid: str
    why: str | None


@dataclass(frozen=True)
class Allocated:
    """A scheduler's source says a device is allocated to these jobs or pods (None: to none of
    its now): the Slurm job map ("slurm"), or the kubelet ("kubernetes")."""

    uuid: str
    allocation: SchedulerAllocation | None
    source: str


class Signals:
    """The signals of one daemon.

    Send with keyword `record`:
      sample.send(monitor, record=Sample(...))
      process_started.send(monitor, record=GpuProcess(...))
      process_ended.send(monitor, record=GpuProcess(...))
      processes_listed.send(monitor, record=ProcessList(...))
      process_sampled.send(monitor, record=ProcessSamples(...))
      device_gone.send(monitor, record="what nvidia-smi said")
      device_silent.send(watch, record=Silence(uuid, why or None))
      inventory_changed.send(watch, record=InventoryChange(...))
      health_read.send(watch, record={uuid: Reading(...)})  # core/health.py
      xid.send(kernel_log, record=XidLine(...))  # observe/xid.py
    """

    def __init__(self) -> None:
        namespace = blinker.Namespace()
        self.sample = namespace.signal("sample", doc="statistics for one device")
        self.process_started = namespace.signal(
            "process-started", doc="a process appeared on a device"
        )
        self.process_ended = namespace.signal("process-ended", doc="a process left a device")
        self.processes_listed = namespace.signal(
            "processes-listed", doc="the process lists of some devices are current"
        )
        self.process_sampled = namespace.signal(
            "process-sampled", doc="figures of some processes in one interval"
        )
        self.device_gone = namespace.signal(
            "device-gone", doc="a stream ended saying a device is gone: read the inventory"
        )
        self.device_silent = namespace.signal(
            "device-silent", doc="a device printed nothing while the others did, or again"
        )
        self.scheduler_allocation = namespace.signal(
            "scheduler-allocation",
            doc="the Slurm job map or the kubelet changed what a device is allocated to",
        )
        self.inventory_changed = namespace.signal(
            "inventory-changed", doc="devices were added, lost, renumbered or changed"
        )
        self.topology_read = namespace.signal(
            "topology-read", doc="`topo -m` was read: how the GPUs are linked (a Topology)"
        )
        self.health_read = namespace.signal(
            "health-read", doc="a reading of -q -x: what it says of each device's health"
        )
        self.xid = namespace.signal("xid", doc="the kernel logged an Xid line")
