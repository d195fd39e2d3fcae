"""Test mode's synthetic processes (`--test-processes`): so that every usage category shows in
the first minutes on a host with no GPU, processes come and go on the synthetic devices as
people's jobs would, by a fixed script. Pure: the synthetic monitor asks it each tick.

- A held GPU gets its holder's process `after` seconds after it was first held (meanwhile it is
  reserved and unused); the process computes (`busy_sm`) for the first two thirds of each
  `cycle` and holds its memory idle for the rest, each GPU a quarter cycle after the one before.
- A stranger (`mallory@example.org`) computes on the last GPU for the first third of every
  other cycle: on it free, taken by computing (unreserved); on it held, a trespass.

Their pids are above any the kernel hands out (`PID_BASE`: Linux's pid_max is at most 2^22),
so none is a real process's; the identifier of test mode names them (identify/resolver.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from patroller.core.devices import Inventory
from patroller.core.identity import Identity, named_user
from patroller.core.leases.holds import Hold

PID_BASE = 1 << 22  # 4194304: above every pid the kernel may give
STRANGER = "mallory@example.org"


@dataclass(frozen=True)
class Running:
    """One synthetic process on a device now."""

    pid: int
    owner: Identity
    computing: bool
    fb: float  # MiB it holds


class SyntheticProcesses:
    """Which synthetic processes run on which device at a moment, from who holds them."""

    def __init__(
        self,
        inventory: Inventory,
        holder: Callable[[str], Identity | None],
        cycle: float,
        after: float,
        busy_fb: float,
    ) -> None:
        self.inventory = inventory
        self.holder = holder  # who holds a device now (None: nobody)
        self.cycle = cycle
        self.after = after
        self.busy_fb = busy_fb
        self._held_since: dict[str, tuple[Identity, float]] = {}  # uuid -> (holder, since)
        self._current: dict[tuple[str, str], int] = {}  # (uuid, "holder"|"stranger") -> pid
        self._owners: dict[int, Identity] = {}  # the pids running now, and whose they are
        self._next = PID_BASE
        self._origin: float | None = None  # the first moment asked: the script's start

    def at(self, now: float) -> dict[str, tuple[Running, ...]]:
        """The processes on each device at `now` (seconds on any steady clock; the script
        starts at the first moment asked)."""
        if self._origin is None:
            self._origin = now
        now -= self._origin
        found: dict[str, tuple[Running, ...]] = {}
        last = max((d.number for d in self.inventory), default=-1)
        wanted: dict[tuple[str, str], tuple[Identity, bool]] = {}
        for device in self.inventory:
            holder = self.holder(device.uuid)
            since = self._held_since.get(device.uuid)
            if holder is None:
                self._held_since.pop(device.uuid, None)
            elif since is None or not since[0].same_user(holder):
                since = self._held_since[device.uuid] = (holder, now)
            if holder is not None and since is not None and now - since[1] >= self.after:
                phase = (now + device.number * self.cycle / 4) % self.cycle
                wanted[(device.uuid, "holder")] = (holder, phase < self.cycle * 2 / 3)
            if device.number == last and now % (2 * self.cycle) < self.cycle / 3:
                wanted[(device.uuid, "stranger")] = (named_user(STRANGER), True)
        for key in [k for k in self._current if k not in wanted]:  # ended: its pid is gone
            self._owners.pop(self._current.pop(key), None)
        for key, (owner, computing) in wanted.items():
            pid = self._current.get(key)
            if pid is None or not self._owners[pid].same_user(owner):  # a new job: a new pid
                if pid is not None:
                    self._owners.pop(pid, None)
                pid, self._next = self._next, self._next + 1
                self._current[key], self._owners[pid] = pid, owner
            running = Running(pid, owner, computing, self.busy_fb * (1.0 if computing else 0.6))
            found[key[0]] = found.get(key[0], ()) + (running,)
        return {d.uuid: found.get(d.uuid, ()) for d in self.inventory}

    def owner(self, pid: int) -> Identity | None:
        """Whose a synthetic pid running now is (None: not one of ours)."""
        return self._owners.get(pid)


def asking_holder(hold: Hold) -> Identity | None:
    """Who holds a device by asking (a grant, a scheduler's allocation), not by computing on
    it: the one whose job gets a process there."""
    if hold.holder is None or not (hold.asked or hold.allocation is not None):
        return None
    return hold.holder
