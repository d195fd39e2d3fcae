"""An unhealthy GPU on a real daemon: the simulator's `-q -x` says a row remap is pending (or
the kernel log, a file here, has an Xid for it); the GPU is granted to nobody, its holder keeps
it, a request says why, /status, /metrics and `patroller status` say what to do, and it
returns when the condition clears, or when root says so (`patroller release --healthy`; 403
for anyone else)."""

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from helpers import NOBODY, ROOT, ScenarioFile, async_test, gpu_running, python_for, until
from receivers import Hooks

from patroller.config import Config
from patroller.core.devices import Device, Inventory, InventoryChange
from patroller.core.health import Reading
from patroller.identify.resolver import host_identity
from patroller.observe.health import HealthWatch
from patroller.observe.signals import Signals
from patroller.observe.xid import XidLine

ASK = """
import http.client, json, sys
connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=20)
connection.request("POST", sys.argv[2])
answer = connection.getresponse()
print(json.dumps([answer.status, json.loads(answer.read())]), flush=True)
"""
ENV = {
    name: value
    for name, value in os.environ.items()
    if name not in ("PATROLLER_SERVER", "NO_COLOR")
}
ENV["PYTHONPATH"] = ROOT


async def as_nobody(port: int, target: str):
    """(status, body) of a request that a process of `nobody` makes over loopback."""
    python = python_for(NOBODY)
    done = await asyncio.get_running_loop().run_in_executor(
        None,
        lambda: subprocess.run(
            [python, "-c", ASK, str(port), target],
            capture_output=True,
            text=True,
            timeout=60,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
        ),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def patroller(port: int, *args: str) -> subprocess.CompletedProcess:
    """`patroller ARGS --server 127.0.0.1:PORT`, as root, off the daemon's loop."""
    return await asyncio.get_running_loop().run_in_executor(
        None,
        lambda: subprocess.run(
            [sys.executable, "-m", "patroller", *args, "--server", f"127.0.0.1:{port}"],
            env=ENV,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ),
    )


def root_only():
    if os.getuid() != 0:
        pytest.skip("the administrator is the host's root, and nobody's process needs root")


def metric(text: str, name: str, number: int) -> str:
    return next(line for line in text.splitlines() if line.startswith(f'{name}{{gpu="{number}"'))


@async_test
async def test_a_gpu_with_a_row_remap_pending_is_withheld_until_the_remap_is_done(tmp_path):
    root_only()
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}])
    async with gpu_running(
        scenario, inventory_every=0.2, lease=300, kernel_log=str(tmp_path / "kmsg")
    ) as h:
        leases, uuids = h.services.leases, h.uuids()
        status, [held] = await as_nobody(h.port, "/request?gpu=1")
        assert status == 200 and held["uuid"] == uuids[0]
        scenario.write(
            devices=[
                {"health": {"remap_pending": True}},
                {},
                {"health": {"slowdowns": ["hw_thermal_slowdown"]}},
                {},
            ]
        )
        await until(lambda: leases.holds[uuids[0]].withheld is not None)
        await until(lambda: leases.holds[uuids[2]].health.state == "degraded")
        nobody = host_identity(NOBODY).user
        assert leases.holder(uuids[0]).user == nobody  # its holder keeps it
        reason = "row remap pending: reset the GPU (`nvidia-smi -r -i 0`) when nothing runs on it"
        claim = (await h.ok("/status"))[uuids[0]]["claim"]
        assert claim["withheld"] == reason and claim["health"]["state"] == "unhealthy"
        assert claim["health"]["problems"] == [
            {
                "code": "remap_pending",
                "grave": True,
                "words": "row remap pending",
                "action": reason.split(": ", 1)[1],
            }
        ]
        # Released by its holder, it is still granted to nobody: a request says why.
        status, _ = await as_nobody(h.port, f"/release?uuid={uuids[0]}")
        assert status == 200 and leases.holder(uuids[0]) is None
        status, refused = await h.call("/request?gpu=4")
        assert status == 409 and refused["withheld"] == {"0": reason}
        assert (
            refused["error"] == f"busy: 4 gpu requested, 3 free; GPU 0 is granted to "
            f"nobody: {reason}"
        )
        granted = await h.ok("/request?gpu=3")  # the degraded one is granted as usual
        assert sorted(g["uuid"] for g in granted) == uuids[1:]
        metrics = (await h.http.fetch(h.url + "/metrics")).body.decode()
        assert metric(metrics, "patroller_gpu_healthy", 0).endswith(
            f'reason="remap_pending",state="unhealthy",uuid="{uuids[0]}"}} 0.0'
        )
        assert 'reason="slowdown",state="degraded"' in metric(metrics, "patroller_gpu_healthy", 2)
        assert metric(metrics, "patroller_gpu_healthy", 2).endswith(" 1.0")
        shown = await patroller(h.port, "status")
        assert shown.returncode == 0, shown.stderr
        assert f"GPU 0: granted to nobody: {reason}" in shown.stdout
        assert (
            "GPU 2: degraded: clocks slowed (hw_thermal_slowdown): check its cooling and "
            "power" in shown.stdout
        )
        # The remap done (a reset): -q -x no longer shows it, and it is granted again.
        await h.ok("/release")
        scenario.write(devices=[{}, {}, {}, {}])
        await until(lambda: leases.holds[uuids[0]].withheld is None)
        assert [g["uuid"] for g in await h.ok("/request?gpu=1")] == [uuids[0]]
        events = [
            (e["event"], e.get("user"))
            for e in await h.ok("/history")
            if e["event"] in ("unhealthy", "healthy")
        ]
        assert events == [("unhealthy", nobody), ("healthy", None)]


@async_test
async def test_a_gpu_unhealthy_at_start_is_withheld_from_the_first_answer_and_recorded(tmp_path):
    scenario = ScenarioFile(
        str(tmp_path / "scenario.json"),
        era="r384",
        devices=[{}, {"health": {"retire_pending": True}}],
    )
    async with gpu_running(scenario, inventory_every=3600, kernel_log=None) as h:
        uuid = h.uuids()[1]
        claim = (await h.ok("/status"))[uuid]["claim"]  # discovery's reading: no other yet
        assert (
            claim["withheld"] == "page retirement pending: reset the GPU (`nvidia-smi -r "
            "-i 1`) when nothing runs on it (or reboot the host)"
        )
        [event] = [e for e in await h.ok("/history") if e["event"] == "unhealthy"]
        assert event["devices"] == [{"uuid": uuid, "number": 1}]
        assert event["problems"] == ["retire_pending"]
        assert [m.name for m in h.services.monitors if m.name == "kernel_log"] == []


@async_test
async def test_the_admin_is_told_once_an_episode_through_a_real_webhook(tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    sick = [{}, {"health": {"reset_required": True}}]
    with Hooks() as hooks:
        async with gpu_running(
            scenario, inventory_every=0.2, notify=(hooks.url(),), notify_events=("unhealthy",)
        ) as h:
            leases, uuid = h.services.leases, h.uuids()[1]
            scenario.write(devices=sick)
            await until(lambda: len(hooks.bodies) == 1, timeout=30)
            # Another problem while unhealthy: the same episode, not told again.
            scenario.write(
                devices=[{}, {"health": {"reset_required": True, "remap_pending": True}}]
            )
            await until(lambda: "remap_pending" in leases.holds[uuid].health.codes)
            scenario.write(devices=[{}, {}])  # reset: healthy again, the episode ends
            await until(lambda: len(hooks.bodies) == 2, timeout=30)
            scenario.write(devices=sick)  # a new episode: told again
            await until(lambda: len(hooks.bodies) == 3, timeout=30)
    titles = [body["title"] for body in hooks.bodies]
    host = titles[0].split(":")[0]
    assert titles == [
        f"{host}: GPU 1 is unhealthy",
        f"{host}: GPU 1 is healthy again",
        f"{host}: GPU 1 is unhealthy",
    ]
    assert hooks.bodies[0]["message"].startswith(f"GPU 1 of {host} is unhealthy since ")
    assert (
        "the driver says it needs a reset: reset the GPU (`nvidia-smi -r -i 1`) when "
        "nothing runs on it. Nobody is granted it" in hooks.bodies[0]["message"]
    )


def kmsg(xid: int, pci: str, rest: str) -> str:
    return f"3,100,{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:{pci}): {xid}, {rest}\n"


@async_test
async def test_an_xid_withholds_its_gpu_until_root_says_it_is_healthy(tmp_path):
    root_only()
    kernel_log = tmp_path / "kmsg"
    kernel_log.write_text(kmsg(79, "0000:02:00", "pid=1, name=x, before the daemon: recalled"))
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}])
    async with gpu_running(scenario, kernel_log=str(kernel_log), kernel_log_poll=0.05) as h:
        leases, uuids = h.services.leases, h.uuids()
        # At start: the recent Xid of GPU 1 (PCI 02:00, as the simulator numbers them) counts.
        await until(lambda: leases.holds[uuids[1]].withheld is not None)
        assert leases.holds[uuids[1]].withheld.startswith(
            "Xid 79: fallen off the bus (before the daemon: recalled): reset the GPU "
            "(`nvidia-smi -r -i 1`) when nothing runs on it; then `patroller release --healthy "
            "1`"
        )
        # An application's fault is told against its process, not the GPU.
        with open(kernel_log, "a") as f:
            f.write(kmsg(13, "0000:03:00", "pid=4242, name=python3, Graphics Exception"))
            f.write(kmsg(48, "0000:0a:00", "a GPU this host does not have"))
        await until(lambda: h.services.health.unmatched == 1)
        await until(lambda: leases.holds[uuids[2]].health.faults)
        claim = (await h.ok("/status"))[uuids[2]]["claim"]
        assert claim["withheld"] is None and claim["health"]["state"] == "healthy"
        assert [(f["xid"], f["kind"], f["pid"]) for f in claim["health"]["faults"]] == [
            (13, "application", 4242)
        ]
        # Bad words are a 400; nobody may not say it is healthy; root may.
        for target, error in (
            ("/release?healthy=1", "healthy= names one device: uuid="),
            (f"/release?uuid={uuids[1]}&healthy=yes", "healthy= is 1 (or true) or 0 (or false)"),
        ):
            status, refused = await h.call(target, method="POST", body=b"")
            assert (status, refused["error"]) == (400, error)
        status, refused = await as_nobody(h.port, f"/release?uuid={uuids[1]}&healthy=1")
        assert (
            status == 403 and refused["error"] == "only the host's root may say a GPU is healthy"
        ), refused
        assert leases.holds[uuids[1]].withheld is not None
        said = await patroller(h.port, "release", "--healthy", "1")
        assert said.returncode == 0, said.stderr
        assert said.stdout == "GPU 1 is marked healthy: it is granted again\n"
        assert leases.holds[uuids[1]].withheld is None
        [back] = [e for e in await h.ok("/history") if e["event"] == "healthy"]
        assert back["by"] == host_identity(0).user and back["was"].startswith("Xid 79")
        assert uuids[1] in [g["uuid"] for g in await h.ok("/request?gpu=3")]
        metrics = (await h.http.fetch(h.url + "/metrics")).body.decode()
        assert "patroller_xids_total 2.0" in metrics
        assert "patroller_xids_unmatched_total 1.0" in metrics
        assert 'patroller_monitor_up{monitor="kernel_log"} 1.0' in metrics


def test_a_gpu_that_left_the_host_and_came_back_was_reset_its_xids_end():
    devices = Inventory([Device("GPU-a", 0, pci_address="00000000:3B:00.0")])
    signals, told = Signals(), []
    watch = HealthWatch(devices, Config(), clock=lambda: 1.0)
    watch.on_change = lambda uuid, health, by: told.append((uuid, health.state))
    watch.connect(signals)
    signals.health_read.send(None, record={"GPU-a": Reading(remap_pending=False)})
    signals.xid.send(None, record=XidLine("0000:3b:00", 94, None, None, "contained"))
    assert told == [("GPU-a", "unhealthy")]
    signals.health_read.send(None, record={"GPU-a": Reading(remap_pending=False)})
    assert len(told) == 1  # -q -x does not end an Xid
    signals.inventory_changed.send(None, record=InventoryChange(lost=("GPU-a",)))
    assert len(told) == 1
    signals.inventory_changed.send(None, record=InventoryChange(added=("GPU-a",)))
    assert told[-1] == ("GPU-a", "healthy")
