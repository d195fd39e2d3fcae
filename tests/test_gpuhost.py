"""GPU host mode against the simulator as a real child process, with real processes in /proc."""

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from itertools import pairwise

import pytest
from helpers import (
    ROOT,
    ScenarioFile,
    ServerProcess,
    alive,
    async_test,
    gpu_running,
    known_claim,
    streams_of,
    until,
)

from patroller.config import Config
from patroller.identify.procfs import uid as read_uid
from patroller.identify.resolver import host_identity

SIX = [{"minor": 1}, {"minor": 2}, {"minor": 3}, {"minor": 0}, {"minor": 5}, {"minor": 4}]


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=SIX)


def by_number(status, devices, number):
    uuid = next(u for u, info in devices.items() if info["number"] == number)
    return status[uuid]


@async_test
async def test_discovery_numbers_devices_by_index_not_minor(scenario):
    async with gpu_running(scenario) as h:
        devices = await h.ok("/devices")
        assert [d["number"] for d in devices.values()] == [0, 1, 2, 3, 4, 5]
        assert [d["minor_number"] for d in devices.values()] == [1, 2, 3, 0, 5, 4]
        assert [d["pci_address"] for d in devices.values()] == [
            f"00000000:{n:02X}:00.0" for n in range(1, 7)
        ]
        assert (await h.ok("/"))["mode"] == "gpu"


@async_test
async def test_all_six_devices_get_statistics_not_only_four(scenario):
    devices = [dict(d, stats={"sm": 10 + n, "pwr": 100 + n}) for n, d in enumerate(SIX)]
    scenario.write(devices=devices, show_all_devices=False)  # like the real one: four by default
    async with gpu_running(scenario) as h:
        inventory = await h.ok("/devices")
        await until(lambda: all(h.services.stats.view(u)["updated"] for u in h.uuids()))
        status = await h.ok("/status")
        for number in range(6):
            entry = by_number(status, inventory, number)
            assert entry["sm"] == 10 + number and entry["power"] == 100 + number
            assert entry["stale"] is False and entry["mtemp"] is None  # '-' is null
            assert {"gtemp", "mem", "enc", "dec", "mclk", "pclk", "jpg", "ofa"} <= set(entry)


@async_test
async def test_a_process_appears_on_and_leaves_the_right_device(scenario, sleeper):
    account = host_identity(read_uid(sleeper.pid)).user
    async with gpu_running(scenario, lease=30) as h:
        inventory = await h.ok("/devices")
        await until(lambda: h.services.monitors[1].child.starts == 1)
        scenario.write(processes=[{"pid": sleeper.pid, "gpu": 4, "type": "C", "name": "sleep"}])
        target = by_number({u: u for u in inventory}, inventory, 4)
        await until(lambda: known_claim(h.services.leases, target))
        status = await h.ok("/status")
        claim = status[target]["claim"]
        assert claim["processes"] == [sleeper.pid]
        assert claim["user"]["user"] == account and claim["user"]["source"] == "host"
        others = [e["claim"]["state"] for u, e in status.items() if u != target]
        assert others == ["free"] * 5
        scenario.write(processes=[])
        await until(lambda: h.services.leases.state(target) == "reserved")
        claim = (await h.ok("/status"))[target]["claim"]
        assert claim["processes"] == [] and 0 < claim["expires"] <= 30  # the lease restarted


@async_test
async def test_a_loopback_caller_reserves_and_its_process_claims(scenario, sleeper):
    async with gpu_running(scenario) as h:
        [grant] = await h.ok("/request?gpu=1")
        status = await h.ok("/status")
        me = status[grant["uuid"]]["claim"]["user"]
        assert me["source"] == "host" and me["uid"] == os.getuid()
        scenario.write(processes=[{"pid": sleeper.pid, "gpu": grant["info"]["number"]}])
        await until(lambda: known_claim(h.services.leases, grant["uuid"]))
        got, body = await h.call("/request?gpu=1&user=mallory")
        assert got == 400 and "test mode only" in body["error"]


@async_test
async def test_a_process_on_two_devices_and_one_with_a_seven_digit_pid(scenario, sleeper):
    async with gpu_running(scenario) as h:
        inventory = await h.ok("/devices")
        uuids = {info["number"]: u for u, info in inventory.items()}
        scenario.write(
            processes=[
                {"pid": sleeper.pid, "gpu": 0},
                {"pid": sleeper.pid, "gpu": 5},
                {"pid": 4194303, "gpu": 2, "name": "gone-long-ago"},
            ]
        )
        await until(
            lambda: (
                known_claim(h.services.leases, uuids[0])
                and known_claim(h.services.leases, uuids[5])
                and known_claim(h.services.leases, uuids[2])
            )
        )
        claim = (await h.ok("/status"))[uuids[2]]["claim"]
        assert claim["processes"] == [4194303]
        assert claim["user"]["user"] == "unknown"  # no such pid in /proc


@async_test
async def test_statistics_turn_stale_when_the_stream_stalls(scenario):
    scenario.write(faults={"dmon": {"stall_after_lines": 12}})
    async with gpu_running(scenario) as h:
        first = h.uuids()[0]
        await until(lambda: h.services.stats.view(first)["updated"] is not None)
        await until(lambda: h.services.stats.view(first)["stale"], timeout=10)
        entry = (await h.ok("/status"))[first]
        assert entry["stale"] is True and entry["sm"] == 0  # the last values are kept
        scenario.write(faults={})
        await until(lambda: not h.services.stats.view(first)["stale"], timeout=10)


@pytest.mark.errors_expected
@async_test
async def test_a_dying_child_is_restarted_without_spinning(scenario, caplog):
    scenario.write(faults={"dmon": {"fail": "gpu_lost"}})
    caplog.set_level(logging.INFO, logger="patroller.observe.supervisor")
    first = Config().restart_first
    async with gpu_running(scenario) as h:
        dmon = h.services.monitors[0].child
        # A reader spinning on the closed pipe would never see the exit: no restart at all.
        await until(lambda: dmon.starts >= 3, timeout=10)  # restarted after ~1 s, then ~2 s
        started = [
            r.created for r in caplog.records if r.getMessage().startswith("dmon: started pid")
        ]
        gaps = [later - earlier for earlier, later in pairwise(started)]
        # Each restart waited its delay, doubling (a slow host only makes the gaps longer).
        assert gaps[0] >= 0.99 * first and gaps[1] >= 0.99 * 2 * first, gaps
        assert "exited with status 15" in caplog.text and "GPU is lost" in caplog.text
        assert await h.ok("/status")  # still serving
        scenario.write(faults={})
        await until(
            lambda: all(h.services.stats.view(u)["updated"] for u in h.uuids()), timeout=10
        )


@async_test
async def test_a_pmon_restart_does_not_drop_running_processes(scenario, sleeper):
    scenario.write(
        processes=[{"pid": sleeper.pid, "gpu": 1}],
        faults={"pmon": {"exit_after_lines": 14, "exit_status": 1}},
    )
    async with gpu_running(scenario) as h:
        pmon = h.services.monitors[1]
        target = [u for u in h.uuids()][1]
        ended, listed = [], []
        h.services.signals.process_ended.connect(
            lambda s, record: ended.append(record), weak=False
        )
        h.services.signals.processes_listed.connect(
            lambda s, record: listed.append(pmon.child.starts), weak=False
        )
        await until(lambda: known_claim(h.services.leases, target))
        await until(lambda: pmon.child.starts >= 2, timeout=10)
        # Two intervals completed by the restarted pmon: a process it dropped would have been
        # reported gone at the first (an interval's ends come before its list).
        await until(lambda: len([n for n in listed if n >= 2]) >= 2, timeout=10)
        assert ended == [] and known_claim(h.services.leases, target)


def test_sigterm_stops_the_daemon_and_leaves_no_child(scenario):
    server = ServerProcess("--nvidia-smi", scenario.command).start()
    deadline = time.monotonic() + 10
    while len(streams_of(server.process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    children = streams_of(server.process.pid)
    assert len(children) == 2, server.log
    started = time.monotonic()
    assert server.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 5
    assert not [pid for pid in children if alive(pid)]
    assert "dmon: stopped" in server.log and "pmon: stopped" in server.log


def run_daemon(*args):
    return subprocess.run(
        [sys.executable, "-m", "patroller", "--port", "0", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


@pytest.mark.parametrize(
    "fault,words",
    [
        ("mismatch", "Driver/library version mismatch"),
        ("no_driver", "couldn't communicate with the NVIDIA driver"),
        ("no_devices", "No devices were found"),
    ],
)
def test_nvidia_smi_failing_at_start_is_one_line_and_status_1(scenario, fault, words):
    scenario.write(faults={"-q": {"fail": fault}})
    result = run_daemon("--nvidia-smi", scenario.command)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "--test" in lines[0], result.stderr


def test_missing_nvidia_smi_is_one_line_and_status_1():
    result = run_daemon("--nvidia-smi", "/nonexistent/nvidia-smi")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "patroller: cannot list the GPUs: /nonexistent/nvidia-smi "
        "was not found; run with --test to try Patroller without a GPU"
    )


@pytest.mark.parametrize(
    "devices,words",
    [
        ([], "No devices were found"),
        ([{"uuid": "N/A"}], "lists no GPU with a uuid"),
    ],
)
def test_a_host_without_usable_gpus_is_refused(scenario, devices, words):
    scenario.write(devices=devices)
    result = run_daemon("--nvidia-smi", scenario.command)
    assert result.returncode == 1 and words in result.stderr, result.stderr


@async_test
async def test_an_old_driver_without_architecture(scenario):
    scenario.write(era="r384")
    async with gpu_running(scenario) as h:
        devices = await h.ok("/devices")
        assert {d["arch"] for d in devices.values()} == {None}
        await until(lambda: all(h.services.stats.view(u)["updated"] for u in h.uuids()))
        entry = (await h.ok("/status"))[h.uuids()[0]]
        assert "gtemp" in entry and "temp" not in entry  # old `temp` under the stable name


@async_test
async def test_a_keep_alive_connection_is_identified_once(scenario):
    async with gpu_running(scenario) as h:
        reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
        before = (await h.ok("/metrics.json"))["caller_lookups"]
        for path in ("/request?gpu=1", "/release", "/request?gpu=2"):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        writer.close()
        assert (await h.ok("/metrics.json"))["caller_lookups"] == before + 1
