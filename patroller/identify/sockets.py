"""Who is at the other end of a local TCP connection: sock_diag and /proc/net/tcp{,6}.

A local client's socket is listed in the host's /proc/net/tcp with its state, its creator's uid
and its inode; the inode leads to the process that holds it (holders.py). Only a socket some
process still
holds names a caller: once closed, the kernel keeps a TIME_WAIT or orphan entry with inode 0
(and uid 0 for TIME_WAIT) that belongs to nobody. Readers take an injectable /proc root.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

Address = tuple[str, int]

ESTABLISHED = 1  # the kernel's TCP state number (/proc/net/tcp's `st` 01, sock_diag's state)


@dataclass(frozen=True)
class SocketEntry:
    """One line of /proc/net/tcp or tcp6 (or the same facts from sock_diag)."""

    local: Address
    remote: Address
    uid: int  # whoever created the socket; meaningless once closed (TIME_WAIT says 0)
    inode: int  # 0 once no file holds the socket any more
    state: int  # ESTABLISHED, or another TCP state number


@dataclass(frozen=True)
class Owner:
    """Who a local client socket belongs to, as far as the kernel can tell."""

    pid: int | None = None  # the process found holding it
    uid: int | None = None  # else its creator, when some holders' descriptors are hidden
    reason: str = ""  # else why its owner cannot be known


def closed_reason(entry: SocketEntry) -> str:
    """Why a socket can name no caller because it is closed or closing, or "" (pure)."""
    if entry.inode == 0 or entry.state != ESTABLISHED:
        return (
            f"the connection from port {entry.local[1]} was closed before its caller could "
            "be identified: keep it open until the answer comes"
        )
    return ""


def owner_of(
    entry: SocketEntry, holder: int | None, hidden: bool, exhausted: bool = False
) -> Owner:
    """The owner of a client socket, from its table entry and a search for its holder among
    the processes of the socket's uid (pure).

    `holder` is the pid found holding the socket; `hidden` says whether some processes'
    descriptors could not be read, so that a holder may exist unseen. Then, and only for an
    established socket that a file still holds, the kernel's record of the socket's creator
    stands for its owner: that uid cannot be chosen by the caller. `exhausted`: the search
    stopped at its budget, so the holder is not known.
    """
    reason = closed_reason(entry)
    if reason:
        return Owner(reason=reason)
    if holder is not None:
        return Owner(pid=holder)
    port = entry.local[1]
    if exhausted:
        return Owner(
            reason=f"the processes of uid {entry.uid} hold too many descriptors to "
            f"find the one holding the connection from port {port}: try again "
            "from a process with fewer, or over the unix socket"
        )
    if hidden:
        return Owner(uid=entry.uid)
    return Owner(
        reason=f"no process of uid {entry.uid} holds the connection from port {port} "
        "any more: it was closed before its caller could be identified, or "
        "handed to another user's process"
    )


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
            yield SocketEntry(
                _decode(fields[1]),
                _decode(fields[2]),
                int(fields[7]),
                int(fields[9]),
                int(fields[3], 16),
            )
        except (IndexError, ValueError):
            continue


def _encode(address: Address, width: int) -> str | None:
    """An address as the kernel prints it in /proc/net/tcp (width 4) or tcp6 (width 16)."""
    host, port = address
    try:
        parsed = ipaddress.ip_address(normalize(host))
    except ValueError:
        return None
    if width == 4:
        if parsed.version != 4:
            return None
        raw = struct.pack("=I", struct.unpack(">I", parsed.packed)[0])
    else:
        if parsed.version == 4:
            parsed = ipaddress.IPv6Address("::ffff:" + str(parsed))
        raw = struct.pack("=4I", *struct.unpack(">4I", parsed.packed))
    return f"{raw.hex().upper()}:{port:04X}"


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF


def _diag_candidates(peer: Address, server: Address) -> Iterator[tuple[int, Address, Address]]:
    """(family, client, server) as the client's socket may have them: IPv4 first, then IPv6."""
    client_host, server_host = normalize(peer[0]), normalize(server[0])
    both_v4 = "." in client_host and "." in server_host
    if both_v4:
        yield socket.AF_INET, (client_host, peer[1]), (server_host, server[1])
    yield socket.AF_INET6, (_mapped(client_host), peer[1]), (_mapped(server_host), server[1])


def _mapped(host: str) -> str:
    """An IPv4 address as an IPv6 socket names it."""
    return "::ffff:" + host if "." in host else host


def _diag(family: int, client: Address, server: Address) -> SocketEntry | None:
    """One exact lookup through the kernel's sock_diag netlink interface."""

    def packed(host: str) -> bytes:
        raw = socket.inet_pton(family, host)
        return raw + bytes(16 - len(raw))

    sockid = (
        struct.pack("!HH", client[1], server[1])
        + packed(client[0])
        + packed(server[0])
        + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    )
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, 1, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
        link.settimeout(1.0)
        link.sendto(header + request, (0, 0))
        answer = link.recv(8192)
    kind = struct.unpack_from("=H", answer, 4)[0]
    if kind == _NLMSG_ERROR or len(answer) < 16 + 72:
        return None
    state = answer[16 + 1]  # inet_diag_msg: family, state, timer, retrans, sockid, ...
    uid, inode = struct.unpack_from("=II", answer, 16 + 4 + 48 + 12)
    return SocketEntry(client, server, uid, inode, state)


def find_client(peer: Address, server: Address, proc: str = "/proc") -> SocketEntry | None:
    """The client end of a connection from `peer` to our `server` address, if it is local.

    Local means in our network namespace: over loopback, or from one of the host's own
    addresses. Asks the kernel for exactly that socket (sock_diag); where netlink is not
    allowed, reads /proc/net/tcp{,6}, finding the line by its text (it can hold thousands).
    """
    if proc == "/proc":
        try:
            for family, client, ours in _diag_candidates(peer, server):
                entry = _diag(family, client, ours)
                if entry is not None:
                    return SocketEntry(
                        (normalize(client[0]), client[1]),
                        (normalize(ours[0]), ours[1]),
                        entry.uid,
                        entry.inode,
                        entry.state,
                    )
            return None
        except (OSError, struct.error, ValueError):
            pass  # no netlink here: read the tables
    return find_client_in_tables(peer, server, proc)


def socket_owner(peer: Address, server: Address) -> int | None:
    """The uid the kernel recorded for the client socket of a connection from `peer` to our
    `server` address, if the client is on this host; None otherwise, or where netlink is not
    allowed. One exact sock_diag lookup per address family (30-80 µs): quick enough to make as a
    connection is accepted. Never the /proc tables, which can take 100 ms."""
    try:
        for family, client, ours in _diag_candidates(peer, server):
            entry = _diag(family, client, ours)
            if entry is not None:
                return entry.uid
    except (OSError, struct.error, ValueError):
        pass
    return None


def find_client_in_tables(
    peer: Address, server: Address, proc: str = "/proc"
) -> SocketEntry | None:
    """find_client through /proc/net/tcp and tcp6."""
    for name, width in (("tcp", 4), ("tcp6", 16)):
        local, remote = _encode(peer, width), _encode(server, width)
        if local is None or remote is None:
            continue
        try:
            with open(os.path.join(proc, "net", name), encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        at = text.find(f" {local} {remote} ")
        if at < 0:
            continue
        line = text[text.rfind("\n", 0, at) + 1 : text.find("\n", at)]
        for entry in parse_net_tcp("header\n" + line):
            return entry
    return None
