"""Fidelity in GPU host mode, on the simulator: every figure in every era, per-process figures,
GPUs lost and added while the daemon runs, and processes pmon cannot attribute (MIG, blind)."""

import os

import pytest
from helpers import (
    FakeClock,
    ScenarioFile,
    async_test,
    gpu_running,
    known_claim,
    lease_manager,
    running,
    until,
)

from patroller.core.devices import Device, Inventory
from patroller.core.errors import Busy, Unsatisfiable
from patroller.core.identity import named_user
from patroller.identify.resolver import host_identity
from patroller.observe.stats import FIELDS

ERAS = ("r384", "r470", "r550")
alice = named_user("alice")


def sampled(h):
    return all(h.services.stats.view(u)["updated"] is not None for u in h.uuids())


@pytest.mark.parametrize("era", ERAS)
@async_test
async def test_every_figure_is_there_in_every_era(tmp_path, era):
    scenario = ScenarioFile(
        str(tmp_path / "scenario.json"), era=era, devices=[{"memory_mib": 16384}, {}]
    )
    async with gpu_running(scenario) as h:
        await until(lambda: sampled(h))
        status = await h.ok("/status")
        for _uuid, entry in status.items():
            assert list(entry)[: len(FIELDS)] == list(FIELDS), era
            assert set(entry) == {*FIELDS, "updated", "topology", "stale", "claim"}, era
            assert isinstance(entry["fb"], int), (era, entry)  # dmon -s m: memory used
            assert isinstance(entry["power"], (int, float)) and isinstance(entry["sm"], int)
        assert status[h.uuids()[0]]["fb_total"] == 16384
        columns = h.services.monitors[0].metrics().columns
        assert columns == "pucvmt"


@async_test
async def test_the_keys_of_status_are_the_same_in_every_era_and_in_test_mode(tmp_path):
    keys = []
    for era in ERAS:
        scenario = ScenarioFile(str(tmp_path / f"{era}.json"), era=era)
        async with gpu_running(scenario) as h:
            await until(lambda: sampled(h))
            [entry] = (await h.ok("/status")).values()
            keys.append((era, list(entry), sorted(entry["claim"])))
    async with running() as h:
        await until(lambda: sampled(h))
        entry = next(iter((await h.ok("/status")).values()))
        keys.append(("test", list(entry), sorted(entry["claim"])))
    assert all(k[1:] == keys[0][1:] for k in keys), keys


@async_test
async def test_a_figure_the_driver_does_not_print_is_null(tmp_path):
    # r384 has one temperature column, and no JPEG, optical flow or protected memory columns
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), era="r384")
    async with gpu_running(scenario) as h:
        await until(lambda: sampled(h))
        [entry] = (await h.ok("/status")).values()
        assert entry["mtemp"] is None and entry["jpg"] is None and entry["ccpm"] is None
        assert isinstance(entry["gtemp"], int) and isinstance(entry["pviol"], int)


@async_test
async def test_each_process_shows_its_memory_and_sm(tmp_path, sleeper):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    async with gpu_running(scenario) as h:
        scenario.write(
            processes=[
                {
                    "pid": sleeper.pid,
                    "gpu": 1,
                    "name": "python",
                    "used_mib": 4096,
                    "sm": 95,
                    "mem": 40,
                }
            ]
        )
        uuid = h.uuids()[1]

        def detail():
            found = h.api.status.data()[uuid]["claim"]["process_detail"]
            return found[0] if found and found[0]["fb"] is not None else None

        await until(lambda: detail() is not None)
        shown = (await h.ok("/status"))[uuid]
        [process] = shown["claim"]["process_detail"]
        assert process == {
            "pid": sleeper.pid,
            "user": process["user"],
            "command": "python",
            "trespass": False,
            "sm": 95,
            "mem": 40,
            "fb": 4096,
        }
        assert shown["claim"]["processes"] == [sleeper.pid]  # the old field, as it was
        # the device's memory follows its processes
        await until(lambda: (h.services.stats.view(uuid)["fb"] or 0) >= 4096)


# -- GPUs that change --------------------------------------------------------------------------


def test_a_lost_device_is_never_granted_and_a_new_one_is():
    clock = FakeClock()
    devices = [Device(f"GPU-{n}", n) for n in range(3)]
    inventory = Inventory(devices)
    leases = lease_manager(clock, inventory, lease=10.0)
    [held] = leases.request(alice, {"gpu": 1})
    change = inventory.update([devices[0], Device("GPU-2", 1), Device("GPU-9", 2)])
    assert change.lost == ("GPU-1",) and change.added == ("GPU-9",)
    assert change.renumbered == ("GPU-2",)
    leases.devices_changed()
    assert leases.state("GPU-1") == "lost" and leases.state("GPU-9") == "free"
    assert leases.state(held.uuid) == "reserved"  # GPU-0 is still there, still alice's
    granted = leases.request(alice, {"gpu": 2})
    assert sorted(d.uuid for d in granted) == ["GPU-2", "GPU-9"]
    with pytest.raises(Busy):
        leases.request(alice, {"gpu": 1})
    with pytest.raises(Unsatisfiable):
        leases.request(alice, {"gpu": 4})  # three exist now, not four
    assert [d.uuid for d in inventory] == ["GPU-0", "GPU-2", "GPU-9", "GPU-1"]


@async_test
async def test_a_gpu_removed_while_running_becomes_lost_and_one_added_appears(tmp_path, sleeper):
    devices = [
        {
            "uuid": f"GPU-{n}000000-5a1e-4e57-8000-00000000000{n}",
            "pci": f"00000000:{n + 1:02X}:00.0",
        }
        for n in range(3)
    ]
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=devices)
    async with gpu_running(scenario, inventory_every=0.5) as h:
        await until(lambda: sampled(h))
        gone, moved = h.uuids()[1:]
        scenario.write(devices=[devices[0], devices[2]])  # the second one falls off the bus
        await until(lambda: h.services.leases.state(gone) == "lost", timeout=10)
        listed = await h.ok("/devices")
        assert listed[gone]["lost"] is True
        assert h.uuids() == [h.uuids()[0], moved, gone]  # the lost one last
        assert listed[moved]["number"] == 1  # nvidia-smi renumbers the others
        status, body = await h.call("/request?gpu=3")
        assert status == 422  # two GPUs on the host now
        granted = await h.ok("/request?gpu=2")
        assert gone not in {g["uuid"] for g in granted}
        await h.ok("/release")
        # the renumbered device's statistics and processes follow it
        scenario.write(processes=[{"pid": sleeper.pid, "gpu": 1, "name": "python"}])
        await until(lambda: known_claim(h.services.leases, moved), timeout=10)
        # a new GPU is plugged in
        new = {"uuid": "GPU-0000000a-5a1e-4e57-8000-00000000000a", "pci": "00000000:20:00.0"}
        scenario.write(devices=[devices[0], devices[2], new], processes=[])
        await until(lambda: h.services.inventory.get(new["uuid"]) is not None, timeout=10)
        await until(lambda: h.services.stats.view(new["uuid"])["updated"] is not None, timeout=10)
        assert h.services.leases.state(new["uuid"]) == "free"
        assert (await h.ok("/status"))[gone]["claim"]["state"] == "lost"


# -- processes pmon cannot attribute -------------------------------------------------------------


@async_test
async def test_a_mig_gpus_processes_are_found_by_the_cross_check(tmp_path, sleeper):
    mig = {
        "name": "NVIDIA H100 80GB HBM3",
        "mig": "Enabled",
        "mig_devices": [
            {"gpu_instance_id": 1, "compute_instance_id": 0, "memory_mib": 9856},
            {"gpu_instance_id": 2, "compute_instance_id": 0, "memory_mib": 9856},
        ],
    }
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[mig, {}])
    async with gpu_running(scenario, cross_check_every=0.3) as h:
        target = h.uuids()[0]
        listed = (await h.ok("/devices"))[target]
        assert listed["mig_mode"] == "Enabled" and len(listed["mig_instances"]) == 2
        scenario.write(
            processes=[
                {
                    "pid": sleeper.pid,
                    "gpu": 0,
                    "name": "python",
                    "used_mib": 2048,
                    "gi": 1,
                    "ci": 0,
                }
            ]
        )
        await until(lambda: known_claim(h.services.leases, target), timeout=10)
        claim = (await h.ok("/status"))[target]["claim"]
        assert claim["processes"] == [sleeper.pid]
        assert claim["user"]["user"] == host_identity(os.getuid()).user  # the process's own
        status, _ = await h.call("/request?gpu=2")
        assert status == 409  # the MIG GPU in use is not handed out as a whole
        scenario.write(processes=[])  # it ends: the usual lease follows
        await until(lambda: h.services.leases.state(target) == "reserved", timeout=10)


@async_test
async def test_a_blind_gpus_processes_are_found_by_the_cross_check(tmp_path, sleeper):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {"pmon_blind": True}])
    async with gpu_running(scenario, cross_check_every=0.3) as h:
        target = h.uuids()[1]
        await until(lambda: sampled(h))
        check = next(m for m in h.services.monitors if m.name == "cross_check")
        asked, candidates = [], check.candidates
        check.candidates = lambda: asked.append(candidates()) or asked[-1]
        await until(lambda: len(asked) >= 3)  # three ticks, each asking for candidates
        assert asked[-3:] == [set()] * 3 and check.metrics().runs == 0  # idle: no query
        scenario.write(
            processes=[
                {"pid": sleeper.pid, "gpu": 1, "name": "python", "used_mib": 3000, "sm": 80}
            ]
        )
        await until(lambda: known_claim(h.services.leases, target), timeout=10)
        [detail] = (await h.ok("/status"))[target]["claim"]["process_detail"]
        assert detail["pid"] == sleeper.pid and detail["fb"] == 3000
        assert detail["user"] == host_identity(os.getuid()).user
        scenario.write(processes=[])  # it ends: the usual lease follows
        await until(lambda: h.services.leases.state(target) == "reserved", timeout=10)
