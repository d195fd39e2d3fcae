"""The MIG devices' uuids (observe/miguuids.py), on the daemon run against the simulator with a
pod-resources server (tests/kubelet.py): `nvidia-smi -L` is read at discovery and with the
inventory while a GPU has MIG on, the uuids show in /devices, and a pod given a `MIG-<uuid>`
device holds the GPU it is on; a `-L` that fails or hangs maps no MIG device, is logged once,
and the daemon goes on, mapping them once `-L` answers again."""

import logging
import re
import subprocess

import pytest
from helpers import SIMULATOR, ScenarioFile, async_test, gpu_running, until
from kubelet import Kubelet, gpu_pod

INSTANCES = [
    {"gpu_instance_id": 1, "compute_instance_id": 0, "memory_mib": 9856},
    {"gpu_instance_id": 2, "compute_instance_id": 0, "memory_mib": 9856},
]
HOST = [{}, {"mig": "Enabled", "mig_devices": INSTANCES}]  # GPU 1 has MIG on
MIG_RESOURCE = "nvidia.com/mig-1g.10gb"
FAILED = "cannot list the MIG devices' uuids"


def listed(scenario: ScenarioFile) -> list[str]:
    """The MIG uuids the simulator's own -L prints, read here without the daemon."""
    out = subprocess.run(
        SIMULATOR.split() + ["--scenario", scenario.path, "-L"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    return re.findall(r"\(UUID: (MIG-[^)]+)\)", out.stdout)


def inventory_watch(h):
    return next(m for m in h.services.monitors if m.name == "inventory")


@pytest.mark.parametrize("legacy", [False, True])
@async_test
async def test_a_pod_given_a_mig_device_holds_the_gpu_it_is_on(tmp_path, legacy):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=HOST, legacy_mig_uuids=legacy)
    migs = listed(scenario)
    assert len(migs) == 2 and all(m.startswith("MIG-GPU-" if legacy else "MIG-") for m in migs)
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    try:
        async with gpu_running(
            scenario, kubelet_socket=kubelet.path, kubelet_every=0.05, inventory_every=0.1
        ) as h:
            plain, mig = h.uuids()
            devices = await h.ok("/devices")
            assert [m["uuid"] for m in devices[mig]["mig_instances"]] == migs
            assert [m["index"] for m in devices[mig]["mig_instances"]] == [0, 1]
            assert devices[plain]["mig_instances"] == []
            kubelet.pods = [gpu_pod("ml", "infer-0", f"{migs[1]}::2", resource=MIG_RESOURCE)]
            await until(lambda: h.services.leases.state(mig) == "allocated", timeout=20)
            claim = (await h.ok("/status"))[mig]["claim"]
            assert claim["hold"] == "kubernetes" and claim["pods"][0]["name"] == "infer-0"
            assert h.services.leases.state(plain) == "free"
            watch = inventory_watch(h)  # the watch reads -L again with the inventory
            readings = watch.mig.readings
            await until(lambda: watch.mig.readings > readings + 2, timeout=20)
            assert watch.mig.failures == 0 and h.services.leases.state(mig) == "allocated"
            kubelet.pods = []
            await until(lambda: h.services.leases.state(mig) == "free", timeout=20)
    finally:
        kubelet.stop()


@async_test
async def test_no_gpu_with_mig_on_runs_no_list(tmp_path):
    scenario = ScenarioFile(
        str(tmp_path / "scenario.json"),
        devices=[{}, {"mig": "Enabled"}],  # MIG on, no instance made
        faults={"-L": {"fail": "nvml_unknown"}},
    )
    async with gpu_running(scenario, inventory_every=0.05) as h:
        watch = inventory_watch(h)
        await until(lambda: watch.readings > 3)
        assert watch.mig.readings == 0 and watch.metrics().mig_list_failures == 0


@pytest.mark.parametrize("fault", [{"fail": "nvml_unknown"}, {"hang": True}])
@async_test
async def test_a_failing_list_maps_no_mig_device_is_logged_once_and_the_daemon_goes_on(
    tmp_path, caplog, fault
):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=HOST)
    migs = listed(scenario)
    scenario.write(faults={"-L": fault})
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    kubelet.pods = [gpu_pod("ml", "infer-0", migs[0], resource=MIG_RESOURCE)]
    try:
        with caplog.at_level(logging.INFO, logger="patroller"):
            # A hang is killed at the limit; a failure must be heard whatever the load, so
            # its limit is long (before: 0.3 s, and a loaded machine turned it into a kill).
            limit = 0.3 if "hang" in fault else 30.0
            async with gpu_running(
                scenario,
                kubelet_socket=kubelet.path,
                kubelet_every=0.05,
                inventory_every=0.1,
                mig_list_timeout=limit,
            ) as h:
                plain, mig = h.uuids()
                watch = inventory_watch(h)
                await until(lambda: watch.mig.failures >= 4, timeout=30)  # discovery, then 3
                devices = await h.ok("/devices")
                assert [m["uuid"] for m in devices[mig]["mig_instances"]] == [None, None]
                assert h.services.leases.state(mig) == "free"  # the id maps to no GPU
                assert watch.metrics().state != "failing"  # the inventory itself is read
                assert watch.metrics().mig_list_failures == watch.mig.failures
                failed = [r.getMessage() for r in caplog.records if FAILED in r.getMessage()]
                assert len(failed) == 1, failed
                assert ("killed" if "hang" in fault else "Unknown Error") in failed[0]
                unknown = [r for r in caplog.records if migs[0] in r.getMessage()]
                assert len(unknown) == 1 and unknown[0].levelno == logging.WARNING
                assert not watch.mig.query.running or "hang" in fault
                scenario.write(faults={})  # -L answers again: the pod's GPU is its own
                await until(lambda: h.services.leases.state(mig) == "allocated", timeout=20)
                assert h.services.leases.state(plain) == "free"
                again = [r for r in caplog.records if "uuids again" in r.getMessage()]
                assert len(again) == 1
    finally:
        kubelet.stop()


@async_test
async def test_a_list_that_fails_later_keeps_the_uuids_it_gave(tmp_path, caplog):
    # The pod's GPU stays its own: a failing -L must not hand out a GPU a pod holds.
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=HOST)
    migs = listed(scenario)
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    kubelet.pods = [gpu_pod("ml", "infer-0", migs[1], resource=MIG_RESOURCE)]
    try:
        with caplog.at_level(logging.WARNING, logger="patroller"):
            async with gpu_running(
                scenario, kubelet_socket=kubelet.path, kubelet_every=0.05, inventory_every=0.1
            ) as h:
                mig = h.uuids()[1]
                await until(lambda: h.services.leases.state(mig) == "allocated", timeout=20)
                scenario.write(faults={"-L": {"fail": "gpu_lost"}})
                watch = inventory_watch(h)
                await until(lambda: watch.mig.failures >= 3, timeout=20)
                devices = await h.ok("/devices")
                assert [m["uuid"] for m in devices[mig]["mig_instances"]] == migs
                assert h.services.leases.state(mig) == "allocated"
                assert sum(FAILED in r.getMessage() for r in caplog.records) == 1
    finally:
        kubelet.stop()


@async_test
async def test_discovery_reads_them_before_the_daemon_serves(tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=HOST)
    migs = listed(scenario)
    async with gpu_running(scenario, inventory_every=3600) as h:
        watch = inventory_watch(h)
        devices = await h.ok("/devices")
        assert [m["uuid"] for m in devices[h.uuids()[1]]["mig_instances"]] == migs
        assert (watch.readings, watch.mig.readings) == (0, 1)  # discovery's run, once
