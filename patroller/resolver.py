"""Process resolvers: from a host pid to the identity of whoever runs it."""
from __future__ import annotations

import asyncio
import os
import pwd
from typing import Optional, Protocol

from .identity import UNKNOWN, Identity


class ProcessResolver(Protocol):
    """Turns a host pid into an identity; never raises for a pid that has gone."""

    async def resolve(self, pid: int) -> Identity:
        """The identity of the process, or UNKNOWN."""


def read_uid(pid: int, proc: str = "/proc") -> Optional[int]:
    """The real uid of a process from /proc/<pid>/status, or None if it cannot be read."""
    try:
        with open(os.path.join(proc, str(pid), "status"), encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_identity(uid: int) -> Identity:
    """The identity of a host account, named from the password database when it can be."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid:{uid}"
    return Identity(user=name, source="host", account=name, uid=uid)


class HostResolver:
    """Attributes a process to its host account; reads /proc off the event loop."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc

    def lookup(self, pid: int) -> Identity:
        """Blocking lookup."""
        uid = read_uid(pid, self.proc)
        return UNKNOWN if uid is None else host_identity(uid)

    async def resolve(self, pid: int) -> Identity:
        """The identity of the process's account, or UNKNOWN if /proc has no such pid."""
        return await asyncio.get_running_loop().run_in_executor(None, self.lookup, pid)
