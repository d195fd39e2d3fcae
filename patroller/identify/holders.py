"""Which process holds a local socket: a search of /proc/<pid>/fd whose cost the caller's own
uid decides, bounded by a budget, and whose cost per connection in descriptors read does not
grow with the connections its caller already holds (its directory is still listed).

The kernel says which uid created a client socket (sock_diag), and no other uid's process is
its caller (callers.py refuses one), so only that uid's processes are searched: nobody makes
another user's identification slower by parking descriptors. Among them, the newest processes
are read first, each from its newest descriptor: a caller has typically just started, or just
opened its connection. The pids seen calling lately, and the holders of the socket inodes seen
while searching, are tried before anything else. The search stops at a budget of descriptors
read.

What a search read is remembered (bounded): where each socket inode was seen (pid and
descriptor), and which descriptors of which process were read. A socket seen before is looked
for first at that one descriptor; a process read before is read from the descriptors not read
yet (a new connection's), then the rest; a socket whose connection ended is forgotten
(`forget`: callers.py asks it as the connection closes), so that the descriptor number it
frees, which the client's next connection often gets, counts as not read. One search of a
uid's processes runs at a time: one that waited finds at once what the one before it read.
Memory only orders the reads: a process is named only when the kernel says, in the read just
made, that its descriptor is that socket, as a whole search would; a descriptor closed,
reused, or handed to another process since (SCM_RIGHTS, a fork) reads as something else, and
the search goes on. The descriptors read to check a holder (`holds`) count in `read` too.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from cachetools import LRUCache

from patroller.identify import procfs

HOLDS, NOT, HIDDEN, CUT = "holds", "not", "hidden", "cut"  # one process's descriptors, read
UNBOUNDED = sys.maxsize  # no budget: whether one process holds a socket is read to the end


@dataclass(frozen=True)
class Search:
    """What a search for a socket's holder found, and what it cost."""

    pid: int | None  # the process found holding the socket, or None
    hidden: bool  # some candidate's descriptors could not be read: the holder may be one
    read: int  # descriptors read
    exhausted: bool  # stopped at the budget with candidates left unread


def owned_by(pid: int, uid: int, proc: str) -> bool:
    """Whether /proc says the process runs as `uid` (its directory's owner: the effective uid
    of a dumpable process)."""
    try:
        return os.stat(os.path.join(proc, str(pid))).st_uid == uid
    except OSError:
        return False


def candidates(uid: int, proc: str, first: Iterable[int] = ()) -> list[int]:
    """The processes of `uid` that may hold its socket: `first` (those still of that uid), then
    the others newest first (by pid: a caller has usually just started, or just connected;
    after the pids wrap round, the newest are found later). Raises OSError if /proc cannot be
    listed."""
    ahead = [pid for pid in dict.fromkeys(first) if owned_by(pid, uid, proc)]
    skip = set(ahead)
    return ahead + [
        pid for pid in reversed(procfs.pids(proc)) if pid not in skip and owned_by(pid, uid, proc)
    ]


def socket_inode(name: str | None) -> int:
    """The inode of a descriptor's target if it is a socket (`socket:[123]`), else 0."""
    if name is not None and name.startswith("socket:[") and name.endswith("]"):
        try:
            return int(name[8:-1])
        except ValueError:
            return 0
    return 0


class HolderSearch:
    """Finds the process holding a socket by inode, within a budget; remembers where it saw
    socket inodes and which descriptors it read (both bounded: `remembered`, `descriptors`), so
    that a connection already open when another was searched for is found at once, and a new
    one among the descriptors not read before. Safe to use from several executor threads."""

    def __init__(self, proc: str, budget: int, remembered: int, descriptors: int) -> None:
        self.proc = proc
        self.budget = budget
        self._seen: LRUCache[int, tuple[int, str]] = LRUCache(maxsize=remembered)  # inode ->
        # (pid, descriptor) where it was last read
        self._read: LRUCache[tuple[int, str], int] = LRUCache(maxsize=descriptors)  # (pid,
        # descriptor) read -> the socket inode it was, or 0
        self._lock = threading.Lock()
        self._searches: dict[int, threading.Lock] = {}  # uid -> held while its processes
        # are searched (one entry a uid that called over TCP)
        self.read = 0  # descriptors read in all, for /metrics

    def find(self, inode: int, uid: int, likely: Iterable[int] = ()) -> Search:
        """Blocking: the holder of the socket `inode`, created by `uid`."""
        target = f"socket:[{inode}]"
        where, found = self._where_seen(inode, uid, target, None)
        read = 0 if where is None else 1
        if where is not None and found:
            return self._done(Search(where[0], False, read, False))
        with self._searching(uid):  # one search of a uid's processes at a time: a search
            # that waited finds at once what the one before it read
            again, found = self._where_seen(inode, uid, target, where)
            if again is not None:
                read += 1
                if found:
                    return self._done(Search(again[0], False, read, False))
            first = [w[0] for w in (where, again) if w is not None] + list(likely)
            try:
                pids = candidates(uid, self.proc, first)
            except OSError:
                return self._done(Search(None, True, read, False))
            hidden = False
            for pid in pids:
                verdict, cost = self._scan(pid, target, self.budget - read)
                read += cost
                if verdict is HOLDS:
                    return self._done(Search(pid, hidden, read, False))
                if verdict is CUT:
                    return self._done(Search(None, hidden, read, True))
                hidden = hidden or verdict is HIDDEN
            return self._done(Search(None, hidden, read, False))

    def _where_seen(
        self, inode: int, uid: int, target: str, tried: tuple[int, str] | None
    ) -> tuple[tuple[int, str] | None, bool]:
        """(where the socket was last seen, unless that is `tried` or not a process of `uid`:
        then None; whether it is there now: one descriptor read, if any)."""
        with self._lock:
            where = self._seen.get(inode)
        if where is None or where == tried or not owned_by(where[0], uid, self.proc):
            return None, False
        return where, self._at(where[0], where[1], target)

    def _searching(self, uid: int) -> threading.Lock:
        """The lock held while the processes of `uid` are searched."""
        with self._lock:
            return self._searches.setdefault(uid, threading.Lock())

    def holds(self, pid: int, inode: int) -> bool:
        """Blocking: whether the process holds the socket with this inode now: at the
        descriptor where it was last seen, else at any (all read, newest first)."""
        target = f"socket:[{inode}]"
        with self._lock:
            where = self._seen.get(inode)
        if where is not None and where[0] == pid:
            self._count(1)
            if self._at(pid, where[1], target):
                return True
        verdict, cost = self._scan(pid, target, UNBOUNDED)
        self._count(cost)
        return verdict is HOLDS

    def forget(self, inode: int) -> None:
        """A socket whose connection ended: the descriptor where it was seen reads as not read
        (the client's next connection often gets its number), and the socket as never seen."""
        with self._lock:
            where = self._seen.pop(inode, None)
            if where is not None:
                self._read.pop(where, None)

    def _at(self, pid: int, fd: str, target: str) -> bool:
        """Whether the process's descriptor `fd` is `target` now (one descriptor read)."""
        name = procfs.descriptor_target(pid, fd, self.proc)
        self._note(pid, [(fd, name)])
        return name == target

    def _scan(self, pid: int, target: str, allowance: int) -> tuple[str, int]:
        """(HOLDS, NOT, HIDDEN (its descriptors are not ours to read) or CUT (it has more than
        `allowance` and they were not all read), descriptors read). Reads the descriptors not
        read before first, newest first, then the others; remembers what it read."""
        try:
            fds = procfs.descriptors(pid, self.proc)  # newest first: a new connection's
        except PermissionError:
            return HIDDEN, 0
        except OSError:
            return NOT, 0  # gone
        with self._lock:
            before = [fd for fd in fds if (pid, fd) in self._read]
        done = set(before)
        order = [fd for fd in fds if fd not in done] + before
        names: list[tuple[str, str | None]] = []
        verdict = NOT
        for fd in order:
            if len(names) >= allowance:
                verdict = CUT
                break
            name = procfs.descriptor_target(pid, fd, self.proc)
            names.append((fd, name))
            if name == target:
                verdict = HOLDS
                break
        self._note(pid, names)
        return verdict, len(names)

    def _note(self, pid: int, names: list[tuple[str, str | None]]) -> None:
        """Remember what the process's descriptors were read as (and forget that a socket is
        where another now is)."""
        with self._lock:
            for fd, name in names:
                inode = socket_inode(name)
                was = self._read.get((pid, fd))
                if was and was != inode and self._seen.get(was) == (pid, fd):
                    del self._seen[was]
                self._read[(pid, fd)] = inode
                if inode:
                    self._seen[inode] = (pid, fd)

    def _count(self, read: int) -> None:
        with self._lock:
            self.read += read

    def _done(self, search: Search) -> Search:
        self._count(search.read)
        return search
