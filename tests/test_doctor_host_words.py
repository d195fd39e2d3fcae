"""What the doctor says of /proc, the cgroups, the systemd unit and the kernel log for each
thing it may have found, word for word: the checks are pure, the facts given as the probes
would find them (tests/test_doctor_host.py makes the probes meet a /proc of real files)."""

import pytest

from patroller.doctor.host import (
    ProcFacts,
    UnitFacts,
    _why_refused,
    check_cgroups,
    check_kernel_log,
    check_proc,
    check_unit,
)
from patroller.doctor.results import Result

CLOSED = "cannot be read: a process in a container there is taken for its host account"


@pytest.mark.parametrize(
    "facts, status, detail, fix",
    [
        (
            ProcFacts(0, None, unlisted="Permission denied"),
            "failed",
            "/proc cannot be listed: Permission denied",
            "run Patroller where the host's /proc is mounted (the host's PID namespace: "
            "--pid=host in a container)",
        ),
        (
            ProcFacts(1000, "invisible", 4),
            "failed",
            "/proc is mounted with hidepid=invisible: other users' processes are hidden, so "
            "their GPU processes have no owner",
            "run Patroller as root (or mount /proc with gid= naming its group)",
        ),
        (
            ProcFacts(0, "2", 4),
            "ok",
            "the cgroup and user namespace of all 4 processes read",
            "",
        ),
        (
            ProcFacts(1000, "0", 4),
            "ok",
            "the cgroup and user namespace of all 4 processes read",
            "",
        ),
        (
            ProcFacts(1000, "off", 4),
            "ok",
            "the cgroup and user namespace of all 4 processes read",
            "",
        ),
        (
            ProcFacts(1000, None, 9, userns_unreadable=(3, 4, 5)),
            "degraded",
            f"of 9 processes, 3 user namespaces (pid 3, 4, 5) {CLOSED}",
            "run Patroller as root",
        ),
        (
            ProcFacts(1000, None, 9, cgroup_unreadable=(3, 4, 5, 6), userns_unreadable=(8,)),
            "degraded",
            f"of 9 processes, 4 cgroup files (pid 3, 4, 5, ...) and 1 user namespaces (pid 8) "
            f"{CLOSED}",
            "run Patroller as root",
        ),
    ],
)
def test_what_is_said_of_proc(facts, status, detail, fix):
    assert check_proc(facts) == Result("/proc", status, detail, fix)


def test_a_root_doctor_confined_or_not_is_told_what_closes_the_processes():
    closed = ProcFacts(0, None, 2, cgroup_unreadable=(7,), ptrace=True, named=("pid 7 (init)",))
    assert check_proc(closed).fix == (
        "none to give: Patroller is root with CAP_SYS_PTRACE, in the host's PID namespace and "
        "unconfined, and the kernel still closes these (pid 7 (init)): processes no reader "
        "may inspect (a sandbox's or VM's own init); only a GPU process among them goes unnamed"
    )
    unnamed = ProcFacts(0, None, 2, cgroup_unreadable=(7,))
    assert check_proc(unnamed).fix.startswith(
        "none to give: Patroller is root with CAP_SYS_PTRACE, in the host's PID namespace and "
        "unconfined, and the kernel still closes these: processes"
    )


@pytest.mark.parametrize(
    "facts, status, detail",
    [
        (
            ProcFacts(0, None, hierarchy="v2"),
            "ok",
            "v2, cgroupfs driver; no process in a container",
        ),
        (
            ProcFacts(
                0,
                None,
                runtimes={"podman": 1, "docker": 3},
                jobs=2,
                hierarchy="hybrid",
                systemd=True,
            ),
            "ok",
            "hybrid, systemd driver; processes in containers: 3 docker, 1 podman; 2 in Slurm jobs",
        ),
        (
            ProcFacts(0, None, unknown=("/a/x", "/b/y"), unknown_count=5, hierarchy="v1"),
            "degraded",
            "v1, cgroupfs driver; no process in a container; 5 process(es) in cgroups that look "
            "like a container's but are not recognised: /a/x; /b/y",
        ),
    ],
)
def test_what_is_said_of_the_cgroups(facts, status, detail):
    fix = (
        "they are taken for their host accounts: report these paths to Patroller's developers "
        "(docs/identity.md lists those recognised)"
        if status == "degraded"
        else ""
    )
    assert check_cgroups(facts) == Result("cgroups", status, detail, fix)


UNIT = "/etc/systemd/system/patroller.service"


@pytest.mark.parametrize(
    "facts, status, detail, fix",
    [
        (
            UnitFacts(),
            "ok",
            "not installed (`patroller systemd-unit` prints one for this installation; "
            "docs/gpu-host.md)",
            "",
        ),
        (
            UnitFacts(UNIT, unreadable="Permission denied"),
            "degraded",
            f"{UNIT} cannot be read: Permission denied",
            "make it readable, or install it again",
        ),
        (
            UnitFacts(UNIT, None),
            "degraded",
            f"{UNIT} starts nothing, which is not an executable here: the service cannot start",
            f"install it again: patroller systemd-unit > {UNIT}",
        ),
        (
            UnitFacts(UNIT, "/usr/bin/patroller", True),
            "ok",
            f"{UNIT}, starting /usr/bin/patroller",
            "",
        ),
        (
            UnitFacts(UNIT, "/usr/bin/patroller", True, active="inactive"),
            "ok",
            f"{UNIT}, starting /usr/bin/patroller: inactive",
            "",
        ),
        (
            UnitFacts(UNIT, "/usr/bin/patroller", True, active="activating"),
            "ok",
            f"{UNIT}, starting /usr/bin/patroller: activating",
            "",
        ),
        (
            UnitFacts(UNIT, "/usr/bin/patroller", True, active="reloading"),
            "ok",
            f"{UNIT}, starting /usr/bin/patroller: reloading",
            "",
        ),
        (
            UnitFacts(UNIT, "/usr/bin/patroller", True, active="deactivating"),
            "degraded",
            f"{UNIT}, starting /usr/bin/patroller: deactivating",
            "journalctl -u patroller says why",
        ),
    ],
)
def test_what_is_said_of_the_unit(facts, status, detail, fix):
    assert check_unit(facts) == Result("systemd unit", status, detail, fix)


def test_what_is_said_of_the_kernel_log():
    assert check_kernel_log(None, None) == Result(
        "kernel log", "ok", "not followed: the GPUs' health comes from nvidia-smi -q -x alone"
    )
    assert check_kernel_log("/dev/kmsg", None) == Result(
        "kernel log", "ok", "/dev/kmsg is readable: Xid errors are followed"
    )


def proc_with(tmp_path, status=None, scope=None, label=None):
    """A /proc holding only what tells why a root doctor may be refused."""
    proc = tmp_path / "proc"
    (proc / "self" / "attr").mkdir(parents=True)
    (proc / "sys" / "kernel" / "yama").mkdir(parents=True)
    if status is not None:
        (proc / "self" / "status").write_text(status)
    if scope is not None:
        (proc / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(scope)
    if label is not None:
        (proc / "self" / "attr" / "current").write_text(label)
    return str(proc)


NOTHING = (None, None, False, None)  # nothing known, nothing confining


@pytest.mark.parametrize(
    "files, found",
    [
        ({}, (None, None, False, None)),
        (
            {"status": "Name:\tp\nNSpid:\t12\nCapEff:\t0000000000080000\n", "scope": "1\n"},
            (True, 1, False, None),
        ),
        (
            {"status": "NSpid:\t4242\t17\nCapEff:\t0000000000000000\n", "scope": "x\n"},
            (False, None, True, None),
        ),
        ({"label": "\n"}, (None, None, False, None)),  # no module labels us
        ({"label": "unconfined\n"}, (None, None, False, None)),
        ({"label": "unconfined (complain)\n"}, (None, None, False, None)),
        (
            {"label": "docker-default (enforce)\x00\n"},
            (None, None, False, "docker-default (enforce)"),
        ),
        ({"label": "User::App::X\x00"}, (None, None, False, "User::App::X")),  # a Smack label
        # SELinux: an unconfined domain's context (a login's, a service's) confines nothing
        ({"label": "unconfined_u:unconfined_r:unconfined_t:s0-s0:c0.c1023\n"}, NOTHING),
        ({"label": "system_u:system_r:unconfined_service_t:s0\x00"}, NOTHING),
        (
            {"label": "system_u:system_r:container_t:s0:c1,c2\x00"},
            (None, None, False, "system_u:system_r:container_t:s0:c1,c2"),
        ),
    ],
)
def test_why_a_root_doctor_may_be_refused_is_read_from_proc(tmp_path, files, found):
    assert _why_refused(proc_with(tmp_path, **files)) == found
