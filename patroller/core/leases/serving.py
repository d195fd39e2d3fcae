"""Which free devices go to whom: the free devices by group, those set aside for a starving
waiter, a pick for a request, and the next waiter to serve with its devices.

Pure choices over the holds and the queue: the lease manager reserves what they choose.
"""
from __future__ import annotations

from typing import AbstractSet, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from patroller.core.devices import Device, Inventory
from patroller.core.leases.holds import Hold, Wants
from patroller.core.leases.queue import WaitQueue, Waiter

Free = Dict[str, List[Device]]  # group -> its free devices, in device order


def free_devices(inventory: Inventory, holds: Mapping[str, Hold]) -> Free:
    """The free devices of every group of the inventory, in device order (those withheld, as
    silent, are not)."""
    free: Free = {group: [] for group in inventory.groups}
    for device in inventory:
        hold = holds[device.uuid]
        if not device.lost and hold.free and hold.withheld is None:
            free[device.group].append(device)
    return free


def set_aside(waiters: WaitQueue, free: Free, now: float,
              bound: float) -> Tuple[Optional[Waiter], Set[str]]:
    """The starving waiter, and the free devices held for it (as many of each group it wants
    as are free, lowest numbers first)."""
    waiter = waiters.starving(now, bound)
    if waiter is None:
        return None, set()
    return waiter, {d.uuid for group, n in waiter.shape for d in free.get(group, [])[:n]}


def pick(wants: Wants, free: Free, aside: AbstractSet[str] = frozenset()) -> Optional[List[Device]]:
    """Free devices for every group, but those set aside, by number; None if a group falls short."""
    picked = []
    for group, count in wants.items():
        usable = [d for d in free.get(group, []) if d.uuid not in aside]
        if len(usable) < count:
            return None
        picked.extend(usable[:count])
    return sorted(picked, key=lambda d: d.number)


def choose(waiters: WaitQueue, free: Free, starving: Optional[Waiter], aside: AbstractSet[str],
           passed: Iterable[Waiter] = ()) -> Optional[Tuple[Waiter, List[Device]]]:
    """The next waiter to serve and its devices: the earliest that fits what is free (only the
    starving one may have what is set aside for it), leaving out those `passed` over. One that
    wants more than is free does not hold back a later one that fits."""
    def fits(waiter: Waiter) -> Optional[List[Device]]:
        return pick(waiter.wants, free, frozenset() if waiter is starving else aside)

    waiter = waiters.first(lambda w: fits(w) is not None, passed)
    if waiter is None:
        return None
    return waiter, fits(waiter) or []
