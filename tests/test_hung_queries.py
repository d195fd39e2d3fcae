"""A hung `nvidia-smi -q -x` or `--query-compute-apps` is killed like a hung stream: after its
timeout in the inventory watch and at discovery, within the stop's grace on SIGTERM, and by the
kernel when the daemon is killed. The simulator's `hang` fault is the hung nvidia-smi."""

import asyncio
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import pytest
from helpers import ROOT, ScenarioFile, ServerProcess, alive, async_test, children_of, until

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.observe.inventory import GpuHostError, InventoryWatch, command, devices_of, discover
from patroller.observe.signals import Signals

SIX = [{"minor": n} for n in range(6)]
MIG = {
    "name": "NVIDIA H100 80GB HBM3",
    "mig": "Enabled",
    "mig_devices": [{"gpu_instance_id": 1, "compute_instance_id": 0, "memory_mib": 9856}],
}
HANG = {"hang": True, "ignore_sigterm": True}  # only SIGKILL ends it
BOUND = 10  # seconds: a bound for exits that take well under 2 s (the bug took 118 s)


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=SIX)


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def children_running(parent: int, word: str) -> list[int]:
    """The parent's live children (from /proc) whose command line has `word` in it."""
    return [pid for pid in children_of(parent) if word in cmdline(pid)]


def wait_for_child(parent: int, word: str) -> list[int]:
    deadline = time.monotonic() + BOUND
    while not children_running(parent, word):
        assert time.monotonic() < deadline, f"no `{word}` child of {parent}"
        time.sleep(0.05)
    return children_running(parent, word)


def gone(pids: list[int]) -> bool:
    """Whether every one of `pids` has ended, waiting for the kernel at most BOUND s."""
    deadline = time.monotonic() + BOUND
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(map(alive, pids))


@async_test
async def test_discovery_that_hangs_is_killed_after_its_timeout(scenario):
    scenario.write(faults={"-q": HANG})
    config = replace(Config(), discovery_timeout=0.5)
    before = set(children_of(os.getpid()))
    with pytest.raises(GpuHostError, match=r"`.* -q -x` did not answer in 0.5s: killed"):
        await discover(command(scenario.command), None, config)
    assert set(children_of(os.getpid())) <= before  # killed and reaped


@async_test
async def test_a_hung_reading_in_the_watch_is_killed_counted_logged_once_and_it_goes_on(
    scenario, caplog
):
    argv = command(scenario.command)
    config = replace(Config(), inventory_every=0.1, discovery_timeout=0.5)
    inventory = Inventory(devices_of(await discover(argv, None, Config())))
    signals = Signals()
    watch = InventoryWatch(inventory, signals, argv, None, config)
    changes = []
    signals.inventory_changed.connect(lambda sender, record: changes.append(record), weak=False)
    scenario.write(faults={"-q": HANG})
    watch.start()
    try:
        pids = set()

        def three_failed():
            if watch.query.child is not None:
                pids.add(watch.query.child.pid)
            return watch.failures >= 3

        await until(three_failed, timeout=30)
        running = watch.query.child.pid if watch.query.child is not None else None
        assert len(pids) >= 3 and not [p for p in pids if alive(p) and p != running]
        assert watch.metrics().hangs >= 3 and watch.metrics().failures >= 3
        failed = [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING
            and "reading the GPU inventory again failed" in r.getMessage()
        ]
        assert len(failed) == 1, failed  # once a minute, not once a reading
        assert "did not answer in 0.5s: killed" in failed[0] and "keeping it" in failed[0]
        assert changes == [] and not any(d.lost for d in inventory)
        # It goes on: the query answers again, and a device gone from the host is seen.
        scenario.write(faults={}, devices=SIX[:5])
        await until(lambda: changes, timeout=10)
        assert len(changes[0].lost) == 1
    finally:
        await watch.stop(0.5)


def start_daemon(scenario: ScenarioFile, *args: str) -> "subprocess.Popen[bytes]":
    """`python -m patroller` on the simulator, not waiting for it to listen (it may not)."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed when the child is stopped)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "patroller",
            "--port",
            "0",
            "--address",
            "127.0.0.1",
            "--nvidia-smi",
            scenario.command,
            *args,
        ],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env={**os.environ, "PYTHONPATH": ROOT, "PATROLLER_STATE_DIR": ""},
    )


@pytest.mark.parametrize("hang", [{"hang": True}, HANG])
def test_sigterm_ends_a_daemon_whose_discovery_hangs(scenario, hang):
    scenario.write(faults={"-q": hang})
    daemon = start_daemon(scenario)
    hung: list[int] = []
    try:
        hung = wait_for_child(daemon.pid, "-q")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=BOUND) == 0  # stopped in order, while still starting
        assert gone(hung)  # killed as the build is cancelled, or by the parent-death signal
    finally:
        daemon.kill()
        daemon.wait()
        for pid in filter(alive, hung):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_ends_a_daemon_whose_reading_of_the_inventory_hangs(scenario):
    server = ServerProcess("--nvidia-smi", scenario.command, "--inventory-every", "0.3").start()
    hung: list[int] = []
    try:
        scenario.write(faults={"-q": HANG})
        hung = wait_for_child(server.process.pid, "-q")
        streams = children_running(server.process.pid, "dmon")
        assert server.stop(signal.SIGTERM, timeout=BOUND) == 0, server.log
        assert gone(hung + streams)
        assert "stopping" in server.log and "stopped" in server.log
    finally:
        server.stop(signal.SIGKILL)
        for pid in filter(alive, hung):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "kind,devices,args",
    [
        ("-q", SIX, ["--inventory-every", "0.3"]),
        (
            "--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
            [MIG, {}],
            ["--cross-check-every", "0.3"],
        ),  # the MIG device is one the cross-check watches
    ],
)
def test_kill_9_of_the_daemon_leaves_no_hung_query_running(scenario, kind, devices, args):
    scenario.write(devices=devices)
    server = ServerProcess("--nvidia-smi", scenario.command, *args).start()
    hung: list[int] = []
    try:
        scenario.write(faults={kind.split("=")[0]: HANG})
        hung = wait_for_child(server.process.pid, kind)
        server.stop(signal.SIGKILL)
        assert gone(hung)  # the kernel kills it as the daemon dies: the parent-death signal
    finally:
        server.stop(signal.SIGKILL)
        for pid in filter(alive, hung):
            os.kill(pid, signal.SIGKILL)


@async_test
async def test_a_stop_at_any_moment_of_the_watch_ends_it(scenario):
    # Stops that land before, during and as a reading ends, and one in the pause after a poke
    # (rediscover_soonest long): each ends the watch at once. A stop that lost its way (as a
    # cancellation does when it comes as the awaited reading finishes, before Python 3.12)
    # would leave the watch reading for ever.
    argv = command(scenario.command)
    inventory = Inventory(devices_of(await discover(argv, None, Config())))
    quick = replace(Config(), inventory_every=0.005)
    for attempt in range(40):
        watch = InventoryWatch(inventory, Signals(), argv, None, quick)
        watch.start()
        await asyncio.sleep(0.005 + (attempt % 10) * 0.02)
        await asyncio.wait_for(watch.stop(0.5), BOUND)  # fails here: TimeoutError
        assert not watch.query.running
    patient = replace(Config(), inventory_every=60, rediscover_soonest=60)
    watch = InventoryWatch(inventory, Signals(), argv, None, patient)
    watch.start()
    await watch.read()
    watch.poke("a test")
    await asyncio.sleep(0.1)  # in the pause: the last reading was just now
    await asyncio.wait_for(watch.stop(0.5), BOUND)
