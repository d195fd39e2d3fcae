"""Who is calling the API: the identity behind an HTTP request, and the process that sent it."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from functools import partial
from typing import Any, Protocol

from tornado.httputil import HTTPServerRequest

from patroller.config import Config
from patroller.core.errors import BadRequest, NoCallerProcess, Unidentified
from patroller.core.identity import Identity, ProcessRef, named_user
from patroller.core.throttle import Throttle
from patroller.identify import procfs
from patroller.identify.connection import ConnectionFacts, facts_of, stream_of, when_ended
from patroller.identify.containers import ContainerDirectory, DockerUnavailable, container_identity
from patroller.identify.holders import HolderSearch
from patroller.identify.resolver import (
    ProcessIdentifier,
    ProcFacts,
    host_identity,
    read_facts,
    runs_as,
)
from patroller.identify.sockets import (
    Address,
    Owner,
    SocketEntry,
    closed_reason,
    find_client,
    is_loopback,
    normalize,
    owner_of,
)

log = logging.getLogger(__name__)

DEFAULT_TEST_USER = "test-user"
SOCKET_HINT = (
    "call over the daemon's unix socket (PATROLLER_SERVER=unix:///run/patroller/"
    "api.sock, the directory mounted into the container) or from a process on the "
    "host, or ask hold=lease"
)


class CallerIdentifier(Protocol):
    """Turns a request into the caller's identity, or raises errors.Unidentified."""

    lookups: int  # TCP callers looked up in the kernel's socket table (/metrics counts them)

    @property
    def descriptors_read(self) -> int:
        """Descriptors read to find the processes of TCP callers (/metrics counts them)."""

    async def identify(self, request: HTTPServerRequest, claimed: str | None) -> Identity:
        """`claimed` is the request's user= (already checked for form), or None."""

    async def process(self, request: HTTPServerRequest) -> ProcessRef:
        """The process that sent the request (after `identify`); NoCallerProcess if unknown."""


class LocalProcesses:
    """The process behind a connection from this host, as the kernel tells it: the unix
    socket's peer credentials, or the holder of a loopback TCP client socket."""

    def __init__(self, config: Config) -> None:
        self.proc = config.proc_root
        self.shifted_from = config.shifted_uids_from
        self.reports = Throttle(1, config.repeat_log_every)  # refusals of a borrowed pid, logged
        self.holders = HolderSearch(
            self.proc,
            config.holder_search_budget,
            config.holder_sockets_remembered,
            config.holder_descriptors_remembered,
        )
        self.recent_callers = config.recent_callers
        self._recent: OrderedDict[int, None] = OrderedDict()  # pids that called lately
        self._recent_lock = threading.Lock()  # used from executor threads

    async def of_connection(self, known: ConnectionFacts | None) -> ProcFacts | None:
        """Facts of the unix-socket peer, or of the process found earlier for a TCP caller."""
        if known is None:
            return None
        if known.peer is not None:
            facts: ProcFacts | str = await known.peer.facts
            if isinstance(facts, str):  # its pid no longer names the process that connected
                self._report(facts)
                raise Unidentified(facts)
            return facts
        return known.process

    def _report(self, reason: str) -> None:
        logged, held = self.reports.admit()
        if logged:
            more = f" ({held} more since the last such line)" if held else ""
            log.warning("caller refused: %s%s", reason, more)

    def forget_at_end(self, connection: Any, entry: SocketEntry) -> None:
        """On the loop: once the connection ends, its client socket's place is forgotten, so
        that the descriptor number it frees, which the client's next connection often gets, is
        read early in the next search."""
        if entry.inode:
            when_ended(connection, partial(self.holders.forget, entry.inode))

    def owner(self, entry: SocketEntry) -> tuple[Owner, ProcFacts | None]:
        """Blocking: the owner of a local client socket, with its holder's /proc facts."""
        if closed_reason(entry):  # nobody can hold it: no need to look
            return owner_of(entry, None, False), None
        with self._recent_lock:
            likely = list(reversed(self._recent))
        search = self.holders.find(entry.inode, entry.uid, likely)
        owner = owner_of(entry, search.pid, search.hidden, search.exhausted)
        if owner.pid is None:
            return owner, None
        with self._recent_lock:
            self._recent.pop(owner.pid, None)
            self._recent[owner.pid] = None
            while len(self._recent) > self.recent_callers:
                self._recent.popitem(last=False)
        facts = read_facts(owner.pid, self.proc, self.shifted_from)
        if facts is None:
            return owner, None
        refused = self._not_the_holder(entry, facts)
        if refused:
            self._report(refused)
            return Owner(reason=refused), None
        return owner, facts

    def _not_the_holder(self, entry: SocketEntry, facts: ProcFacts) -> str:
        """Why the process whose facts were read is not the one holding the client socket (its
        pid was reused meanwhile, or the socket is another uid's), or ""."""
        port = entry.local[1]
        if entry.uid not in facts.uids:
            return (
                f"pid {facts.pid} is not the process that made the connection from port "
                f"{port}: it runs as uid {facts.uids[0]}, the socket is uid {entry.uid}'s"
            )
        # Holding the socket after its facts were read, and still the same process: the facts
        # are that holder's, not those of a process that took its pid in between.
        if not self.holders.holds(facts.pid, entry.inode) or not procfs.is_alive(
            ProcessRef(facts.pid, facts.start), self.proc
        ):
            return (
                f"pid {facts.pid} is not the process that made the connection from port "
                f"{port}: it no longer holds it"
            )
        return ""


class TestModeCallers:
    """Test mode: callers are who they say they are (`user=`), or one default user; the process
    behind a request from this host is still the kernel's word."""

    def __init__(self, config: Config, default: str = DEFAULT_TEST_USER) -> None:
        self.default = default
        self.local = LocalProcesses(config)
        self.lookups = 0  # loopback callers of hold=process looked up

    @property
    def descriptors_read(self) -> int:
        """Descriptors read to find the processes of TCP callers."""
        return self.local.holders.read

    async def identify(self, request: HTTPServerRequest, claimed: str | None) -> Identity:
        """The user named in the request, or the default test user."""
        return named_user(claimed or self.default)

    async def process(self, request: HTTPServerRequest) -> ProcessRef:
        """The calling process, for a unix-socket or loopback caller."""
        known = facts_of(request.connection)
        facts = await self.local.of_connection(known)
        if facts is None and (known is None or known.peer is None):
            facts = await self._by_address(request)
            if facts is not None and known is not None:
                known.process = facts
        if facts is None:
            raise NoCallerProcess(
                "hold=process: the calling process cannot be known for this "
                "connection; " + SOCKET_HINT,
                hold="process",
            )
        return ProcessRef(facts.pid, facts.start)

    async def _by_address(self, request: HTTPServerRequest) -> ProcFacts | None:
        ends = _ends(request)
        if ends is None:
            return None
        loop = asyncio.get_running_loop()
        self.lookups += 1
        entry = await loop.run_in_executor(None, find_client, ends[0], ends[1], self.local.proc)
        if entry is None:
            return None
        self.local.forget_at_end(request.connection, entry)
        owner, facts = await loop.run_in_executor(None, self.local.owner, entry)
        if owner.reason:
            raise Unidentified(owner.reason)
        return facts


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

    def __init__(
        self, identifier: ProcessIdentifier, directory: ContainerDirectory | None, config: Config
    ) -> None:
        self.identifier = identifier
        self.directory = directory
        self.proc = config.proc_root
        self.local = LocalProcesses(config)
        self.lookups = 0  # TCP callers looked up (once per connection), counted when done

    @property
    def descriptors_read(self) -> int:
        """Descriptors read to find the processes of TCP callers."""
        return self.local.holders.read

    async def identify(self, request: HTTPServerRequest, claimed: str | None) -> Identity:
        """The caller's identity, or Unidentified."""
        if claimed is not None:
            raise BadRequest(
                "user= is accepted in test mode only: callers are identified by the system"
            )
        known = facts_of(request.connection)
        if known is not None and known.peer is not None:
            facts = await self.local.of_connection(known)
            assert facts is not None
            return _known(await self.identifier.identify(facts))
        if known is not None and known.caller is not None:  # said before on it
            return known.caller
        try:
            identity, facts = await self._by_address(_ends(request), request.connection)
            identity = _known(identity)
        finally:
            self.lookups += 1  # counted once the outcome is known (tests wait on it)
        if known is not None:
            known.caller = identity  # one TCP connection, one caller
            if facts is not None:
                known.process = facts
        return identity

    async def process(self, request: HTTPServerRequest) -> ProcessRef:
        """The calling process: the unix-socket peer, or the holder of a local TCP socket."""
        facts = await self.local.of_connection(facts_of(request.connection))
        if facts is None:
            ends = _ends(request)
            where = f" at {ends[0][0]}" if ends is not None else ""
            raise NoCallerProcess(
                f"hold=process: the daemon cannot know the calling process of "
                f"a caller{where}; " + SOCKET_HINT,
                hold="process",
            )
        return ProcessRef(facts.pid, facts.start)

    async def _by_address(
        self, ends: tuple[Address, Address] | None, connection: Any
    ) -> tuple[Identity, ProcFacts | None]:
        """The caller of a TCP connection (`connection`, a request's), with its process's
        facts when it is local."""
        if ends is None:
            raise Unidentified("the connection was closed before its caller could be identified")
        client, server = ends
        loop = asyncio.get_running_loop()
        # The kernel first: a client socket in our network namespace is a process on this
        # host, over loopback or through one of the host's own addresses.
        entry = await loop.run_in_executor(None, find_client, client, server, self.proc)
        if entry is not None:
            self.local.forget_at_end(connection, entry)
            return await self._local(entry)
        if is_loopback(client[0]) or normalize(client[0]) == normalize(server[0]):
            raise Unidentified(
                f"the connection from port {client[1]} is no longer in the "
                "kernel's socket table: it was closed before its caller could "
                "be identified"
            )
        return await self._remote(client[0]), None

    async def _local(self, entry: SocketEntry) -> tuple[Identity, ProcFacts | None]:
        loop = asyncio.get_running_loop()
        owner, facts = await loop.run_in_executor(None, self.local.owner, entry)
        if owner.reason:
            raise Unidentified(owner.reason)
        if owner.pid is not None:
            if facts is None:
                raise Unidentified(
                    f"the process holding the connection from port "
                    f"{entry.local[1]} (pid {owner.pid}) ended before it could "
                    "be identified"
                )
            return await self.identifier.identify(facts), facts
        assert owner.uid is not None
        # Its holder is hidden from us (no CAP_SYS_PTRACE): the live socket's creator stands.
        return await loop.run_in_executor(None, host_identity, owner.uid), None

    async def _remote(self, address: str) -> Identity:
        if self.directory is None:
            raise Unidentified(f"cannot identify a caller at {address}")
        try:
            info = await self.directory.by_address(normalize(address))
        except DockerUnavailable as exc:
            raise Unidentified(f"cannot identify a caller at {address}: {exc}") from None
        if info is None:
            raise Unidentified(
                f"no container has the address {address}: call from a container "
                "on this host, from the host itself, or over the unix socket"
            )
        identity = container_identity(
            info, self.identifier.user_labels, self.identifier.info_labels
        )
        if info.pid is None:
            return identity
        # The account it runs as: its first process's (the caller's own is not known).
        facts = await self.identifier.facts(info.pid)
        if facts is None or facts.container is None or facts.container.id != info.id:
            return identity  # it stopped, or restarted since Docker was asked
        return runs_as(identity, facts.host)


def _known(identity: Identity) -> Identity:
    """Refuse a caller whose user cannot be told: nothing may be reserved for "unknown"."""
    if identity.degraded:
        raise Unidentified(
            "your container's labels cannot be read just now (its container "
            "engine is unreachable): try again shortly"
        )
    if identity.user == "unknown":
        raise Unidentified("the calling process cannot be identified")
    return identity


def _ends(request: HTTPServerRequest) -> tuple[Address, Address] | None:
    """(client, our end) of the request's TCP connection."""
    known = facts_of(request.connection)
    stream = stream_of(request.connection)
    address = known.address if known is not None else None
    sock = stream.socket if stream is not None else None
    if address is None or sock is None:
        return None
    try:
        local = sock.getsockname()
    except OSError:
        return None
    return (address[0], address[1]), (local[0], local[1])
