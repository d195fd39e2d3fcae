"""Where the API listens: TCP, and a unix socket whose callers the kernel identifies."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.httputil import HTTPServerConnectionDelegate
from tornado.iostream import IOStream
from tornado.netutil import bind_sockets

from patroller.config import Config
from patroller.core.throttle import Throttle
from patroller.http.accepting import Acceptor
from patroller.http.access import Requests
from patroller.http.fastlane import Connection, FastLane
from patroller.http.framing import Framing, TornadoReports
from patroller.identify.connection import Accepted, ConnectionFacts
from patroller.identify.peers import Credentials, Peer, peer_credentials
from patroller.identify.sockets import normalize, socket_owner

log = logging.getLogger(__name__)

# Tornado's own body-size check answers a bare 400, so it must never come first: a chunk
# header may announce up to 16**62 bytes at once, before any of them is read. The Guard of
# framing.py enforces Config.max_body instead, in JSON.
UNLIMITED = 1 << 256
TORNADO_LOG = "tornado.general"  # where Tornado logs the requests it refuses itself


class PeerServer(HTTPServer):
    """An HTTPServer that reads, as each unix-socket connection arrives, who made it.

    The pid from SO_PEERCRED is read at once, with its /proc facts (in the executor), because
    the caller may exit and its pid be reused before the request is handled; those facts are
    kept only if the process at that pid is still the one that connected (its pidfd, its uid).
    Connections are
    accepted by an Acceptor (it pauses when descriptors run out), each with the fast lane at
    its door (fastlane.py); every other request passes framing.py's Guard first (framing
    errors get JSON answers where Tornado lets us answer), then goes to the application.
    """

    # TCPServer.initialize takes none of these: HTTPServer's own, with the lane and config
    def initialize(  # type: ignore[override]
        self,
        app: HTTPServerConnectionDelegate,
        lane: FastLane,
        config: Config,
        read_facts: Callable[[Credentials], Awaitable[Any]],
        requests: Requests,
    ) -> None:
        reports = Throttle(config.framing_reports, config.framing_window)
        # Idle keep-alive connections end after a while (a waiting /wait is not idle); the
        # Guard bounds bodies, in size and in time.
        super().initialize(
            Framing(app, config, reports),
            xheaders=False,
            idle_connection_timeout=config.header_timeout,
            max_body_size=UNLIMITED,
            body_timeout=None,
        )
        self.read_facts = read_facts
        self.acceptor = Acceptor(self, config, requests, lane)
        self.counts = ConnectionCounts(
            config.max_connections_per_caller, Throttle(1, config.repeat_log_every)
        )
        self.tornado_reports = TornadoReports(reports)
        logging.getLogger(TORNADO_LOG).addFilter(self.tornado_reports)

    def add_sockets(self, sockets: Iterable[socket.socket]) -> None:
        """Accept on these listening sockets, through the Acceptor."""
        for sock in sockets:
            self.acceptor.watch(sock)

    def stop(self) -> None:
        """Stop accepting; the open connections are served until `close_all_connections`."""
        self.acceptor.stop()
        logging.getLogger(TORNADO_LOG).removeFilter(self.tornado_reports)
        super().stop()

    def handle_stream(self, stream: IOStream, address: Any) -> None:
        """Count the connection against its caller's (a caller at its limit is closed at
        once), note who is calling in its facts (a unix caller's credentials and /proc facts, a
        TCP caller's address), then serve the connection as HTTP."""
        sock = stream.socket
        credentials = None
        if sock is not None and sock.family == socket.AF_UNIX:
            credentials = peer_credentials(sock)
        if not self.counts.admit(stream, _caller_of(sock, address, credentials)):
            if credentials is not None and credentials.pidfd is not None:
                os.close(credentials.pidfd)
            return
        # (a stream the Acceptor did not make has no facts: what is noted of it is lost)
        known = stream.facts if isinstance(stream, Accepted) else ConnectionFacts()
        if credentials is not None:
            known.peer = Peer(credentials, asyncio.ensure_future(self.read_facts(credentials)))
        elif isinstance(address, tuple):
            known.address = (address[0], address[1])
        super().handle_stream(stream, address)


Caller = tuple[str, int | str | None]  # ("uid", 1000) or ("address", "10.0.0.7")


def _caller_of(
    sock: socket.socket | None, address: Any, credentials: Credentials | None
) -> Caller:
    """Who holds a connection, for counting: the uid the kernel recorded for the client (the
    unix socket's peer, or a TCP client's socket on this host), else its address."""
    if sock is not None and sock.family == socket.AF_UNIX:
        return ("uid", credentials.uid if credentials is not None else None)
    if not isinstance(address, tuple) or sock is None:
        return ("address", None)
    try:
        ours = sock.getsockname()
    except OSError:
        return ("address", normalize(address[0]))
    uid = socket_owner((address[0], address[1]), (ours[0], ours[1]))
    return ("uid", uid) if uid is not None else ("address", normalize(address[0]))


class ConnectionCounts:
    """Open connections per caller, so that no caller can hold every descriptor: one at its
    limit (`max_connections_per_caller`) is closed as it is accepted, the others go on."""

    def __init__(self, limit: int, reports: Throttle) -> None:
        self.limit = limit
        self.reports = reports
        self.open: dict[Caller, int] = {}
        self.refused = 0  # connections closed at once, for /metrics

    def admit(self, stream: IOStream, caller: Caller) -> bool:
        """Count a new connection, or close it if its caller is at the limit."""
        held = self.open.get(caller, 0)
        if held >= self.limit or not isinstance(stream, Connection):
            if held >= self.limit:
                self.refused += 1
                admitted, more = self.reports.admit()
                if admitted:
                    log.warning(
                        "closed a connection of %s %s at once: it holds %d, the most one "
                        "caller may (--max-connections-per-caller)%s",
                        caller[0],
                        caller[1],
                        held,
                        f"; {more} more not logged" if more else "",
                    )
                stream.close()
                return False
            return True  # not ours to count (a stream made elsewhere)
        self.open[caller] = held + 1
        stream.on_close = lambda: self._closed(caller)
        return True

    def _closed(self, caller: Caller) -> None:
        left = self.open.get(caller, 1) - 1
        if left > 0:
            self.open[caller] = left
        else:
            self.open.pop(caller, None)


def tcp_sockets(port: int, address: str) -> list[socket.socket]:
    """Bound TCP sockets (every interface when address is empty). Raises OSError."""
    return bind_sockets(port, address or None)


class SocketPathError(Exception):
    """The --socket path is served by a live daemon, or is not a socket; one line says which."""


@dataclass(frozen=True)
class SocketFile:
    """A unix socket's file as we bound it: removed at stop only while it is still this one."""

    path: str
    device: int
    inode: int


def unix_socket(path: str) -> tuple[socket.socket, SocketFile]:
    """A listening unix socket that any local user (and container) may connect to.

    A live server on `path` is left alone and a path that is not a socket is refused (both
    SocketPathError); a stale socket file, which a killed daemon leaves, is replaced. Raises
    OSError when it cannot bind for another reason.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(path)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            _clear_stale(path)
            try:
                sock.bind(path)
            except OSError as again:
                if again.errno != errno.EADDRINUSE:
                    raise
                raise SocketPathError(
                    f"another Patroller is serving on {path}: it was bound as this one started"
                ) from None
        os.chmod(path, 0o666)
        sock.setblocking(False)
        sock.listen(128)
        bound = os.stat(path)
    except BaseException:
        sock.close()
        raise
    return sock, SocketFile(path, bound.st_dev, bound.st_ino)


def _clear_stale(path: str) -> None:
    """Remove a socket file nobody serves on; refuse a live one, or anything not a socket."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        return  # gone meanwhile: bind again
    if stat.S_ISDIR(before.st_mode):
        raise SocketPathError(
            f"--socket {path} is a directory: give the path of a socket "
            f"file to create, e.g. {path.rstrip('/')}/api.sock"
        )
    if not stat.S_ISSOCK(before.st_mode):
        raise SocketPathError(
            f"--socket {path} exists and is not a socket: remove it, or choose another --socket"
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            pass  # stale: nobody listens on it any more
        except OSError as exc:  # not ours to connect to, or too busy to accept
            why = exc.strerror or "no answer"
            raise SocketPathError(
                f"--socket {path} may be in use ({why}): stop whoever serves "
                "on it, or choose another --socket"
            ) from None
        else:
            raise SocketPathError(
                f"another Patroller is serving on {path}: stop it first, or "
                "choose another --socket"
            )
    try:
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) == (before.st_dev, before.st_ino):  # not one bound since
            os.unlink(path)
            log.info("replacing the stale socket file %s: nobody answers on it", path)
    except FileNotFoundError:
        pass


def remove_unix_socket(bound: SocketFile) -> None:
    """Remove our socket file at shutdown, unless another daemon's has replaced it since."""
    try:
        now = os.lstat(bound.path)
        if (now.st_dev, now.st_ino) == (bound.device, bound.inode):
            os.unlink(bound.path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove the socket file %s: %s", bound.path, exc.strerror or exc)
