"""Which process holds a local socket: a search of /proc/<pid>/fd whose cost the caller's own
uid decides, bounded by a budget.

The kernel says which uid created a client socket (sock_diag), and no other uid's process is
its caller (callers.py refuses one), so only that uid's processes are searched: nobody makes
another user's identification slower by parking descriptors. Among them, the newest processes
are read first, each from its newest descriptor: a caller has typically just started, or just
opened its connection. The pids seen calling lately, and the holders of the socket inodes seen
while searching, are tried before anything else. The search stops at a budget of descriptors
read.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from cachetools import LRUCache

from patroller.identify import procfs

HOLDS, NOT, HIDDEN, CUT = "holds", "not", "hidden", "cut"  # one process's descriptors, read


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


def holds(pid: int, inode: int, proc: str = "/proc") -> bool:
    """Whether the process holds the socket with this inode now."""
    target = f"socket:[{inode}]"
    try:
        fds = procfs.descriptors(pid, proc)
    except OSError:
        return False
    return any(procfs.descriptor_target(pid, fd, proc) == target for fd in fds)


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


class HolderSearch:
    """Finds the process holding a socket by inode, within a budget; remembers the socket
    inodes it saw on the way (bounded), so that connections already open when another was
    searched for are found at once. Safe to use from several executor threads."""

    def __init__(self, proc: str, budget: int, remembered: int) -> None:
        self.proc = proc
        self.budget = budget
        self._seen: LRUCache[int, int] = LRUCache(maxsize=remembered)  # inode -> pid
        self._lock = threading.Lock()
        self.read = 0  # descriptors read in all, for /metrics

    def find(self, inode: int, uid: int, likely: Iterable[int] = ()) -> Search:
        """Blocking: the holder of the socket `inode`, created by `uid`."""
        target = f"socket:[{inode}]"
        with self._lock:
            known = self._seen.get(inode)
        first = ([known] if known is not None else []) + list(likely)
        try:
            pids = candidates(uid, self.proc, first)
        except OSError:
            return Search(None, True, 0, False)
        read, hidden = 0, False
        for pid in pids:
            verdict, cost = self._scan(pid, target, self.budget - read)
            read += cost
            if verdict is HOLDS:
                return self._done(Search(pid, hidden, read, False))
            if verdict is CUT:
                return self._done(Search(None, hidden, read, True))
            hidden = hidden or verdict is HIDDEN
        return self._done(Search(None, hidden, read, False))

    def _scan(self, pid: int, target: str, allowance: int) -> tuple[str, int]:
        """(HOLDS, NOT, HIDDEN (its descriptors are not ours to read) or CUT (it has more than
        `allowance` and they were not all read), descriptors read). Remembers the sockets it
        passes."""
        try:
            fds = procfs.descriptors(pid, self.proc)  # newest first: a new connection's
        except PermissionError:
            return HIDDEN, 0
        except OSError:
            return NOT, 0  # gone
        seen: list[tuple[int, int]] = []
        verdict = NOT
        read = 0
        for fd in fds:
            if read >= allowance:
                verdict = CUT
                break
            name = procfs.descriptor_target(pid, fd, self.proc)
            read += 1
            if name == target:
                verdict = HOLDS
                break
            if name is not None and name.startswith("socket:["):
                seen.append((int(name[8:-1]), pid))
        with self._lock:
            for inode, holder in seen:
                self._seen[inode] = holder
        return verdict, read

    def _done(self, search: Search) -> Search:
        with self._lock:
            self.read += search.read
        return search
