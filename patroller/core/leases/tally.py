"""Who runs on one device, counted as its processes come and go: the state of a device and its
users, without a pass over its processes (a GPU with 5,000 processes, a notebook server gone
wild or a fork bomb, would otherwise cost the loop a pass at every process started or ended).

A Tally follows one hold's `processes` (pid -> owner, oldest first), told of every change
(Hold.add, Hold.rename and Hold.forget make them all). It knows how many processes each user
has there, how many of them are known (not still being identified), how many each distinct
owner has (a Slurm job's or a pod's processes are a few owners, whatever their number: whether
each is in the allocation is asked once an owner), and each user's first process, in the order
of the users' first processes. That order is found again by one pass
only when a change moves it: a process replaced by another user's, or the first process of a
user who has more, ending while an older process of someone else runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter
from typing import Any

from patroller.core.identity import Identity

_USER = attrgetter("user")


def _count(counts: dict[Any, int], key: Any, step: int) -> None:
    left = counts.get(key, 0) + step
    if left:
        counts[key] = left
    else:
        del counts[key]


class Tally:
    """The users of one device's processes (see the module's doc)."""

    __slots__ = ("every", "known", "owners", "_first")

    def __init__(self) -> None:
        self.every: dict[str, int] = {}  # user -> processes here
        self.known: dict[str, int] = {}  # user -> processes here whose owner is known
        self.owners: dict[Identity, int] = {}  # owner -> processes here
        # user -> pid of their first process, in the order of the users' first processes;
        # None: to be found again
        self._first: dict[str, int] | None = {}

    def arrived(self, pid: int, owner: Identity) -> None:
        """A process `pid` (new: the newest) of `owner` was added."""
        self._more(owner, 1)
        if self._first is not None and owner.user not in self._first:
            self._first[owner.user] = pid

    def changed(self, old: Identity, new: Identity) -> None:
        """A process's owner `old` was replaced by `new`, in its place."""
        self._more(old, -1)
        self._more(new, 1)
        if old.user != new.user:
            self._first = None

    def left(self, pid: int, owner: Identity, processes: Mapping[int, Identity]) -> None:
        """The process `pid` of `owner` was removed from `processes`."""
        self._more(owner, -1)
        first, user = self._first, owner.user
        if first is None or first.get(user) != pid:
            return
        if user not in self.every:
            del first[user]
            return
        oldest = next(iter(processes.items()))  # what a process ending oldest first leaves
        if oldest[1].user == user:
            self._first = {user: oldest[0], **{u: p for u, p in first.items() if u != user}}
        else:
            self._first = None

    def users(self, processes: Mapping[int, Identity], holder: Identity | None) -> list[Identity]:
        """The holder, then every other user whose processes run on the device, in the order of
        their first process, which names them."""
        first = self._first
        if first is None:
            pids, owners = list(processes), list(processes.values())
            earliest = dict(zip(map(_USER, reversed(owners)), reversed(pids), strict=True))
            first = self._first = {user: earliest[user] for user in map(_USER, owners)}
        named = [processes[pid] for pid in first.values()]
        if holder is None:
            return named
        return [holder, *(owner for owner in named if owner.user != holder.user)]

    def _more(self, owner: Identity, step: int) -> None:
        _count(self.owners, owner, step)
        _count(self.every, owner.user, step)
        if not owner.identifying:
            _count(self.known, owner.user, step)
