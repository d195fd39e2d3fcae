"""From a pid to the container it runs in: /proc/<pid>/cgroup, in every layout seen.

cgroup v1 lists one line per hierarchy, v2 one line `0::<path>`; the container id is the
last 64-hex-digit component that a container runtime put there:
  /docker/<id>                                   cgroupfs driver, v1 and v2
  /system.slice/docker-<id>.scope                systemd driver
  /system.slice/docker.service/docker/<id>       nested parents (--cgroup-parent)
  /machine.slice/libpod-<id>.scope, /libpod_parent/libpod-<id>          podman
  /system.slice/containerd.service/cri-containerd-<id>.scope, crio-<id>.scope
  /kubepods/burstable/pod<uid>/<id>, /kubepods.slice/.../cri-containerd-<id>.scope

and, for a process of a Slurm job, the job and its step:
  /slurm[_<node>]/uid_<uid>/job_<id>/step_<step>[/task_<n>]                 cgroup v1
  /system.slice/[<node>_]slurmstepd.scope/job_<id>/step_<step>[/user/task_<n>]  cgroup v2
where from Slurm 26.05 the job's directory may be its SLUID (`sEKNKTV3WPV500`, or
`job_sEKNKTV3WPV500`), and a step is a number, `batch`, `extern` or `interactive`.
Pure parsing; the file is read by procfs.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from patroller.identify import procfs

_ID = r"[0-9a-f]{64}"
# A path component that is a container: a runtime prefix and a 64-hex id (systemd scopes), or
# the bare id (cgroupfs: under /docker, a --cgroup-parent, /kubepods/.../pod<uid>, ...).
_SCOPE = re.compile(rf"^(docker|libpod|cri-containerd|crio|containerd)-({_ID})(?:\.scope)?$")
_BARE = re.compile(rf"^({_ID})$")


@dataclass(frozen=True)
class ContainerRef:
    """A container named by a process's cgroup: its runtime and full id."""

    runtime: str  # docker, libpod, cri-containerd, crio, containerd, or "" when unknown
    id: str

    @property
    def short(self) -> str:
        """The first 12 hex digits, as docker prints them."""
        return self.id[:12]


def container_of_path(path: str) -> Optional[ContainerRef]:
    """The container in one cgroup path, or None."""
    parts = [p for p in path.strip().split("/") if p]
    for index in range(len(parts) - 1, -1, -1):
        part = parts[index]
        scope = _SCOPE.match(part)
        if scope:
            return ContainerRef(scope.group(1), scope.group(2))
        if _BARE.match(part):
            return ContainerRef("docker" if "docker" in parts[:index] else "", part)
    return None


_SLURM_V1 = re.compile(r"^slurm(?:_[^/]+)?$")
_SLURM_V2 = re.compile(r"^(?:[^/]+_)?slurmstepd\.scope$")
_JOB = re.compile(r"^(?:job_)?([0-9]+|s[0-9A-Z]{13})$")
_STEP = re.compile(r"^step_([0-9]+|batch|extern|interactive)$")


@dataclass(frozen=True)
class SlurmStep:
    """A Slurm job's step, as a process's cgroup names it."""

    job: str  # the job id, or its SLUID
    step: str  # a number, "batch", "extern" or "interactive"


def slurm_of_path(path: str) -> Optional[SlurmStep]:
    """The Slurm job step in one cgroup path, or None."""
    parts = [p for p in path.strip().split("/") if p]
    for index, part in enumerate(parts):
        if _SLURM_V1.match(part):
            rest = parts[index + 1:]
            if rest and rest[0].startswith("uid_"):
                rest = rest[1:]
        elif _SLURM_V2.match(part):
            rest = parts[index + 1:]
        else:
            continue
        if len(rest) >= 2:
            job, step = _JOB.match(rest[0]), _STEP.match(rest[1])
            if job and (rest[0].startswith("job_") or not job.group(1).isdigit()) and step:
                return SlurmStep(job.group(1), step.group(1))
    return None


def parse_slurm(text: str) -> Optional[SlurmStep]:
    """The Slurm job step named in a /proc/<pid>/cgroup file (any hierarchy), or None."""
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3 and fields[0].strip().isdigit():
            found = slurm_of_path(fields[2])
            if found is not None:
                return found
    return None


def parse_cgroup(text: str) -> Optional[ContainerRef]:
    """The container named in a /proc/<pid>/cgroup file; malformed lines are skipped."""
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[0].strip().isdigit():
            continue
        found = container_of_path(fields[2])
        if found is not None:
            return found
    return None


def read_container(pid: int, proc: str = "/proc") -> Optional[ContainerRef]:
    """The container of a live pid; None for a host process. Raises OSError if it is gone."""
    return parse_cgroup(procfs.cgroup(pid, proc))
