"""Who is at the other end of a connection: the kernel's word (SO_PEERCRED) for a unix-socket
caller, the address a TCP caller came from.

The server reads a unix connection's credentials as it accepts it, starts reading the peer's
/proc facts at once (the caller may exit and its pid be reused before its request is handled),
and keeps both as a `Peer` in the connection's facts (connection.py), as it keeps a TCP
connection's address; the callers layer reads them there.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import struct
from dataclasses import dataclass
from typing import Any

from patroller.identify import procfs

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5 and later
UCRED = "iII"  # struct ucred: a pid_t, then a uid_t and a gid_t, which are unsigned


@dataclass(frozen=True)
class Credentials:
    """The kernel's word on who connected to a unix socket (SO_PEERCRED, SO_PEERPIDFD), and
    when the daemon accepted the connection."""

    pid: int
    uid: int
    gid: int
    accepted: int = 0  # clock ticks after boot, when the connection was accepted
    pidfd: int | None = None  # the connecting process itself, where the kernel gives one


def peer_credentials(sock: socket.socket) -> Credentials | None:
    """The peer of a connected unix socket, as the kernel recorded it at connect(). The pidfd
    it may come with is the caller's to close (`not_the_caller` does)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(UCRED))
    except (OSError, AttributeError):
        return None
    pid, uid, gid = struct.unpack(UCRED, raw)
    if pid <= 0:
        return None
    try:
        pidfd: int | None = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:  # an older kernel: the start time stands in for it
        pidfd = None
    return Credentials(pid, uid, gid, procfs.boot_ticks(), pidfd)


def not_the_caller(credentials: Credentials, uids: tuple[int, ...], start: int) -> str | None:
    """Blocking: why the process now at the caller's pid, with these uids and start time
    (read from /proc), is not the process that connected, or None if it is. The kernel's
    record of the connecting process's uid is the ground truth; its pidfd, where there is one,
    says whether that very process still runs (a pid is handed out again only once its process
    is gone); else a process that started after the connection was accepted is another.
    Closes the pidfd."""
    try:
        if uids and credentials.uid not in uids:
            return (
                f"pid {credentials.pid} is not the process that connected: it runs as uid "
                f"{uids[0]}, the connection was made by uid {credentials.uid}"
            )
        if credentials.pidfd is not None:
            if select.select([credentials.pidfd], [], [], 0)[0]:  # readable: it has exited
                return (
                    f"pid {credentials.pid} is not the process that connected: that "
                    "process has ended"
                )
        elif start > credentials.accepted:
            return (
                f"pid {credentials.pid} is not the process that connected: it started "
                "after the connection was made"
            )
        return None
    finally:
        if credentials.pidfd is not None:
            os.close(credentials.pidfd)


class Peer:
    """A unix-socket caller: its credentials, and its /proc facts read as it connected."""

    def __init__(self, credentials: Credentials, facts: asyncio.Future[Any]) -> None:
        self.credentials = credentials
        self.facts = facts


POLLRDHUP = getattr(select, "POLLRDHUP", 0x2000)  # Linux's, which Python names where it exists


def left(stream: Any) -> bool:
    """Whether the client of a connection has left: its stream is closed, or the kernel says
    now that the other end shut its side or the whole connection (POLLRDHUP, POLLHUP,
    POLLERR), before the stream has read the end of its input.

    A unix-socket caller needs this most: identified as it connected, its request is handled
    before the loop reads a close that came with it. (A TCP caller's lookup in the socket table
    refuses one whose socket is closed, but only on a connection's first request.)"""
    sock = getattr(stream, "socket", None)
    if stream is None or sock is None or stream.closed():
        return True
    try:
        poller = select.poll()
        poller.register(sock, POLLRDHUP)  # POLLHUP and POLLERR are always told
        return bool(poller.poll(0))
    except (OSError, ValueError):  # closed under us
        return True
