"""Who is at the other end of a connection: the kernel's word (SO_PEERCRED) for a unix-socket
caller, the address a TCP caller came from.

The server reads a unix connection's credentials as it accepts it, starts reading the peer's
/proc facts at once (the caller may exit and its pid be reused before its request is handled),
and attaches both to the connection's stream here, as it attaches a TCP connection's address;
the callers layer looks them up by the stream.
"""
from __future__ import annotations

import asyncio
import socket
import struct
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Tuple


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
_ADDRESSES: "weakref.WeakKeyDictionary[Any, Tuple[str, int]]" = weakref.WeakKeyDictionary()


def attach(stream: Any, peer: Peer) -> None:
    """Say who is behind a unix connection's stream (the server does, as it accepts it)."""
    _PEERS[stream] = peer


def peer_of(stream: Any) -> Optional[Peer]:
    """The unix-socket caller behind a request's stream, if it came that way."""
    if stream is None:
        return None
    return _PEERS.get(stream)


def attach_address(stream: Any, address: Tuple[str, int]) -> None:
    """Say where a TCP connection's stream comes from (host, port), as it was accepted."""
    _ADDRESSES[stream] = address


def address_of(stream: Any) -> Optional[Tuple[str, int]]:
    """The (host, port) a TCP connection came from, if the server said so."""
    if stream is None:
        return None
    return _ADDRESSES.get(stream)
