"""Noticing waste: held GPUs that nobody uses.

A device that someone holds (reserved, allocated to a Slurm job, claimed or shared) is idle while
its SM use is at most
the policy's `idle_sm` (%) and its memory used under `idle_memory_mib` (canhazgpu's 1 GiB is the
reference: a loaded model or a CUDA context of a live job uses more), as dmon reports them. A
figure the driver does not print (`-`, MIG) is not taken for idle: nothing is marked idle or
released on a guess. After `idle_after` seconds idle, /status and the metrics say so
(`idle_for`). With `idle_release` set (off by default), a reservation idle that long with no
process on it is released, and the audit record says so with its user (a Slurm job's never:
Slurm ends its jobs).

Each sample updates one timestamp per device: no history is kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from patroller.core.leases import LeaseManager
from patroller.observe.signals import Sample, Signals

log = logging.getLogger(__name__)


class IdleWatch:
    """When each held device became idle, from the samples."""

    def __init__(self, leases: LeaseManager, clock: Callable[[], float] = time.monotonic) -> None:
        self.leases = leases
        self.clock = clock
        self._since: dict[str, tuple[str, float]] = {}  # uuid -> (holder, when it became idle)

    def connect(self, signals: Signals) -> None:
        signals.sample.connect(self._on_sample)

    def _on_sample(self, sender: Any, record: Sample) -> None:
        self.observe(record.uuid, record.values)

    def observe(self, uuid: str, values: Any) -> None:
        """A sample of one device: is it idle, and for how long?"""
        policy = self.leases.policy
        state = self.leases.state(uuid) if self.leases.inventory.get(uuid) else None
        if state not in ("reserved", "allocated", "claimed", "shared"):
            self._since.pop(uuid, None)
            return
        sm, used = _number(values.get("sm")), _number(values.get("fb"))
        quiet = (
            sm is not None
            and sm <= policy.idle_sm
            and used is not None
            and used < policy.idle_memory_mib
        )
        if not quiet:
            self._since.pop(uuid, None)
            return
        now = self.clock()
        holder = self.leases.holder(uuid)
        user = holder.user if holder is not None else ""
        known = self._since.get(uuid)
        if known is None or known[0] != user:  # idle from now, or held by someone else now
            known = self._since[uuid] = (user, now)
        since = known[1]
        if (
            policy.idle_release is not None
            and state == "reserved"
            and now - since >= policy.idle_release
        ) and self.leases.release_idle(uuid, now - since):
            self._since.pop(uuid, None)

    def idle_for(self, uuid: str) -> float | None:
        """Seconds the held device has been idle, once that is at least `idle_after`."""
        idle = self.quiet_for(uuid)
        return (
            round(idle, 3) if idle is not None and idle >= self.leases.policy.idle_after else None
        )

    def quiet_for(self, uuid: str) -> float | None:
        """Seconds the held device has been idle under its holder now, however few."""
        known = self._since.get(uuid)
        holder = self.leases.holder(uuid)
        if known is None or holder is None or known[0] != holder.user:
            return None
        return self.clock() - known[1]


def _number(value: Any) -> float | None:
    return (
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    )
