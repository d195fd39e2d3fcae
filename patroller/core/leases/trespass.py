"""Telling of a claim, and of a trespass, once: a process on a device that is not its owner's
to use.

Three kinds: a process of another user on a held device; one that took a free device beyond
its owner's limit (limits.py); and, on a device a Slurm job (core/jobs.py) or a Kubernetes
pod (core/pods.py) holds, a process that is not in the job (or pod), whoever runs it. Each is
logged and recorded (the audit record's
`trespass` event); the hold remembers whom it has told of (Hold.trespassers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from patroller.core.devices import Device
from patroller.core.identity import Identity
from patroller.core.leases.holds import Hold, Notices
from patroller.core.leases.limits import Count

log = logging.getLogger(__name__)


def trespass(
    notices: Notices,
    device: Device | None,
    pid: int,
    owner: Identity,
    hold: Hold | None = None,
    beyond: Count | None = None,
) -> None:
    """Log and record a trespass: a process on a device another user (or job) holds
    (`hold`), or one that took a free device beyond its owner's limit (`beyond`, the count it
    went past). The process's command, when known, goes with it (a notice names it)."""
    where = device.uuid if device is not None else "?"
    command = hold.commands.get(pid) if hold is not None else None
    if beyond is not None:
        log.warning(
            "trespassing: %s runs pid %d on %s, beyond the limit of %d of %s",
            owner.user,
            pid,
            where,
            beyond.limit,
            beyond.describe(owner).rstrip(","),
        )
        notices.event(
            "trespass",
            owner.user,
            [device],
            pid=pid,
            command=command,
            why="over_limit",
            limit=beyond.limit,
            held=[d.number for d in beyond.held],
            account=beyond.name if beyond.kind == "account" else None,
        )
        return
    holder = hold.holder.user if hold is not None and hold.holder else None
    allocation = hold.allocation if hold is not None else None
    if allocation is None:
        log.warning(
            "trespassing: %s runs pid %d on %s, held by %s",
            owner.user,
            pid,
            where,
            holder or "nobody",
        )
        notices.event("trespass", owner.user, [device], pid=pid, command=command, holder=holder)
        return
    own, word = allocation.own(owner), allocation.word
    log.warning(
        "trespassing: %s runs pid %d on %s (%s), allocated to %s %s of %s",
        owner.user,
        pid,
        where,
        f"{word} {own}" if own else f"in no {word}",
        allocation.scheduler,
        allocation.describe(),
        holder or "?",
    )
    notices.event(
        "trespass",
        owner.user,
        [device],
        pid=pid,
        command=command,
        holder=holder,
        why=allocation.why,
        **{allocation.key: list(allocation.ids()), allocation.member_key: own},
    )


def arrive(
    notices: Notices,
    device: Device | None,
    hold: Hold,
    pid: int,
    owner: Identity,
    beyond: Callable[[], Count | None],
    now: float,
) -> None:
    """A process is on the device: the first of a known owner claims it (the audit record's
    `claim`, and a trespass if that takes its owner past a limit: `beyond()`); one being looked
    up holds it meanwhile, if nobody does (holds.py); each is then placed, and told of if it
    trespasses."""
    if owner.identifying:
        hold.holder = hold.holder or owner
    elif hold.holder is None or hold.holder.identifying:
        over = beyond()
        hold.holder, hold.over_limit = owner, over is not None
        notices.event("claim", owner.user, [device], pid=pid, command=hold.commands.get(pid))
        if over is not None:
            trespass(notices, device, pid, owner, hold=hold, beyond=over)
    if hold.place(owner, now):
        trespass(notices, device, pid, owner, hold=hold)
