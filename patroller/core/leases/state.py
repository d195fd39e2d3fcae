"""The read side of the lease rules: the hold of every device and the queue of waiters, with
the queries others need of them (who holds what, what a limit allows, what is free, what is set
aside, when the next reservation runs out). LeaseManager (manager.py) adds the commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import patroller.core.leases.limits as limits
import patroller.core.leases.refusals as refusals
import patroller.core.leases.serving as serving
from patroller.core.devices import Device, Inventory
from patroller.core.errors import Busy, Unsatisfiable
from patroller.core.identity import Identity, ProcessRef
from patroller.core.leases.holds import Clock, Hold, Wants
from patroller.core.leases.limits import Count
from patroller.core.leases.queue import Waiter, WaitQueue
from patroller.core.leases.serving import Choose, Free, lowest
from patroller.core.policy import Policy
from patroller.core.topology import Search, Topology, best, usable


class LeaseState:
    """The hold of every device and the queue of waiters, with the queries others need of them:
    the read side of the lease rules (LeaseManager, below, adds the commands)."""

    def __init__(
        self, inventory: Inventory, lease: float, policy: Policy, clock: Clock, waiters: WaitQueue
    ) -> None:
        self.inventory = inventory
        self.lease = lease
        self.clock = clock
        self.policy = policy  # replaced whole when the administrator reloads it
        self.waiters = waiters
        self.topology = Topology()  # replaced whole when `topo -m` is read again
        self.search = Search()  # how hard the choice looks (core/topology.py; Config's)
        now = clock()
        self._holds = {d.uuid: Hold(since=now, uuid=d.uuid) for d in inventory}

    @property
    def holds(self) -> Mapping[str, Hold]:
        """Every device's hold, by uuid, in the order the devices were first seen: to read."""
        return MappingProxyType(self._holds)

    def state(self, uuid: str) -> str:
        """free, reserved, claimed, shared or lost."""
        return self._holds[uuid].state

    def holder(self, uuid: str) -> Identity | None:
        """Who holds the device now, or None."""
        hold = self._holds.get(uuid)
        return hold.holder if hold is not None else None

    def held_by(self, user: str) -> list[Device]:
        """The present devices `user` holds, every way (reserved, claimed, shared)."""
        holders = {uuid: h.holder.user for uuid, h in self._holds.items() if h.holder is not None}
        return [d for d in self.inventory if not d.lost and holders.get(d.uuid) == user]

    def exceeded(self, who: Identity, asked: int) -> Count | None:
        """The limit (of the user, or of the host account they run as) that `asked` more
        devices would take `who` past, or None (limits.py)."""
        return limits.exceeded(who, asked, self.policy, self._holds, self.inventory)

    # -- checks before a command: they raise, and change nothing ----------------------------

    def check(self, wants: Wants, link: str | None = None) -> None:
        """Raise Unsatisfiable if the request could never be granted on this host: too many
        devices, or none linked as `link` insists, even were all of them free."""
        refusals.check_exists(self.inventory, wants)
        if link is None:
            return
        present = self.inventory.present()
        for group, count in wants.items():
            devices = [d for d in present if d.group == group]
            why = refusals.topology_unknown(self.topology, devices, link)
            if why is None and self.chooser(None, link)(devices, count) is None:
                why = refusals.never_linked(group, count, link)
            if why is not None:
                raise why

    def check_limit(self, user: Identity, wants: Wants) -> None:
        """Raise OverLimit if granting `wants` would take the user, or the host account they
        run as, past its limit (limits.py)."""
        count = self.exceeded(user, sum(wants.values()))
        if count is not None:
            raise refusals.over_limit(user, wants, count)

    def busy(self, wants: Wants, link: str | None = None) -> Busy:
        """The error for a request that cannot be granted now: says how many are free, why
        those of its groups granted to nobody are, and the link asked for."""
        withheld = {
            d.number: self._holds[d.uuid].withheld
            for d in self.inventory.present()
            if d.group in wants and self._holds[d.uuid].withheld
        }
        return refusals.busy(
            wants, {group: len(free) for group, free in self.free().items()}, link, withheld
        )

    def chooser(self, user: Identity | None, link: str | None = None) -> Choose:
        """How to choose among free devices for `user`: the best-connected set by the
        topology (core/topology.py), meeting `link`; the lowest numbers where the topology is
        not known for them (no `topo -m`, MIG), where `link` is then never met."""
        name = user.user if user is not None else None
        holds, topology, search = self._holds, self.topology, self.search

        def prefer(device: Device) -> tuple[int, float]:
            hold = holds.get(device.uuid)
            if hold is None:
                return 1, float("-inf")
            freed = hold.freed if hold.freed is not None else float("-inf")
            return (0 if name is not None and hold.last_user == name else 1), freed

        def choose(free: list[Device], count: int) -> list[Device] | None:
            if not usable(topology, free):
                return lowest(free, count) if link is None else None
            return best(topology, free, count, prefer, link, search)

        return choose

    def hold_of(self, uuid: str) -> dict[str, Any]:
        """How a device is held, as a grant shows it: its hold, seconds left, the process."""
        hold = self._holds[uuid]
        return {
            "hold": hold.how,
            "expires": hold.expires(self.clock()),
            "held_for_pid": hold.held_for.pid if hold.held_for is not None else None,
        }

    def next_deadline(self) -> float | None:
        """The earliest time a reservation runs out, on the manager's clock."""
        ends = [t for h in self._holds.values() for t in (h.deadline, h.until) if t is not None]
        return min(ends) if ends else None

    def processes_held_for(self) -> set[ProcessRef]:
        """The processes devices are held for: lifetimes.py watches them."""
        return {h.held_for for h in self._holds.values() if h.held_for is not None}

    def free(self) -> Free:
        """The free devices of every group (set-aside ones included), in device order."""
        return serving.free_devices(self.inventory, self._holds)

    def set_aside(self, free: Free | None = None) -> tuple[Waiter | None, set[str]]:
        """The starving waiter, and the free devices set aside for it."""
        return serving.set_aside(
            self.waiters,
            self.free() if free is None else free,
            self.clock(),
            self.policy.starvation_bound,
            self.choose_for,
        )

    def choose_for(self, waiter: Waiter) -> Choose:
        """How to choose a waiter's devices: as for a request of its user, its link."""
        return self.chooser(waiter.user, waiter.link)

    def check_admin(self, user: Identity, uuid: str, what: str) -> None:
        """Raise Unsatisfiable if there is no such device, NotYours unless `user` is root."""
        self._hold(uuid)
        refusals.check_admin(user, uuid, what)

    def _hold(self, uuid: str) -> Hold:
        hold = self._holds.get(uuid)
        if hold is None or self.inventory.get(uuid) is None:
            raise Unsatisfiable(f"there is no device {uuid!r}", uuid=uuid)
        return hold

    def _pick(
        self, wants: Wants, user: Identity | None = None, link: str | None = None
    ) -> list[Device] | None:
        """Free devices for a request: none of those set aside for a starving waiter."""
        free = self.free()
        return serving.pick(wants, free, self.set_aside(free)[1], self.chooser(user, link))
