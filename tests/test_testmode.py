"""Test mode's synthetic devices and statistics."""
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
    monitor = SyntheticMonitor(inventory, signals, Config().test_interval, seed=7,
                               held=held.__contains__)
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
    signals.sample.connect(lambda sender, record: got[record.uuid].append(record.values),
                           weak=False)
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
    assert all(got[uuid][-1]["sm"] <= config.idle_sm and got[uuid][-1]["fb"] < config.idle_memory
               for uuid in got)


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
