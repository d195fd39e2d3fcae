"""Who is at the other end of a local TCP connection: /proc/net/tcp{,6} and /proc/<pid>/fd.

A loopback client's socket is listed in the host's /proc/net/tcp with its owner's uid and
inode; the inode leads to the process that holds it. Readers take an injectable /proc root.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

Address = Tuple[str, int]


@dataclass(frozen=True)
class SocketEntry:
    """One line of /proc/net/tcp or tcp6."""

    local: Address
    remote: Address
    uid: int
    inode: int


def normalize(host: str) -> str:
    """An address as text, with IPv4-mapped IPv6 (::ffff:a.b.c.d) turned into plain IPv4."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def is_loopback(host: str) -> bool:
    """Whether the address is a loopback address (IPv4-mapped included)."""
    try:
        return ipaddress.ip_address(normalize(host)).is_loopback
    except ValueError:
        return False


def _decode(field: str) -> Address:
    """`0100007F:1F90` or a 32-hex-digit IPv6 form: the kernel's words in host byte order."""
    host_hex, port_hex = field.split(":")
    raw = bytes.fromhex(host_hex)
    if len(raw) == 4:
        host = socket.inet_ntop(socket.AF_INET, struct.pack("=I", struct.unpack(">I", raw)[0]))
    elif len(raw) == 16:
        words = struct.unpack(">4I", raw)
        host = socket.inet_ntop(socket.AF_INET6, struct.pack("=4I", *words))
    else:
        raise ValueError(f"address of {len(raw)} bytes")
    return normalize(host), int(port_hex, 16)


def parse_net_tcp(text: str) -> Iterator[SocketEntry]:
    """The entries of a /proc/net/tcp or tcp6 file; malformed lines are skipped."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        try:
            yield SocketEntry(_decode(fields[1]), _decode(fields[2]), int(fields[7]), int(fields[9]))
        except (IndexError, ValueError):
            continue


def find_client(peer: Address, server: Address, proc: str = "/proc") -> Optional[SocketEntry]:
    """The client end of a connection from `peer` to our `server` address, if it is local."""
    want_local = (normalize(peer[0]), peer[1])
    want_remote = (normalize(server[0]), server[1])
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", name), encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        for entry in parse_net_tcp(text):
            if entry.local == want_local and entry.remote == want_remote:
                return entry
    return None


def pid_of_socket(inode: int, proc: str = "/proc") -> Optional[int]:
    """A process holding the socket with this inode (the lowest pid), or None."""
    target = f"socket:[{inode}]"
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return None
    for pid in pids:
        fd_dir = os.path.join(proc, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) == target:
                    return pid
            except OSError:
                continue
    return None


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
