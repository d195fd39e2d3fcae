"""Reserve GPUs from Patroller inside a training script.

Standard library only: copy this one file into a container and `from client import claim`.

    if not claim(2, server="gpuhost:8080", timeout=600):
        raise SystemExit("no GPUs free")
    # CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER=PCI_BUS_ID are set: import torch now;
    # the GPUs stay reserved for as long as this process lives (hold="process")

    with Claim(1, server="gpuhost:8080") as devices:   # released when the block ends
        ...
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import threading
import urllib.parse
import warnings
from typing import Any

__all__ = [
    "claim",
    "reserve",
    "release",
    "release_all",
    "renew",
    "keep_alive",
    "status",
    "devices",
    "queue",
    "get_json",
    "Claim",
    "KeepAlive",
    "PatrollerError",
    "RequestRefused",
    "ServerUnreachable",
    "Busy",
    "HOLDS",
]

DEFAULT_SERVER = "localhost"  # or the PATROLLER_SERVER environment variable
DEFAULT_PORT = 8080  # the daemon's: a server named without a port (an http:// URL's is 80)
HOLDS = ("process", "lease")  # what keeps a reservation: the calling process, or a lease; or
# a duration ("2h", "90m", "3600"): held that long whatever runs (the server's --max-hold at most)
_DURATION = re.compile(r"\s*\d+(\.\d+)?\s*[smhd]?\s*", re.IGNORECASE)
CUDA_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
_SLACK = 30.0  # seconds the HTTP connection outlives a /wait timeout
_LEASE = 10.0  # the server's default lease, for a grant that does not say its own
_SHORTEST_RENEWAL = 0.1  # seconds: keep_alive never asks more often than this


# What this process reserved through this module and has not released, by server: what a
# bare release() gives back (never another job's reservations of the same user).
_reserved: dict[tuple[str, str, int], list[str]] = {}
_reserved_lock = threading.Lock()
_before_claim: dict[str, str | None] | None = None  # CUDA's variables before claim()


class PatrollerError(Exception):
    """Base of the client's errors."""


class ServerUnreachable(PatrollerError):
    """The server could not be reached, or did not answer in time."""


class RequestRefused(PatrollerError):
    """The server refused the request (a bad request, an unknown group, ...)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(
            f"{status}: {body.get('error', body) if isinstance(body, dict) else body}"
        )
        self.status = status
        self.body = body


class Busy(PatrollerError):
    """The devices were not free (in time). Raised by `Claim`; `claim()` returns False."""


def reserve(
    count: int = 1,
    server: str | None = None,
    timeout: float | None = 0,
    resource: str = "gpu",
    hold: str = "process",
    link: str | None = None,
) -> list[dict[str, Any]] | None:
    """Reserve `count` devices of group `resource`; the granted devices, or None when busy.

    timeout=0 asks once (/request); a positive timeout waits that many seconds (/wait);
    timeout=None waits for as long as it takes. hold="process" keeps the devices for as long
    as the calling process lives; hold="lease" keeps them for the server's short lease, until
    the user's process shows up on them (see `keep_alive` to hold a lease longer); a duration
    (hold="2h") keeps them that long, whatever runs on them. link="nvlink" or "numa" insists on
    GPUs linked by NVLink, or in one NUMA node; without it, the best-connected are given."""
    _check_hold(hold)
    params: dict[str, Any] = {resource: count, "hold": hold, **({"link": link} if link else {})}
    if timeout not in (0, None):
        params["timeout"] = timeout
    http_timeout = None if timeout is None else float(timeout) + _SLACK
    code, body = _call(
        server, "GET", "/request" if timeout == 0 else "/wait", params, http_timeout
    )
    if code == 200:
        with _reserved_lock:
            _reserved.setdefault(parse_server(server), []).extend(d["uuid"] for d in body)
        return body
    if code == 409:
        return None
    raise RequestRefused(code, body)


def _check_hold(hold: str) -> None:
    """ValueError unless `hold` is one of HOLDS or a duration (the server checks its length)."""
    if hold not in HOLDS and not _DURATION.fullmatch(str(hold)):
        raise ValueError(f"hold must be process, lease or a duration such as 2h, not {hold!r}")


def claim(
    count: int = 1,
    server: str | None = None,
    timeout: float | None = 0,
    resource: str = "gpu",
    hold: str = "process",
    link: str | None = None,
) -> bool:
    """Reserve devices and point CUDA at them; True on success, False when busy or timed out.

    Sets CUDA_VISIBLE_DEVICES to the devices' nvidia-smi numbers and CUDA_DEVICE_ORDER to
    PCI_BUS_ID, the order those numbers follow (call it before CUDA is initialised): as they
    were before once release() has given back all that was claimed."""
    global _before_claim
    devices = reserve(count, server, timeout, resource, hold, link)
    if devices is None:
        return False
    with _reserved_lock:
        _before_claim = _before_claim or {n: os.environ.get(n) for n in CUDA_VARIABLES}
    export(devices)
    return True


def _put_back(saved: dict[str, str | None]) -> None:
    """The CUDA variables as they were saved (unset if they were unset)."""
    for name, value in saved.items():
        os.environ.pop(name, None) if value is None else os.environ.update({name: value})


def export(devices: list[dict[str, Any]]) -> None:
    """Set the CUDA environment variables for granted GPUs."""
    numbers = [str(d["info"]["number"]) for d in devices if d.get("group") == "gpu"]
    if numbers:
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(numbers)


def release(
    server: str | None = None, uuid: str | None = None, reason: str | None = None
) -> dict[str, Any]:
    """Give back what this process reserved through this module (claim, reserve, Claim), or
    the device `uuid`; what the server released. The user's other reservations (another job's,
    a hold for a duration) stay: `release_all` gives back those too. The host's root may name
    another user's device, with a `reason` for the audit record (the answer's `holder`)."""
    key = parse_server(server)
    with _reserved_lock:
        uuids = [uuid] if uuid is not None else list(_reserved.get(key, []))
    answer: dict[str, Any] = {"released": [], "after_exit": []}
    for one in uuids:
        params = {"uuid": one, **({"reason": reason} if reason else {})}
        body = _granted(server, "POST", "/release", params, _SLACK)
        answer["released"] += body["released"]
        answer["after_exit"] += body["after_exit"]
        if body.get("holder"):  # the host's root released another user's device
            answer["holder"] = body["holder"]
        _forget(key, [one])
    return answer


def release_all(server: str | None = None, reason: str | None = None) -> dict[str, Any]:
    """Give back every reservation of this caller's user, but those held for another process
    that still runs (a job's: `kept`, with why); what the server released and kept."""
    body = _granted(server, "POST", "/release", {"reason": reason} if reason else {}, _SLACK)
    _forget(parse_server(server), [d["uuid"] for d in body["released"] + body["after_exit"]])
    return body


def _forget(key: tuple[str, str, int], uuids: list[str]) -> None:
    """What this process no longer holds; once it holds nothing, CUDA's are as before claim()."""
    global _before_claim
    with _reserved_lock:
        _reserved[key] = [one for one in _reserved.get(key, []) if one not in uuids]
        if _before_claim is not None and not any(_reserved.values()):
            _put_back(_before_claim)
            _before_claim = None


def renew(
    server: str | None = None, uuid: str | None = None, http_timeout: float = _SLACK
) -> list[dict[str, Any]]:
    """Restart the lease of this caller's lease-held devices (all, or one); the renewed grants.

    Raises RequestRefused: 409 when the device is no longer the caller's (the lease ran out or
    it was released), 403 when another user holds it, 422 when there is no such device.
    """
    params = {"uuid": uuid} if uuid is not None else {}
    return _granted(server, "POST", "/renew", params, http_timeout)["renewed"]


def status(server: str | None = None) -> dict[str, Any]:
    """GET /status: every device's statistics and claim, by uuid."""
    return get_json(server, "/status")


def devices(server: str | None = None) -> dict[str, Any]:
    """GET /devices: the inventory, by uuid, in device order."""
    return get_json(server, "/devices")


def queue(server: str | None = None) -> list[dict[str, Any]]:
    """GET /queue: the waiting requests in arrival order."""
    return get_json(server, "/queue")


def users(server: str | None = None) -> dict[str, Any]:
    """GET /users: per user, GPUs held, unused, used without asking, idle; the limit."""
    return get_json(server, "/users")


class KeepAlive:
    """Renews leases from a daemon thread until stopped; made by `keep_alive`.

    `lost` maps each device that can no longer be renewed (the server answered 409, 403 or
    422: it ran out, was released or is another's) to the server's error; those are not asked
    for again. `error` is the last failure to reach the server (it keeps trying), or None.
    The thread never raises into the caller and never keeps the interpreter alive.
    """

    def __init__(self, uuids: list[str], server: str | None, every: float) -> None:
        self.uuids = list(uuids)
        self.server = server
        self.every = every
        self.lost: dict[str, str] = {}
        self.error: PatrollerError | None = None
        self.renewals = 0  # successful /renew answers, all devices together
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="patroller-keep-alive", daemon=True)

    def start(self) -> KeepAlive:
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop renewing and wait for the thread (at most one renewal in flight)."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> KeepAlive:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _run(self) -> None:
        # An answer later than `every` would be too late anyway; a hung server must not hold
        # stop() up for long either.
        http_timeout = max(self.every, 2.0)
        while not self._stopping.wait(self.every):
            left = [uuid for uuid in self.uuids if uuid not in self.lost]
            if not left:
                return
            for uuid in left:
                if self._stopping.is_set():
                    return
                try:
                    renew(self.server, uuid, http_timeout)
                except RequestRefused as refused:
                    if refused.status in (403, 409, 422):
                        self.lost[uuid] = str(refused.body.get("error", refused.body))
                    else:
                        self.error = refused
                except ServerUnreachable as unreachable:
                    self.error = unreachable
                except Exception as unexpected:  # never into the caller's thread
                    self.error = PatrollerError(f"keep-alive: {unexpected!r}")
                else:
                    self.renewals += 1
                    self.error = None


def keep_alive(
    granted: list[dict[str, Any]], server: str | None = None, every: float | None = None
) -> KeepAlive:
    """Renew the leases of `granted` (what reserve returned) every `every` seconds, from a
    daemon thread, until `.stop()`; started. By default `every` is a third of the shortest
    `expires` among the grants (the server's 10 s lease if none says), never under 0.1 s."""
    if every is None:
        leases = [float(g["expires"]) for g in granted if g.get("expires") is not None]
        every = max(min(leases, default=_LEASE) / 3.0, _SHORTEST_RENEWAL)
    if every <= 0:
        raise ValueError(f"every must be positive, not {every!r}")
    return KeepAlive([g["uuid"] for g in granted], server, every).start()


class Claim:
    """A context manager: reserves on entry (raising Busy if it cannot), releases on exit.

    Inside the block CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER point at the devices; on exit
    they are put back as they were (unset if they were unset). With hold="lease" a background
    thread keeps the lease alive while the block runs.
    """

    def __init__(
        self,
        count: int = 1,
        server: str | None = None,
        timeout: float | None = 0,
        resource: str = "gpu",
        hold: str = "process",
    ) -> None:
        _check_hold(hold)
        self.count, self.server, self.timeout, self.resource = count, server, timeout, resource
        self.hold = hold
        self.devices: list[dict[str, Any]] = []
        self.keeper: KeepAlive | None = None
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> list[dict[str, Any]]:
        devices = reserve(self.count, self.server, self.timeout, self.resource, self.hold)
        if devices is None:
            raise Busy(
                f"{self.count} {self.resource} not free"
                + (f" within {self.timeout} s" if self.timeout else "")
            )
        self.devices = devices
        if self.hold == "lease":
            self.keeper = keep_alive(devices, self.server)
        self._saved = {name: os.environ.get(name) for name in CUDA_VARIABLES}
        export(devices)
        return devices

    def __exit__(self, *exc: Any) -> None:
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None
        _put_back(self._saved)
        self._saved = {}
        for device in self.devices:
            try:
                release(self.server, device["uuid"])
            except PatrollerError as error:  # never hide the block's own exception
                warnings.warn(f"could not release {device['uuid']}: {error}", stacklevel=2)
        self.devices = []


def parse_server(server: str | None) -> tuple[str, str, int]:
    """(scheme, host, port) from 'host' (port DEFAULT_PORT), 'host:port', 'http://host[:port]'
    or 'https://...'; ('unix', path, 0) from 'unix:///path/to/socket'."""
    text = (server or os.environ.get("PATROLLER_SERVER") or DEFAULT_SERVER).strip()
    if text.startswith("unix://"):
        path = text[len("unix://") :]
        if not path.startswith("/"):
            raise ValueError(f"a unix socket address needs an absolute path: {server!r}")
        return "unix", path, 0
    bare = "://" not in text  # a name, not a URL: the daemon's port by default
    parts = urllib.parse.urlsplit("http://" + text if bare else text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a Patroller server address: {server!r}")
    try:
        port = parts.port or (DEFAULT_PORT if bare else 443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"bad port in server address {server!r}") from None
    return parts.scheme, parts.hostname, port


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: the server identifies the caller from the kernel's word."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:  # a socket that cannot connect is closed with the connection
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def get_json(
    server: str | None,
    path: str,
    timeout: float = _SLACK,
    limit: int = 0,
    post: dict[str, Any] | None = None,
) -> Any:
    """GET `path` (/status, ...), or POST `post` to it: its JSON. RequestRefused when refused;
    ServerUnreachable when not answered within `timeout` s, nor JSON of `limit` bytes at most."""
    return _granted(server, "GET" if post is None else "POST", path, post or {}, timeout, limit)


def _granted(
    server: str | None,
    method: str,
    path: str,
    params: dict[str, Any],
    timeout: float | None,
    limit: int = 0,
) -> Any:
    """The answer to a call that must succeed; RequestRefused when the server refuses."""
    code, body = _call(server, method, path, params, timeout, limit)
    if code != 200:
        raise RequestRefused(code, body)
    return body


def _call(
    server: str | None,
    method: str,
    path: str,
    params: dict[str, Any],
    timeout: float | None,
    limit: int = 0,
) -> tuple[int, Any]:
    scheme, host, port = parse_server(server)
    kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    connection = (
        _UnixConnection(host, timeout) if scheme == "unix" else kind(host, port, timeout=timeout)
    )
    form = urllib.parse.urlencode(params) if method == "POST" else None  # a POST's: its body
    target = path + ("?" + urllib.parse.urlencode(params) if params and form is None else "")
    headers = {"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"}
    try:
        connection.request(method, target, body=form, headers=headers)
        response = connection.getresponse()
        raw = response.read(limit + 1 if limit else None)
    except (OSError, http.client.HTTPException) as exc:
        where = host if scheme == "unix" else f"{host}:{port}"
        raise ServerUnreachable(f"Patroller at {where}: {exc}") from None
    finally:
        connection.close()
    if limit and len(raw) > limit:
        raise ServerUnreachable(f"bad answer: {path} is more than {limit} bytes")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # not JSON; or nested deeper than Python recurses
        raise ServerUnreachable(
            f"{server or host} did not answer like Patroller (HTTP {response.status})"
        ) from None
    return response.status, body
