"""A device's allocation by a scheduler coming and going: Slurm's jobs (core/jobs.py) or
Kubernetes' pods (core/pods.py), which answer one protocol.

When the scheduler lists a device, its jobs (pods) hold it: a hold of Patroller's on it ends
(the scheduler decides on its node, and its user is told by the audit record's `preempted`),
the first job's user is the holder, no lease runs, and every process on it that is not in the
jobs trespasses. When it no longer lists it, the hold ends as any other: the processes still
there pass it to the owner of the oldest, or it is free. A device that one scheduler lets go
while the other lists it (sources.py says which holds) passes from one to the other: the first
is `deallocated`, the second `allocated`, and nobody is told of a preemption.
"""

from __future__ import annotations

import logging

from patroller.core.devices import Device
from patroller.core.leases.holds import Hold, Notices
from patroller.core.leases.trespass import trespass
from patroller.core.scheduled import SchedulerAllocation

log = logging.getLogger(__name__)


def apply(
    hold: Hold,
    allocation: SchedulerAllocation | None,
    device: Device | None,
    now: float,
    notices: Notices,
) -> None:
    """Make the hold what the allocation says (the caller serves waiters after)."""
    known = hold.allocation
    if known is not None and (allocation is None or allocation.how != known.how):
        log.info(
            "%s is no longer allocated to %s %s", hold.uuid, known.scheduler, known.describe()
        )
        notices.event(
            "deallocated",
            hold.holder.user if hold.holder else None,
            [device],
            **{known.key: list(known.ids())},
        )
        if allocation is None:
            hold.end(now)
            return
    if allocation is None:
        return
    if hold.allocation is None and hold.holder is not None:
        log.warning(
            "%s allocated %s to %s: the hold of %s on it ends",
            allocation.scheduler,
            hold.uuid,
            allocation.describe(),
            hold.holder.user,
        )
        notices.event(
            "preempted",
            hold.holder.user,
            [device],
            **{allocation.key: list(allocation.ids())},
            hold=hold.how,
        )
    members = [o for o in hold.processes.values() if allocation.member_of(o) is not None]
    hold.allocation = allocation
    # asked: the job (or pod) asked its scheduler for the device, as a grant is asked for
    hold.take(allocation.holder(members[0] if members else None), now, asked=True)
    if known is None or known.ids() != allocation.ids():
        log.info(
            "%s is allocated to %s %s", hold.uuid, allocation.scheduler, allocation.describe()
        )
        notices.event(
            "allocated",
            hold.holder.user if hold.holder else None,
            [device],
            **{allocation.key: list(allocation.ids())},
        )
    told, hold.trespassers = hold.trespassers, set()
    for pid, owner in hold.processes.items():
        if hold.place(owner, now) and hold.key(owner) not in told:
            trespass(notices, device, pid, owner, hold=hold)
