"""Where the command line finds the daemon when no --server names it: the daemon's unix socket
(where the unit serves it; there the caller is who the kernel says), then PATROLLER_SERVER, then
the socket, address and port of the daemon's configuration file, then port 8080 on this host.
The first that takes a connection is the one asked; when none does, one message names each
place tried and why it failed, and how to name the server.

The configuration file is read here only for those three keys (the client side imports nothing
of the daemon); the daemon's own reader checks the whole file.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from typing import NamedTuple

from patroller import client
from patroller.cli.exits import EX_UNAVAILABLE, Failure
from patroller.durations import describe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10, where a client installed --no-deps may lack tomli
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

SOCKET = "/run/patroller/api.sock"  # the unit's --socket; PATROLLER_SOCKET names another
CONFIG_FILE = "/etc/patroller/patroller.toml"  # the daemon's default --config
CONNECT_TIMEOUT = 3.0  # seconds a place may take to take the connection
MAX_BYTES = 1024 * 1024  # the daemon's limit on its file too


class Place(NamedTuple):
    """A server to try, and what named it; or (server "") a place that names none, and why."""

    server: str  # as --server takes it
    named: str  # the daemon's socket, PATROLLER_SERVER, the file's port, the default port


def find(environ: Mapping[str, str]) -> str:
    """The first place that takes a connection, as --server takes it; Failure naming every
    place tried (and why it failed) when none does."""
    tried = []
    for place in places_of(environ):
        failed = knock(place.server) if place.server else place.named
        if failed is None:
            return place.server
        tried.append(f"{place.server} ({place.named}: {failed})" if place.server else failed)
    config = environ.get("PATROLLER_CONFIG") or CONFIG_FILE
    raise Failure(
        "cannot find the Patroller daemon: tried "
        + "; ".join(tried)
        + ". Name it with --server HOST:PORT (or unix:///path/to/socket) or "
        f"PATROLLER_SERVER, or give the daemon's port or socket in {config}",
        EX_UNAVAILABLE,
    )


def places_of(environ: Mapping[str, str]) -> list[Place]:
    """The places to try, in order, each once; with those that name none, and why (no
    PATROLLER_SERVER, no configuration file)."""
    places = [
        Place("unix://" + (environ.get("PATROLLER_SOCKET") or SOCKET), "the daemon's socket")
    ]
    server = environ.get("PATROLLER_SERVER", "").strip()
    places.append(
        Place(server, "PATROLLER_SERVER") if server else Place("", "PATROLLER_SERVER (not set)")
    )
    places += from_file(environ)
    places.append(Place(f"localhost:{client.DEFAULT_PORT}", "the default port"))
    servers = [place.server for place in places]
    return [p for n, p in enumerate(places) if not p.server or p.server not in servers[:n]]


def from_file(environ: Mapping[str, str]) -> list[Place]:
    """The socket and the address and port the daemon's configuration file gives (PATROLLER_CONFIG,
    else CONFIG_FILE); or why it gives none."""
    path = environ.get("PATROLLER_CONFIG")
    if path is not None and path.strip().lower() in ("", "none"):
        return []
    path = os.path.abspath(os.path.expanduser(path.strip())) if path else CONFIG_FILE
    if tomllib is None:
        return [Place("", f"{path} (not read: Python 3.10 reads TOML with tomli, not installed)")]
    try:
        with open(path, "rb") as f:
            data = tomllib.loads(f.read(MAX_BYTES).decode("utf-8"))
    except OSError as exc:
        return [Place("", f"{path} ({(exc.strerror or str(exc)).lower()})")]
    except (ValueError, UnicodeDecodeError):  # TOMLDecodeError is a ValueError
        return [Place("", f"{path} (not TOML: `patroller config` says why)")]
    named = f"{path}'s socket"
    places = (
        [Place("unix://" + data["socket"], named)]
        if isinstance(data.get("socket"), str) and data["socket"].startswith("/")
        else []
    )
    port = data.get("port")
    port = int(port) if isinstance(port, str) and port.strip().isdigit() else port
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        port = None  # none, or one the daemon would refuse (0: a port of the kernel's choice)
    address = data["address"].strip() if isinstance(data.get("address"), str) else ""
    if port is not None or address:
        host = "localhost" if address in ("", "0.0.0.0", "::") else address
        host = f"[{host}]" if ":" in host else host
        places.append(Place(f"{host}:{port or client.DEFAULT_PORT}", f"{path}'s port"))
    return places or [Place("", f"{path} (names no port nor socket)")]


def knock(server: str) -> str | None:
    """None when `server` takes a connection (closed at once, nothing sent); else why not."""
    try:
        scheme, host, port = client.parse_server(server)
    except ValueError as exc:
        return str(exc)
    try:
        if scheme == "unix":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
                unix.settimeout(CONNECT_TIMEOUT)
                unix.connect(host)
        else:
            socket.create_connection((host, port), CONNECT_TIMEOUT).close()
    except TimeoutError:
        return f"no connection within {describe(CONNECT_TIMEOUT)}"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    return None
