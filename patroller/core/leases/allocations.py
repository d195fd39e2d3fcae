"""A device's Slurm allocation coming and going (core/jobs.py says what one is).

When the job map lists a device, its jobs hold it: a hold of Patroller's on it ends (Slurm
decides on its node, and its user is told by the audit record's `preempted`), the first job's
user is the holder, no lease runs, and every process on it that is not in the jobs trespasses.
When the map no longer lists it, the hold ends as any other: the processes still there pass it
to the owner of the oldest, or it is free.
"""
from __future__ import annotations

import logging
from typing import Optional

from patroller.core.devices import Device
from patroller.core.jobs import Allocation
from patroller.core.leases.holds import Hold, Notices
from patroller.core.leases.trespass import trespass

log = logging.getLogger(__name__)


def apply(hold: Hold, allocation: Optional[Allocation], device: Optional[Device], now: float,
          notices: Notices) -> None:
    """Make the hold what the allocation says (the caller serves waiters after)."""
    if allocation is None:
        if hold.allocation is not None:
            log.info("%s is no longer allocated to Slurm %s", hold.uuid,
                     hold.allocation.describe())
            notices.event("deallocated", hold.holder.user if hold.holder else None, [device],
                          jobs=list(hold.allocation.ids()))
            hold.end(now)
        return
    if hold.allocation is None and hold.holder is not None:
        log.warning("Slurm allocated %s to %s: the hold of %s on it ends", hold.uuid,
                    allocation.describe(), hold.holder.user)
        notices.event("preempted", hold.holder.user, [device], jobs=list(allocation.ids()),
                      hold=hold.how)
    known = hold.allocation
    members = [o for o in hold.processes.values() if allocation.job_of(o) is not None]
    hold.allocation = allocation
    hold.take(allocation.holder(members[0] if members else None), now, asked=False)
    if known is None or known.ids() != allocation.ids():
        log.info("%s is allocated to Slurm %s", hold.uuid, allocation.describe())
        notices.event("allocated", hold.holder.user if hold.holder else None, [device],
                      jobs=list(allocation.ids()))
    told, hold.trespassers = hold.trespassers, set()
    for pid, owner in hold.processes.items():
        if hold.place(owner, now) and hold.key(owner) not in told:
            trespass(notices, device, pid, owner, hold=hold)
