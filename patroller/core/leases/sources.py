"""The allocations each scheduler's source tells of, kept apart: Slurm's job map and the
kubelet's pod-resources may both run on one node, and neither ever clears the other's.

Each source tells of its own devices (a device it no longer lists: None); the allocation a hold
follows is the first source's, in SOURCES order, that lists the device. Slurm comes first: a
GPU a Slurm job holds is never taken from it because the kubelet lists it too (the job's
processes would become trespassers on their own GPU); the pods' processes there trespass, and
the clash is logged, once, until one of them lets go. When Slurm lets go, the pods hold it.
"""

from __future__ import annotations

import logging

from patroller.core.scheduled import SchedulerAllocation

log = logging.getLogger(__name__)

SOURCES = ("slurm", "kubernetes")  # which holds a device both list: the first


class Sources:
    """Per source, the allocation of every device it lists."""

    def __init__(self) -> None:
        self._by: dict[str, dict[str, SchedulerAllocation]] = {source: {} for source in SOURCES}
        self._clashes: set[str] = set()  # devices both list: logged once

    def tell(
        self, source: str, uuid: str, allocation: SchedulerAllocation | None
    ) -> SchedulerAllocation | None:
        """`source` says `uuid` is allocated so (None: not by it); the allocation that holds."""
        if source not in self._by:
            raise ValueError(f"no such allocation source: {source!r}")
        if allocation is None:
            self._by[source].pop(uuid, None)
        else:
            self._by[source][uuid] = allocation
        listed = [s for s in SOURCES if uuid in self._by[s]]
        if len(listed) > 1 and uuid not in self._clashes:
            first = self._by[listed[0]][uuid]
            others = ", ".join(
                f"{self._by[s][uuid].scheduler} {self._by[s][uuid].describe()}" for s in listed[1:]
            )
            log.warning(
                "%s is allocated both to %s %s and to %s: %s holds it",
                uuid,
                first.scheduler,
                first.describe(),
                others,
                first.scheduler,
            )
            self._clashes.add(uuid)
        elif len(listed) < 2:
            self._clashes.discard(uuid)
        return self._by[listed[0]][uuid] if listed else None
