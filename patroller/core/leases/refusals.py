"""Why a request is refused, said with what the client needs to know: the errors the lease
manager raises before anything changes (the API maps each to its status)."""
from __future__ import annotations

from typing import Dict

from patroller.core.devices import Inventory
from patroller.core.errors import Busy, NotHeld, NotYours, OverLimit, Unsatisfiable
from patroller.core.identity import Identity
from patroller.core.leases.holds import Hold, Wants, is_admin
from patroller.core.leases.limits import Count


def check_exists(inventory: Inventory, wants: Wants) -> None:
    """Raise Unsatisfiable if the request could never be granted on this host."""
    for group, count in wants.items():
        exist = inventory.groups.get(group)
        if exist is None:
            raise Unsatisfiable(f"there is no device group {group!r}",
                                requested=dict(wants), groups=sorted(inventory.groups))
        if count > exist:
            raise Unsatisfiable(f"{count} {group} requested but only {exist} exist on this host",
                                requested=dict(wants), exist=dict(inventory.groups))


def over_limit(user: Identity, wants: Wants, count: Count) -> OverLimit:
    """The error for a request that `count` (the user's, or their account's) does not allow."""
    asked = sum(wants.values())
    numbers = ", ".join(str(d.number) for d in count.held)
    whom = "one user" if count.kind == "user" else "one host account"
    account = {"account": count.name, "uid": count.uid} if count.kind == "account" else {}
    if count.held:
        message = (f"{count.describe(user)} holds {len(count.held)} device(s) ({numbers}) and "
                   f"asks for {asked}: the most {whom} may hold is {count.limit}; release some "
                   "first (/release?uuid=..., or patroller release NUMBER)")
    else:  # nothing to release: the request alone is over the limit
        message = (f"{count.describe(user)} asks for {asked}: the most {whom} may hold is "
                   f"{count.limit}")
    return OverLimit(message, limit=count.limit, held=[d.number for d in count.held],
                     requested=dict(wants), **account)


def busy(wants: Wants, free: Dict[str, int]) -> Busy:
    """The error for a request that cannot be granted now, with how many of each group are free."""
    parts = [f"{count} {group} requested, {free.get(group, 0)} free"
             for group, count in wants.items()]
    return Busy("busy: " + "; ".join(parts), requested=dict(wants), free=free)


def check_renew(user: Identity, hold: Hold) -> None:
    """Raise NotHeld if the device is not held by `user` (its lease ran out, or it was
    released), NotYours if another user holds it."""
    uuid = hold.uuid
    if hold.holder is None:
        raise NotHeld(f"device {uuid} is not held by you: its lease ran out or it was "
                      "released", uuid=uuid, state=hold.state)
    if hold.releasing:
        raise NotHeld(f"device {uuid} was released: it is free once your processes on it end",
                      uuid=uuid, state=hold.state)
    if not hold.holder.same_user(user):
        raise NotYours(f"device {uuid} is held by another user", uuid=uuid)


def check_release(user: Identity, hold: Hold) -> bool:
    """Raise NotYours if another user holds the device and `user` is not the host's root, or
    if a Slurm job or a Kubernetes pod holds it (its scheduler ends that, for root too); True if
    root releases another user's device (an administrator's release)."""
    allocation = hold.allocation
    if allocation is not None:
        raise NotYours(f"device {hold.uuid} is allocated to {allocation.scheduler} "
                       f"{allocation.describe()}: {allocation.release_hint}", uuid=hold.uuid,
                       **{allocation.key: list(allocation.ids())})
    other = hold.holder is not None and not hold.holder.same_user(user)
    if other and not is_admin(user):
        raise NotYours(f"device {hold.uuid} is held by another user", uuid=hold.uuid)
    return other
