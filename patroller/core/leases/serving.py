"""Which free devices go to whom: the free devices by group, those set aside for a starving
waiter, a pick for a request, and the next waiter to serve with its devices.

Pure choices over the holds and the queue: the lease manager reserves what they choose. The
queue, the limits and the starvation bound decide whether and when a request is served; a
`Choose` (the topology's best-connected set, core/topology.py, or the lowest numbers) decides
which of the free devices it gets, the same way for a request, a waiter and a set-aside.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set

from patroller.core.devices import Device, Inventory
from patroller.core.leases.holds import Hold, Wants
from patroller.core.leases.queue import Waiter, WaitQueue

Free = dict[str, list[Device]]  # group -> its free devices, in device order
# Which `count` of these free devices (in device order) to give, or None if none will do.
Choose = Callable[[list[Device], int], list[Device] | None]


def lowest(usable: list[Device], count: int) -> list[Device] | None:
    """The lowest numbers: the choice where the topology is not known."""
    return usable[:count] if len(usable) >= count else None


def free_devices(inventory: Inventory, holds: Mapping[str, Hold]) -> Free:
    """The free devices of every group of the inventory, in device order (those withheld, as
    silent, are not). The rule answers.py's `free` applies to another host's answers: written
    twice because that one reads JSON on the client side, which imports nothing of the daemon;
    tests/test_free_rule.py holds the two to each other."""
    free: Free = {group: [] for group in inventory.groups}
    for device in inventory:
        hold = holds[device.uuid]
        if not device.lost and hold.free and hold.withheld is None:
            free[device.group].append(device)
    return free


def set_aside(
    waiters: WaitQueue,
    free: Free,
    now: float,
    bound: float,
    chooser: Callable[[Waiter], Choose] = lambda w: lowest,
) -> tuple[Waiter | None, set[str]]:
    """The starving waiter, and the free devices held for it: of each group it wants, the set
    it would be given, or while too few (or none linked as it insists) are free, the largest
    such set there is (the lowest numbers without a topology)."""
    waiter = waiters.starving(now, bound)
    if waiter is None:
        return None, set()
    choose_for = chooser(waiter)
    aside: set[str] = set()
    for group, n in waiter.wants.items():
        usable = free.get(group, [])
        for count in range(min(n, len(usable)), 0, -1):
            chosen = choose_for(usable, count)
            if chosen is not None:
                aside.update(d.uuid for d in chosen)
                break
    return waiter, aside


def pick(
    wants: Wants, free: Free, aside: Set[str] = frozenset(), choose: Choose = lowest
) -> list[Device] | None:
    """Free devices for every group, but those set aside, as `choose` says; None if a group
    falls short. In device (PCI bus) order."""
    picked = []
    for group, count in wants.items():
        usable = [d for d in free.get(group, []) if d.uuid not in aside]
        chosen = choose(usable, count) if len(usable) >= count else None
        if chosen is None:
            return None
        picked.extend(chosen)
    return sorted(picked, key=lambda d: d.number)


def choose(
    waiters: WaitQueue,
    free: Free,
    starving: Waiter | None,
    aside: Set[str],
    passed: Iterable[Waiter] = (),
    chooser: Callable[[Waiter], Choose] = lambda w: lowest,
) -> tuple[Waiter, list[Device]] | None:
    """The next waiter to serve and its devices: the earliest that fits what is free (only the
    starving one may have what is set aside for it), leaving out those `passed` over. One that
    wants more than is free does not hold back a later one that fits."""
    found: dict[Waiter, list[Device] | None] = {}

    def fits(waiter: Waiter) -> bool:
        found[waiter] = pick(
            waiter.wants, free, frozenset() if waiter is starving else aside, chooser(waiter)
        )
        return found[waiter] is not None

    waiter = waiters.first(fits, passed)
    if waiter is None:
        return None
    return waiter, found[waiter] or []
