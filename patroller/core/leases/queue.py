"""The requests that wait: in arrival order per shape, counted per user and in all, with limits.

The queue keeps order and says who comes first and who is starving; it never reserves anything
(the lease manager decides and reserves). Waiters are kept by shape, each shape in arrival
order: serving looks at the head of each shape, not at every waiter (a scan of 1,000 waiters
cost 3.6 ms a change).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable

from patroller.core.devices import Device
from patroller.core.errors import TooManyWaiting, Unavailable
from patroller.core.identity import Identity, ProcessRef
from patroller.core.leases.holds import Shape, Wants


class Waiter:
    """A request that waits until it can be granted."""

    def __init__(
        self,
        user: Identity,
        wants: Wants,
        on_grant: Callable[[list[Device]], None],
        on_abort: Callable[[Exception], None] | None = None,
        held_for: ProcessRef | None = None,
        duration: float | None = None,
        link: str | None = None,
    ) -> None:
        self.user = user
        self.wants = dict(wants)
        self.link = link  # how the devices must be linked ("nvlink", "numa"), or None
        self.shape: Shape = (tuple(sorted(self.wants.items())), link)
        self.on_grant = on_grant
        self.on_abort = on_abort
        self.held_for = held_for  # the grant is held for this process
        self.duration = duration  # or for this many seconds
        self.granted: list[Device] | None = None
        self.arrival = 0  # set when queued: waiters are served in this order
        self.since = 0.0  # when queued, on the manager's clock


class WaitQueue:
    """Waiters in arrival order, at most `max_waiters` in all and `max_waiting_per_user` each."""

    def __init__(self, max_waiters: int, max_waiting_per_user: int) -> None:
        self.max_waiters = max_waiters
        self.max_waiting_per_user = max_waiting_per_user
        self._shapes: dict[Shape, OrderedDict[Waiter, None]] = {}
        self._arrivals = itertools.count()
        self._count = 0
        self._by_user: dict[str, int] = {}

    def __len__(self) -> int:
        """How many requests wait, all users together."""
        return self._count

    def __contains__(self, waiter: Waiter) -> bool:
        return waiter in self._shapes.get(waiter.shape, ())

    def count_of(self, user: str) -> int:
        """How many requests `user` has waiting."""
        return self._by_user.get(user, 0)

    def add(self, waiter: Waiter, now: float) -> None:
        """Queue a waiter behind every earlier one. TooManyWaiting when its user already has
        `max_waiting_per_user` waiting, Unavailable when the queue is full."""
        user = waiter.user.user
        mine = self.count_of(user)
        if mine >= self.max_waiting_per_user:
            raise TooManyWaiting(
                f"{user} already has {mine} requests waiting, the most one user may have",
                limit=self.max_waiting_per_user,
                waiting=mine,
            )
        if self._count >= self.max_waiters:
            raise Unavailable(f"too many waiting requests ({self._count})")
        waiter.arrival = next(self._arrivals)
        waiter.since = now
        self._shapes.setdefault(waiter.shape, OrderedDict())[waiter] = None
        self._count += 1
        self._by_user[user] = mine + 1

    def remove(self, waiter: Waiter) -> bool:
        """Take a waiter out; True if it was waiting."""
        shape = self._shapes.get(waiter.shape)
        if shape is None or waiter not in shape:
            return False
        del shape[waiter]
        if not shape:
            del self._shapes[waiter.shape]
        self._count -= 1
        user = waiter.user.user
        left = self._by_user[user] - 1
        if left:
            self._by_user[user] = left
        else:
            del self._by_user[user]
        return True

    def in_order(self) -> list[Waiter]:
        """Every waiter, in arrival order."""
        return sorted(
            (w for shape in self._shapes.values() for w in shape), key=lambda w: w.arrival
        )

    def first(
        self, fits: Callable[[Waiter], bool], passed: Iterable[Waiter] = ()
    ) -> Waiter | None:
        """The earliest waiter that `fits`, leaving out those `passed` over.

        Only the first of each shape (after those passed over) is asked: one behind it wants
        the same and arrived later, so it cannot come first.
        """
        skip = set(passed)
        heads = (
            next((w for w in shape if w not in skip), None) for shape in self._shapes.values()
        )
        fitting = [w for w in heads if w is not None and fits(w)]
        return min(fitting, key=lambda w: w.arrival) if fitting else None

    def starving(self, now: float, bound: float) -> Waiter | None:
        """The waiter no longer overtaken: the longest waiting, once it has waited `bound`."""
        heads = [next(iter(shape)) for shape in self._shapes.values()]
        if not heads:
            return None
        first = min(heads, key=lambda w: w.arrival)
        return first if now - first.since >= bound else None

    def clear(self) -> list[Waiter]:
        """Empty the queue; the waiters it held, in arrival order."""
        waiters = self.in_order()
        self._shapes.clear()
        self._by_user.clear()
        self._count = 0
        return waiters
