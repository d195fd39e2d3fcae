"""Containers and their labels, from the Docker Engine or any engine that serves its API
(Podman, a user's rootless Docker): cached, shared, and off the event loop.

The Docker SDK is blocking, so every call runs in the executor. A container's labels are
fetched once (concurrent lookups of one container share that call) and cached for `ttl`
seconds. When the engine cannot be reached, lookups fail fast with DockerUnavailable for a few
seconds and then try again: nothing waits on a dead engine, and it recovers by itself (lookups.py
does this for every directory).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

from patroller.config import Config
from patroller.core.identity import Identity
from patroller.durations import describe
from patroller.identify.lookups import SharedLookups

log = logging.getLogger(__name__)

_EMAIL = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")


class DockerUnavailable(Exception):
    """The Docker Engine cannot be reached (or answered with an error) just now."""


@dataclass(frozen=True)
class ContainerInfo:
    """What Patroller needs to know of a container."""

    id: str
    name: str
    labels: Mapping[str, str]
    addresses: tuple[str, ...] = ()  # its IP addresses on container networks
    pid: int | None = None  # its first process, on the host (while it runs)

    @property
    def short(self) -> str:
        return self.id[:12]


def email_in(value: str) -> str | None:
    """The e-mail address in a label value: `alice@example.org` or `Alice <alice@example.org>`."""
    angled = re.search(r"<([^<>]+)>", value)
    text = angled.group(1).strip() if angled else value.strip()
    match = _EMAIL.fullmatch(text)
    return match.group(0) if match else None


def container_identity(
    info: ContainerInfo, user_labels: Sequence[str], info_labels: Sequence[str]
) -> Identity:
    """The identity of a container's user from its labels (pure)."""
    email = None
    for label in user_labels:
        email = email_in(info.labels.get(label, ""))
        if email:
            break
    copied = tuple((label, info.labels[label]) for label in info_labels if label in info.labels)
    return Identity(
        user=email.lower() if email else f"container:{info.short}",
        source="container",
        email=email,
        container=(info.short, info.name),
        info=copied,
    )


def unlabelled_identity(container_id: str, degraded: bool = False) -> Identity:
    """A container Docker does not know (another runtime), or cannot tell about (degraded)."""
    short = container_id[:12]
    return Identity(
        user="unknown" if degraded else f"container:{short}",
        source="container",
        container=(short, None),
        degraded=degraded,
    )


def lxd_identity(name: str) -> Identity:
    """An LXD container: its name is all the host knows of it (`lxd:<name>`)."""
    return Identity(user=f"lxd:{name}", source="container", container=(name, name))


def _info(container: Any) -> ContainerInfo:
    attrs = container.attrs or {}
    networks = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
    addresses = tuple(
        sorted(
            {
                addr
                for net in networks.values()
                for addr in ((net or {}).get("IPAddress"), (net or {}).get("GlobalIPv6Address"))
                if addr
            }
        )
    )
    pid = (attrs.get("State") or {}).get("Pid")
    return ContainerInfo(
        container.id,
        container.name,
        dict(container.labels or {}),
        addresses,
        pid if isinstance(pid, int) and pid > 0 else None,
    )


class ContainerDirectory:
    """Container labels by id (and by network address), from the Docker Engine, cached."""

    def __init__(
        self, config: Config, base_url: str | None = None, engine: str = "the Docker Engine"
    ) -> None:
        # None: the configured Docker Engine (--docker-host), else the Docker SDK's default
        self.base_url = base_url or config.docker_host
        self.engine = engine  # what the log and the errors call it
        self.timeout = config.docker_timeout
        self.retry_after = config.docker_retry_after
        self.calls = 0  # Docker API calls made: the benchmark watches it
        self._by_address: TTLCache[str, Any] = TTLCache(maxsize=1, ttl=config.address_ttl)
        self._addresses: asyncio.Future[dict[str, ContainerInfo]] | None = None
        self._client: Any = None
        self.closed = False  # shut down for good
        self._lock = threading.Lock()
        # Its own threads: a hung engine must not hold up the /proc reads of the default pool.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="docker")
        self.deadline = config.docker_deadline
        self._lookups: SharedLookups[ContainerInfo] = SharedLookups(
            self._pool,
            self._fetch,
            config.container_cache,
            config.container_ttl,
            DockerUnavailable,
            config.docker_deadline,
            self._overdue,
        )

    async def get(self, container_id: str) -> ContainerInfo | None:
        """The container, or None if the engine does not know it. Raises DockerUnavailable."""
        return await self._lookups.get(container_id)

    async def by_address(self, address: str) -> ContainerInfo | None:
        """The container with this IP address on a container network, or None."""
        table: dict[str, ContainerInfo] | None = self._by_address.get("all")
        if table is None:
            if self._addresses is None:
                self._lookups.check_up()
                self._addresses = asyncio.ensure_future(self._load_addresses())
                self._addresses.add_done_callback(lambda _: setattr(self, "_addresses", None))
            table = await asyncio.shield(self._addresses)
        return table.get(address)

    def shutdown(self) -> None:
        """Stop for good: close the connection, let the threads go."""
        self.closed = True
        self.close_quietly()
        self._pool.shutdown(wait=False)

    def close(self) -> None:
        """Close the connection to the engine. Never waits for the client being made (its
        first call holds the lock): an engine answering a byte at a time would hold the
        caller, the event loop itself at a stop (the client is let go with the directory)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._client is not None:
                self._client.close()
                self._client = None
        finally:
            self._lock.release()

    async def _load_addresses(self) -> dict[str, ContainerInfo]:
        loop = asyncio.get_running_loop()
        infos = await self._lookups.within_deadline(
            loop.run_in_executor(self._pool, self._fetch_all)
        )
        table = {address: info for info in infos for address in info.addresses}
        self._by_address["all"] = table
        for info in infos:
            self._lookups.cache[info.id] = info
        return table

    # -- in the executor --------------------------------------------------------------------

    def _fetch(self, container_id: str) -> ContainerInfo | None:
        import docker.errors

        try:
            container = self._call(lambda client: client.containers.get(container_id))
        except docker.errors.NotFound:
            return None
        return _info(container)

    def _fetch_all(self) -> Sequence[ContainerInfo]:
        # A container removed between the listing and the look at it is passed over, not an
        # error (NotFound would reach the caller being identified).
        return [
            _info(c)
            for c in self._call(lambda client: client.containers.list(ignore_removed=True))
        ]

    def _call(self, action: Any) -> Any:
        import docker
        import docker.errors

        try:
            with self._lock:
                if self._client is None:
                    self.calls += 1  # the version negotiation
                    self._client = docker.DockerClient(
                        base_url=self.base_url, version="auto", timeout=self.timeout
                    )
                client = self._client
            self.calls += 1
            result = action(client)
        except docker.errors.NotFound:
            raise
        except Exception as exc:  # unreachable, timed out, or an engine error
            self._went_down(exc)
            raise DockerUnavailable(self._lookups.reason) from None
        if self._lookups.came_up():
            log.info(
                "%s at %s is reachable again",
                self.engine,
                self.base_url or "unix:///var/run/docker.sock",
            )
        return result

    def _overdue(self) -> str:
        """A lookup took the whole deadline: the engine is down for a while (said once)."""
        reason = (
            f"{self.engine} at {self.base_url or 'unix:///var/run/docker.sock'} gave no "
            f"whole answer within {describe(self.deadline)}"
        )
        if self._lookups.went_down(reason, self.retry_after):
            log.warning(
                "cannot read container labels: %s; identities degrade to the "
                "container id until it is back",
                reason,
            )
        return reason

    def _went_down(self, exc: Exception) -> None:
        reason = in_words(
            exc, self.base_url or "unix:///var/run/docker.sock", self.timeout, self.engine
        )
        if self._lookups.went_down(reason, self.retry_after):
            log.warning(
                "cannot read container labels: %s; identities degrade to the "
                "container id until it is back",
                reason,
            )
        self.close_quietly()

    def close_quietly(self) -> None:
        try:
            self.close()
        except Exception:
            self._client = None


def in_words(
    exc: BaseException, where: str, timeout: float, engine: str = "the Docker Engine"
) -> str:
    """What went wrong talking to the engine, said in words, never an exception's repr.

    The SDK wraps the cause in requests' and urllib3's errors, whose text is a tuple's repr
    ("('Connection aborted.', FileNotFoundError(2, ...))"): the cause is dug out of the chain.
    Where none says a timeout, a system error or an engine's answer, the innermost that says
    itself in words alone is said (a connection closed without an answer).
    """
    seen = set()
    chain = [exc]
    words = exc  # the innermost cause whose text is words, not a repr of other causes
    while chain:
        cause = chain.pop(0)
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        if isinstance(cause, TimeoutError) or "Timeout" in type(cause).__name__:
            return f"{engine} at {where} did not answer within {describe(timeout)}"
        if isinstance(cause, OSError) and cause.strerror:
            return f"{engine} at {where} cannot be reached: {cause.strerror.lower()}"
        status = getattr(cause, "status_code", None)
        if isinstance(status, int):
            said = getattr(cause, "explanation", None) or ""
            return f"{engine} at {where} answered {status}" + (f": {said}" if said else "")
        if cause.args and all(isinstance(arg, str) for arg in cause.args):
            words = cause
        chain.extend(
            c
            for c in (
                cause.__cause__,
                cause.__context__,
                getattr(cause, "reason", None),
                *cause.args,
            )
            if isinstance(c, BaseException)
        )
    text = str(words).splitlines()[0][:200] if str(words) else type(words).__name__
    return f"{engine} at {where} cannot be used: {text}"
