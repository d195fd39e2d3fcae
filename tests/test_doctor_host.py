"""The doctor's /proc, cgroups, systemd unit and kernel log checks over a /proc made of real
files in tmp_path, laid out as the kernel lays its own out (`<pid>/cgroup`, `<pid>/ns/user`,
`<pid>/comm`, `self/status`, `self/mounts`, `self/attr/current`, Yama's `ptrace_scope`):
a host of any shape, where this machine's own /proc has one (tests/test_doctor_checks.py reads
that one). A file the kernel would refuse is a symbolic link to itself, read as the kernel's
refusals are (an error that is not the process's end). Each check's words compared whole."""

import asyncio
import importlib
import os
from dataclasses import replace

import pytest
from helpers import need_root

from patroller.config import Config
from patroller.doctor.host import (
    ProcFacts,
    UnitFacts,
    check_cgroups,
    check_kernel_log,
    check_proc,
    check_unit,
    probe_kernel_log,
    probe_proc,
    probe_unit,
)
from patroller.doctor.results import Result

# the module (the package's `examine` is its function)
examining = importlib.import_module("patroller.doctor.examine")

HEX = "0123456789abcdef" * 4  # a 64-hex container id
ALL_CAPS = "000001ffffffffff"  # CapEff: every capability, CAP_SYS_PTRACE (bit 19) among them
UNREADABLE = object()  # a file the kernel refuses to give


def closed(path):
    """A file that cannot be read, and not because its process ended (ELOOP)."""
    os.symlink(os.path.basename(path), path)


def fake_proc(
    root,
    processes,
    mounts="proc /proc proc rw,nosuid 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n",
    status=f"Name:\tpatroller\nNSpid:\t4242\nCapEff:\t{ALL_CAPS}\n",
    label="unconfined",
    ptrace_scope=None,
):
    """A /proc at `root`: `processes` maps a pid to its cgroup file's text (UNREADABLE: closed)
    and, optionally, its user namespace closed and its name: (cgroup, userns_closed, comm)."""
    root.mkdir()
    (root / "self" / "attr").mkdir(parents=True)
    (root / "self" / "mounts").write_text(mounts)
    (root / "self" / "status").write_bytes(status.encode() if isinstance(status, str) else status)
    if label is not None:
        (root / "self" / "attr" / "current").write_text(label)
    if ptrace_scope is not None:
        (root / "sys" / "kernel" / "yama").mkdir(parents=True)
        (root / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(f"{ptrace_scope}\n")
    for pid, found in processes.items():
        cgroup, userns_closed, comm = found if isinstance(found, tuple) else (found, False, None)
        (root / str(pid) / "ns").mkdir(parents=True)
        if cgroup is UNREADABLE:
            closed(root / str(pid) / "cgroup")
        else:
            (root / str(pid) / "cgroup").write_text(cgroup)
        if userns_closed:
            closed(root / str(pid) / "ns" / "user")
        else:
            (root / str(pid) / "ns" / "user").write_text("")
        if comm is not None:
            (root / str(pid) / "comm").write_text(f"{comm}\n")
    return str(root)


def test_the_cgroups_of_a_host_with_containers_jobs_and_paths_not_recognised(tmp_path):
    """systemd's slices, a Docker container, one of a runtime the path does not name, a Slurm
    job, and five processes in container-like cgroups not recognised: three paths named, each
    once, whatever comes after them (a cgroup's name may hold a colon)."""
    odd = [f"/sandbox/vm-{n}{HEX[1:]}" for n in range(4)]
    proc = fake_proc(
        tmp_path / "proc",
        {
            1: "0::/init.scope\n",
            100: f"0::/system.slice/docker-{HEX}.scope\n",
            101: f"0::/mystery/{HEX}\n",
            102: "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
            103: f"0::{odd[0]}:gpu\n",
            104: f"0::{odd[0]}:gpu\n",
            105: f"0::{odd[1]}\n",
            106: f"0::{odd[2]}\n",
            107: f"0::{odd[3]}\n",
        },
    )
    facts = probe_proc(proc)
    assert check_cgroups(facts) == Result(
        "cgroups",
        "degraded",
        "v2, systemd driver; processes in containers: 1 docker, 1 of an unnamed runtime; "
        "1 in Slurm jobs; 5 process(es) in cgroups that look like a container's but are not "
        f"recognised: {odd[0]}:gpu; {odd[1]}; {odd[2]}",
        "they are taken for their host accounts: report these paths to Patroller's developers "
        "(docs/identity.md lists those recognised)",
    )
    assert check_proc(facts) == Result(
        "/proc", "ok", "the cgroup and user namespace of all 9 processes read"
    )


def test_the_cgroup_hierarchy_and_a_hidden_proc_are_read_from_the_mounts(tmp_path):
    """/proc mounted with hidepid (as a daemon that is not root meets it) and cgroup v1 beside
    v2; a cgroupfs host (no slice)."""
    proc = fake_proc(
        tmp_path / "proc",
        {1: "12:pids:/\n0::/\n"},
        mounts="proc /proc proc rw,nosuid,hidepid=invisible 0 0\n"
        "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n",
    )
    facts = probe_proc(proc)
    assert check_cgroups(facts) == Result(
        "cgroups", "ok", "hybrid, cgroupfs driver; no process in a container"
    )
    assert check_proc(replace(facts, euid=1000)) == Result(
        "/proc",
        "failed",
        "/proc is mounted with hidepid=invisible: other users' processes are hidden, so "
        "their GPU processes have no owner",
        "run Patroller as root (or mount /proc with gid= naming its group)",
    )


def refused(tmp_path, **settings):
    """The /proc check of a host where pid 7's cgroup and pid 9's user namespace are closed."""
    proc = fake_proc(
        tmp_path / "proc",
        {
            1: "0::/init.scope\n",
            7: (UNREADABLE, False, "sandbox-init"),
            9: ("0::/init.scope\n", True, None),
        },
        **settings,
    )
    return check_proc(probe_proc(proc))


SAID = (
    "of 3 processes, 1 cgroup files (pid 7) and 1 user namespaces (pid 9) cannot be read: a "
    "process in a container there is taken for its host account"
)


def test_processes_closed_to_a_root_doctor_with_every_capability_are_named(tmp_path):
    need_root("the fix said to a root doctor")
    assert refused(tmp_path) == Result(
        "/proc",
        "degraded",
        SAID,
        "none to give: Patroller is root with CAP_SYS_PTRACE, in the host's PID namespace and "
        "unconfined, and the kernel still closes these (pid 7 (sandbox-init), pid 9): "
        "processes no reader may inspect (a sandbox's or VM's own init); only a GPU process "
        "among them goes unnamed",
    )


@pytest.mark.parametrize(
    "settings, fix",
    [
        (  # CAP_SYS_PTRACE alone missing (bit 19), the one above it there; a name not ASCII
            {"status": f"Name:\tp\u00e4troller\nCapEff:\t{0x1FFFFFFFFFF & ~(1 << 19):016x}\n"},
            "give Patroller CAP_SYS_PTRACE (it is root without it: a unit's "
            "CapabilityBoundingSet= or a container's --cap-add SYS_PTRACE)",
        ),
        (
            {"ptrace_scope": 3, "status": f"CapEff:\t{1 << 19:016x}\n"},
            "kernel.yama.ptrace_scope is 3, which closes every process's namespaces even to "
            "root: set it to 2 or less at boot (it cannot be lowered until a reboot)",
        ),
        (
            {"status": f"NSpid:\t4242\t17\nCapEff:\t{ALL_CAPS}\n"},
            "run Patroller in the host's PID namespace with the host's /proc (a container's "
            "--pid=host): it is in a PID namespace of its own",
        ),
        (
            {"label": "docker-default (enforce)\n"},
            "the security module confines Patroller (docker-default (enforce)): let it read "
            "other processes (AppArmor: `ptrace (read)`; SELinux: the domain's sys_ptrace)",
        ),
    ],
)
def test_why_a_root_doctor_is_refused_is_told_apart(tmp_path, settings, fix):
    need_root("the fix said to a root doctor")
    assert refused(tmp_path, **settings) == Result("/proc", "degraded", SAID, fix)


def test_a_doctor_that_is_not_root_is_told_to_be():
    facts = ProcFacts(1000, None, 3, cgroup_unreadable=(7,))
    assert check_proc(facts) == Result(
        "/proc",
        "degraded",
        "of 3 processes, 1 cgroup files (pid 7) cannot be read: a process in a container there "
        "is taken for its host account",
        "run Patroller as root",
    )


# -- the systemd unit -----------------------------------------------------------------------


def unit_starting(folder, program):
    folder.mkdir()
    (folder / "patroller.service").write_text(f"[Service]\nExecStart={program} --port 8080\n")
    return probe_unit([str(folder)])


def test_a_unit_that_starts_an_executable_is_fine_and_one_that_does_not_is_not(tmp_path):
    program = tmp_path / "patroller"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    unit = tmp_path / "units" / "patroller.service"
    assert check_unit(unit_starting(tmp_path / "units", program)) == Result(
        "systemd unit", "ok", f"{unit}, starting {program}"
    )
    program.chmod(0o644)  # there, but not executable
    assert check_unit(probe_unit([str(tmp_path / "units")])) == Result(
        "systemd unit",
        "degraded",
        f"{unit} starts {program}, which is not an executable here: the service cannot start",
        f"install it again: patroller systemd-unit > {unit}",
    )


@pytest.mark.parametrize(
    "word, status, fix",
    [
        ("active", "ok", ""),
        ("failed", "degraded", "journalctl -u patroller says why"),
    ],
)
def test_where_systemd_runs_the_units_state_is_asked(tmp_path, monkeypatch, word, status, fix):
    """systemd cannot run here: where it runs is a folder (what sd_booted looks for), and
    systemctl a program answering `is-active` as systemctl does, first on the PATH."""
    running = tmp_path / "systemd-running"
    running.mkdir()
    monkeypatch.setattr(examining, "SYSTEMD_RUNNING", str(running))
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "systemctl").write_text(
        '#!/bin/sh\n[ "$1 $2" = "is-active patroller.service" ] || exit 64\n'
        f"echo {word}\n[ {word} = active ]\n"
    )
    (tools / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    unit = unit_starting(tmp_path / "units", "/bin/sh")
    found = asyncio.run(examining._activity(unit, Config()))
    path = tmp_path / "units" / "patroller.service"
    assert check_unit(found) == Result(
        "systemd unit", status, f"{path}, starting /bin/sh: {word}", fix
    )
    # no unit installed: systemctl is not asked
    assert asyncio.run(examining._activity(UnitFacts(), Config())) == UnitFacts()


# -- the kernel log -------------------------------------------------------------------------


def test_a_kernel_log_that_cannot_be_read_says_what_is_lost(tmp_path):
    missing = str(tmp_path / "kmsg")
    trouble = probe_kernel_log(missing)
    assert trouble == os.strerror(2)
    assert check_kernel_log(missing, trouble) == Result(
        "kernel log",
        "degraded",
        f"{missing} cannot be read ({trouble}): Xid errors are not seen, the GPUs' health "
        "comes from nvidia-smi -q -x alone",
        "run the daemon as root, which may read /dev/kmsg (in a container: --device "
        "/dev/kmsg); or --kernel-log none",
    )
