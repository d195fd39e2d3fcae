"""The one reader of /proc for a process: its stat (state and start time), its real uid, its
cgroup file, the owner of its user namespace, its descriptors, and this boot's id.

Every reader takes the /proc root (Config.proc_root) so that tests can give a tree of their own.
They are blocking: callers run them in the executor, never on the event loop. A process that is
gone raises OSError where the caller must tell "gone" from "unreadable", else reads as None.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from typing import NamedTuple

from patroller.core.identity import ProcessRef

ENDED = ("Z", "X", "x")  # the states of a process that has ended (a zombie, dead)
NS_GET_OWNER_UID = 0xB704  # linux/nsfs.h: _IO(0xb7, 0x4), the uid that made a user namespace


class Stat(NamedTuple):
    """What /proc/<pid>/stat says of a process."""

    state: str  # R, S, D, Z, ...
    start: int  # clock ticks after boot: with the pid, names exactly one process


def stat(pid: int, proc: str = "/proc") -> Stat:
    """The state and start time of a process. Raises OSError if it is gone, ValueError if the
    file cannot be read as one."""
    with open(os.path.join(proc, str(pid), "stat"), encoding="ascii", errors="replace") as f:
        text = f.read()
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    try:
        fields = text.rsplit(")", 1)[1].split()
        return Stat(fields[0], int(fields[19]))
    except (IndexError, ValueError):
        raise ValueError(f"/proc/{pid}/stat is not readable as one: {text[:80]!r}") from None


def process_state(pid: int, proc: str = "/proc") -> Stat | None:
    """The state and start time of a process, or None if it is gone or unreadable."""
    try:
        return stat(pid, proc)
    except (OSError, ValueError):
        return None


def is_alive(ref: ProcessRef, proc: str = "/proc") -> bool:
    """Whether this very process still runs (a zombie has ended; a reused pid is another)."""
    found = process_state(ref.pid, proc)
    return found is not None and found.start == ref.start and found.state not in ENDED


def uids(pid: int, proc: str = "/proc") -> tuple[int, ...]:
    """The real, effective, saved and file-system uids of a process (/proc/<pid>/status), or
    () if they cannot be read."""
    try:
        with open(os.path.join(proc, str(pid), "status"), encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return tuple(int(field) for field in line.split()[1:5])
    except (OSError, ValueError):
        return ()
    return ()


def uid(pid: int, proc: str = "/proc") -> int | None:
    """The real uid of a process, or None if it cannot be read."""
    found = uids(pid, proc)
    return found[0] if found else None


def cgroup(pid: int, proc: str = "/proc") -> str:
    """The text of /proc/<pid>/cgroup. Raises OSError if the process is gone."""
    with open(os.path.join(proc, str(pid), "cgroup"), encoding="ascii", errors="replace") as f:
        return f.read()


def userns_owner(pid: int, proc: str = "/proc") -> int | None:
    """The uid that made the process's user namespace (as the kernel keeps it), when that is not
    the reader's own namespace; None when it is, or when it cannot be told."""
    theirs = os.path.join(proc, str(pid), "ns", "user")
    try:
        mine = os.stat(os.path.join(proc, "self", "ns", "user"))
        found = os.stat(theirs)
        if (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino):
            return None
        fd = os.open(theirs, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        uid: int = struct.unpack("I", fcntl.ioctl(fd, NS_GET_OWNER_UID, bytes(4)))[0]
        return uid
    except OSError:
        return None
    finally:
        os.close(fd)


def descriptors(pid: int, proc: str = "/proc") -> list[str]:
    """The names of a process's open descriptors, newest (highest) first. Raises
    PermissionError when they are not ours to read, OSError when it is gone."""
    names = os.listdir(os.path.join(proc, str(pid), "fd"))
    return sorted(names, key=lambda name: -int(name) if name.isdigit() else 0)


def descriptor_target(pid: int, fd: str, proc: str = "/proc") -> str | None:
    """What one descriptor names (`socket:[123]`, a path), or None if it cannot be read."""
    try:
        return os.readlink(os.path.join(proc, str(pid), "fd", fd))
    except OSError:
        return None


def pids(proc: str = "/proc") -> list[int]:
    """Every process's pid, in order. Raises OSError if /proc cannot be listed."""
    return sorted(int(name) for name in os.listdir(proc) if name.isdigit())


def boot_ticks() -> int:
    """Now, in the clock ticks after boot that a process's start time is counted in."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def boot_id(proc: str = "/proc") -> str | None:
    """This boot's id: start times count from boot, so a process of another boot is none of
    this one's."""
    try:
        with open(os.path.join(proc, "sys", "kernel", "random", "boot_id"), encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None
