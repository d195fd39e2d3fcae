"""Devices a batch scheduler (Slurm) has allocated to jobs: whose they are, and which processes
belong there.

An allocation is what the job map (observe/jobmap.py) says of one device: the jobs it is
allocated to, each with what the map knows of it (its user, uid, account and partition, where
the prolog wrote them). While a device is allocated the job holds it: the lease rules never
grant it, no lease runs on it, and a process on it that is not in one of its jobs trespasses,
whoever runs it (another job, the job's own user from an SSH session the job did not adopt, a
container, a host process).

A process is in a job when its cgroup names the job (identify/cgroups.py): by its numeric id, or
by its SLUID (Slurm 26.05 and later name the cgroup after it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from patroller.core.identity import Identity


@dataclass(frozen=True)
class Job:
    """One job, as the job map knows it."""

    id: str  # SLURM_JOB_ID
    uid: int | None = None
    user: str | None = None  # the uid's account name
    account: str | None = None  # Slurm's account (not a host account)
    partition: str | None = None
    sluid: str | None = None  # SLURM_JOB_SLUID, where Slurm has one

    def names(self) -> tuple[str, ...]:
        """What a cgroup may call the job: its id, and its SLUID."""
        return (self.id,) + ((self.sluid,) if self.sluid else ())

    def fields(self) -> tuple[tuple[str, str], ...]:
        """The job as an identity's `job` shows it."""
        pairs = [
            ("id", self.id),
            ("account", self.account),
            ("partition", self.partition),
            ("sluid", self.sluid),
        ]
        return tuple((k, v) for k, v in pairs if v)


@dataclass(frozen=True)
class Allocation:
    """The jobs one device is allocated to, in the job map's order (usually one)."""

    jobs: tuple[Job, ...]

    # The protocol both kinds of allocation answer (core/scheduled.py says what each is).
    how: ClassVar[str] = "slurm"
    key: ClassVar[str] = "jobs"
    member_key: ClassVar[str] = "job"
    why: ClassVar[str] = "outside_job"
    word: ClassVar[str] = "job"
    scheduler: ClassVar[str] = "Slurm"
    release_hint: ClassVar[str] = "it is released when the job ends (scancel)"

    def own(self, owner: Identity | None) -> str | None:
        """The id of the job `owner`'s process is in (ours or not), or None."""
        return dict(owner.job).get("id") if owner is not None and owner.job else None

    def ids(self) -> tuple[str, ...]:
        return tuple(job.id for job in self.jobs)

    def member_of(self, owner: Identity | None) -> Job | None:
        """The job of ours that `owner`'s process is in, or None (not in a job, or another)."""
        return member(owner, self.jobs)

    def holder(self, seen: Identity | None = None) -> Identity:
        """Who holds the device: the first job, as its user. `seen`: a process of one of the
        jobs, whose host account names the user when the map does not (a map of bare ids)."""
        job = self.member_of(seen) if seen is not None else None
        job = job or self.jobs[0]
        user = job.user or (
            seen.account if seen is not None and self.member_of(seen) is job else None
        )
        uid = (
            job.uid
            if job.uid is not None
            else (seen.uid if seen is not None and self.member_of(seen) is job else None)
        )
        who = Identity(
            user=user or (f"uid:{uid}" if uid is not None else f"job {job.id}"),
            source="slurm",
            account=user,
            uid=uid,
            job=job.fields(),
        )
        return who

    def named(self) -> bool:
        """Whether the map names the first job's user (else its processes will)."""
        return self.jobs[0].user is not None or self.jobs[0].uid is not None

    def describe(self) -> str:
        """The jobs in words: `job 4242`, `jobs 4242, 4243`."""
        ids = self.ids()
        return ("job " if len(ids) == 1 else "jobs ") + ", ".join(ids)


def member(owner: Identity | None, jobs: Iterable[Job]) -> Job | None:
    """The one of `jobs` that `owner`'s process is in, or None (not in a job, or another).
    Where the map gives the job's uid, the process must run as it: slurmd runs a job's
    processes as its user, so a process of another uid is no part of the job."""
    if owner is None or not owner.job:
        return None
    name = dict(owner.job).get("id")
    job = next((job for job in jobs if name in job.names()), None)
    if job is not None and job.uid is not None and owner.uid != job.uid:
        return None
    return job


def listed(allocations: Iterable[object]) -> tuple[Job, ...]:
    """Every job that the job map lists now, once each, from the allocations of every device
    (a Kubernetes pod's allocation lists none)."""
    found = {
        job.id: job
        for allocation in allocations
        if isinstance(allocation, Allocation)
        for job in allocation.jobs
    }
    return tuple(found.values())


def billed_to(owner: Identity | None, jobs: Iterable[Job]) -> str:
    """The Slurm account that `owner`'s GPU-time is billed to: the one the job map gives its
    job, which root's prolog wrote; "" when the map lists no such job or gives it no account.
    Never one the process says of itself (SLURM_JOB_ACCOUNT in its environment is its user's
    to write): a user would bill her GPU-time to any account she likes."""
    job = member(owner, jobs)
    return job.account or "" if job is not None else ""
