"""Who is calling the API: the identity behind an HTTP request."""
from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from typing import Optional, Protocol, Tuple

from tornado.httputil import HTTPServerRequest

from .containers import ContainerDirectory, DockerUnavailable, container_identity
from .errors import BadRequest, Unidentified
from .identity import Identity, named_user
from .listeners import peer_of
from .peers import (Address, Owner, SocketEntry, closed_reason, find_client, find_holder,
                    is_loopback, normalize, owner_of)
from .resolver import ProcessIdentifier, ProcFacts, host_identity, read_facts

DEFAULT_TEST_USER = "test-user"


class CallerIdentifier(Protocol):
    """Turns a request into the caller's identity, or raises errors.Unidentified."""

    async def identify(self, request: HTTPServerRequest, claimed: Optional[str]) -> Identity:
        """`claimed` is the request's user= (already checked for form), or None."""


class TestModeCallers:
    """Test mode: callers are who they say they are (`user=`), or one default user."""

    def __init__(self, default: str = DEFAULT_TEST_USER) -> None:
        self.default = default

    async def identify(self, request: HTTPServerRequest, claimed: Optional[str]) -> Identity:
        """The user named in the request, or the default test user."""
        return named_user(claimed or self.default)


class SystemCallers:
    """Outside test mode: a caller is identified by the system, never by what it says.

    - unix socket: the kernel's peer credentials (pid) -> cgroup -> container -> labels, or the
      host account. The caller cannot forge it.
    - TCP from a socket on this host (loopback, or one of the host's own addresses): the
      process that holds the client socket (sock_diag or /proc/net/tcp{,6}, and
      /proc/<pid>/fd), then the same chain. As trustworthy as the kernel's socket table. A
      socket already closed belongs to nobody: its caller is refused, never guessed.
    - other TCP: the container whose network address the caller has (advisory: addresses can
      be spoofed on a shared network).
    """

    def __init__(self, identifier: ProcessIdentifier, directory: Optional[ContainerDirectory],
                 proc: str = "/proc") -> None:
        self.identifier = identifier
        self.directory = directory
        self.proc = proc
        self._recent: "OrderedDict[int, None]" = OrderedDict()  # pids that called lately
        self._recent_lock = threading.Lock()  # used from executor threads
        self.lookups = 0  # TCP callers looked up (once per connection), counted when done

    async def identify(self, request: HTTPServerRequest, claimed: Optional[str]) -> Identity:
        """The caller's identity, or Unidentified."""
        if claimed is not None:
            raise BadRequest("user= is accepted in test mode only: callers are identified "
                             "by the system")
        stream = getattr(request.connection, "stream", None)
        peer = peer_of(stream)
        if peer is not None:
            facts = await peer.facts
            if facts is None:
                raise Unidentified(f"the calling process (pid {peer.credentials.pid}) is gone "
                                   "or cannot be read")
            return _known(await self.identifier.identify(facts))
        known = getattr(stream, _CALLER, None)  # a keep-alive connection's earlier answer
        if known is not None:
            return known
        try:
            identity = _known(await self._by_address(_ends(request)))
        finally:
            self.lookups += 1  # counted once the outcome is known (tests wait on it)
        if stream is not None:
            setattr(stream, _CALLER, identity)  # one TCP connection, one caller
        return identity

    async def _by_address(self, ends: Optional[Tuple[Address, Address]]) -> Identity:
        if ends is None:
            raise Unidentified("the connection was closed before its caller could be identified")
        client, server = ends
        loop = asyncio.get_running_loop()
        # The kernel first: a client socket in our network namespace is a process on this
        # host, over loopback or through one of the host's own addresses.
        entry = await loop.run_in_executor(None, find_client, client, server, self.proc)
        if entry is not None:
            return await self._local(entry)
        if is_loopback(client[0]) or normalize(client[0]) == normalize(server[0]):
            raise Unidentified(f"the connection from port {client[1]} is no longer in the "
                               "kernel's socket table: it was closed before its caller could "
                               "be identified")
        return await self._remote(client[0])

    async def _local(self, entry: SocketEntry) -> Identity:
        loop = asyncio.get_running_loop()
        owner, facts = await loop.run_in_executor(None, self._owner, entry)
        if owner.reason:
            raise Unidentified(owner.reason)
        if owner.pid is not None:
            if facts is None:
                raise Unidentified(f"the process holding the connection from port "
                                   f"{entry.local[1]} (pid {owner.pid}) ended before it could "
                                   "be identified")
            return await self.identifier.identify(facts)
        assert owner.uid is not None
        # Its holder is hidden from us (no CAP_SYS_PTRACE): the live socket's creator stands.
        return await loop.run_in_executor(None, host_identity, owner.uid)

    def _owner(self, entry: SocketEntry) -> Tuple[Owner, Optional[ProcFacts]]:
        """Blocking: the owner of a local client socket, with its holder's /proc facts."""
        if closed_reason(entry):  # nobody can hold it: no need to look
            return owner_of(entry, None, False), None
        with self._recent_lock:
            likely = list(reversed(self._recent))
        pid, hidden = find_holder(entry.inode, self.proc, likely=likely)
        owner = owner_of(entry, pid, hidden)
        if owner.pid is None:
            return owner, None
        with self._recent_lock:
            self._recent.pop(owner.pid, None)
            self._recent[owner.pid] = None
            while len(self._recent) > 16:
                self._recent.popitem(last=False)
        return owner, read_facts(owner.pid, self.proc)

    async def _remote(self, address: str) -> Identity:
        if self.directory is None:
            raise Unidentified(f"cannot identify a caller at {address}")
        try:
            info = await self.directory.by_address(normalize(address))
        except DockerUnavailable as exc:
            raise Unidentified(f"cannot identify a caller at {address}: {exc}") from None
        if info is None:
            raise Unidentified(f"no container has the address {address}: call from a container "
                               "on this host, from the host itself, or over the unix socket")
        return container_identity(info, self.identifier.user_labels, self.identifier.info_labels)


_CALLER = "patroller_caller"  # the identity a TCP connection's stream carries once known


def _known(identity: Identity) -> Identity:
    """Refuse a caller whose user cannot be told: nothing may be reserved for "unknown"."""
    if identity.degraded:
        raise Unidentified("your container's labels cannot be read just now (the Docker Engine "
                           "is unreachable): try again shortly")
    if identity.user == "unknown":
        raise Unidentified("the calling process cannot be identified")
    return identity


def _ends(request: HTTPServerRequest) -> Optional[Tuple[Address, Address]]:
    """(client, our end) of the request's TCP connection."""
    address = getattr(request.connection.context, "address", None)  # type: ignore[union-attr]
    stream = getattr(request.connection, "stream", None)
    sock = getattr(stream, "socket", None)
    if not isinstance(address, tuple) or sock is None:
        return None
    try:
        local = sock.getsockname()
    except OSError:
        return None
    return (address[0], address[1]), (local[0], local[1])
