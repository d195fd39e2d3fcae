"""What the host tells the lease rules, applied: processes that arrive on a device, change
owner, leave or end (a device held for a process is freed when it ends), devices lost and back,
a scheduler's allocations, a device withheld (silent, unhealthy), and reservations that run out.
Each is a change of the same holds and queue as the callers' commands (manager.py), and every
change ends the same way, here: the waiters that can be served are granted, in order, and the
change is announced (`_serve_and_announce`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import patroller.core.leases.allocations as allocations
import patroller.core.leases.serving as serving
import patroller.core.leases.withholding as withholding
from patroller.core.devices import Device, Inventory
from patroller.core.health import Health
from patroller.core.identity import Identity, ProcessRef
from patroller.core.leases.holds import Clock, Hold, Notices
from patroller.core.leases.queue import Waiter, WaitQueue
from patroller.core.leases.sources import Sources
from patroller.core.leases.state import LeaseState
from patroller.core.leases.trespass import arrive, trespass
from patroller.core.policy import Policy
from patroller.core.scheduled import SchedulerAllocation

log = logging.getLogger(__name__)


class Observed(LeaseState):
    """The lease rules' state with what the host tells applied, and the end of every change
    (waiters served, the change announced); LeaseManager (manager.py) adds the callers'
    commands."""

    def __init__(
        self,
        inventory: Inventory,
        *,
        lease: float,
        policy: Policy,
        max_waiters: int,
        max_waiting_per_user: int,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(
            inventory, lease, policy, clock, WaitQueue(max_waiters, max_waiting_per_user)
        )
        self._notices = Notices()
        self.on_change = self._notices.on_change  # (callback): after every change of state
        self.on_event = self._notices.on_event  # (callback): every event of the audit record
        # Why nothing may be handed out now (a lease book that cannot be written), or None.
        self.gate: Callable[[], str | None] = lambda: None
        self._closed = False
        self._sources = Sources()  # each scheduler's allocations, kept apart

    # -- what the monitors see, and time ------------------------------------------------------

    def withhold(
        self,
        uuid: str,
        why: str | None,
        cause: str = "silent",
        health: Health | None = None,
        by: str | None = None,
    ) -> None:
        """Grant the device to nobody while `why` holds for `cause` (silent; health, with the
        device's `health`, `by` root if root said so); None: that cause is gone."""
        hold = self._holds.get(uuid)
        if hold is not None and withholding.apply(
            hold, why, cause, health, self.inventory.get(uuid), self._notices, by
        ):
            self._serve_and_announce()

    def allocate(
        self, uuid: str, allocation: SchedulerAllocation | None, source: str = "slurm"
    ) -> None:
        """A scheduler (Slurm's job map; "kubernetes": the kubelet) says the device is its
        jobs' or pods' (None: none of its now): allocations.py; two that list it: sources.py."""
        allocation = self._sources.tell(source, uuid, allocation)
        hold = self._holds.get(uuid)
        if hold is not None and hold.allocation != allocation:
            allocations.apply(
                hold, allocation, self.inventory.get(uuid), self.clock(), self._notices
            )
            self._serve_and_announce()

    def devices_changed(self) -> None:
        """The inventory changed: new devices are free, lost ones lost, those back as they were."""
        now = self.clock()
        for device in self.inventory:
            hold = self._holds.get(device.uuid)
            if hold is None:
                hold = self._holds[device.uuid] = Hold(since=now, uuid=device.uuid)
            if hold.lost != device.lost:
                hold.lost = device.lost
                log.warning("%s is %s", device.uuid, "lost" if device.lost else "back")
                self._notices.event(
                    "lost" if device.lost else "back",
                    hold.holder.user if hold.holder else None,
                    [device],
                )
            hold.touch(now)
        self._serve_and_announce()

    def process_started(
        self, uuid: str, pid: int, owner: Identity, command: str | None = None
    ) -> None:
        """A process of `owner` appeared on a device (`command`: its name, when known)."""
        hold = self._holds.get(uuid)
        if hold is None or pid in hold.processes:
            return
        hold.add(pid, owner, command)
        log.debug("pid %d of %s on %s", pid, owner.user, uuid)
        self._arrive(hold, pid, owner)
        self._notices.changed()

    def update_owner(self, uuid: str, pid: int, owner: Identity) -> None:
        """A process's owner became known (it was being looked up, or degraded, e.g. while
        Docker was down), or better known (still being looked up, now in its container)."""
        hold = self._holds.get(uuid)
        if hold is None or pid not in hold.processes:
            return
        if hold.rename(pid, owner):  # no longer looked up: as if it had just started
            self._arrive(hold, pid, owner)
        else:
            self._place(hold, pid, owner)
        self._serve_and_announce()

    def process_ended(self, uuid: str, pid: int) -> None:
        """A process left a device."""
        hold = self._holds.get(uuid)
        if hold is not None and pid in hold.processes:
            self._forget(hold, pid)
            self._serve_and_announce()

    def process_exited(self, ref: ProcessRef) -> list[Device]:
        """A process devices were held for has ended: free them (the usual rules where the
        holder's processes run); the devices it held."""
        devices = [d for d in self.inventory if self._holds[d.uuid].held_for == ref]
        if not devices:
            return []
        for hold in self._holds.values():  # the kernel's word: it is on no device any more,
            if ref.pid in hold.processes:  # though pmon may list it for another interval
                self._forget(hold, ref.pid)
        for device in devices:
            hold = self._holds[device.uuid]
            hold.held_for = None
            user = hold.holder.user if hold.holder else "?"
            if hold.pids_of(hold.holder):
                log.info(
                    "pid %d of %s ended; that user's processes still run on %s",
                    ref.pid,
                    user,
                    device.uuid,
                )
            else:
                log.info("pid %d of %s ended: %s is free", ref.pid, user, device.uuid)
                self._notices.event("ended", user, [device], pid=ref.pid)
                hold.end(self.clock())
        self._serve_and_announce()
        return devices

    def expire(self) -> list[Device]:
        """End every reservation whose lease (or duration) has run out; return those devices."""
        now, expired = self.clock(), []
        for device in self.inventory:
            hold = self._holds[device.uuid]
            user, what = hold.holder.user if hold.holder else "?", hold.ran_out(now)
            if what is None:
                continue
            log.info(
                "the reservation of %s on %s ended"
                if what == "duration"
                else "lease of %s on %s expired",
                user,
                device.uuid,
            )
            self._notices.event("expire", user, [device], hold=what)
            hold.end(now)
            expired.append(device)
        if expired:
            self._serve_and_announce()
        return expired

    # -- inside -----------------------------------------------------------------------------

    def _grant(
        self,
        user: Identity,
        devices: list[Device],
        held_for: ProcessRef | None,
        duration: float | None,
        **details: Any,
    ) -> None:
        now = self.clock()
        held = held_for is not None or duration is not None
        for device in devices:
            self._holds[device.uuid].take(
                user,
                now,
                None if held else now + self.lease,
                None if duration is None else now + duration,
                held_for,
            )
        how = (
            {"hold": "process", "pid": held_for.pid}
            if held_for is not None
            else {"hold": "duration", "seconds": duration}
            if duration is not None
            else {"hold": "lease"}
        )
        self._notices.event("grant", user.user, devices, **details, **how)

    def _serve_and_announce(self) -> None:
        """After a change that may free devices: reserve, in arrival order, for every waiter
        that can be served now (one over its user's limit is passed over and waits on),
        announce the change, then hand out the grants (so that their callbacks see it whole)."""
        granted: list[Waiter] = []
        passed: set[Waiter] = set()
        free = self.free() if len(self.waiters) and self.gate() is None else {}
        while any(free.values()):
            chosen = serving.choose(
                self.waiters, free, *self.set_aside(free), passed, self.choose_for
            )
            if chosen is None:
                break
            waiter, devices = chosen
            if self.exceeded(waiter.user, len(devices)):
                passed.add(waiter)
                continue
            self.waiters.remove(waiter)
            free = {group: [d for d in ds if d not in devices] for group, ds in free.items()}
            waiter.granted = devices
            self._grant(
                waiter.user,
                devices,
                waiter.held_for,
                waiter.duration,
                waited=round(self.clock() - waiter.since, 3),
            )
            granted.append(waiter)
        self._notices.changed()
        for waiter in granted:
            waiter.on_grant(waiter.granted or [])

    def _arrive(self, hold: Hold, pid: int, owner: Identity) -> None:
        arrive(
            self._notices,
            self.inventory.get(hold.uuid),
            hold,
            pid,
            owner,
            lambda: self.exceeded(owner, 1),
            self.clock(),
        )

    def _place(self, hold: Hold, pid: int, owner: Identity) -> None:
        """A process of `owner` is on a held device: it claims it, or trespasses (told once)."""
        if hold.place(owner, self.clock()):
            trespass(self._notices, self.inventory.get(hold.uuid), pid, owner, hold=hold)

    def _forget(self, hold: Hold, pid: int) -> None:
        log.debug("pid %d of %s left %s", pid, hold.processes[pid].user, hold.uuid)
        hold.forget(pid, self.clock(), self.lease)
