"""The lease rules: who holds which device, reservations that expire, and waiters served in order.

Pure logic: no I/O, no event loop, an injectable clock. Whoever drives it calls `expire()` at
`next_deadline()` (see state/timer.py) and feeds it process events (observed.py applies them);
every change is announced to the callbacks given to `on_change`, and waiters are served by the
change itself. A device's states are those of its Hold (holds.py); the API's read models
(http/views.py) and the book on disk (state/schema.py) read the holds, and the book gives them
back at start (`give_back`).

A device held for a process (its pid and start time, a ProcessRef) is freed when the process
ends (`process_exited`, told by lifetimes.py), unless the holder's processes run on it: then the
usual rules go on (claimed; a lease when they end). A device held for a duration (hold=2h) is
held until then whatever runs on it; then the usual rules go on.

Fair use (policy.py): a user, and the host account they run as (limits.py), may hold at most
the policy's limit of devices (a process that takes a free device beyond it trespasses); a
waiter that has waited the starvation bound is no longer overtaken: the free devices it needs
are set aside for it (neither /request nor a later waiter gets them) until it can be served.
Every grant, release, expiry, claim and trespass is announced as an Event (the audit record) to
`on_event` callbacks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import patroller.core.leases.refusals as refusals
from patroller.core.devices import Device
from patroller.core.errors import Unavailable
from patroller.core.identity import Identity, ProcessRef
from patroller.core.leases.holds import Wants
from patroller.core.leases.observed import Observed
from patroller.core.leases.queue import Waiter
from patroller.durations import describe

log = logging.getLogger(__name__)


class LeaseManager(Observed):
    """Reservations, claims and waiters for an inventory of devices: what the API's callers
    ask (request, wait, release, renew), the idle policy's release, the close, and the book's
    holds given back at start. What the host tells the rules (processes, devices, schedulers,
    health, time) is Observed's (observed.py); the state and its queries LeaseState's
    (state.py); which devices go to whom serving.py's, fair use's limits.py's and refusals'
    refusals.py's."""

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
        log.warning(
            "%s on %s was idle for %s with no process: released", user, uuid, describe(idle)
        )
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
