"""What a scheduler's allocation of a device answers, whichever scheduler made it: Slurm's jobs
(core/jobs.py) or the kubelet's pods (core/pods.py). The lease rules (core/leases) hold an
allocated device through this protocol alone, never asking which scheduler it is.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from patroller.core.identity import Identity


class Member(Protocol):
    """One of an allocation's members: a job, or a pod."""

    @property
    def id(self) -> str:
        """What the audit record and /status call it: a job id, `namespace/name`."""


class SchedulerAllocation(Protocol):
    """The members (jobs, pods) one device is allocated to, and what the rules need of them."""

    how: ClassVar[str]  # the hold's `how`: slurm, kubernetes
    key: ClassVar[str]  # the audit record's field for the members: jobs, pods
    member_key: ClassVar[str]  # and for the member a process is in: job, pod
    why: ClassVar[str]  # a trespass's why: outside_job, outside_pod
    word: ClassVar[str]  # a member in words: job, pod
    scheduler: ClassVar[str]  # Slurm, Kubernetes
    release_hint: ClassVar[str]  # how such an allocation ends, for a refused /release

    def ids(self) -> tuple[str, ...]:
        """The members' ids, in the scheduler's order."""

    def member_of(self, owner: Identity | None) -> Member | None:
        """The member of ours that `owner`'s process is in, or None (in none, or another's)."""

    def own(self, owner: Identity | None) -> str | None:
        """The id of what `owner`'s process is in, of this kind, ours or not; None if nothing."""

    def holder(self, seen: Identity | None = None) -> Identity:
        """Who holds the device; `seen`: a process of one of the members, if one is known."""

    def named(self) -> bool:
        """Whether the scheduler names the holder's user (else the members' processes will)."""

    def describe(self) -> str:
        """The members in words: `job 4242`, `pods ml/a, ml/b`."""
