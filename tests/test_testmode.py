"""Test mode's synthetic devices and statistics."""
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
    monitor = SyntheticMonitor(inventory, signals, Config().test_interval, seed=7)
    for _ in range(200):
        monitor.sample()
    assert len(got) == 200 * 8
    assert {r.uuid for r in got} == {d.uuid for d in inventory}
    for record in got:
        values = record.values
        assert 0 <= values["sm"] <= 100 and 0 <= values["mem"] <= 100
        assert 28 <= values["gtemp"] <= 85 and values["mtemp"] > values["gtemp"]
        assert 50 <= values["power"] <= 420
    assert len({r.values["sm"] for r in got}) > 10  # it moves
