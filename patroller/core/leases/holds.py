"""The hold of one device, the events of the audit record, and the types the lease rules share.

A device is
  free      no holder and no process;
  reserved  held for a user whose process has not (or no longer) shown up: the lease runs, or,
            held for a process (hold=process), no lease runs while that process lives;
  claimed   every process on it belongs to the holder;
  shared    a process of another user runs on it as well (logged once as trespassing);
  allocated held by a Slurm job (core/jobs.py) or a Kubernetes pod (core/pods.py) with no
            process of it there yet: never granted, no lease runs; once the job (or pod)
            computes it is claimed, and a process not in it makes it shared, whoever runs it;
  lost      gone from the host (fell off the bus, removed): never granted; its holder, if any,
            is still shown, and its reservation ends by the usual rules.

A process whose owner is still being looked up (`Identity.identifying`: an engine slow to
answer) counts for nothing but this: a device with no holder is held by it (claimed by
`unknown`), so that it is never shown free, nor granted, while a process runs there. It is no
one's claim or trespass, it stops no lease and changes no state of a held device, until its
owner is known (LeaseManager.update_owner); if it ends unknown, the device is as before.

A hold is held one way: for a lease (a deadline while the holder runs nothing there), for a
process (`held_for`: while that process lives), for a duration (`until`: whatever runs), or
for a Slurm job or a Kubernetes pod (`allocation`: while the job map, or the kubelet, lists
the device).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any

from patroller.core.devices import Device
from patroller.core.health import FINE, Health
from patroller.core.identity import Identity, ProcessRef
from patroller.core.leases.tally import Tally
from patroller.core.scheduled import SchedulerAllocation

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Wants = Mapping[str, int]  # group -> count
# wants in a fixed order, and the link insisted on: waiters of one shape queue together
Shape = tuple[tuple[tuple[str, int], ...], str | None]

# A timer may fire a hair before its deadline, and a float sum may land a hair short of it:
# an end within this many seconds from now is taken as reached. Not a tuning value: the
# tolerance of comparing times, shared by expiry and the book's restore.
EARLY = 0.001


_USER = attrgetter("user")


@dataclass(eq=False)
class Hold:
    """The mutable state of one device: who holds it, how, and what runs on it."""

    since: float  # when `shown` last changed: the age of the state
    uuid: str = ""
    holder: Identity | None = None
    deadline: float | None = None  # while the holder has no process here
    releasing: bool = False  # released by the holder: free once their processes end
    held_for: ProcessRef | None = None  # held while this process lives (hold=process)
    until: float | None = None  # held until then whatever runs (hold=<duration>)
    lost: bool = False  # the device is gone from the host
    withheld: str | None = None  # why it is granted to nobody now: `withholds`, joined
    withholds: dict[str, str] = field(default_factory=dict)  # cause (silent, health) -> why
    health: Health = FINE  # what nvidia-smi and the kernel say of the device (core/health.py)
    asked: bool = False  # the holder asked for it (a grant), rather than took it by computing
    over_limit: bool = False  # the holder took it by computing, beyond a limit (a trespass)
    allocation: SchedulerAllocation | None = None  # the Slurm jobs or pods it is allocated to
    processes: dict[int, Identity] = field(default_factory=dict)  # pid -> owner, oldest first
    commands: dict[int, str | None] = field(default_factory=dict)  # pid -> name nvidia-smi printed
    trespassers: set[str] = field(default_factory=set)  # users already logged
    shown: tuple[str, str | None] = ("free", None)  # (state, holder) when `since` was set
    # Changes of `processes` and `commands` (made only by add, rename and forget): a view
    # shows the process list again when it moves, without comparing the lists.
    process_version: int = 0
    # The users of `processes`, counted as they change (the state and users at 5,000
    # processes without a pass over them)
    tally: Tally = field(default_factory=Tally, repr=False)
    # Who held it last, and when it was freed: the tie-breaks of the topology's choice.
    last_user: str | None = None
    freed: float | None = None

    @property
    def free(self) -> bool:
        """Whether the state is free, without looking at the processes."""
        return not self.lost and self.holder is None

    @property
    def state(self) -> str:
        """free, reserved, allocated, claimed, shared or lost."""
        if self.lost:
            return "lost"
        if self.holder is None:
            return "free"
        if self.holder.identifying:
            return "claimed"
        if self.allocation is None:  # belongs: the holder's user, counted by the tally
            users = self.tally.known
            if len(users) > (self.holder.user in users):
                return "shared"
            return "claimed" if users else "reserved"
        known = [owner for owner in self.tally.owners if not owner.identifying]  # distinct
        if any(not self.belongs(owner) for owner in known):
            return "shared"
        return "claimed" if known else "allocated"

    def belongs(self, owner: Identity) -> bool:
        """Whether a process of `owner` runs here by right: it is the holder's, or, on a
        device allocated to jobs (or pods), it is in one of them."""
        if self.allocation is not None:
            return self.allocation.member_of(owner) is not None
        return owner.same_user(self.holder)

    def key(self, owner: Identity) -> str:
        """Whom a trespass is told of once: the user, and on an allocated device the job
        their process is in (or none), as one user's two jobs are two trespassers (pods
        likewise)."""
        if self.allocation is None:
            return owner.user
        return f"{owner.user} in {self.allocation.word} {self.allocation.own(owner) or '-'}"

    def held_by_processes(self) -> bool:
        """Whether a process here holds the device: the holder's, or on an allocated one a
        process of its jobs (or pods), as the tally says."""
        if self.allocation is not None:  # each distinct owner asked once
            return any(map(self.belongs, self.tally.owners))
        return self.holder is not None and self.holder.user in self.tally.every

    @property
    def how(self) -> str:
        """How it is held: for a process, for a duration, or for a lease."""
        if self.allocation is not None:
            return self.allocation.how  # slurm, kubernetes
        if self.held_for is not None:
            return "process"
        return "duration" if self.until is not None else "lease"

    def expires(self, now: float) -> float | None:
        """Seconds until the hold ends: its lease, or the duration asked for."""
        end = self.until if self.until is not None else self.deadline
        return None if end is None else round(max(0.0, end - now), 3)

    def pids_of(self, user: Identity | None) -> list[int]:
        """The pids of `user`'s processes on the device (as `same_user` says, in C)."""
        if user is None:
            return []
        owners = self.processes.values()
        return list(compress(self.processes, map(user.user.__eq__, map(_USER, owners))))

    def users(self) -> list[Identity]:
        """The holder, then every other user whose processes run on the device (the first
        process of each names them), as the tally keeps them."""
        return self.tally.users(self.processes, self.holder)  # users as same_user says

    def touch(self, now: float) -> None:
        """Restart the age when the state or the holder changed."""
        shown = (self.state, self.holder.user if self.holder else None)
        if shown != self.shown:
            self.shown, self.since = shown, now

    def take(
        self,
        holder: Identity,
        now: float,
        deadline: float | None = None,
        until: float | None = None,
        held_for: ProcessRef | None = None,
        releasing: bool = False,
        asked: bool = True,
    ) -> None:
        """Hold the device for `holder`, as granted: until `deadline` (a lease), until `until`
        (a duration), or while `held_for` lives. `asked`: by a grant (else taken by computing,
        as the lease book may say at start)."""
        self.holder, self.deadline, self.until = holder, deadline, until
        self.held_for, self.releasing, self.asked = held_for, releasing, asked
        self.over_limit = False
        self.touch(now)

    def place(self, owner: Identity, now: float) -> bool:
        """A process of `owner` runs here: the holder's own stops the lease. True for the first
        process here of another user: a trespass, reported once."""
        trespass = False
        if owner.identifying:
            pass  # nobody's yet: it changes nothing until its owner is known
        elif self.belongs(owner):
            self.deadline = None
            if self.allocation is not None and not self.allocation.named():
                self.holder = self.allocation.holder(owner)  # the job's user, from its process
        elif self.key(owner) not in self.trespassers:
            self.trespassers.add(self.key(owner))
            trespass = True
        self.touch(now)
        return trespass

    def add(self, pid: int, owner: Identity, command: str | None) -> None:
        """A process of `owner` (named `command`, when known) started here: its arrival is
        `place`'s."""
        old = self.processes.get(pid)
        self.processes[pid], self.commands[pid] = owner, command
        self.process_version += 1
        if old is None:
            self.tally.arrived(pid, owner)
        else:  # a pid seen again before its end: in its place
            self.tally.changed(old, owner)

    def rename(self, pid: int, owner: Identity) -> bool:
        """The owner of a process here became known, or better known: True if it was being
        looked up and is known now (it arrives as if it had just started)."""
        old, self.processes[pid] = self.processes[pid], owner
        self.process_version += 1
        self.tally.changed(old, owner)
        if old.identifying and not owner.identifying:
            return True
        if self.holder is not None and (
            self.holder == old
            if old.identifying
            else (
                self.allocation is None
                and self.holder.same_user(old)
                and old.user not in self.tally.every
            )
        ):
            self.holder = owner  # the device was held only through this process
        return False

    def forget(self, pid: int, now: float, lease: float) -> None:
        """A process left: a lease of `lease` s starts if it was the holder's last (unless the
        hold is for a process or a duration); a released device's hold ends."""
        owner = self.processes.pop(pid)
        self.commands.pop(pid, None)
        self.process_version += 1
        self.tally.left(pid, owner, self.processes)
        if self.allocation is None:  # the key is the user
            if owner.user not in self.tally.every:
                self.trespassers.discard(owner.user)
        elif not any(self.key(o) == self.key(owner) for o in self.tally.owners):
            self.trespassers.discard(self.key(owner))
        if self.holder is not None and self.holder.identifying:
            # held only by processes not known yet: by the next of them, or by nobody
            self.holder = next(iter(self.processes.values()), None)
        elif self.holder is not None and not self.held_by_processes():
            if self.releasing:
                self.end(now)
            elif (
                self.deadline is None
                and self.held_for is None
                and self.until is None
                and self.allocation is None
            ):
                self.deadline = now + lease
        self.touch(now)

    def release(self, now: float) -> bool:
        """The holder gives it back: the hold ends now, or (True) once their processes here end."""
        if self.held_by_processes():
            self.releasing, self.held_for = True, None
            return True
        self.end(now)
        return False

    def ran_out(self, now: float) -> str | None:
        """What of the hold ran out by `now`, "duration" or "lease": then the hold ends. A
        duration over while the holder's processes run leaves them the device (None)."""
        if self.until is not None and self.until <= now + EARLY:
            self.until = None  # the duration asked for is over: the usual rules
            if not self.held_by_processes():
                return "duration"
            log.info(
                "the reservation of %s on %s ended; their processes hold it",
                self.holder.user if self.holder else "?",
                self.uuid,
            )
        elif self.deadline is not None and self.deadline <= now + EARLY:
            return "lease"
        return None

    def end(self, now: float) -> None:
        """End the holder's hold, however held: the processes still on the device pass it to
        the owner of the oldest."""
        if self.holder is not None and not self.holder.identifying:
            self.last_user, self.freed = self.holder.user, now
        self.holder, self.deadline, self.until, self.held_for = None, None, None, None
        self.allocation = None
        self.releasing, self.asked, self.over_limit = False, False, False
        self.trespassers.clear()
        if self.processes:  # a known owner before one still being looked up
            self.holder = min(self.processes.values(), key=lambda o: o.identifying)
            self.trespassers = self.tally.known.keys() - {self.holder.user}
        self.touch(now)


@dataclass(frozen=True)
class Event:
    """Something the audit record keeps: a grant, a release, an expiry, a claim, ..."""

    kind: str
    user: str | None  # whose devices (the holder; the trespasser for a trespass)
    devices: tuple[tuple[str, int], ...]  # (uuid, number)
    details: Mapping[str, Any] = field(default_factory=dict)


class Notices:
    """Who follows the lease rules: callbacks after every change of state (the book, the views,
    the timer, ...), and callbacks for every event of the audit record."""

    def __init__(self) -> None:
        self._on_change: list[Callable[[], None]] = []
        self._on_event: list[Callable[[Event], None]] = []

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after every change of state."""
        self._on_change.append(callback)

    def on_event(self, callback: Callable[[Event], None]) -> None:
        """Call `callback(event)` for every event of the audit record."""
        self._on_event.append(callback)

    def changed(self) -> None:
        for callback in list(self._on_change):
            try:
                callback()
            except Exception:  # a follower's bug must not corrupt the lease state
                log.exception("lease change callback failed")

    def event(
        self, kind: str, user: str | None, devices: Iterable[Device | None], **details: Any
    ) -> None:
        """Tell the audit record: `details` that are None are left out."""
        if not self._on_event:
            return
        event = Event(
            kind,
            user,
            tuple((d.uuid, d.number) for d in devices if d is not None),
            {k: v for k, v in details.items() if v is not None},
        )
        for callback in list(self._on_event):
            try:
                callback(event)
            except Exception:  # a broken audit sink must not break the lease rules
                log.exception("event callback failed")


def is_admin(user: Identity) -> bool:
    """The host's root, as the system identified it (never a name a caller gives)."""
    return user.source == "host" and user.uid == 0
