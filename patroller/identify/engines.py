"""Which engine can name a container, by what its cgroup says: the Docker Engine, Podman's
service, the rootless engine of the user whose slice holds it, or containerd; one client each.

All but containerd are asked through the Docker API (Podman's service serves it too), with the
same label rules; containerd through its own gRPC API (containerd.py). Where a container goes:
  containerd (cri-containerd-<id>)                           -> --containerd-socket
  a bare id under a Kubernetes pod's cgroupfs path           -> --containerd-socket if containerd
                                                                knows it, else the Docker Engine
  Docker, or a bare id under a parent that names no runtime  -> the Docker Engine (--docker-host)
  Podman                                                     -> --podman-socket
  in the slice of uid U: rootless Podman                     -> --rootless-podman-socket, for U
  in the slice of uid U: rootless Docker (or not said)       -> --rootless-docker-socket, for U
  LXD, CRI-O                                                 -> none: named by name (or id)
A user's container is never looked up in the system's engines: anyone may name a cgroup in
their own slice after someone else's container, and only their own engines know theirs.

The engines other than the Docker Engine are optional (containerd also needs grpcio): a socket
that is not there is none to ask (checked off the loop, remembered for `engine_socket_ttl`
seconds, said in the log only when it is there but cannot be used), and its containers are named
by their ids until it is there (`awaits`: the tracker asks again). One that is there but does
not answer degrades like the Docker Engine, and is asked again later. A client is made
for an engine when it is first needed, one per socket, and at most `engine_clients` are kept.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache, TTLCache

from patroller.config import Config
from patroller.identify.cgroups import ContainerRef
from patroller.identify.containerd import ContainerdDirectory
from patroller.identify.containers import ContainerDirectory
from patroller.observe import grpcunix

log = logging.getLogger(__name__)

# Runtimes with no engine that serves the Docker API: LXD names its containers in the cgroup
# itself; containerd has an API of its own (asks_containerd); CRI-O's are named by their ids.
UNASKED = ("lxd", "containerd", "crio")


def asks_containerd(ref: ContainerRef) -> bool:
    """Whether containerd may know this container: one its cgroup says is containerd's, or a
    bare id in a Kubernetes pod's cgroupfs path (the runtime is not said there). Never one in
    a user's slice: the system's containerd is not that user's engine."""
    if ref.owner is not None:
        return False
    return ref.runtime == "containerd" or (ref.runtime == "" and ref.pod is not None)


@dataclass(frozen=True)
class Route:
    """The engine to ask about a container."""

    engine: str  # what the log and the errors call it
    address: str | None  # its Docker API address; None: the Docker Engine (--docker-host)


def route(ref: ContainerRef, config: Config) -> Route | None:
    """The engine that may name this container, or None when none of those configured can."""
    if ref.runtime in UNASKED:
        return None
    if ref.owner is not None:  # the user's own engine, or none
        podman = ref.runtime == "podman"
        template = config.rootless_podman_socket if podman else config.rootless_docker_socket
        if template is None:
            return None
        engine = "rootless Podman" if podman else "the rootless Docker Engine"
        return Route(f"{engine} of uid {ref.owner}", template.format(uid=ref.owner))
    if ref.runtime == "podman":
        return None if config.podman_socket is None else Route("Podman", config.podman_socket)
    return Route("the Docker Engine", None)


class _Clients(LRUCache):  # type: ignore[type-arg]  # cachetools: generic only in its stubs
    """The engines' directories by address; one pushed out is shut down."""

    def __init__(self, maxsize: int, retired: Callable[[ContainerDirectory], None]) -> None:
        super().__init__(maxsize=maxsize)
        self._retired = retired

    def popitem(self) -> tuple[Any, Any]:
        address, directory = super().popitem()
        self._retired(directory)
        return address, directory


class Engines:
    """The container engines, each asked only about the containers that are its own."""

    def __init__(self, config: Config, docker: ContainerDirectory) -> None:
        self.config = config
        self.docker = docker  # the Docker Engine: always there, degrading when it is down
        self._clients = _Clients(config.engine_clients, self._retire)
        self._sockets: TTLCache[str, bool] = TTLCache(maxsize=4096, ttl=config.engine_socket_ttl)
        self._looking: dict[str, asyncio.Future[tuple[bool, str]]] = {}
        self._reported: set[str] = set()  # sockets whose trouble was logged once
        self._retired_calls = 0
        self._containerd: ContainerdDirectory | None = None
        self._grpc: bool | None = None  # whether grpcio is installed, once known
        # Its own thread: a socket on a hung file system must not hold up the /proc reads.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-sockets")

    @property
    def calls(self) -> int:
        """Docker API calls made to every engine."""
        found: int = (
            self.docker.calls
            + self._retired_calls
            + sum(d.calls for d in list(self._clients.values()))
        )
        return found

    async def directory(self, ref: ContainerRef) -> ContainerDirectory | None:
        """The directory of the engine that may name this container; None when there is none
        to ask (not configured, or its socket is not there)."""
        found = route(ref, self.config)
        if found is None or found.address is None:
            return None if found is None else self.docker
        if not await self._socket_exists(found.address):
            return None
        directory = self._clients.get(found.address)
        if directory is None:
            directory = ContainerDirectory(self.config, found.address, found.engine)
            self._clients[found.address] = directory
        return directory

    @property
    def containerd_calls(self) -> int:
        """gRPC calls made to containerd."""
        return self._containerd.calls if self._containerd is not None else 0

    async def containerd(self) -> ContainerdDirectory | None:
        """containerd's directory; None when there is none to ask (not configured, its socket
        not there, or grpcio not installed)."""
        address = self.config.containerd_socket
        if address is None or not await self._socket_exists(address):
            return None
        if self._grpc is None:  # the first import of grpc takes a while: off the loop
            loop = asyncio.get_running_loop()
            self._grpc = await loop.run_in_executor(self._pool, grpcunix.installed)
        if not self._grpc:
            return None
        if self._containerd is None:
            self._containerd = ContainerdDirectory(self.config, address)
        return self._containerd

    def awaits(self, ref: ContainerRef) -> bool:
        """Whether an engine configured to name this container was not there to ask (its
        socket missing): once it is, it may name it. Not so for a container no engine is
        configured for, nor for containerd's while grpcio is not installed."""
        if ref.runtime == "containerd":
            return self.config.containerd_socket is not None and self._grpc is not False
        return route(ref, self.config) is not None

    def shutdown(self) -> None:
        """Close every engine's client; let the threads go."""
        self.docker.shutdown()
        if self._containerd is not None:
            self._containerd.shutdown()
        for directory in list(self._clients.values()):
            directory.shutdown()
        self._clients.clear()
        self._pool.shutdown(wait=False)

    def _retire(self, directory: ContainerDirectory) -> None:
        self._retired_calls += directory.calls
        directory.shutdown()

    async def _socket_exists(self, address: str) -> bool:
        if not address.startswith("unix://"):
            return True  # a TCP engine: asking it is the only way to know
        path = address[len("unix://") :]
        known = self._sockets.get(path)
        if known is not None:
            return known
        pending = self._looking.get(path)
        if pending is None:
            pending = asyncio.get_running_loop().run_in_executor(self._pool, _is_socket, path)
            self._looking[path] = pending
            pending.add_done_callback(lambda _: self._looking.pop(path, None))
        exists, trouble = await asyncio.shield(pending)
        self._sockets[path] = exists
        if trouble and path not in self._reported:
            self._reported.add(path)
            log.warning("cannot use %s: %s; its containers are named by their ids", path, trouble)
        return exists


def _is_socket(path: str) -> tuple[bool, str]:
    """Blocking: whether a unix socket is at `path`, and what is wrong if something else is."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return False, ""  # no such engine: nothing to say
        return False, (exc.strerror or str(exc)).lower()
    if not stat.S_ISSOCK(mode):
        return False, "it is not a socket"
    return True, ""
