"""Reserve GPUs from Patroller inside a training script.

Standard library only: copy this one file into a container and `from client import claim`.

    if not claim(2, server="gpuhost:8080", timeout=600):
        raise SystemExit("no GPUs free")
    # CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER=PCI_BUS_ID are set: import torch now

    with Claim(1, server="gpuhost:8080") as devices:   # released when the block ends
        ...
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.parse
import warnings
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["claim", "reserve", "release", "Claim", "PatrollerError", "RequestRefused",
           "ServerUnreachable", "Busy"]

DEFAULT_SERVER = "localhost"  # or the PATROLLER_SERVER environment variable
_SLACK = 30.0  # seconds the HTTP connection outlives a /wait timeout


class PatrollerError(Exception):
    """Base of the client's errors."""


class ServerUnreachable(PatrollerError):
    """The server could not be reached, or did not answer in time."""


class RequestRefused(PatrollerError):
    """The server refused the request (a bad request, an unknown group, ...)."""

    def __init__(self, status: int, body: Dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('error', body)}")
        self.status = status
        self.body = body


class Busy(PatrollerError):
    """The devices were not free (in time). Raised by `Claim`; `claim()` returns False."""


def reserve(count: int = 1, server: Optional[str] = None, timeout: Optional[float] = 0,
            resource: str = "gpu") -> Optional[List[Dict[str, Any]]]:
    """Reserve `count` devices of group `resource`; the granted devices, or None when busy.

    timeout=0 asks once (/request); a positive timeout waits that many seconds (/wait);
    timeout=None waits for as long as it takes.
    """
    params: Dict[str, Any] = {resource: count}
    if timeout == 0:
        path = "/request"
        http_timeout: Optional[float] = _SLACK
    else:
        path = "/wait"
        if timeout is not None:
            params["timeout"] = timeout
        http_timeout = None if timeout is None else float(timeout) + _SLACK
    status, body = _call(server, "GET", path, params, http_timeout)
    if status == 200:
        return body
    if status == 409:
        return None
    raise RequestRefused(status, body)


def claim(count: int = 1, server: Optional[str] = None, timeout: Optional[float] = 0,
          resource: str = "gpu") -> bool:
    """Reserve devices and point CUDA at them; True on success, False when busy or timed out.

    Sets CUDA_VISIBLE_DEVICES to the devices' nvidia-smi numbers and CUDA_DEVICE_ORDER to
    PCI_BUS_ID, the order those numbers follow. Call it before CUDA is initialised.
    """
    devices = reserve(count, server, timeout, resource)
    if devices is None:
        return False
    export(devices)
    return True


def export(devices: List[Dict[str, Any]]) -> None:
    """Set the CUDA environment variables for granted GPUs."""
    numbers = [str(d["info"]["number"]) for d in devices if d.get("group") == "gpu"]
    if numbers:
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(numbers)


def release(server: Optional[str] = None, uuid: Optional[str] = None) -> Dict[str, Any]:
    """Give back this caller's reservations (all, or one by uuid); what the server released."""
    params = {"uuid": uuid} if uuid is not None else {}
    status, body = _call(server, "POST", "/release", params, _SLACK)
    if status != 200:
        raise RequestRefused(status, body)
    return body


class Claim:
    """A context manager: reserves on entry (raising Busy if it cannot), releases on exit."""

    def __init__(self, count: int = 1, server: Optional[str] = None,
                 timeout: Optional[float] = 0, resource: str = "gpu") -> None:
        self.count, self.server, self.timeout, self.resource = count, server, timeout, resource
        self.devices: List[Dict[str, Any]] = []

    def __enter__(self) -> List[Dict[str, Any]]:
        devices = reserve(self.count, self.server, self.timeout, self.resource)
        if devices is None:
            raise Busy(f"{self.count} {self.resource} not free"
                       + (f" within {self.timeout} s" if self.timeout else ""))
        self.devices = devices
        export(devices)
        return devices

    def __exit__(self, *exc: Any) -> None:
        for device in self.devices:
            try:
                release(self.server, device["uuid"])
            except PatrollerError as error:  # never hide the block's own exception
                warnings.warn(f"could not release {device['uuid']}: {error}")
        self.devices = []


def parse_server(server: Optional[str]) -> Tuple[str, str, int]:
    """(scheme, host, port) from 'host', 'host:port', 'http://host[:port]' or 'https://...';
    ('unix', path, 0) from 'unix:///path/to/socket'."""
    text = (server or os.environ.get("PATROLLER_SERVER") or DEFAULT_SERVER).strip()
    if text.startswith("unix://"):
        path = text[len("unix://"):]
        if not path.startswith("/"):
            raise ValueError(f"a unix socket address needs an absolute path: {server!r}")
        return "unix", path, 0
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a Patroller server address: {server!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"bad port in server address {server!r}") from None
    return parts.scheme, parts.hostname, port


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: the server identifies the caller from the kernel's word."""

    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _connection(scheme: str, host: str, port: int,
                timeout: Optional[float]) -> http.client.HTTPConnection:
    if scheme == "unix":
        return _UnixConnection(host, timeout)
    if scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=timeout)
    return http.client.HTTPConnection(host, port, timeout=timeout)


def _call(server: Optional[str], method: str, path: str, params: Dict[str, Any],
          timeout: Optional[float]) -> Tuple[int, Any]:
    scheme, host, port = parse_server(server)
    connection = _connection(scheme, host, port, timeout)
    target = path + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        connection.request(method, target, headers={"Accept": "application/json"})
        response = connection.getresponse()
        raw = response.read()
    except (OSError, http.client.HTTPException) as exc:
        where = host if scheme == "unix" else f"{host}:{port}"
        raise ServerUnreachable(f"Patroller at {where}: {exc}") from None
    finally:
        connection.close()
    try:
        body = json.loads(raw.decode("utf-8"))
    except ValueError:
        raise ServerUnreachable(f"{server or host} did not answer like Patroller "
                                f"(HTTP {response.status})") from None
    return response.status, body
