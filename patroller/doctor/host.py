"""The host as the identity sources meet it: whether every process's `/proc/<pid>/cgroup` and
`ns/user` can be read (as identify/procfs.py reads them), the cgroup version and driver, the
cgroup paths that look like a container's but that identify/cgroups.py does not recognise
(a runtime or a systemd that names its scopes in a way never seen), and the systemd unit.

`probe_*` functions read (blocking: the doctor runs them in the executor); `check_*`
functions are pure, over what they read."""

from __future__ import annotations

import collections
import errno
import os
import re
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from patroller.doctor.results import Result, degraded, failed, ok
from patroller.identify import procfs
from patroller.identify.cgroups import container_of_path, slurm_of_path

# A 64-hex-digit id on a cgroup path: some runtime's container, recognised or not.
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
SHOWN = 3  # examples named in one line
UNIT = "patroller.service"
# Where systemd looks for units, the administrator's first (systemd.unit(5)).
UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
)


@dataclass(frozen=True)
class ProcFacts:
    """What reading every process's cgroup and user namespace found."""

    euid: int
    hidepid: str | None  # the /proc mount's hidepid= option, if any
    processes: int = 0  # read (those that ended meanwhile are not counted)
    cgroup_unreadable: tuple[int, ...] = ()
    userns_unreadable: tuple[int, ...] = ()
    unlisted: str | None = None  # /proc itself could not be listed: why
    runtimes: dict[str, int] = field(default_factory=dict)  # containers seen, by runtime
    jobs: int = 0  # processes in a Slurm job's cgroup
    unknown: tuple[str, ...] = ()  # container-like paths not recognised (a few)
    unknown_count: int = 0
    hierarchy: str = "unknown"  # v1, v2 or hybrid
    systemd: bool = False  # the cgroups are systemd's (slices and scopes)
    # Why a root doctor may still be refused another process's namespaces, where it can be told:
    ptrace: bool | None = None  # CAP_SYS_PTRACE is in our effective set; None: not known
    ptrace_scope: int | None = None  # Yama's kernel.yama.ptrace_scope; None: no Yama
    nested_pids: bool = False  # we are in a PID namespace of our own (a container's)
    confined: str | None = None  # the security module's label confining us (not unconfined)
    named: tuple[str, ...] = ()  # a few of the unreadable processes, as `pid (comm)`


def probe_proc(proc: str = "/proc") -> ProcFacts:
    """Read every process's cgroup and ns/user, as the resolver would."""
    euid = os.geteuid()
    hidepid, hierarchy = _mounts(proc)
    try:
        pids = procfs.pids(proc)
    except OSError as exc:
        return ProcFacts(euid, hidepid, unlisted=exc.strerror or str(exc), hierarchy=hierarchy)
    seen = 0
    no_cgroup: list[int] = []
    no_userns: list[int] = []
    runtimes: Counter[str] = collections.Counter()
    unknown: list[str] = []
    jobs, unknown_count, systemd = 0, 0, False
    for pid in pids:
        try:
            text = procfs.cgroup(pid, proc)
        except OSError as exc:
            if _gone(exc):
                continue
            no_cgroup.append(pid)
            text = ""
        try:
            os.close(
                os.open(os.path.join(proc, str(pid), "ns", "user"), os.O_RDONLY | os.O_CLOEXEC)
            )
        except OSError as exc:
            if _gone(exc):
                continue
            no_userns.append(pid)
        seen += 1
        paths = [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]
        systemd = systemd or any(".slice" in p for p in paths)
        refs = [r for r in map(container_of_path, paths) if r is not None]
        if refs:
            runtimes[refs[0].runtime or "of an unnamed runtime"] += 1
        elif any(slurm_of_path(p) is not None for p in paths):
            jobs += 1
        else:
            odd = [p for p in paths if _CONTAINER_ID.search(p)]
            if odd:
                unknown_count += 1
                if len(unknown) < SHOWN and odd[0] not in unknown:
                    unknown.append(odd[0])
    refused = sorted(set(no_cgroup) | set(no_userns))
    return ProcFacts(
        euid,
        hidepid,
        seen,
        tuple(no_cgroup),
        tuple(no_userns),
        None,
        dict(runtimes),
        jobs,
        tuple(unknown),
        unknown_count,
        hierarchy,
        systemd,
        *_why_refused(proc),
        tuple(_named(pid, proc) for pid in refused[:SHOWN]),
    )


CAP_SYS_PTRACE = 19  # capability(7)'s bit


def _why_refused(proc: str) -> tuple[bool | None, int | None, bool, str | None]:
    """(CAP_SYS_PTRACE ours, Yama's ptrace_scope, a PID namespace of our own, the security
    module's label confining us): what tells apart why another process's /proc is closed."""
    ptrace, nested = None, False
    try:
        with open(os.path.join(proc, "self", "status"), encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == "CapEff":
                    ptrace = bool(int(value.strip(), 16) >> CAP_SYS_PTRACE & 1)
                elif key == "NSpid":
                    nested = len(value.split()) > 1
    except (OSError, ValueError):
        pass
    scope = _first_line(os.path.join(proc, "sys", "kernel", "yama", "ptrace_scope"))
    label = _first_line(os.path.join(proc, "self", "attr", "current"))
    confined = None if label is None or _unconfined(label) else label.rstrip("\x00")
    return ptrace, int(scope) if scope and scope.isdigit() else None, nested, confined


def _unconfined(label: str) -> bool:
    """AppArmor's `unconfined` (a mode may follow), or an SELinux context whose type is an
    unconfined domain (`unconfined_t`, a service's `unconfined_service_t`)."""
    fields = label.rstrip("\x00").split(":")
    return (
        label in ("", "unconfined")
        or label.startswith("unconfined ")
        or (len(fields) >= 3 and fields[2].startswith("unconfined_"))
    )


def _first_line(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return None


def _named(pid: int, proc: str) -> str:
    """`pid (comm)`, or the pid alone where its name cannot be read either."""
    comm = _first_line(os.path.join(proc, str(pid), "comm"))
    return f"pid {pid} ({comm})" if comm else f"pid {pid}"


def _gone(exc: OSError) -> bool:
    """Whether an error reading /proc/<pid> means the process has ended."""
    return exc.errno in (errno.ENOENT, errno.ESRCH)


def _mounts(proc: str) -> tuple[str | None, str]:
    """The /proc mount's hidepid option, and the cgroup hierarchy: v1, v2 or hybrid."""
    hidepid, v1, v2 = None, False, False
    try:
        with open(os.path.join(proc, "self", "mounts"), encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 4:
                    continue
                where, kind, options = fields[1], fields[2], fields[3].split(",")
                if kind == "proc" and where == "/proc":
                    hidepid = next(
                        (o.split("=", 1)[1] for o in options if o.startswith("hidepid=")), None
                    )
                v1 = v1 or kind == "cgroup"
                v2 = v2 or kind == "cgroup2"
    except OSError:
        return None, "unknown"
    hierarchy = "hybrid" if v1 and v2 else "v2" if v2 else "v1" if v1 else "unknown"
    return hidepid, hierarchy


def check_proc(facts: ProcFacts) -> Result:
    """Can every process's owner be learned from /proc?"""
    name = "/proc"
    root = facts.euid == 0
    if facts.unlisted is not None:
        return failed(
            name,
            f"/proc cannot be listed: {facts.unlisted}",
            "run Patroller where the host's /proc is mounted (the host's PID "
            "namespace: --pid=host in a container)",
        )
    if facts.hidepid not in (None, "0", "off") and not root:
        return failed(
            name,
            f"/proc is mounted with hidepid={facts.hidepid}: other users' "
            "processes are hidden, so their GPU processes have no owner",
            "run Patroller as root (or mount /proc with gid= naming its group)",
        )
    cgroups, userns = len(facts.cgroup_unreadable), len(facts.userns_unreadable)
    read = f"{facts.processes} processes"
    if not cgroups and not userns:
        return ok(name, f"the cgroup and user namespace of all {read} read")
    said = (
        f"of {read}, "
        + " and ".join(
            part
            for part in (
                f"{cgroups} cgroup files (pid {_few(facts.cgroup_unreadable)})" if cgroups else "",
                f"{userns} user namespaces (pid {_few(facts.userns_unreadable)})"
                if userns
                else "",
            )
            if part
        )
        + " cannot be read: a process in a container there is taken for its host account"
    )
    return degraded(name, said, refused_fix(facts))


def refused_fix(facts: ProcFacts) -> str:
    """What to do about processes whose /proc entries are closed to Patroller: the cause that
    can be told apart, not a capability it already has."""
    if facts.euid != 0:
        return "run Patroller as root"
    if facts.ptrace is False:
        return (
            "give Patroller CAP_SYS_PTRACE (it is root without it: a unit's "
            "CapabilityBoundingSet= or a container's --cap-add SYS_PTRACE)"
        )
    if facts.ptrace_scope == 3:
        return (
            "kernel.yama.ptrace_scope is 3, which closes every process's namespaces even "
            "to root: set it to 2 or less at boot (it cannot be lowered until a reboot)"
        )
    if facts.nested_pids:
        return (
            "run Patroller in the host's PID namespace with the host's /proc (a "
            "container's --pid=host): it is in a PID namespace of its own"
        )
    if facts.confined is not None:
        return (
            f"the security module confines Patroller ({facts.confined}): let it read "
            "other processes (AppArmor: `ptrace (read)`; SELinux: the domain's "
            "sys_ptrace)"
        )
    shown = f" ({', '.join(facts.named)})" if facts.named else ""
    return (
        f"none to give: Patroller is root with CAP_SYS_PTRACE, in the host's PID namespace "
        f"and unconfined, and the kernel still closes these{shown}: processes no reader "
        "may inspect (a sandbox's or VM's own init); only a GPU process among them goes "
        "unnamed"
    )


def check_cgroups(facts: ProcFacts) -> Result:
    """The cgroup version and driver, the containers seen, and paths not recognised."""
    name = "cgroups"
    seen = ", ".join(f"{count} {runtime}" for runtime, count in sorted(facts.runtimes.items()))
    said = (
        f"{facts.hierarchy}, {'systemd' if facts.systemd else 'cgroupfs'} driver; "
        + (f"processes in containers: {seen}" if seen else "no process in a container")
        + (f"; {facts.jobs} in Slurm jobs" if facts.jobs else "")
    )
    if facts.unknown_count:
        return degraded(
            name,
            f"{said}; {facts.unknown_count} process(es) in cgroups that look "
            f"like a container's but are not recognised: {'; '.join(facts.unknown)}",
            "they are taken for their host accounts: report these paths to "
            "Patroller's developers (docs/identity.md lists those recognised)",
        )
    return ok(name, said)


def _few(pids: Sequence[int]) -> str:
    return ", ".join(map(str, pids[:SHOWN])) + (", ..." if len(pids) > SHOWN else "")


@dataclass(frozen=True)
class UnitFacts:
    """The systemd unit, if one is installed."""

    path: str | None = None  # where it is; None: not installed
    executable: str | None = None  # what its ExecStart= starts
    runs: bool = False  # that file is there and executable
    unreadable: str | None = None
    active: str | None = None  # `systemctl is-active`'s word, where it could be asked


def probe_unit(dirs: Sequence[str] = UNIT_DIRS) -> UnitFacts:
    """Find patroller.service and what it starts (systemctl is asked by the caller)."""
    for folder in dirs:
        path = os.path.join(folder, UNIT)
        if not os.path.lexists(path):
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(1 << 16)
        except OSError as exc:
            return UnitFacts(path, unreadable=exc.strerror or str(exc))
        executable = exec_start(text)
        return UnitFacts(
            path, executable, executable is not None and os.access(executable, os.X_OK)
        )
    return UnitFacts()


def exec_start(text: str) -> str | None:
    """The program of the unit's (last) ExecStart=, its prefixes (-@:+!) taken off."""
    found = None
    for line in text.splitlines():
        key, _, value = line.strip().partition("=")
        if key.strip() == "ExecStart" and value.strip():
            try:
                words = shlex.split(value)
            except ValueError:
                continue
            found = words[0].lstrip("-@:+!") if words else None
    return found


def check_unit(facts: UnitFacts) -> Result:
    name = "systemd unit"
    if facts.path is None:
        return ok(
            name,
            "not installed (`patroller systemd-unit` prints one for this "
            "installation; docs/gpu-host.md)",
        )
    if facts.unreadable is not None:
        return degraded(
            name,
            f"{facts.path} cannot be read: {facts.unreadable}",
            "make it readable, or install it again",
        )
    if facts.executable is None or not facts.runs:
        return degraded(
            name,
            f"{facts.path} starts {facts.executable or 'nothing'}, which is "
            "not an executable here: the service cannot start",
            f"install it again: patroller systemd-unit > {facts.path}",
        )
    said = f"{facts.path}, starting {facts.executable}"
    if facts.active in (None, "active", "activating", "reloading", "inactive"):
        return ok(name, said + (f": {facts.active}" if facts.active else ""))
    return degraded(name, f"{said}: {facts.active}", "journalctl -u patroller says why")


def probe_kernel_log(path: str | None) -> str | None:
    """Why the kernel log (Config.kernel_log) cannot be opened for reading; None if it can
    (or none is followed)."""
    if path is None:
        return None
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def check_kernel_log(path: str | None, trouble: str | None) -> Result:
    """The kernel log the daemon follows for Xid lines (a GPU's faults: observe/kernlog.py)."""
    name = "kernel log"
    if path is None:
        return ok(name, "not followed: the GPUs' health comes from nvidia-smi -q -x alone")
    if trouble is not None:
        return degraded(
            name,
            f"{path} cannot be read ({trouble}): Xid errors are not seen, "
            "the GPUs' health comes from nvidia-smi -q -x alone",
            "run the daemon as root, which may read /dev/kmsg (in a container: "
            "--device /dev/kmsg); or --kernel-log none",
        )
    return ok(name, f"{path} is readable: Xid errors are followed")
