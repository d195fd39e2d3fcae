"""The lease rules: who holds which device, reservations that expire, and waiters served in order.

Pure logic: no I/O, no event loop, an injectable clock. Whoever drives it calls `expire()` at
`next_deadline()` (see `timer.py`) and feeds it process events; every change is announced to
subscribers, and waiters are served by the change itself.

A device is
  free      no holder and no process;
  reserved  held for a user whose process has not (or no longer) shown up: the lease runs, or,
            held for a process (hold=process), no lease runs while that process lives;
  claimed   every process on it belongs to the holder;
  shared    a process of another user runs on it as well (logged once as trespassing);
  lost      gone from the host (fell off the bus, removed): never granted; its holder, if any,
            is still shown, and its reservation ends by the usual rules.

A device held for a process (its pid and start time, a ProcessRef) is freed when the process
ends (`process_exited`, told by lifetimes.py), unless the holder's processes run on it: then the
usual rules go on (claimed; a lease when they end). A device held for a duration (hold=2h) is
held until then whatever runs on it; then the usual rules go on.

Fair use (policy.py): a user may hold at most the policy's limit of devices; a waiter that has
waited longer than the starvation bound is no longer overtaken: the free devices it needs are
set aside for it (neither /request nor a later waiter gets them) until it can be served. Every
grant, release, expiry, claim and trespass is announced as an Event (the audit record).
"""
from __future__ import annotations

import itertools
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from patroller.core.devices import Device, Inventory
from patroller.core.errors import (Busy, NotHeld, NotYours, OverLimit, TooManyWaiting, Unavailable,
                     Unsatisfiable)
from patroller.core.identity import Identity, ProcessRef
from patroller.core.policy import Policy

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Wants = Mapping[str, int]  # group -> count
Shape = Tuple[Tuple[str, int], ...]  # wants in a fixed order: waiters of one shape queue together

# A timer may fire a hair before its deadline; treat that as on time.
_EARLY = 0.001


@dataclass
class _Hold:
    """The mutable state of one device."""

    since: float
    uuid: str = ""
    holder: Optional[Identity] = None
    deadline: Optional[float] = None  # while the holder has no process here
    releasing: bool = False  # released by the holder: free once their processes end
    bound: Optional[ProcessRef] = None  # held while this process lives (hold=process)
    until: Optional[float] = None  # held until then whatever runs (hold=<duration>)
    lost: bool = False  # the device is gone from the host
    asked: bool = False  # the holder asked for it (a grant), rather than took it by computing
    processes: Dict[int, Identity] = field(default_factory=dict)  # pid -> owner, oldest first
    commands: Dict[int, Optional[str]] = field(default_factory=dict)  # pid -> name nvidia-smi printed
    trespassers: Set[str] = field(default_factory=set)  # users already logged
    shown: Tuple[str, Optional[str]] = ("free", None)  # (state, holder) when `since` was set


@dataclass(frozen=True)
class Event:
    """Something the audit record keeps: a grant, a release, an expiry, a claim, ..."""

    kind: str
    user: Optional[str]  # whose devices (the holder; the trespasser for a trespass)
    devices: Tuple[Tuple[str, int], ...]  # (uuid, number)
    details: Mapping[str, Any] = field(default_factory=dict)


def is_admin(user: Identity) -> bool:
    """The host's root, as the system identified it (never a name a caller gives)."""
    return user.source == "host" and user.uid == 0


class Waiter:
    """A request that waits until it can be granted."""

    def __init__(self, user: Identity, wants: Wants, on_grant: Callable[[List[Device]], None],
                 on_abort: Optional[Callable[[Exception], None]] = None,
                 bound: Optional[ProcessRef] = None, duration: Optional[float] = None) -> None:
        self.user = user
        self.wants = dict(wants)
        self.shape: Shape = tuple(sorted(self.wants.items()))
        self.on_grant = on_grant
        self.on_abort = on_abort
        self.bound = bound  # the grant is held for this process
        self.duration = duration  # or for this many seconds
        self.granted: Optional[List[Device]] = None
        self.arrival = 0  # set when queued: waiters are served in this order
        self.since = 0.0  # when queued, on the manager's clock


class LeaseManager:
    """Reservations, claims and waiters for an inventory of devices."""

    def __init__(self, inventory: Inventory, lease: float, clock: Clock = time.monotonic,
                 max_waiters: int = 10000, max_waiting_per_user: int = 100,
                 policy: Optional[Policy] = None) -> None:
        self.inventory = inventory
        self.lease = lease
        self.clock = clock
        self.policy = policy or Policy()  # replaced whole when the administrator reloads it
        self.max_waiters = max_waiters
        self.max_waiting_per_user = max_waiting_per_user
        now = clock()
        self._holds = {d.uuid: _Hold(since=now, uuid=d.uuid) for d in inventory}
        # Waiters by shape, each queue in arrival order: serving looks at the head of each
        # shape, not at every waiter (a scan of 1,000 waiters cost 3.6 ms a change).
        self._queues: Dict[Shape, "OrderedDict[Waiter, None]"] = {}
        self._arrivals = itertools.count()
        self._waiting = 0
        self._waiting_by_user: Dict[str, int] = {}
        self._bound: Dict[ProcessRef, Set[str]] = {}  # process -> uuids held for it
        self._subscribers: List[Callable[[], None]] = []
        self._listeners: List[Callable[[Event], None]] = []
        self._closed = False

    # -- asking for devices -------------------------------------------------------------

    def check(self, wants: Wants) -> None:
        """Raise Unsatisfiable if the request could never be granted on this host."""
        for group, count in wants.items():
            exist = self.inventory.groups.get(group)
            if exist is None:
                raise Unsatisfiable(f"there is no device group {group!r}",
                                    requested=dict(wants), groups=sorted(self.inventory.groups))
            if count > exist:
                raise Unsatisfiable(
                    f"{count} {group} requested but only {exist} exist on this host",
                    requested=dict(wants), exist=dict(self.inventory.groups))

    def request(self, user: Identity, wants: Wants, bound: Optional[ProcessRef] = None,
                duration: Optional[float] = None) -> List[Device]:
        """Reserve now, all or nothing; raise Busy when the devices are not free, OverLimit
        when the user would hold more than the policy allows.

        With `bound`, the devices are held while that process lives instead of for a lease;
        with `duration`, for that many seconds.
        """
        self._check_open()
        self.check(wants)
        self.check_limit(user, wants)
        picked = self._pick(wants)
        if picked is None:
            raise self.busy(wants)
        self._reserve(user, picked, bound, duration)
        self._event("grant", user.user, picked, **self._how(bound, duration))
        self._changed()
        return picked

    def holder(self, uuid: str) -> Optional[Identity]:
        """Who holds the device now, or None."""
        hold = self._holds.get(uuid)
        return hold.holder if hold is not None else None

    def release_idle(self, uuid: str, idle: float) -> bool:
        """Release a reservation nobody uses (no process on it), as the idle policy says; True
        if it was released."""
        hold = self._holds.get(uuid)
        if hold is None or hold.holder is None or hold.processes or hold.lost:
            return False
        user = hold.holder.user
        log.warning("%s on %s was idle for %.0f s with no process: released", user, uuid, idle)
        self._event("idle_release", user, [self.inventory.get(uuid)], idle=round(idle, 1))
        self._drop(hold)
        self._settle()
        return True

    def check_limit(self, user: Identity, wants: Wants) -> None:
        """Raise OverLimit if granting `wants` would give the user more than their limit."""
        limit = self.policy.limit_of(user.user)
        if limit is None:
            return
        held = self.held_by(user.user)
        asked = sum(wants.values())
        if len(held) + asked > limit:
            numbers = ", ".join(str(d.number) for d in held) or "none"
            raise OverLimit(
                f"{user.user} holds {len(held)} device(s) ({numbers}) and asks for {asked}: "
                f"the most one user may hold is {limit}; release some first "
                "(/release?uuid=..., or patroller release NUMBER)",
                limit=limit, held=[d.number for d in held], requested=dict(wants))

    def held_by(self, user: str) -> List[Device]:
        """The present devices `user` holds, every way (reserved, claimed, shared)."""
        return [d for d in self.inventory if not d.lost
                and self._holds[d.uuid].holder is not None
                and self._holds[d.uuid].holder.user == user]

    def wait(self, user: Identity, wants: Wants, on_grant: Callable[[List[Device]], None],
             on_abort: Optional[Callable[[Exception], None]] = None,
             bound: Optional[ProcessRef] = None, duration: Optional[float] = None) -> Waiter:
        """Queue a request; `on_grant(devices)` is called once it is reserved (maybe at once).

        `on_abort(error)` is called instead if the manager closes first. A request that has to
        wait raises TooManyWaiting when the user already has `max_waiting_per_user` waiting,
        Unavailable when the queue is full.
        """
        self._check_open()
        self.check(wants)
        self.check_limit(user, wants)
        waiter = Waiter(user, wants, on_grant, on_abort, bound, duration)
        # Every change that frees a device serves the queue, so no queued waiter fits what is
        # free now: only the newcomer can, and trying it alone keeps the arrival order.
        picked = self._pick(waiter.wants)
        if picked is None:
            mine = self._waiting_by_user.get(user.user, 0)
            if mine >= self.max_waiting_per_user:
                raise TooManyWaiting(
                    f"{user.user} already has {mine} requests waiting, the most one user may have",
                    limit=self.max_waiting_per_user, waiting=mine)
            if self._waiting >= self.max_waiters:
                raise Unavailable(f"too many waiting requests ({self._waiting})")
            self._enqueue(waiter)
            return waiter
        self._reserve(user, picked, bound, duration)
        waiter.granted = picked
        self._event("grant", user.user, picked, waited=0.0, **self._how(bound, duration))
        self._changed()
        on_grant(picked)
        return waiter

    def cancel(self, waiter: Waiter) -> bool:
        """Stop waiting; True if it was still waiting (and so got nothing)."""
        queue = self._queues.get(waiter.shape)
        if queue is None or waiter not in queue:
            return False
        self._dequeue(waiter)
        return True

    def release(self, user: Identity, uuid: Optional[str] = None,
                reason: Optional[str] = None) -> Tuple[List[Device], List[Device]]:
        """Give back the user's devices (all, or one): (freed now, freed when their processes
        end). The host's root (`is_admin`) may release another user's device, named by uuid:
        recorded with `reason` as an administrator's release."""
        admin = False
        if uuid is not None:
            device = self.inventory.get(uuid)
            if device is None:
                raise Unsatisfiable(f"there is no device {uuid!r}", uuid=uuid)
            holder = self._holds[uuid].holder
            if holder is not None and not holder.same_user(user):
                if not is_admin(user):
                    raise NotYours(f"device {uuid} is held by another user", uuid=uuid)
                admin = True
            devices = [device]
        else:
            devices = list(self.inventory)
        now_free, after_exit = [], []
        for device in devices:
            hold = self._holds[device.uuid]
            owner = hold.holder
            if owner is None or not (admin or user.same_user(owner)):
                continue
            if admin:
                self._event("admin_release", owner.user, [device], by=user.user,
                            reason=reason or "released by the administrator")
                log.warning("%s released %s, held by %s: %s", user.user, device.uuid,
                            owner.user, reason or "no reason given")
            else:
                self._event("release", owner.user, [device], **({"reason": reason}
                                                              if reason else {}))
            if self._pids_of(hold, owner):
                hold.releasing = True
                self._unbind(hold)
                after_exit.append(device)
            else:
                self._drop(hold)
                now_free.append(device)
        if now_free or after_exit:
            self._settle()
        return now_free, after_exit

    def renew(self, user: Identity, uuid: Optional[str] = None) -> List[Device]:
        """Restart the lease of the user's reservations (all, or one); the devices they hold.

        A device whose lease does not run (claimed by the user's processes, or held for a
        process) is listed unchanged. Asked for one device: NotHeld if the user does not hold
        it (the lease ran out, or it was released), NotYours if another user does.
        """
        self._check_open()
        if uuid is not None:
            device = self.inventory.get(uuid)
            if device is None:
                raise Unsatisfiable(f"there is no device {uuid!r}", uuid=uuid)
            hold = self._holds[uuid]
            if hold.holder is None:
                raise NotHeld(f"device {uuid} is not held by you: its lease ran out or it was "
                              "released", uuid=uuid, state=self._state(hold))
            if not hold.holder.same_user(user) or hold.releasing:
                if hold.releasing:
                    raise NotHeld(f"device {uuid} was released: it is free once your processes "
                                  "on it end", uuid=uuid, state=self._state(hold))
                raise NotYours(f"device {uuid} is held by another user", uuid=uuid)
            devices = [device]
        else:
            devices = [d for d in self.inventory if user.same_user(self._holds[d.uuid].holder)
                       and not self._holds[d.uuid].releasing]
        deadline = self.clock() + self.lease
        for device in devices:
            hold = self._holds[device.uuid]
            if hold.deadline is not None:
                hold.deadline = deadline
        if devices:
            self._changed()
        return devices

    def hold_of(self, uuid: str) -> Dict[str, Any]:
        """How a device is held, as a grant shows it: its hold, seconds left, the process."""
        hold = self._holds[uuid]
        now = self.clock()
        return {
            "hold": self._hold_kind(hold),
            "expires": self._expires(hold, now),
            "held_for_pid": hold.bound.pid if hold.bound is not None else None,
        }

    @staticmethod
    def _hold_kind(hold: _Hold) -> str:
        if hold.bound is not None:
            return "process"
        return "duration" if hold.until is not None else "lease"

    @staticmethod
    def _expires(hold: _Hold, now: float) -> Optional[float]:
        """Seconds until the hold ends: its lease, or the duration asked for."""
        end = hold.until if hold.until is not None else hold.deadline
        return None if end is None else round(max(0.0, end - now), 3)

    # -- what the monitors see ------------------------------------------------------------

    def devices_changed(self) -> None:
        """The inventory changed (Inventory.update): new devices are free, lost ones are lost,
        and a device that came back is free again unless someone holds it."""
        now = self.clock()
        for device in self.inventory:
            hold = self._holds.get(device.uuid)
            if hold is None:
                hold = self._holds[device.uuid] = _Hold(since=now, uuid=device.uuid)
            if hold.lost != device.lost:
                hold.lost = device.lost
                log.warning("%s is %s", device.uuid, "lost" if device.lost else "back")
                self._event("lost" if device.lost else "back",
                            hold.holder.user if hold.holder else None, [device])
            self._touch(hold)
        self._settle()

    def process_started(self, uuid: str, pid: int, owner: Identity,
                        command: Optional[str] = None) -> None:
        """A process of `owner` appeared on a device (`command`: its name, when known)."""
        hold = self._holds.get(uuid)
        if hold is None or pid in hold.processes:
            return
        hold.processes[pid] = owner
        hold.commands[pid] = command
        log.debug("pid %d of %s on %s", pid, owner.user, uuid)
        if hold.holder is None:
            hold.holder = owner
            self._event("claim", owner.user, [self.inventory.get(uuid)], pid=pid,
                        command=command)
        self._place(hold, uuid, pid, owner)
        self._changed()

    def update_owner(self, uuid: str, pid: int, owner: Identity) -> None:
        """A process's owner became known (it was degraded, e.g. while Docker was down)."""
        hold = self._holds.get(uuid)
        if hold is None or pid not in hold.processes:
            return
        old = hold.processes[pid]
        hold.processes[pid] = owner
        if hold.holder is not None and hold.holder.same_user(old) and not self._pids_of(hold, old):
            hold.holder = owner  # the device was held only through this process
        self._place(hold, uuid, pid, owner)
        self._settle()

    def _place(self, hold: _Hold, uuid: str, pid: int, owner: Identity) -> None:
        """A process of `owner` is on a held device: it claims it, or it trespasses (logged once)."""
        if owner.same_user(hold.holder):
            hold.deadline = None
        elif owner.user not in hold.trespassers:
            hold.trespassers.add(owner.user)
            log.warning("trespassing: %s runs pid %d on %s, held by %s",
                        owner.user, pid, uuid, hold.holder.user if hold.holder else "nobody")
            self._event("trespass", owner.user, [self.inventory.get(uuid)], pid=pid,
                        holder=hold.holder.user if hold.holder else None)
        self._touch(hold)

    def process_ended(self, uuid: str, pid: int) -> None:
        """A process left a device."""
        hold = self._holds.get(uuid)
        if hold is None or pid not in hold.processes:
            return
        self._forget(hold, pid)
        self._settle()

    def _forget(self, hold: _Hold, pid: int) -> None:
        """A process is no longer on the device: the lease restarts if it was the holder's last
        (unless the device is held for a live process), a released device is freed."""
        owner = hold.processes.pop(pid)
        hold.commands.pop(pid, None)
        log.debug("pid %d of %s left %s", pid, owner.user, hold.uuid)
        if not self._pids_of(hold, owner):
            hold.trespassers.discard(owner.user)
        if hold.holder is not None and not self._pids_of(hold, hold.holder):
            if hold.releasing:
                self._drop(hold)
            elif hold.deadline is None and hold.bound is None and hold.until is None:
                hold.deadline = self.clock() + self.lease  # the lease restarts
        self._touch(hold)

    def bound_processes(self) -> Set[ProcessRef]:
        """The processes devices are held for: lifetimes.py watches them."""
        return set(self._bound)

    def process_exited(self, ref: ProcessRef) -> List[Device]:
        """A process devices were held for has ended: free them, unless the holder's processes
        run on them (then the usual rules go on). The devices it held."""
        uuids = self._bound.get(ref)
        if not uuids:
            return []
        devices = [d for d in self.inventory if d.uuid in uuids]
        for hold in self._holds.values():  # the kernel's word: it is on no device any more,
            if ref.pid in hold.processes:  # though pmon may list it for another interval
                self._forget(hold, ref.pid)
        for device in devices:
            hold = self._holds[device.uuid]
            self._unbind(hold)
            user = hold.holder.user if hold.holder else "?"
            if self._pids_of(hold, hold.holder):
                log.info("pid %d of %s ended; that user's processes still run on %s", ref.pid, user,
                         device.uuid)
            else:
                log.info("pid %d of %s ended: %s is free", ref.pid, user, device.uuid)
                self._event("ended", user, [device], pid=ref.pid)
                self._drop(hold)
        self._settle()
        return devices

    # -- time -----------------------------------------------------------------------------

    def next_deadline(self) -> Optional[float]:
        """The earliest time a reservation runs out, on the manager's clock."""
        deadlines = [t for h in self._holds.values() for t in (h.deadline, h.until)
                     if t is not None]
        return min(deadlines) if deadlines else None

    def expire(self) -> List[Device]:
        """End every reservation whose lease has run out; return those devices."""
        now = self.clock()
        expired = []
        for device in self.inventory:
            hold = self._holds[device.uuid]
            user = hold.holder.user if hold.holder else "?"
            if hold.until is not None and hold.until <= now + _EARLY:
                hold.until = None  # the duration asked for is over: the usual rules
                if self._pids_of(hold, hold.holder):
                    log.info("the reservation of %s on %s ended; their processes hold it", user,
                             device.uuid)
                    continue
                log.info("the reservation of %s on %s ended", user, device.uuid)
                self._event("expire", user, [device], hold="duration")
                self._drop(hold)
                expired.append(device)
            elif hold.deadline is not None and hold.deadline <= now + _EARLY:
                log.info("lease of %s on %s expired", user, device.uuid)
                self._event("expire", user, [device], hold="lease")
                self._drop(hold)
                expired.append(device)
        if expired:
            self._settle()
        return expired

    # -- reading ----------------------------------------------------------------------------

    def state(self, uuid: str) -> str:
        """free, reserved, claimed, shared or lost."""
        return self._state(self._holds[uuid])

    def claims(self) -> Dict[str, Dict[str, Any]]:
        """The claim part of /status for every device, in device order."""
        now = self.clock()
        claims = {uuid: self._claim_view(hold, now) for uuid, hold in self._holds.items()}
        waiter, aside = self._set_aside()
        for uuid in aside:
            claims[uuid]["set_aside_for"] = waiter.user.user if waiter is not None else None
        return claims

    def free_counts(self) -> Dict[str, int]:
        """How many devices of each group are free now."""
        counts = {group: 0 for group in self.inventory.groups}
        for device in self.inventory:
            if self._state(self._holds[device.uuid]) == "free":
                counts[device.group] += 1
        return counts

    @property
    def waiting(self) -> int:
        """How many requests are waiting."""
        return self._waiting

    def waiting_of(self, user: Identity) -> int:
        """How many requests this user has waiting."""
        return self._waiting_by_user.get(user.user, 0)

    def queue(self) -> List[Dict[str, Any]]:
        """The waiting requests in arrival order, as /queue lists them."""
        now = self.clock()
        waiters = sorted((w for queue in self._queues.values() for w in queue),
                         key=lambda w: w.arrival)
        return [{
            "position": n,
            "user": w.user.user,
            "wants": dict(w.wants),
            "waited": round(now - w.since, 3),
            "hold": "process" if w.bound is not None else "lease",
            "pid": w.bound.pid if w.bound is not None else None,
        } for n, w in enumerate(waiters, 1)]

    def usage(self) -> Dict[str, Dict[str, int]]:
        """Per user: devices held (`held`), held with nothing running (`reserved_unused`), and
        used without having asked for them (`unreserved`: their processes on a device another
        user holds, or on one they took by computing on it rather than by a request)."""
        out: Dict[str, Dict[str, int]] = {}

        def add(user: str, key: str) -> None:
            counts = out.setdefault(user, {"held": 0, "reserved_unused": 0, "unreserved": 0})
            counts[key] += 1

        for hold in self._holds.values():
            if hold.lost:
                continue
            if hold.holder is not None:
                add(hold.holder.user, "held")
                if not hold.processes:
                    add(hold.holder.user, "reserved_unused")
            for user in {owner.user for owner in hold.processes.values()}:
                if hold.holder is None or user != hold.holder.user or not hold.asked:
                    add(user, "unreserved")
        return out

    def waiting_by_user(self) -> Dict[str, Tuple[int, float]]:
        """Per user: (requests waiting, seconds the longest has waited)."""
        now = self.clock()
        out: Dict[str, Tuple[int, float]] = {}
        for queue in self._queues.values():
            for waiter in queue:
                count, longest = out.get(waiter.user.user, (0, 0.0))
                out[waiter.user.user] = (count + 1, max(longest, now - waiter.since))
        return out

    def holds(self) -> Dict[str, Dict[str, Any]]:
        """Per device: what the metrics show of its hold (state, holder, age, lease left, and
        each process's owner and command)."""
        now = self.clock()
        return {uuid: {
            "state": self._state(hold),
            "holder": hold.holder,
            "age": now - hold.since,
            "expires": self._expires(hold, now),
            "processes": [(pid, owner, hold.commands.get(pid))
                          for pid, owner in hold.processes.items()],
        } for uuid, hold in self._holds.items()}

    def listen(self, callback: Callable[[Event], None]) -> None:
        """Call `callback(event)` for every event of the audit record."""
        self._listeners.append(callback)

    def _event(self, kind: str, user: Optional[str], devices: List[Optional[Device]],
               **details: Any) -> None:
        if not self._listeners:
            return
        event = Event(kind, user, tuple((d.uuid, d.number) for d in devices if d is not None),
                      {k: v for k, v in details.items() if v is not None})
        for callback in list(self._listeners):
            try:
                callback(event)
            except Exception:  # a broken audit sink must not break the lease rules
                log.exception("event listener failed")

    @staticmethod
    def _how(bound: Optional[ProcessRef], duration: Optional[float]) -> Dict[str, Any]:
        if bound is not None:
            return {"hold": "process", "pid": bound.pid}
        if duration is not None:
            return {"hold": "duration", "seconds": duration}
        return {"hold": "lease"}

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after every change of state."""
        self._subscribers.append(callback)

    def busy(self, wants: Wants) -> Busy:
        """The error for a request that cannot be granted now: says how many are free."""
        free = self.free_counts()
        parts = [f"{count} {group} requested, {free.get(group, 0)} free"
                 for group, count in wants.items()]
        return Busy("busy: " + "; ".join(parts), requested=dict(wants), free=free)

    def close(self) -> None:
        """Refuse new requests; every waiter is aborted and gets nothing."""
        self._closed = True
        waiters = sorted((w for queue in self._queues.values() for w in queue),
                         key=lambda w: w.arrival)
        self._queues.clear()
        self._waiting_by_user.clear()
        self._waiting = 0
        for waiter in waiters:
            if waiter.on_abort is not None:
                waiter.on_abort(Unavailable("the server is shutting down"))

    # -- inside -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the server is shutting down")

    def _pick(self, wants: Wants) -> Optional[List[Device]]:
        """Free devices for every group, in device order, or None if any group falls short.
        Devices set aside for a starving waiter are not free for anyone else."""
        aside = self._set_aside()[1]
        picked = []
        for group, count in wants.items():
            free = [d for d in self.inventory.in_group(group)
                    if self._state(self._holds[d.uuid]) == "free" and d.uuid not in aside]
            if len(free) < count:
                return None
            picked.extend(free[:count])
        return sorted(picked, key=lambda d: d.number)

    def _reserve(self, user: Identity, devices: List[Device],
                 bound: Optional[ProcessRef] = None, duration: Optional[float] = None) -> None:
        now = self.clock()
        held = bound is not None or duration is not None
        deadline = None if held else now + self.lease
        for device in devices:
            hold = self._holds[device.uuid]
            hold.holder, hold.deadline, hold.releasing, hold.asked = user, deadline, False, True
            hold.until = None if duration is None else now + duration
            if bound is not None:
                self._bind(hold, bound)
            self._touch(hold)

    def _bind(self, hold: _Hold, ref: ProcessRef) -> None:
        self._unbind(hold)
        hold.bound = ref
        self._bound.setdefault(ref, set()).add(hold.uuid)

    def _unbind(self, hold: _Hold) -> None:
        ref, hold.bound = hold.bound, None
        if ref is None:
            return
        uuids = self._bound.get(ref)
        if uuids is not None:
            uuids.discard(hold.uuid)
            if not uuids:
                del self._bound[ref]

    def _settle(self) -> None:
        """After a change that may free devices: serve the waiters, tell the subscribers, then
        hand out the grants."""
        granted = self._serve()
        self._changed()
        for waiter in granted:  # after the state is settled, so callbacks see it whole
            waiter.on_grant(waiter.granted or [])

    def _serve(self) -> List[Waiter]:
        """Reserve, in arrival order, for every waiter whose request can be satisfied now.

        A waiter that wants more than is free does not hold back a later one that fits. The
        next to serve is the earliest head among the shapes that fit: a waiter behind a head
        of its own shape cannot come first, and free devices only run out within one pass.
        """
        granted: List[Waiter] = []
        if not self._queues:
            return granted
        free: Dict[str, List[Device]] = {}
        for device in self.inventory:
            if self._state(self._holds[device.uuid]) == "free":
                free.setdefault(device.group, []).append(device)
        skipped: Set[Waiter] = set()  # over their user's limit now: they wait on
        while free:
            starving, aside = self._set_aside(free)
            heads = []
            for queue in self._queues.values():
                waiter = next((w for w in queue if w not in skipped), None)
                if waiter is None:
                    continue
                usable = free if waiter is starving else {
                    g: [d for d in devs if d.uuid not in aside] for g, devs in free.items()}
                if all(len(usable.get(group, ())) >= count for group, count in waiter.shape):
                    heads.append((waiter, usable))
            if not heads:
                break
            waiter, usable = min(heads, key=lambda pair: pair[0].arrival)
            limit = self.policy.limit_of(waiter.user.user)
            if limit is not None and len(self.held_by(waiter.user.user)) + sum(
                    waiter.wants.values()) > limit:
                skipped.add(waiter)
                continue
            self._dequeue(waiter)
            picked = []
            for group, count in waiter.shape:
                chosen = usable[group][:count]
                picked.extend(chosen)
                free[group] = [d for d in free[group] if d not in chosen]
            picked.sort(key=lambda d: d.number)
            self._reserve(waiter.user, picked, waiter.bound, waiter.duration)
            waiter.granted = picked
            self._event("grant", waiter.user.user, picked,
                        waited=round(self.clock() - waiter.since, 3),
                        **self._how(waiter.bound, waiter.duration))
            granted.append(waiter)
        return granted

    def starving(self) -> Optional[Waiter]:
        """The waiter no longer overtaken: the longest waiting, once it has waited longer than
        the policy's starvation bound."""
        heads = [next(iter(queue)) for queue in self._queues.values()]
        if not heads:
            return None
        first = min(heads, key=lambda w: w.arrival)
        return first if self.clock() - first.since >= self.policy.starvation_bound else None

    def _set_aside(self, free: Optional[Dict[str, List[Device]]] = None
                   ) -> Tuple[Optional[Waiter], Set[str]]:
        """The starving waiter, and the free devices held for it (as many of each group it
        wants as are free, lowest numbers first)."""
        waiter = self.starving()
        if waiter is None:
            return None, set()
        if free is None:
            free = {}
            for device in self.inventory:
                if self._state(self._holds[device.uuid]) == "free":
                    free.setdefault(device.group, []).append(device)
        return waiter, {d.uuid for group, count in waiter.shape
                        for d in free.get(group, [])[:count]}

    def _enqueue(self, waiter: Waiter) -> None:
        waiter.arrival = next(self._arrivals)
        waiter.since = self.clock()
        self._queues.setdefault(waiter.shape, OrderedDict())[waiter] = None
        self._waiting += 1
        user = waiter.user.user
        self._waiting_by_user[user] = self._waiting_by_user.get(user, 0) + 1

    def _dequeue(self, waiter: Waiter) -> None:
        queue = self._queues[waiter.shape]
        del queue[waiter]
        if not queue:
            del self._queues[waiter.shape]
        self._waiting -= 1
        user = waiter.user.user
        left = self._waiting_by_user[user] - 1
        if left:
            self._waiting_by_user[user] = left
        else:
            del self._waiting_by_user[user]

    def _drop(self, hold: _Hold) -> None:
        """End the holder's hold; remaining processes pass the device to their owner."""
        if hold.bound is not None:
            self._unbind(hold)
        hold.holder, hold.deadline, hold.releasing, hold.asked = None, None, False, False
        hold.until = None
        hold.trespassers.clear()
        if hold.processes:
            hold.holder = next(iter(hold.processes.values()))
            hold.trespassers = {o.user for o in hold.processes.values()} - {hold.holder.user}
        self._touch(hold)

    def _touch(self, hold: _Hold) -> None:
        """Restart the age when the state or the holder changes."""
        shown = (self._state(hold), hold.holder.user if hold.holder else None)
        if shown != hold.shown:
            hold.shown, hold.since = shown, self.clock()

    @staticmethod
    def _pids_of(hold: _Hold, user: Optional[Identity]) -> List[int]:
        return [pid for pid, owner in hold.processes.items() if owner.same_user(user)]

    @staticmethod
    def _state(hold: _Hold) -> str:
        if hold.lost:
            return "lost"
        if hold.holder is None:
            return "free"
        if any(not owner.same_user(hold.holder) for owner in hold.processes.values()):
            return "shared"
        return "claimed" if hold.processes else "reserved"

    def _claim_view(self, hold: _Hold, now: float) -> Dict[str, Any]:
        users: List[Identity] = [hold.holder] if hold.holder else []
        for owner in hold.processes.values():
            if not any(owner.same_user(u) for u in users):
                users.append(owner)
        return {
            "state": self._state(hold),
            "user": hold.holder.to_json() if hold.holder else None,
            "users": [u.to_json() for u in users],
            "processes": list(hold.processes),
            "process_detail": [{"pid": pid, "user": owner.user, "command": hold.commands.get(pid)}
                               for pid, owner in hold.processes.items()],
            "age": round(now - hold.since, 3),
            "expires": self._expires(hold, now),
            "held_for_pid": hold.bound.pid if hold.bound is not None else None,
            "hold": self._hold_kind(hold) if hold.holder is not None else None,
            "asked": hold.asked,
            "set_aside_for": None,
        }

    def _changed(self) -> None:
        for callback in list(self._subscribers):
            try:
                callback()
            except Exception:  # a subscriber's bug must not corrupt the lease state
                log.exception("lease subscriber failed")

    # -- the book on disk -------------------------------------------------------------------
    # What survives a restart (book.py keeps it in a file): every held device's holder,
    # releasing flag, deadline and the process it is held for. Deadlines go to disk on the wall clock (this manager's clock
    # + `offset`), as the monotonic clock means nothing to the next process after a reboot.

    def snapshot(self, offset: float) -> Dict[str, Dict[str, Any]]:
        """Every held device as the book keeps it; deadlines as epoch seconds (clock() + offset)."""
        return {
            uuid: {
                "holder": hold.holder.to_json(),
                "state": self._state(hold),
                "releasing": hold.releasing,
                "deadline": None if hold.deadline is None else round(hold.deadline + offset, 3),
                **({"pid": hold.bound.pid, "start": hold.bound.start} if hold.bound else {}),
                **({"until": round(hold.until + offset, 3)} if hold.until is not None else {}),
            }
            for uuid, hold in self._holds.items() if hold.holder is not None
        }

    def restore(self, held: Any, offset: float,
                alive: Callable[[ProcessRef], bool] = lambda ref: False) -> Restored:
        """Give held devices back to their holders at start; ValueError, and no change, if bad.

        A reservation keeps its deadline, and is not restored if that passed while the daemon
        was down. A device its holder's processes were on comes back reserved with a fresh
        lease: the processes claim it again when the monitors see them, and if they died the
        lease runs out as any other. A device held for a process comes back held for it if
        `alive(process)` says it still runs, else it is not restored.
        """
        if not isinstance(held, Mapping):
            raise ValueError("devices must be an object")
        entries = [(uuid, *_book_entry(uuid, value)) for uuid, value in held.items()]
        now = self.clock()
        restored = Restored()
        for uuid, holder, deadline, releasing, bound, until in entries:
            hold = self._holds.get(uuid)
            if hold is None:
                log.warning("the lease book holds %s for %s, a device this host no longer has: "
                            "dropped", uuid, holder.user)
                restored.dropped.append(uuid)
                continue
            if hold.holder is not None:  # already held again (restore runs before serving)
                continue
            if bound is not None:
                if not alive(bound):
                    log.info("pid %d of %s, which held %s, ended while the daemon was down",
                             bound.pid, holder.user, uuid)
                    restored.ended.append(uuid)
                    continue
                deadline = None
            elif until is not None:  # never longer than the longest hold one may ask for
                until = min(until - offset, now + self.policy.max_hold)
                if until <= now + _EARLY:
                    log.info("the reservation of %s on %s ended while the daemon was down",
                             holder.user, uuid)
                    restored.expired.append(uuid)
                    continue
                deadline = None
            elif deadline is None:
                deadline = now + self.lease
            else:  # never more than a full lease: the wall clock may have been set back
                deadline = min(deadline - offset, now + self.lease)
                if deadline <= now + _EARLY:
                    log.info("lease of %s on %s ran out while the daemon was down", holder.user,
                             uuid)
                    restored.expired.append(uuid)
                    continue
            hold.holder, hold.deadline, hold.releasing = holder, deadline, releasing
            hold.until = until if bound is None else None
            hold.asked = True  # the book keeps grants; a claim by processes is seen again
            if bound is not None:
                self._bind(hold, bound)
            self._touch(hold)
            restored.held.append(uuid)
        if restored.held:
            self._changed()
        return restored


@dataclass
class Restored:
    """What `LeaseManager.restore` did with each device of the book, by uuid."""

    held: List[str] = field(default_factory=list)  # given back to their holder
    expired: List[str] = field(default_factory=list)  # the lease ran out during the downtime
    dropped: List[str] = field(default_factory=list)  # no such device on this host any more
    ended: List[str] = field(default_factory=list)  # the process it was held for has ended


def _time(uuid: Any, name: str, value: Any) -> Optional[float]:
    """A time of the book (epoch seconds), or None; ValueError if it is not one."""
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        value = float(value)  # an int too big for a float: OverflowError
        if not math.isfinite(value):
            raise TypeError
    except (TypeError, OverflowError):
        raise ValueError(f"device {uuid!r} has a {name} that is not a time") from None
    return value


def _book_entry(uuid: Any, value: Any) -> Tuple[Identity, Optional[float], bool,
                                                Optional[ProcessRef], Optional[float]]:
    """(holder, deadline, releasing, process, until) of one device in the book; ValueError if
    it is not one."""
    if not isinstance(value, Mapping):
        raise ValueError(f"device {uuid!r} must be an object")
    deadline, releasing = value.get("deadline"), value.get("releasing", False)
    deadline = _time(uuid, "deadline", deadline)
    until = _time(uuid, "end", value.get("until"))
    if not isinstance(releasing, bool):
        raise ValueError(f"device {uuid!r} has a releasing flag that is not true or false")
    pid, start = value.get("pid"), value.get("start")
    bound = None
    if pid is not None or start is not None:
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (pid, start)):
            raise ValueError(f"device {uuid!r} has a process that is not a pid and a start time")
        bound = ProcessRef(pid, start)
    return Identity.from_json(value.get("holder")), deadline, releasing, bound, until
