"""Who is at the other end of a unix-socket connection: the kernel's word (SO_PEERCRED).

The server reads a connection's credentials as it accepts it, starts reading the peer's /proc
facts at once (the caller may exit and its pid be reused before its request is handled), and
attaches both to the connection's stream here; the callers layer looks them up by the stream.
"""
from __future__ import annotations

import asyncio
import socket
import struct
import weakref
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Credentials:
    """The kernel's word on who connected to a unix socket (SO_PEERCRED)."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> Optional[Credentials]:
    """The peer of a connected unix socket, as the kernel recorded it at connect()."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    pid, uid, gid = struct.unpack("3i", raw)
    return Credentials(pid, uid, gid) if pid > 0 else None


class Peer:
    """A unix-socket caller: its credentials, and its /proc facts read as it connected."""

    def __init__(self, credentials: Credentials, facts: "asyncio.Future[Any]") -> None:
        self.credentials = credentials
        self.facts = facts


# Keyed by the connection's stream and weakly, so that an entry lives exactly as long as its
# connection; two daemons in one process never share a stream.
_PEERS: "weakref.WeakKeyDictionary[Any, Peer]" = weakref.WeakKeyDictionary()


def attach(stream: Any, peer: Peer) -> None:
    """Say who is behind a unix connection's stream (the server does, as it accepts it)."""
    _PEERS[stream] = peer


def peer_of(stream: Any) -> Optional[Peer]:
    """The unix-socket caller behind a request's stream, if it came that way."""
    if stream is None:
        return None
    return _PEERS.get(stream)
