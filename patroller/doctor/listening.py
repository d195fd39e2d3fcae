"""Where the daemon would listen: its address and port (bound for a moment, as the daemon binds
them, then closed; when taken, asked whether a Patroller answers there), and its unix socket
(--socket: the folder it is made in, whether others can reach it, a file already there).

`probe_*` functions read and knock (blocking: the doctor runs them in the executor); `check_*`
functions are pure, over what they found."""

from __future__ import annotations

import errno
import os
import socket
import stat
from dataclasses import dataclass

from tornado.netutil import bind_sockets

from patroller.doctor.deadline import bounded, deadline
from patroller.doctor.results import Result, degraded, failed, ok

HEAD_LIMIT = 4096  # bytes of an answer's head read to learn who answers


@dataclass(frozen=True)
class PortFacts:
    port: int
    address: str  # "" for every interface
    error: int | None = None  # the errno binding failed with; None: it could be bound
    why: str = ""
    answers: str | None = None  # when taken: the Server header of what answers there


def probe_port(port: int, address: str, timeout: float) -> PortFacts:
    """Bind the port as the daemon would (every interface when no address), and let it go."""
    try:
        for sock in bind_sockets(port, address or None):
            sock.close()
    except OSError as exc:
        answers = _who_answers(address, port, timeout) if exc.errno == errno.EADDRINUSE else None
        return PortFacts(port, address, exc.errno, exc.strerror or str(exc), answers)
    return PortFacts(port, address)


def _who_answers(address: str, port: int, timeout: float) -> str | None:
    """The Server header of what answers an HTTP request there ("" if it answers without one,
    None if it does not answer HTTP in time)."""
    host = address if address and address not in ("0.0.0.0", "::") else "127.0.0.1"
    until = deadline(timeout)  # for the whole head: whatever holds the port may be anyone's
    try:
        with bounded(
            socket.create_connection((host, port), timeout=timeout), until, timeout
        ) as sock:
            sock.sendall(b"GET /openapi.json HTTP/1.0\r\nHost: doctor\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head and len(head) < HEAD_LIMIT:
                chunk = sock.recv(HEAD_LIMIT)
                if not chunk:
                    break
                head += chunk
    except OSError:
        return None
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "server":
            return value.strip()
    return "" if head.startswith(b"HTTP/") else None


def check_port(facts: PortFacts) -> Result:
    name = "address and port"
    where = f"port {facts.port} on {facts.address or 'every interface'}"
    if facts.error is None:
        return ok(
            name,
            f"{where}: free" if facts.port else "port 0: the kernel chooses a free one at start",
        )
    if facts.error == errno.EADDRINUSE:
        if facts.answers == "patroller":
            return ok(
                name,
                f"{where}: a Patroller serves there (this one, or the one this "
                "doctor is checking for)",
            )
        who = (
            f"`{facts.answers}` answers there"
            if facts.answers
            else "something that does not answer as Patroller does holds it"
        )
        return failed(
            name, f"{where} is taken: {who}", "stop it, or choose another --port or --address"
        )
    if facts.error == errno.EACCES:
        return failed(
            name,
            f"{where}: {facts.why}: only root may listen below port 1024",
            "run as root, choose a --port from 1024 up, or give the daemon CAP_NET_BIND_SERVICE",
        )
    if facts.error == errno.EADDRNOTAVAIL:
        return failed(
            name,
            f"{where}: {facts.why}: no interface of this host has that address",
            "choose an --address this host has (ip addr), or none for every one",
        )
    return failed(name, f"{where}: {facts.why}", "choose another --port or --address")


@dataclass(frozen=True)
class SocketFacts:
    path: str | None
    kind: str | None = None  # what is at the path: socket, directory, file; None: nothing
    mode: int | None = None  # its permission bits
    live: bool = False  # something accepts connections on it
    folder_missing: bool = False
    folder_unwritable: str | None = None  # why a socket cannot be made in its folder
    closed_by: str | None = None  # a folder on the way others may not pass through
    closed_mode: int = 0


def probe_socket(path: str | None, timeout: float) -> SocketFacts:
    """What is at the --socket path, and whether the daemon could bind there for everyone."""
    if path is None:
        return SocketFacts(None)
    folder = os.path.dirname(os.path.abspath(path))
    closed, closed_mode = _closed_folder(folder)
    try:
        info = os.lstat(path)
    except OSError:
        if not os.path.isdir(folder):
            return SocketFacts(path, folder_missing=True)
        unwritable = (
            None
            if os.access(folder, os.W_OK | os.X_OK)
            else f"{folder} is not writable by uid {os.geteuid()}"
        )
        return SocketFacts(
            path, folder_unwritable=unwritable, closed_by=closed, closed_mode=closed_mode
        )
    kind = (
        "socket"
        if stat.S_ISSOCK(info.st_mode)
        else "directory"
        if stat.S_ISDIR(info.st_mode)
        else "file"
    )
    live = False
    if kind == "socket":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(path)
                live = True
            except OSError:
                pass
    return SocketFacts(
        path, kind, stat.S_IMODE(info.st_mode), live, closed_by=closed, closed_mode=closed_mode
    )


def _closed_folder(folder: str) -> tuple[str | None, int]:
    """The first folder on the way to `folder` that others may not pass (no o+x), if any."""
    current = os.sep
    for part in [p for p in folder.split(os.sep) if p]:
        current = os.path.join(current, part)
        try:
            mode = stat.S_IMODE(os.stat(current).st_mode)
        except OSError:
            return None, 0
        if not mode & 0o001:
            return current, mode
    return None, 0


def check_socket(facts: SocketFacts) -> Result:
    name = "unix socket"
    path = facts.path
    if path is None:
        return ok(name, "none (--socket): callers are identified over TCP, from this host only")
    if facts.folder_missing:
        return failed(
            name,
            f"{os.path.dirname(path)} does not exist: {path} cannot be made",
            "make the folder (under systemd: RuntimeDirectory=patroller), or choose "
            "another --socket",
        )
    if facts.folder_unwritable is not None:
        return failed(
            name,
            f"{path} cannot be made: {facts.folder_unwritable}",
            "choose a --socket in a folder the daemon's user may write to",
        )
    if facts.kind in ("directory", "file"):
        return failed(
            name,
            f"{path} is a {facts.kind}, not a socket",
            "remove it, or choose another --socket",
        )
    reach = (
        ""
        if facts.closed_by is None
        else f"; but {facts.closed_by} (mode {facts.closed_mode:o}) lets no other user through"
    )
    if facts.kind is None:
        said = f"{path}: made at start (mode 666)"
    elif facts.live:
        said = f"{path}: a server answers there (mode {facts.mode:o})"
        if facts.mode is not None and facts.mode & 0o666 != 0o666:
            return degraded(
                name,
                f"{said}: not every user may connect",
                "the daemon makes it 666: is another program serving there?",
            )
    else:
        said = f"{path}: a stale socket nobody answers on, replaced at start"
    if reach:
        return degraded(
            name,
            said + reach,
            f"chmod o+x {facts.closed_by} (under systemd: RuntimeDirectoryMode=0755)",
        )
    return ok(name, said)
