"""What the doctor says of nvidia-smi when a command gives no answer, word for word: the checks
are pure, over runs as the probe keeps them (tests/test_doctor_nvidia.py runs the simulator):
a command missing or not executable, a failing -q -x, --query-compute-apps, -L and topo -m,
each fix chosen by what nvidia-smi printed."""

import errno
from dataclasses import replace

import pytest

from patroller.config import Config
from patroller.core.devices import Device
from patroller.doctor.gpu import GpuFacts, Ran, Stream
from patroller.doctor.gpuchecks import (
    FALLBACK,
    FIXES,
    INSTALL,
    RUN_BY_HAND,
    _node_name,
    _timely,
    apps,
    fix_for,
    gpu_results,
    mig,
    query,
    stream,
    topology,
)
from patroller.doctor.results import Result
from patroller.observe.nvsmi.parsers import PmonRow
from patroller.observe.supervisor import Answer

ARGV = ("nvidia-smi",)
LOST = "GPU 0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU\n"


def ran(shown="nvidia-smi -q -x", seconds=0.5, **answer):
    return Ran(shown, seconds, Answer(**answer), 5.0)


def test_a_command_that_cannot_be_found_or_run_is_said_so_with_how_to_install_it():
    config = Config()
    missing = GpuFacts(ARGV, None, ran(error=FileNotFoundError(errno.ENOENT, "gone")))
    assert gpu_results(missing, config) == [
        Result("nvidia-smi", "failed", "`nvidia-smi` was not found", INSTALL)
    ]
    closed = GpuFacts(
        ("/opt/nv/nvidia-smi",), None, ran(error=PermissionError(errno.EACCES, "no"))
    )
    assert gpu_results(closed, config) == [
        Result("nvidia-smi", "failed", "`/opt/nv/nvidia-smi` is not executable", INSTALL)
    ]
    assert gpu_results(None, config) == [
        Result("nvidia-smi", "ok", "not used: --test serves synthetic devices")
    ]
    assert gpu_results(missing, replace(config, test=True)) == gpu_results(None, config)


def test_each_thing_nvidia_smi_says_when_it_fails_has_its_fix():
    said = [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "Failed to initialize NVML: Driver/library version mismatch",
        "No devices were found",
        LOST,
        "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
        "Failed to initialize NVML: Unknown Error",
        "Not supported on the device(s)",
        "Insufficient Permissions",
    ]
    assert [fix_for(text) for text in said] == [fix for _, fix in FIXES]
    assert fix_for("GPU 0: requires RESET") == fix_for(LOST)
    assert fix_for("something new") == RUN_BY_HAND == "run the command by hand to see what it says"


def test_a_failing_inventory_says_how_it_ended_and_what_to_do():
    failing = GpuFacts(ARGV, "/usr/bin/nvidia-smi", ran(status=9, output=LOST))
    assert gpu_results(failing, Config()) == [
        Result(
            "nvidia-smi",
            "degraded",
            "/usr/bin/nvidia-smi: driver version unknown (-q -x gave no answer)",
            "see nvidia-smi -q -x below",
        ),
        Result(
            "nvidia-smi -q -x",
            "failed",
            "`nvidia-smi -q -x` failed with status 9: GPU 0000:3B:00.0: GPU is lost.  Reboot "
            "the system to recover this GPU",
            fix_for(LOST),
        ),
    ]
    hung = GpuFacts(ARGV, None, ran(status=-9, timed_out=True, output=LOST))
    assert query(hung, Config()) == Result(
        "nvidia-smi -q -x",
        "failed",
        "`nvidia-smi -q -x` no answer in 5s: killed",
        "nvidia-smi hangs: check the driver (dmesg) and start nvidia-persistenced",
    )
    unread = GpuFacts(ARGV, None, ran(status=0, output="<xml"), unreadable="not XML")
    assert query(unread, Config()) == Result(
        "nvidia-smi -q -x",
        "failed",
        "answered in 0.5s, but not as nvidia-smi does: not XML",
        RUN_BY_HAND,
    )


def test_a_command_slower_than_the_doctors_bound_is_degraded():
    assert _timely("x", "answered", ran(seconds=2.5), 2.0) == Result(
        "x",
        "degraded",
        "answered: slow (over 2s)",
        "start nvidia-persistenced (persistence mode), so that NVML need not start afresh at "
        "each command",
    )
    assert _timely("x", "answered", ran(seconds=2.0), 2.0) == Result("x", "ok", "answered")


PLAIN = (Device("GPU-a", 0, "A100"), Device("GPU-b", 1, "A100"))
MIG_ON = (Device("GPU-a", 0, "A100", mig_mode="Enabled"), Device("GPU-b", 1, "A100"))


def test_a_failing_compute_apps_query_fails_only_where_mig_needs_it():
    shown = "nvidia-smi --query-compute-apps=pid --format=csv"
    failing = ran(shown, status=2, said="Insufficient Permissions\n")
    needed = GpuFacts(ARGV, None, devices=MIG_ON, apps=failing)
    assert apps(needed, Config()) == Result(
        "nvidia-smi --query-compute-apps",
        "failed",
        f"`{shown}` failed with status 2: Insufficient Permissions: processes on MIG GPUs "
        "cannot be attributed",
        "this user may not ask the driver: run Patroller as root",
    )
    spare = GpuFacts(ARGV, None, devices=PLAIN, apps=failing)
    assert apps(spare, Config()) == Result(
        "nvidia-smi --query-compute-apps",
        "degraded",
        f"`{shown}` failed with status 2: Insufficient Permissions: processes that pmon does "
        "not list cannot be attributed",
        "this user may not ask the driver: run Patroller as root",
    )


MIG_SAID = (
    "on for GPU 0 (0 instance(s)): a MIG GPU is reserved whole; its processes are attributed "
    "by --query-compute-apps"
)


@pytest.mark.parametrize(
    "listing, shown, fix",
    [
        (None, "was not run", RUN_BY_HAND),
        (
            ran("nvidia-smi -L", status=9, output=LOST),
            "failed with status 9: " + LOST.strip(),
            fix_for(LOST),
        ),
    ],
)
def test_mig_without_the_mig_devices_listed_is_degraded(listing, shown, fix):
    facts = GpuFacts(ARGV, None, devices=MIG_ON, listing=listing)
    assert mig(facts) == Result(
        "MIG",
        "degraded",
        f"{MIG_SAID}; `nvidia-smi -L` {shown}: the MIG devices' uuids are unknown (the kubelet "
        "names them so)",
        fix,
    )
    assert mig(replace(facts, devices=PLAIN)) == Result(
        "MIG", "ok", "off on every GPU: pmon attributes every process"
    )


@pytest.mark.parametrize(
    "matrix, shown, fix",
    [
        (None, "was not run", RUN_BY_HAND),
        (
            ran("nvidia-smi topo -m", status=9, output=LOST),
            "failed with status 9: " + LOST.strip(),
            fix_for(LOST),
        ),
        (ran("nvidia-smi topo -m", status=3), "failed with status 3: nothing", RUN_BY_HAND),
    ],
)
def test_a_topology_not_had_falls_back_to_the_lowest_numbers(matrix, shown, fix):
    facts = GpuFacts(ARGV, None, devices=PLAIN, topology=matrix)
    assert topology(facts) == Result(
        "GPU topology", "degraded", f"`nvidia-smi topo -m` {shown}: {FALLBACK}", fix
    )


def test_a_numa_node_is_named_as_printed_or_said_to_be_none():
    assert _node_name("1") == "NUMA node 1"
    assert _node_name("cpus 0-15") == "cpus 0-15"
    assert _node_name(None) == "no node"
    assert _node_name("") == "no node"


DMON = "nvidia-smi dmon -i 0,1 -c 1"


def sampled(kind, selects, answered=True, gpus=(0, 1), processes=()):
    """A sample whose every column group but the last was refused."""
    runs = [
        ran(f"nvidia-smi {kind} -s {s} -i 0,1 -c 1", status=6, output="Not supported")
        for s in selects[:-1]
    ]
    last = selects[-1]
    shown = f"nvidia-smi {kind}" + (f" -s {last}" if last else "") + " -i 0,1 -c 1"
    if answered:
        runs.append(ran(shown, seconds=1.5, status=0))
        return Stream(tuple(runs), last, gpus, processes)
    runs.append(ran(shown, status=9, output=LOST))
    return Stream(tuple(runs), None)


def test_a_sample_with_no_answer_costs_statistics_for_dmon_and_owners_for_pmon():
    facts = GpuFacts(ARGV, None, devices=PLAIN)
    assert stream("nvidia-smi dmon", sampled("dmon", [""], False), facts, Config()) == Result(
        "nvidia-smi dmon",
        "degraded",
        f"`{DMON}` failed with status 9: {LOST.strip()}: no statistics",
        fix_for(LOST),
    )
    pmon = stream("nvidia-smi pmon", sampled("pmon", ["um", ""], False), facts, Config())
    assert pmon == Result(
        "nvidia-smi pmon",
        "failed",
        f"`nvidia-smi pmon -i 0,1 -c 1` failed with status 9: {LOST.strip()}: no process is "
        "attributed to its user",
        fix_for(LOST),
    )


def test_a_sample_says_its_columns_what_was_refused_and_the_gpus_without_a_row():
    facts = GpuFacts(ARGV, None, devices=PLAIN)
    first = stream("nvidia-smi dmon", sampled("dmon", ["pucvmt"]), facts, Config())
    assert first == Result(
        "nvidia-smi dmon",
        "ok",
        "one sample in 1.5s, columns -s pucvmt, a row from every GPU",
    )
    fewer = stream("nvidia-smi dmon", sampled("dmon", ["pucvmt", "pucm", ""]), facts, Config())
    assert fewer == Result(
        "nvidia-smi dmon",
        "degraded",
        "one sample in 1.5s, columns the default (pucvmt and pucm refused), a row from every GPU",
        "nothing to do: the daemon asks for fewer columns, as here",
    )
    rows = (PmonRow(0, 4242, "C", "python"), PmonRow(0, 4243, "C", "python"))
    missing = stream(
        "nvidia-smi pmon", sampled("pmon", ["um"], gpus=(0,), processes=rows), facts, Config()
    )
    assert missing == Result(
        "nvidia-smi pmon",
        "degraded",
        "one sample in 1.5s, columns -s um, 2 process row(s); GPU 1 printed no row",
        "a GPU that prints nothing is granted to nobody: check it with `nvidia-smi -i N -q`",
    )
    whole = stream("nvidia-smi pmon", sampled("pmon", ["um"], processes=rows), facts, Config())
    assert whole == Result(
        "nvidia-smi pmon",
        "ok",
        "one sample in 1.5s, columns -s um, 2 process row(s), a row from every GPU",
    )


def test_one_refused_group_is_named_and_every_gpu_without_a_row():
    facts = GpuFacts(ARGV, None, devices=PLAIN)
    one = stream("nvidia-smi pmon", sampled("pmon", ["um", ""]), facts, Config())
    assert one == Result(
        "nvidia-smi pmon",
        "degraded",
        "one sample in 1.5s, columns the default (um refused), 0 process row(s), a row from "
        "every GPU",
        "nothing to do: the daemon asks for fewer columns, as here",
    )
    none = stream("nvidia-smi dmon", sampled("dmon", ["pucvmt"], gpus=()), facts, Config())
    assert none.detail == "one sample in 1.5s, columns -s pucvmt; GPU 0, 1 printed no row"


def test_every_gpu_with_mig_on_is_named():
    both = tuple(replace(d, mig_mode="Enabled") for d in PLAIN)
    said = mig(GpuFacts(ARGV, None, devices=both)).detail
    assert said.startswith("on for GPU 0 (0 instance(s)), 1 (0 instance(s)): a MIG GPU")
