"""From a pid to the container it runs in: /proc/<pid>/cgroup, in every layout seen.

cgroup v1 lists one line per hierarchy, v2 one line `0::<path>`; every line is read, and the
first that names a container gives it. A container is the innermost path component that a
runtime named with a 64-hex-digit id, or an LXD container at the top:
  /docker/<id>                                   Docker, cgroupfs driver, v1 and v2
  /system.slice/docker-<id>.scope                Docker, systemd driver
  /system.slice/docker.service/docker/<id>       nested parents (--cgroup-parent)
  /machine.slice/libpod-<id>.scope[/container]   Podman, systemd (machine-libpod_pod_... pods)
  /libpod_parent/libpod-<id>                     Podman, cgroupfs
  /system.slice/containerd.service/cri-containerd-<id>.scope, crio-<id>.scope
  /user.slice/user-<uid>.slice/user@<uid>.service/user.slice/docker-<id>.scope   rootless
      Docker (libpod-<id>.scope: rootless Podman); the owner is the uid of the user slice
  /kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid, '_' for '-'>.slice/
      cri-containerd-<id>.scope (or crio-, docker-); Guaranteed pods directly under
      kubepods.slice (kubepods-pod<uid>.slice); a prefix such as kubelet- is allowed
  /kubepods/<qos>/pod<uid>/<id>, /kubepods/pod<uid>/<id>   Kubernetes, cgroupfs driver
  /lxc.payload.<name>[/...]                      LXD (and LXC), v1 and v2: named, not an id

A container found under a user's slice is that user's, whatever its name says: everything under
a user's manager (`user@<uid>.service`, with `Delegate=yes`) is the user's to create, so such a
container is looked up only in that user's own engines, never in the system's. Its owner is the
uid of the outermost `user-<uid>.slice` or `user@<uid>.service` on the path, which systemd made,
never one further in, which the user may have made: a path that nests another uid's slice there
(`.../user@1000.service/user-1001.slice/docker-<id>.scope`) is marked (`nested`), and the
resolver takes it for no container at all. For the same reason an LXD
container counts only at the top of the hierarchy, which only root can write; whatever runs
inside an LXD container (nested containers too) is that container's. `lxc.monitor.<name>` is
LXD's monitor, not the container; `libpod-conmon-<id>` and `crio-conmon-<id>` are the runtimes'
monitors. Apptainer (Singularity) makes no container cgroup: its processes are host accounts.

and, for a process of a Slurm job, the job and its step:
  /slurm[_<node>]/uid_<uid>/job_<id>/step_<step>[/task_<n>]                 cgroup v1
  /system.slice/[<node>_]slurmstepd.scope/job_<id>/step_<step>[/user/task_<n>]  cgroup v2
where from Slurm 26.05 the job's directory may be its SLUID (`sEKNKTV3WPV500`, or
`job_sEKNKTV3WPV500`), and a step is a number, `batch`, `extern` or `interactive`. Only the
places slurmd makes count: the `slurm[_<node>]` directory at the top of a v1 hierarchy, or
`system.slice/[<node>_]slurmstepd.scope` at the top of v2, which only root can write; the same
names further down (in a user's delegated subtree, say) are anyone's to make, and name no job.
Leading `..` components (a host process seen from inside a cgroup namespace) are passed over.
Pure parsing; the file is read by procfs.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ID = r"[0-9a-f]{64}"
# A path component that is a container: a runtime prefix and a 64-hex id (systemd scopes), or
# the bare id (cgroupfs: under /docker, a --cgroup-parent, /kubepods/.../pod<uid>, ...).
_SCOPE = re.compile(rf"^(docker|libpod|cri-containerd|crio|containerd)-({_ID})(?:\.scope)?$")
_BARE = re.compile(rf"^({_ID})$")
_RUNTIMES = {
    "docker": "docker",
    "libpod": "podman",
    "cri-containerd": "containerd",
    "containerd": "containerd",
    "crio": "crio",
}
# LXD names are letters, digits and '-'; a project's instances are <project>_<name>.
_LXD = re.compile(r"^lxc\.payload\.([A-Za-z0-9][A-Za-z0-9_.-]*)$")
# What names a user's uid on the path: the slice logind makes, and the manager's service in it.
_USER_UNIT = re.compile(r"^user(?:-([0-9]+)\.slice|@([0-9]+)\.service)$")
# A pod's uid: a UUID, or a static pod's 32-hex hash; '_' for '-' in systemd's unit names.
_POD_UID = r"[0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD_SLICE = re.compile(rf"^(?:.+-)?kubepods(?:-(besteffort|burstable))?-pod({_POD_UID})\.slice$")
_POD_DIR = re.compile(rf"^pod({_POD_UID})$")
_QOS_DIRS = ("besteffort", "burstable")


@dataclass(frozen=True)
class ContainerRef:
    """A container named by a process's cgroup: which runtime made it, its id, and what else
    the path says of it."""

    runtime: str  # docker, podman, containerd, crio, lxd; "" when the path does not say
    id: str  # 64 hex digits; an LXD container's name
    owner: int | None = None  # rootless: the uid whose user slice holds it
    pod: str | None = None  # Kubernetes: the pod's uid, as the API shows it (with '-')
    qos: str | None = None  # and the pod's QoS class: guaranteed, burstable or besteffort
    nested: int | None = None  # another uid's slice the owner's subtree holds: forged

    @property
    def rootless(self) -> bool:
        """Whether a user's own engine runs it (the path lies in that user's slice)."""
        return self.owner is not None

    @property
    def short(self) -> str:
        """The first 12 hex digits, as docker prints them; an LXD container's name."""
        return self.id if self.runtime == "lxd" else self.id[:12]


def container_of_path(path: str) -> ContainerRef | None:
    """The container in one cgroup path, or None."""
    parts = [p for p in path.strip().split("/") if p]
    if parts:
        lxd = _LXD.match(parts[0])
        if lxd:
            return ContainerRef("lxd", lxd.group(1))
    for index in range(len(parts) - 1, -1, -1):
        part = parts[index]
        scope = _SCOPE.match(part)
        if scope:
            return _placed(_RUNTIMES[scope.group(1)], scope.group(2), parts[:index])
        if _BARE.match(part):
            runtime = "docker" if "docker" in parts[:index] else ""  # else: not said
            return _placed(runtime, part, parts[:index])
    return None


def _placed(runtime: str, cid: str, parents: list[str]) -> ContainerRef:
    """The container, with its owner (the outermost user slice above it), another uid's slice
    nested under that one, if any, and its pod."""
    owner = nested = None
    for part in parents:
        user = _USER_UNIT.match(part)
        if user:
            uid = int(user.group(1) or user.group(2))
            if owner is None:
                owner = uid
            elif uid != owner and nested is None:
                nested = uid
    pod, qos = _pod_of(parents)
    return ContainerRef(runtime, cid, owner, pod, qos, nested)


def _pod_of(parents: list[str]) -> tuple[str | None, str | None]:
    """The Kubernetes pod uid and QoS class its parents name, or (None, None)."""
    for index in range(len(parents) - 1, -1, -1):
        part = parents[index]
        sliced = _POD_SLICE.match(part)
        if sliced:
            return sliced.group(2).replace("_", "-"), sliced.group(1) or "guaranteed"
        plain = _POD_DIR.match(part)
        if plain and index > 0:
            above = parents[index - 1]
            if above.endswith("kubepods"):
                return plain.group(1), "guaranteed"
            if above in _QOS_DIRS and index > 1 and parents[index - 2].endswith("kubepods"):
                return plain.group(1), above
    return None, None


_SLURM_V1 = re.compile(r"^slurm(?:_[^/]+)?$")
_SLURM_V2 = re.compile(r"^(?:[^/]+_)?slurmstepd\.scope$")
_JOB = re.compile(r"^(?:job_)?([0-9]+|s[0-9A-Z]{13})$")
_STEP = re.compile(r"^step_([0-9]+|batch|extern|interactive)$")
_UID = re.compile(r"^uid_[0-9]+$")


@dataclass(frozen=True)
class SlurmStep:
    """A Slurm job's step, as a process's cgroup names it."""

    job: str  # the job id, or its SLUID
    step: str  # a number, "batch", "extern" or "interactive"
    uid: int | None = None  # the job's user, where the path says it (v1's uid_<uid>)


def slurm_of_path(path: str) -> SlurmStep | None:
    """The Slurm job step in one cgroup path, where slurmd puts it, or None."""
    parts = [p for p in path.strip().split("/") if p]
    while parts and parts[0] == "..":
        parts = parts[1:]
    uid = None
    if parts and _SLURM_V1.match(parts[0]):
        rest = parts[1:]
        if rest and _UID.match(rest[0]):
            uid, rest = int(rest[0][4:]), rest[1:]
    elif len(parts) > 1 and parts[0] == "system.slice" and _SLURM_V2.match(parts[1]):
        rest = parts[2:]
    else:
        return None
    if len(rest) >= 2:
        job, step = _JOB.match(rest[0]), _STEP.match(rest[1])
        if job and (rest[0].startswith("job_") or not job.group(1).isdigit()) and step:
            return SlurmStep(job.group(1), step.group(1), uid)
    return None


def parse_slurm(text: str) -> SlurmStep | None:
    """The Slurm job step named in a /proc/<pid>/cgroup file (any hierarchy), or None."""
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3 and fields[0].strip().isdigit():
            found = slurm_of_path(fields[2])
            if found is not None:
                return found
    return None


def parse_cgroup(text: str) -> ContainerRef | None:
    """The container named in a /proc/<pid>/cgroup file; malformed lines are skipped."""
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[0].strip().isdigit():
            continue
        found = container_of_path(fields[2])
        if found is not None:
            return found
    return None
