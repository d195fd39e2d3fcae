"""The room the usage store leaves on its filesystem: it writes only while at least
Config.usage_reserve bytes are free there, so that the lease book (which every grant waits on)
and the audit record can still be written when the history has filled the rest.

A user can make the history grow (new names, new jobs); a full disk then stopped every
reservation, because the lease book could not be written. The check is one statvfs before each
write (some microseconds); the largest one interval can add (Config.usage_new_parties new
parties of six names cut to 253 characters, and their two indexes) is well under the reserve."""

from __future__ import annotations

import errno
import os

MIB = 1 << 20


class Low(OSError):
    """Writing would eat the room kept for the lease book (an ENOSPC of the store's own)."""

    def __init__(self, free: int, reserve: int) -> None:
        super().__init__(
            errno.ENOSPC,
            f"{free / MIB:.1f} MiB free, under the "
            f"{reserve / MIB:.1f} MiB kept for the lease book (usage_reserve): "
            "the history waits in memory until there is room",
        )
        self.free = free


def free(directory: str) -> int:
    """Bytes an unprivileged writer may still use on `directory`'s filesystem (root's own
    reserved blocks are left out: they are the last room, not the store's)."""
    found = os.statvfs(directory)
    return found.f_bavail * found.f_frsize


def ensure(directory: str, reserve: int) -> int:
    """The bytes free on `directory`'s filesystem; Low if they are fewer than `reserve`."""
    left = free(directory)
    if left < reserve:
        raise Low(left, reserve)
    return left
