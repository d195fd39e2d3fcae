"""Why a request is refused, said with what the client needs to know: the errors the lease
manager raises before anything changes (the API maps each to its status)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from patroller.core.devices import Device, Inventory
from patroller.core.errors import Busy, NotHeld, NotYours, OverLimit, Unsatisfiable
from patroller.core.identity import Identity
from patroller.core.jobs import Allocation
from patroller.core.leases.holds import Hold, Wants, is_admin
from patroller.core.leases.limits import Count
from patroller.core.topology import Topology, usable


def check_exists(inventory: Inventory, wants: Wants) -> None:
    """Raise Unsatisfiable if the request could never be granted on this host."""
    for group, count in wants.items():
        exist = inventory.groups.get(group)
        if exist is None:
            raise Unsatisfiable(
                f"there is no device group {group!r}",
                requested=dict(wants),
                groups=sorted(inventory.groups),
            )
        if count > exist:
            raise Unsatisfiable(
                f"{count} {group} requested but only {exist} exist on this host",
                requested=dict(wants),
                exist=dict(inventory.groups),
            )


def over_limit(user: Identity, wants: Wants, count: Count) -> OverLimit:
    """The error for a request that `count` (the user's, or their account's) does not allow.
    The devices others hold under the account are theirs: (--hide-users) a caller who may not
    see them is told how many, not which (which would say whose runs as that account)."""
    account = {"account": count.name, "uid": count.uid} if count.kind == "account" else {}
    held = [d.number for d in count.held]
    data = dict(limit=count.limit, held=held, requested=dict(wants), **account)
    error = OverLimit(_over(user, wants, count, held), **data)
    others = [holder for holder in count.holders if holder != user.user]
    if others:
        mine: list[int | None] = [
            d.number if holder == user.user else None
            for d, holder in zip(count.held, count.holders, strict=True)
        ]
        error.naming(
            dict.fromkeys(others), _over(user, wants, count, mine), **{**data, "held": mine}
        )
    return error


def _over(user: Identity, wants: Wants, count: Count, held: Sequence[int | None]) -> str:
    """Why `count` refuses the request, naming the devices held (None: one held by another)."""
    asked = sum(wants.values())
    whom = "one user" if count.kind == "user" else "one host account"
    if not held:  # nothing to release: the request alone is over the limit
        return (
            f"{count.describe(user)} asks for {asked}: the most {whom} may hold is {count.limit}"
        )
    numbers = ", ".join(str(n) for n in held if n is not None)
    if None in held:
        numbers += f"{', and ' if numbers else ''}{held.count(None)} under other identities"
    return (
        f"{count.describe(user)} holds {len(held)} device(s) ({numbers}) and "
        f"asks for {asked}: the most {whom} may hold is {count.limit}; release some "
        "first (/release?uuid=..., or patroller release NUMBER)"
    )


LINKED = {
    "nvlink": "all linked to each other by NVLink",
    "numa": "all in one NUMA node (one CPU affinity)",
}


def topology_unknown(topology: Topology, devices: list[Device], link: str) -> Unsatisfiable | None:
    """The error for `link` on devices whose links are not known, or None."""
    if usable(topology, devices):
        return None
    why = (
        "some are in MIG mode"
        if any(d.mig for d in devices)
        else topology.why or "`nvidia-smi topo -m` was not read"
    )
    return Unsatisfiable(
        f"link={link} asks for devices {LINKED[link]}, but how this host's "
        f"devices are linked is not known ({why})",
        link=link,
    )


def never_linked(group: str, count: int, link: str) -> Unsatisfiable:
    """The error for `link` that no set of `count` devices of this host meets, free or not."""
    return Unsatisfiable(
        f"no {count} {group} of this host are {LINKED[link]} (link={link}); "
        "ask without link, or for fewer",
        requested={group: count},
        link=link,
    )


def busy(
    wants: Wants,
    free: dict[str, int],
    link: str | None = None,
    withheld: dict[int, str | None] | None = None,
) -> Busy:
    """The error for a request that cannot be granted now, with how many of each group are
    free, why each device granted to nobody is (by number), and the link asked for if none."""
    parts = [
        f"{count} {group} requested, {free.get(group, 0)} free" for group, count in wants.items()
    ]
    said = "".join(
        f"; GPU {number} is granted to nobody: {why}"
        for number, why in sorted((withheld or {}).items())
    )
    extra: dict[str, Any] = (
        {"withheld": {str(n): w for n, w in withheld.items()}} if withheld else {}
    )
    if link is None:
        return Busy("busy: " + "; ".join(parts) + said, requested=dict(wants), free=free, **extra)
    return Busy(
        "busy: " + "; ".join(parts) + f", but none {LINKED[link]} (link={link})" + said,
        requested=dict(wants),
        free=free,
        link=link,
        **extra,
    )


def check_renew(user: Identity, hold: Hold) -> None:
    """Raise NotHeld if the device is not held by `user` (its lease ran out, or it was
    released), NotYours if another user holds it."""
    uuid = hold.uuid
    if hold.holder is None:
        raise NotHeld(
            f"device {uuid} is not held by you: its lease ran out or it was released",
            uuid=uuid,
            state=hold.state,
        )
    if hold.releasing:
        raise NotHeld(
            f"device {uuid} was released: it is free once your processes on it end",
            uuid=uuid,
            state=hold.state,
        )
    if not hold.holder.same_user(user):
        raise NotYours(f"device {uuid} is held by another user", uuid=uuid)


def check_release(user: Identity, hold: Hold) -> bool:
    """Raise NotYours if another user holds the device and `user` is not the host's root, or
    if a Slurm job or a Kubernetes pod holds it (its scheduler ends that, for root too); True if
    root releases another user's device (an administrator's release)."""
    allocation = hold.allocation
    if allocation is not None:
        ids = allocation.ids()
        what = (
            f"a {allocation.scheduler} {allocation.word}"
            if len(ids) == 1
            else f"{allocation.scheduler} {allocation.word}s"
        )
        raise NotYours(
            f"device {hold.uuid} is allocated to {allocation.scheduler} "
            f"{allocation.describe()}: {allocation.release_hint}",
            uuid=hold.uuid,
            **{allocation.key: list(ids)},
        ).naming(
            _owners(hold),
            f"device {hold.uuid} is allocated to {what}: {allocation.release_hint}",
            uuid=hold.uuid,
            **{allocation.key: None},
        )
    other = hold.holder is not None and not hold.holder.same_user(user)
    if other and not is_admin(user):
        raise NotYours(f"device {hold.uuid} is held by another user", uuid=hold.uuid)
    return other


def _owners(hold: Hold) -> tuple[str, ...]:
    """Whose the jobs (pods) a device is allocated to are, as /status hides them: each job's
    user where the job map names one, else the holder's (the kubelet names no pod's user)."""
    allocation = hold.allocation
    assert allocation is not None
    holder = hold.holder.user if hold.holder is not None else allocation.describe()
    if isinstance(allocation, Allocation):
        return tuple(dict.fromkeys(job.user or holder for job in allocation.jobs))
    return (holder,)


def check_admin(user: Identity, uuid: str, what: str) -> None:
    """Raise NotYours unless `user` is the host's root, who alone may `what`."""
    if not is_admin(user):
        raise NotYours(f"only the host's root may {what}", uuid=uuid)
