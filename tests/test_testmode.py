"""Test mode's synthetic devices and statistics."""

import asyncio

from helpers import async_test, running, until

from patroller.config import Config
from patroller.observe.signals import Signals
from patroller.observe.testmode import SyntheticMonitor, synthetic_inventory


def test_eight_stable_devices_with_plausible_inventory():
    first, second = synthetic_inventory(8), synthetic_inventory(8)
    assert [d.uuid for d in first] == [d.uuid for d in second]  # stable across restarts
    assert [d.number for d in first] == list(range(8))
    assert len({d.uuid for d in first}) == len({d.pci_address for d in first}) == 8
    for device in first:
        assert device.group == "gpu" and device.uuid.startswith("GPU-")
        assert device.total_mem == "81920 MiB" and device.arch == "Ampere"
    buses = [d.pci_address for d in first]
    assert buses == sorted(buses)  # index order is PCI bus order, as on a real host


def test_samples_reach_the_signal_and_stay_in_range():
    inventory = synthetic_inventory(8)
    signals = Signals()
    got = []
    signals.sample.connect(lambda sender, record: got.append(record), weak=False)
    held = {d.uuid for d in list(inventory)[4:]}
    monitor = SyntheticMonitor(
        inventory, signals, Config().test_interval, seed=7, held=held.__contains__
    )
    for _ in range(200):
        monitor.sample()
    assert len(got) == 200 * 8
    assert {r.uuid for r in got} == {d.uuid for d in inventory}
    for record in got:
        values = record.values
        assert 0 <= values["sm"] <= 100 and 0 <= values["mem"] <= 100
        assert 28 <= values["gtemp"] <= 85 and values["mtemp"] > values["gtemp"]
        assert 45 <= values["power"] <= 400 and 0 <= values["fb"] <= 81920
    assert len({r.values["sm"] for r in got}) > 10  # it moves


def test_a_free_device_stays_idle_and_a_held_one_busy_for_ten_minutes():
    # As found: an unbounded random walk showed "free" GPUs at 87% SM, 354 W and 9 GiB after
    # ten minutes. Free ones must look idle by the daemon's own measure (--idle-sm,
    # --idle-memory), held ones busy, all within the A100's 400 W and 81920 MiB.
    config = Config()
    inventory = synthetic_inventory(8)
    signals = Signals()
    got = {d.uuid: [] for d in inventory}
    signals.sample.connect(
        lambda sender, record: got[record.uuid].append(record.values), weak=False
    )
    held = {d.uuid for d in list(inventory)[:3]}
    monitor = SyntheticMonitor(inventory, signals, 1.0, seed=11, held=held.__contains__)
    for _ in range(600):  # ten minutes at one sample a second
        monitor.sample()
    for uuid, samples in got.items():
        if uuid in held:
            settled = samples[30:]
            assert min(v["sm"] for v in settled) >= 60 and min(v["fb"] for v in settled) >= 20000
            assert all(200 <= v["power"] <= 400 and v["gtemp"] <= 85 for v in settled)
        else:
            assert max(v["sm"] for v in samples) <= config.idle_sm
            assert max(v["fb"] for v in samples) < config.idle_memory
            assert max(v["power"] for v in samples) <= 70
    # Released, a held device is idle again within half a minute.
    held.clear()
    for _ in range(30):
        monitor.sample()
    assert all(
        got[uuid][-1]["sm"] <= config.idle_sm and got[uuid][-1]["fb"] < config.idle_memory
        for uuid in got
    )


@async_test
async def test_in_the_daemon_a_reserved_device_looks_busy_and_a_free_one_idle():
    async with running(test_interval=0.05) as h:
        [granted] = await h.ok("/request?gpu=1&user=alice")
        uuid = granted["uuid"]
        await until(lambda: (h.services.stats.view(uuid)["sm"] or 0) >= 60)
        others = [u for u in h.uuids() if u != uuid]
        assert all(h.services.stats.view(u)["sm"] <= Config().idle_sm for u in others)
        await h.ok(f"/release?uuid={uuid}&user=alice")
        await until(lambda: h.services.stats.view(uuid)["sm"] <= Config().idle_sm)


# -- --test-processes: processes that compute and idle, so that every usage category shows -----


def script(holders, cycle=90.0, after=5.0):
    from patroller.observe.testprocesses import SyntheticProcesses

    inventory = synthetic_inventory(8)
    return inventory, SyntheticProcesses(
        inventory, lambda uuid: holders.get(uuid), cycle, after, 38000.0
    )


def test_the_holders_process_comes_after_the_hold_computes_idles_and_goes_with_it():
    from patroller.core.identity import named_user

    holders = {}
    inventory, processes = script(holders)
    uuid = inventory.by_number(0).uuid
    assert processes.at(1000.0)[uuid] == ()  # the script's start: nobody holds it
    holders[uuid] = named_user("alice")
    assert processes.at(1001.0)[uuid] == ()  # held, no process yet: reserved and unused
    [first] = processes.at(1006.0)[uuid]  # `after` seconds later, alice's job
    assert first.owner.user == "alice" and first.computing and first.pid >= 1 << 22
    assert processes.owner(first.pid).user == "alice"
    [later] = processes.at(1000.0 + 61.0)[uuid]  # two thirds of the cycle: idle, memory held
    assert later.pid == first.pid and not later.computing and 0 < later.fb < first.fb
    [again] = processes.at(1000.0 + 91.0)[uuid]
    assert again.pid == first.pid and again.computing  # a new cycle: computing again
    holders[uuid] = named_user("bob")  # another holder: another job, another pid
    assert processes.at(1000.0 + 92.0)[uuid] == ()
    [bobs] = processes.at(1000.0 + 98.0)[uuid]
    assert bobs.owner.user == "bob" and bobs.pid != first.pid
    assert processes.owner(first.pid) is None  # alice's is gone
    del holders[uuid]
    assert processes.at(1000.0 + 99.0)[uuid] == () and processes.owner(bobs.pid) is None


def test_a_stranger_computes_on_the_last_gpu_a_third_of_every_other_cycle():
    from patroller.core.identity import named_user

    holders = {}
    inventory, processes = script(holders)
    last = inventory.by_number(7).uuid
    [stranger] = processes.at(0.0)[last]
    assert stranger.owner.user == "mallory@example.org" and stranger.computing
    assert [r.pid for r in processes.at(29.0)[last]] == [stranger.pid]
    assert processes.at(31.0)[last] == () and processes.at(179.0)[last] == ()
    holders[last] = named_user("alice")  # held: the stranger's next run is a trespass
    here = processes.at(181.0)[last]
    assert [r.owner.user for r in here] == ["mallory@example.org"]
    assert stranger.pid not in [r.pid for r in here]  # a new process each run
    assert sorted(r.owner.user for r in processes.at(186.0)[last]) == [
        "alice",
        "mallory@example.org",
    ]
    assert all(processes.at(186.0)[u] == () for u in [d.uuid for d in inventory][:-1])


@async_test
async def test_with_test_processes_every_usage_category_shows(tmp_path):
    # As found: test mode showed held GPUs at 70-80 % SM, and `users` and the report counted
    # them reserved_unused: it had no processes. A cycle of 4 s here (90 s by default).
    async with running(
        test_processes=True,
        test_process_cycle=4.0,
        test_process_after=0.5,
        lease=0.5,  # a stranger's GPU is free soon after its process ends
        test_interval=0.05,
        usage_interval=0.25,
        state_dir=str(tmp_path / "state"),
    ) as h:
        uuids = h.uuids()
        assert len(await h.ok("/request?gpu=6&user=alice&hold=1h")) == 6  # GPU 6 stays free
        seen = set()

        async def categories():
            code, body = await h.call("/usage?since=1h&by=user")
            assert code == 200, body
            for row in body["rows"]:
                seen.update(
                    (category, row["key"]) for category, hours in row["hours"].items() if hours > 0
                )
            return {category for category, _ in seen}

        wanted = {"active", "idle_held", "reserved_unused", "trespass", "unreserved", "free"}
        deadline = asyncio.get_running_loop().time() + 60
        while not wanted <= await categories():
            assert asyncio.get_running_loop().time() < deadline, sorted(seen)
            last = (await h.ok("/status"))[uuids[7]]["claim"]
            if ("unreserved", "mallory@example.org") in seen and last["state"] == "free":
                await h.ok("/request?gpu=2&user=alice&hold=1h")  # GPU 7's next run: trespass
                await h.ok(f"/release?uuid={uuids[6]}&user=alice")
            await asyncio.sleep(0.25)
        assert ("trespass", "mallory@example.org") in seen
        assert ("unreserved", "mallory@example.org") in seen
        assert {("active", "alice"), ("idle_held", "alice"), ("reserved_unused", "alice")} <= seen
        status = await h.ok("/status")
        users = {
            p["user"]
            for entry in status.values()
            for p in entry["claim"].get("process_detail") or []
        }
        assert "alice" in users  # /status shows the synthetic processes as whose they are


def test_test_processes_are_test_modes_alone_and_off_unless_asked():
    import pytest

    from patroller.config import ConfigError, load

    assert load(["--test"], {}).test_processes is False
    assert load(["--test", "--test-processes"], {}).test_processes is True
    assert load(["--test"], {"PATROLLER_TEST_PROCESSES": "yes"}).test_processes is True
    for argv, environ in ((["--test-processes"], {}), ([], {"PATROLLER_TEST_PROCESSES": "1"})):
        with pytest.raises(ConfigError, match="only with --test"):
            load(argv, environ)
