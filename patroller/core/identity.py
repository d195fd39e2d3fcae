"""Who someone is: the identity of an API caller or of a GPU process.

Leases compare identities by `user` alone: the same person reserving from one container and
computing in another is one user.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Identity:
    """A user, and where we learned who they are."""

    user: str  # the key that leases compare: an e-mail, a host account, a container, "unknown"
    # "test", "container", "host", "slurm" (a job's process), "pod" (a Kubernetes pod's
    # process) or "unknown"
    source: str
    email: str | None = None
    account: str | None = None  # host account name
    uid: int | None = None
    container: tuple[str, str | None] | None = None  # (short id, name)
    info: tuple[tuple[str, str], ...] = field(default=())  # extra labels, in configured order
    degraded: bool = False  # the user could not be learned just now (Docker unreachable)
    # A Slurm job's process: ("id", ...), ("step", ...) as its cgroup names them; a job's
    # holder, as the job map lists it: ("id", ...), and ("account", ...), ("partition", ...)
    # where the map gives them (never the process's environment: its user's to write). None
    # for any other process.
    job: tuple[tuple[str, str], ...] | None = None
    # A Kubernetes pod's process: ("namespace", ...), ("name", ...), and ("uid", ...),
    # ("container", ...) where known; None for any other process.
    pod: tuple[tuple[str, str], ...] | None = None
    # A container whose engine could not be asked (its socket was not there): named by its id
    # for now, and asked about again later (identify/tracker.py). Not shown, not compared.
    pending: bool = field(default=False, compare=False)
    # What its labels say (`email`, `info`) is its own user's word, not that of an engine the
    # host trusts: a rootless container's, labelled by whoever runs it. Such a claim is shown,
    # marked, and never names the user (`user` is then its host account).
    claimed: bool = False
    # A process seen on a GPU whose owner is still being looked up (identify/tracker.py): it
    # keeps a free GPU from being granted, and is no one's claim or trespass until its owner
    # is known. Never written to the lease book; shown as `unknown` (degraded).
    identifying: bool = False

    def same_user(self, other: Identity | None) -> bool:
        """Whether the two are the same user for the lease rules."""
        return other is not None and other.user == self.user

    def to_json(self) -> dict[str, Any]:
        """The identity as /status shows it."""
        return {
            "user": self.user,
            "source": self.source,
            "email": self.email,
            "account": self.account,
            "uid": self.uid,
            "container": (
                {"id": self.container[0], "name": self.container[1]} if self.container else None
            ),
            "info": dict(self.info),
            "degraded": self.degraded,
            "job": dict(self.job) if self.job else None,
            "pod": dict(self.pod) if self.pod else None,
            **({"claimed": True} if self.claimed else {}),
            **({"identifying": True} if self.identifying else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Identity:
        """The identity `to_json` gave (read back from the lease book); ValueError if not one."""
        if not isinstance(data, Mapping):
            raise ValueError("an identity must be an object")
        user, source = data.get("user"), data.get("source")
        if not isinstance(user, str) or not user or not isinstance(source, str):
            raise ValueError("an identity needs a user and a source")
        for key in ("email", "account"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise ValueError(f"an identity's {key} must be a string")
        uid = data.get("uid")
        if uid is not None and (not isinstance(uid, int) or isinstance(uid, bool)):
            raise ValueError("an identity's uid must be an integer")
        container = data.get("container")
        if container is not None:
            if (
                not isinstance(container, Mapping)
                or not isinstance(container.get("id"), str)
                or not isinstance(container.get("name"), (str, type(None)))
            ):
                raise ValueError("an identity's container must have an id and a name")
            container = (container["id"], container.get("name"))
        info = data.get("info") or {}
        if not isinstance(info, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in info.items()
        ):
            raise ValueError("an identity's info must map strings to strings")
        degraded, claimed = data.get("degraded", False), data.get("claimed", False)
        if not isinstance(degraded, bool):
            raise ValueError("an identity's degraded must be true or false")
        if not isinstance(claimed, bool):
            raise ValueError("an identity's claimed must be true or false")
        job = data.get("job")  # a book written before jobs were known has none
        if job is not None and (
            not isinstance(job, Mapping)
            or not isinstance(job.get("id"), str)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in job.items())
        ):
            raise ValueError("an identity's job must map strings to strings, with an id")
        pod = data.get("pod")  # nor one written before pods were
        if pod is not None and (
            not isinstance(pod, Mapping)
            or not all(isinstance(pod.get(k), str) for k in ("namespace", "name"))
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in pod.items())
        ):
            raise ValueError(
                "an identity's pod must map strings to strings, with a namespace and a name"
            )
        return cls(
            user=user,
            source=source,
            email=data.get("email"),
            account=data.get("account"),
            uid=uid,
            container=container,
            info=tuple(info.items()),
            degraded=degraded,
            claimed=claimed,
            job=tuple(job.items()) if job else None,
            pod=tuple(pod.items()) if pod else None,
        )


UNKNOWN = Identity(user="unknown", source="unknown")
IDENTIFYING = Identity(user="unknown", source="unknown", degraded=True, identifying=True)
NAMELESS = frozenset({UNKNOWN.user})  # user strings that name nobody: shown as they are


@dataclass(frozen=True)
class Viewer:
    """Who asks, as far as names go (--hide-users: http/hiding.py): a user's name is shown to
    that user (the lease rules' same user: by `user`) and to the host's root (`everything`),
    never to anyone else; a user string that names nobody, to everyone."""

    user: str | None = None  # the caller's `user`; None: not identified, or a scraper
    everything: bool = False  # the host's root: every name

    def sees(self, user: str | None) -> bool:
        """Whether this caller may see `user` named."""
        return self.everything or user is None or user in NAMELESS or user == self.user


class ProcessRef(NamedTuple):
    """One process for ever: its pid and its start time (clock ticks after boot). A pid that
    ends and is handed out again has a later start time, so it never names the same process."""

    pid: int
    start: int


def named_user(name: str) -> Identity:
    """The identity a test-mode caller gives itself with `user=`."""
    return Identity(user=name, source="test", email=name if "@" in name else None)
