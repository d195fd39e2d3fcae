"""The lease rules: who holds which device, reservations that expire, and waiters served in order.

Pure logic: no I/O, no event loop, an injectable clock. Whoever drives it calls `expire()` at
`next_deadline()` (see state/timer.py) and feeds it process events; every change is announced
to the callbacks given to `on_change`, and waiters are served by the change itself. A device's
states are those of its Hold (holds.py); the API's read models (http/views.py) and the book on
disk (state/schema.py) read the holds, and the book gives them back at start (`give_back`).

A device held for a process (its pid and start time, a ProcessRef) is freed when the process
ends (`process_exited`, told by lifetimes.py), unless the holder's processes run on it: then the
usual rules go on (claimed; a lease when they end). A device held for a duration (hold=2h) is
held until then whatever runs on it; then the usual rules go on.

Fair use (policy.py): a user, and the host account they run as (limits.py), may hold at most
the policy's limit of devices (a process that takes a free device beyond it trespasses); a
waiter that has waited the starvation bound is no longer overtaken: the free devices it needs
are set aside for it (neither /request nor a later waiter gets them) until it can be served. Every
grant, release,
expiry, claim and trespass is announced as an Event (the audit record) to `on_event` callbacks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import patroller.core.leases.allocations as allocations
import patroller.core.leases.refusals as refusals
import patroller.core.leases.serving as serving
import patroller.core.leases.withholding as withholding
from patroller.core.devices import Device, Inventory
from patroller.core.errors import Unavailable
from patroller.core.health import Health
from patroller.core.identity import Identity, ProcessRef
from patroller.core.leases.holds import Clock, Hold, Notices, Wants
from patroller.core.leases.queue import Waiter, WaitQueue
from patroller.core.leases.sources import Sources
from patroller.core.leases.state import LeaseState
from patroller.core.leases.trespass import arrive, trespass
from patroller.core.policy import Policy
from patroller.core.scheduled import SchedulerAllocation

log = logging.getLogger(__name__)


class LeaseManager(LeaseState):
    """Reservations, claims and waiters for an inventory of devices: the commands.

    One command object: each public method is one command of the lease rules, and all keep the
    same invariants over the same holds and queue (every change announced, waiters served by
    the change itself). The state and its queries are LeaseState's (state.py), which devices go
    to whom serving.py's, fair use's limits.py's and refusals' refusals.py's; its size is let
    past the usual cap for it alone (tests/test_layout.py says why)."""

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

    # -- asking for devices -------------------------------------------------------------

    def request(
        self,
        user: Identity,
        wants: Wants,
        held_for: ProcessRef | None = None,
        duration: float | None = None,
        link: str | None = None,
    ) -> list[Device]:
        """Reserve now, all or nothing (Busy): a lease, `duration` s, or while `held_for` lives;
        linked as `link` insists ("nvlink", "numa"), else the best-connected set."""
        self._admit(user, wants, link)
        picked = self._pick(wants, user, link)
        if picked is None:
            raise self.busy(wants, link)
        self._grant(user, picked, held_for, duration)
        self._notices.changed()
        return picked

    def wait(
        self,
        user: Identity,
        wants: Wants,
        on_grant: Callable[[list[Device]], None],
        on_abort: Callable[[Exception], None] | None = None,
        held_for: ProcessRef | None = None,
        duration: float | None = None,
        link: str | None = None,
    ) -> Waiter:
        """Queue a request: `on_grant(devices)` once reserved (maybe now), `on_abort` at close."""
        self._admit(user, wants, link)
        waiter = Waiter(user, wants, on_grant, on_abort, held_for, duration, link)
        # Every change that frees a device serves the queue, so no queued waiter fits what is
        # free now: only the newcomer can, and trying it alone keeps the arrival order.
        picked = self._pick(waiter.wants, user, link)
        if picked is None:
            self.waiters.add(waiter, self.clock())
            return waiter
        waiter.granted = picked
        self._grant(user, picked, held_for, duration, waited=0.0)
        self._notices.changed()
        on_grant(picked)
        return waiter

    def cancel(self, waiter: Waiter) -> bool:
        """Stop waiting; True if it was still waiting (and so got nothing)."""
        return self.waiters.remove(waiter)

    def release(
        self,
        user: Identity,
        uuid: str | None = None,
        reason: str | None = None,
        caller: ProcessRef | None = None,
    ) -> tuple[list[Device], list[Device]]:
        """Give back the user's devices (all, or one): (freed now, freed when their processes
        end). All of them leaves those held for a process other than `caller` (the process
        asking): they are released by that process, by uuid, or when it ends. The host's root
        may release another's device, named, as an administrator."""
        devices, admin = list(self.inventory), False
        if uuid is not None:
            admin = refusals.check_release(user, self._hold(uuid))  # root, another's device
            devices = [d for d in devices if d.uuid == uuid]
        now_free: list[Device] = []
        after_exit: list[Device] = []
        for device in devices:
            hold = self._holds[device.uuid]
            owner = hold.holder
            if owner is None or not (admin or user.same_user(owner)):
                continue
            if uuid is None and (hold.held_for not in (None, caller) or hold.allocation):
                continue  # another process's job, or a Slurm job or a pod, runs on it
            if admin:
                self._notices.event(
                    "admin_release",
                    owner.user,
                    [device],
                    by=user.user,
                    reason=reason or "released by the administrator",
                )
                log.warning(
                    "%s released %s, held by %s: %s",
                    user.user,
                    device.uuid,
                    owner.user,
                    reason or "no reason given",
                )
            else:
                self._notices.event(
                    "release", owner.user, [device], **({"reason": reason} if reason else {})
                )
            (after_exit if hold.release(self.clock()) else now_free).append(device)
        if now_free or after_exit:
            self._serve_and_announce()
        return now_free, after_exit

    def renew(self, user: Identity, uuid: str | None = None) -> list[Device]:
        """Restart the lease of the user's reservations (all, or one); the devices they hold."""
        self._check_open()
        if uuid is not None:
            refusals.check_renew(user, self._hold(uuid))
        devices = [
            d
            for d in self.inventory
            if d.uuid == uuid
            or uuid is None
            and user.same_user(self._holds[d.uuid].holder)
            and not self._holds[d.uuid].releasing
        ]
        deadline = self.clock() + self.lease
        for hold in (self._holds[d.uuid] for d in devices):
            if hold.deadline is not None:
                hold.deadline = deadline
        if devices:
            self._notices.changed()
        return devices

    def release_idle(self, uuid: str, idle: float) -> bool:
        """Release a reservation with no process on it, as the idle policy says; True if done.
        A hold for a duration is kept to its end: the user asked for that long."""
        hold = self._holds.get(uuid)
        if hold is None or hold.holder is None or hold.processes or hold.lost or hold.until:
            return False
        user = hold.holder.user
        log.warning("%s on %s was idle for %.0f s with no process: released", user, uuid, idle)
        self._notices.event("idle_release", user, [self.inventory.get(uuid)], idle=round(idle, 1))
        hold.end(self.clock())
        self._serve_and_announce()
        return True

    def serve(self) -> None:
        """Serve the waiters now: what held them back (the gate) has cleared."""
        self._serve_and_announce()

    def close(self) -> None:
        """Refuse new requests; every waiter is aborted and gets nothing."""
        self._closed = True
        for waiter in self.waiters.clear():
            if waiter.on_abort is not None:
                waiter.on_abort(Unavailable("the server is shutting down"))

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

    def give_back(
        self,
        uuid: str,
        holder: Identity,
        deadline: float | None = None,
        until: float | None = None,
        held_for: ProcessRef | None = None,
        releasing: bool = False,
        asked: bool = True,
    ) -> None:
        """At start: hold a device again as the book says it was held (the book checked it)."""
        self._holds[uuid].take(holder, self.clock(), deadline, until, held_for, releasing, asked)
        self._notices.changed()

    # -- inside -----------------------------------------------------------------------------

    def _admit(self, user: Identity, wants: Wants, link: str | None = None) -> None:
        self._check_open()
        self.check(wants, link)
        self.check_limit(user, wants)
        closed = self.gate()
        if closed is not None:
            raise Unavailable(closed)

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the server is shutting down")

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
