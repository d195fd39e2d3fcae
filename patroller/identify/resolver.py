"""From a host pid to the identity of whoever runs it: container labels, or the host account.

pid -> /proc/<pid>/cgroup -> container -> the engine that runs it (engines.py) -> labels ->
e-mail; a Kubernetes pod's container (through containerd) is its pod (pods.py); an LXD
container is its name; a process in no container is its host account (uid from
/proc/<pid>/status); only a pid whose /proc entry cannot be read is "unknown". /proc is read in
the executor, never on the event loop. Identities are cached by (pid, start time), so a reused
pid is never taken for the process that had it before.
"""

from __future__ import annotations

import asyncio
import logging
import pwd
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from cachetools import TTLCache

from patroller.config import Config
from patroller.core.identity import UNKNOWN, Identity
from patroller.identify import procfs
from patroller.identify.cgroups import ContainerRef, SlurmStep, parse_cgroup, parse_slurm
from patroller.identify.containerd import ContainerdUnavailable
from patroller.identify.containers import (
    ContainerDirectory,
    DockerUnavailable,
    container_identity,
    lxd_identity,
    unlabelled_identity,
)
from patroller.identify.engines import Engines, asks_containerd
from patroller.identify.peers import Credentials, not_the_caller
from patroller.identify.pods import containerd_identity, mismatch

log = logging.getLogger(__name__)


class ProcessResolver(Protocol):
    """Turns a host pid into an identity; never raises for a pid that has gone."""

    async def resolve(self, pid: int) -> Identity:
        """The identity of the process, or UNKNOWN."""


def host_identity(uid: int) -> Identity:
    """The identity of a host account, named from the password database when it can be."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid:{uid}"
    return Identity(user=name, source="host", account=name, uid=uid)


def job_identity(host: Identity, step: SlurmStep) -> Identity:
    """A Slurm job's process: its host account (the job's user), with the job and its step as
    its cgroup names them. Never the job's account or partition: the process's environment
    (SLURM_JOB_ACCOUNT) is its user's to write, so they come from the job map alone, which root's
    prolog writes (core/jobs.py `billed_to`)."""
    return replace(host, source="slurm", job=(("id", step.job), ("step", step.step)))


def runs_as(identity: Identity, host: Identity | None) -> Identity:
    """A container's identity, with the host account its process runs as (`account`, `uid`):
    the kernel's word, which fair use counts as well as the labels' (core/leases/limits.py)."""
    if host is None:
        return identity
    return replace(identity, account=host.account, uid=host.uid)


def own_word(identity: Identity, container: ContainerRef) -> Identity:
    """A container's identity, once its host account is added: a rootless container's labels
    are its user's own word (anyone may label their container with anyone's e-mail), so what
    they say is kept, marked `claimed`, and never names the user, who is the host account its
    process runs as (the kernel's word). A rootful engine's labels stand: only root, or whom
    root lets use that engine, writes them."""
    if container.owner is None or not (identity.email or identity.info):
        return identity
    return replace(identity, user=identity.account or identity.user, claimed=True)


def account_of(
    container: ContainerRef | None, uid: int, shifted_from: int, ns_owner: int | None = None
) -> Identity | None:
    """The host account a process counts as: a rootless container's is the user whose slice
    holds it (whose uid its root runs as); else a process in a user namespace that a user made
    (`ns_owner`, the kernel's word: a rootless container where no cgroup names it, as on cgroup
    v1, or any `unshare --user`) is that user's; a process running as a shifted uid (a user
    namespace's, from `shifted_from` up) in a container or in a namespace that root made has
    none, as that uid names nobody, or someone else; any other process is its own uid's."""
    if container is not None and container.owner is not None:
        return host_identity(container.owner)
    if ns_owner:  # not None, not root
        return host_identity(ns_owner)
    if (container is not None or ns_owner is not None) and uid >= shifted_from:
        return None
    return host_identity(uid)


def misplaced(
    container: ContainerRef | None, job: SlurmStep | None, uid: int, ns_owner: int | None
) -> str | None:
    """Why a process's cgroup cannot be what it says, or None when it can be. A user may make
    any cgroup in their own delegated subtree: a rootless container there is the user's only
    when the process runs as that user or in a user namespace that user made (the kernel's
    word), and never when another uid's slice is nested in the user's; a Slurm step of v1's
    `uid_<uid>` directory is its user's only (slurmd runs the job's processes as the job's
    uid)."""
    if container is not None and container.owner is not None:
        if container.nested is not None:
            return (
                f"its cgroup nests the slice of uid {container.nested} in that of uid "
                f"{container.owner}, around container {container.short}"
            )
        if container.owner not in (uid, ns_owner):
            return (
                f"it runs as uid {uid}, not as uid {container.owner} whose slice holds "
                f"container {container.short}, nor in a user namespace of theirs"
            )
    if job is not None and job.uid is not None and job.uid != uid:
        return f"it runs as uid {uid}, not as uid {job.uid} of Slurm job {job.job}"
    return None


@dataclass(frozen=True)
class ProcFacts:
    """What /proc says of one process, read in one go."""

    pid: int
    start: int  # clock ticks after boot: with the pid, names exactly one process
    container: ContainerRef | None
    host: Identity | None  # the host account it counts as (account_of); None: shifted
    uids: tuple[int, ...] = ()  # its real, effective, saved and file-system uids
    job: SlurmStep | None = None  # the Slurm job step its cgroup names
    misplaced: str | None = None  # why its cgroup's container or job was not believed


def read_facts(
    pid: int, proc: str = "/proc", shifted_from: int = Config.shifted_uids_from
) -> ProcFacts | None:
    """Blocking: the facts of a live pid, or None if it is gone or unreadable."""
    try:
        start = procfs.stat(pid, proc).start
        text = procfs.cgroup(pid, proc)
    except (OSError, ValueError):
        return None
    container = parse_cgroup(text)
    job = parse_slurm(text) if container is None else None
    uids = procfs.uids(pid, proc)
    if not uids:
        return None
    owner = procfs.userns_owner(pid, proc)
    trouble = misplaced(container, job, uids[0], owner)
    if trouble is not None:  # nobody's container, no job: the process's own account
        container = job = None
    return ProcFacts(
        pid,
        start,
        container,
        account_of(container, uids[0], shifted_from, owner),
        uids,
        job,
        trouble,
    )


def read_peer_facts(
    credentials: Credentials, proc: str, shifted_from: int = Config.shifted_uids_from
) -> ProcFacts | str:
    """Blocking: the facts of the process that connected, or why they cannot be had."""
    facts = read_facts(credentials.pid, proc, shifted_from)
    refused = not_the_caller(
        credentials,
        facts.uids if facts is not None else (),
        facts.start if facts is not None else 0,
    )
    if facts is None:
        return f"the calling process (pid {credentials.pid}) is gone or cannot be read"
    return refused if refused is not None else facts


class ProcessIdentifier:
    """Resolves pids to identities through /proc and (when given the Docker Engine's directory)
    the container engines."""

    def __init__(self, config: Config, directory: ContainerDirectory | None = None) -> None:
        # No Docker Engine (test mode): no engine at all, containers are named by their ids.
        self.engines = Engines(config, directory) if directory is not None else None
        self.user_labels = config.user_labels
        self.info_labels = config.user_info_labels
        self.pod_keys = config.pod_user_keys
        self.proc = config.proc_root
        self.shifted_from = config.shifted_uids_from
        self.proc_reads = 0  # processes whose /proc entry was read: the benchmark watches it
        self._cache: TTLCache[tuple[int, int], Identity] = TTLCache(
            maxsize=config.identity_cache, ttl=config.identity_ttl
        )
        self._warned: TTLCache[Any, bool] = TTLCache(
            maxsize=config.identity_cache, ttl=config.identity_ttl
        )

    async def facts(self, pid: int) -> ProcFacts | None:
        """/proc facts of a pid, read off the loop."""
        self.proc_reads += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, read_facts, pid, self.proc, self.shifted_from)

    async def peer_facts(self, credentials: Credentials) -> ProcFacts | str:
        """/proc facts of a unix-socket caller, read off the loop, if its pid still names the
        process that connected; else why not (`peers.not_the_caller`)."""
        self.proc_reads += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, read_peer_facts, credentials, self.proc, self.shifted_from
        )

    async def resolve(self, pid: int) -> Identity:
        """The identity of a live pid; UNKNOWN if /proc cannot tell."""
        facts = await self.facts(pid)
        return UNKNOWN if facts is None else await self.identify(facts)

    async def identify(self, facts: ProcFacts) -> Identity:
        """The identity behind facts already read (a peer's, read when it connected)."""
        key: tuple[int, int] = (facts.pid, facts.start)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if facts.misplaced is not None and facts.misplaced not in self._warned:
            self._warned[facts.misplaced] = True  # once per forgery, not per process or call
            log.warning("pid %d counts as its own account: %s", facts.pid, facts.misplaced)
        container = facts.container
        if container is None and facts.job is not None and facts.host is not None:
            identity = job_identity(facts.host, facts.job)
        elif container is None:
            identity = facts.host or UNKNOWN
        elif container.runtime == "lxd":
            identity = runs_as(lxd_identity(container.id), facts.host)
        else:
            named = await self._container(container)
            if named is None:  # an engine that may know it cannot be asked just now
                return runs_as(unlabelled_identity(container.id, degraded=True), facts.host)
            identity = own_word(runs_as(named, facts.host), container)
            if identity.pending:  # its engine's socket is not there (yet, or again): not cached
                return identity
        self._cache[key] = identity
        return identity

    async def _container(self, ref: ContainerRef) -> Identity | None:
        """A container's identity from the engine that knows it, before its host account is
        added; None when it is degraded (not cached: asked again at the next lookup)."""
        if self.engines is None:  # no engine to ask: the container is all that is known
            return unlabelled_identity(ref.id)
        containerd_down = False
        if asks_containerd(ref):
            directory = await self.engines.containerd()
            if directory is not None:
                try:
                    found = await directory.get(ref.id)
                except ContainerdUnavailable:
                    found, containerd_down = None, True
                if found is not None:
                    trouble = mismatch(found, ref)
                    if trouble is not None:
                        log.warning("%s", trouble)
                    return containerd_identity(
                        found, ref, self.pod_keys, self.user_labels, self.info_labels
                    )
            if ref.runtime == "containerd":  # no other engine knows it
                if containerd_down:
                    return None
                return replace(
                    unlabelled_identity(ref.id),  # pending only if not asked
                    pending=directory is None and self.engines.awaits(ref),
                )
        engine = await self.engines.directory(ref)
        if engine is None:  # pending where its engine is configured but not there
            return replace(unlabelled_identity(ref.id), pending=self.engines.awaits(ref))
        try:
            info = await engine.get(ref.id)
        except DockerUnavailable:
            return None
        if info is None:  # nobody knows it; but containerd, which might, cannot be asked
            return None if containerd_down else unlabelled_identity(ref.id)
        return container_identity(info, self.user_labels, self.info_labels)

    @property
    def containerd_calls(self) -> int:
        """gRPC calls made to containerd."""
        return self.engines.containerd_calls if self.engines is not None else 0

    @property
    def docker_calls(self) -> int:
        """Docker API calls made to every container engine (the metrics count them)."""
        return self.engines.calls if self.engines is not None else 0

    def close(self) -> None:
        """Close the engines' clients."""
        if self.engines is not None:
            self.engines.shutdown()


class TestModeIdentifier(ProcessIdentifier):
    """Test mode's: the synthetic processes (`--test-processes`) named by whose they are; any
    other pid through /proc, as ever."""

    def __init__(self, config: Config, synthetic: Callable[[int], Identity | None]) -> None:
        super().__init__(config)
        self.synthetic = synthetic  # whose a synthetic pid is (None: not one)

    async def facts(self, pid: int) -> ProcFacts | None:
        owner = self.synthetic(pid)
        if owner is None:
            return await super().facts(pid)
        return ProcFacts(pid, 0, None, owner)
