"""A GPU whose dmon rows stop while the others go on, and no stream says it is lost (as found:
still granted 10 s later, found only at the next inventory reading, 60 s on). The daemon on
the simulator, whose `silent` device prints no row; the rules on the fake clock."""

import pytest
from helpers import FakeClock, ScenarioFile, async_test, gpu_running, lease_manager, until

from patroller.core.devices import Device, Inventory
from patroller.core.identity import named_user
from patroller.http.views import claims
from patroller.observe.signals import Sample, Signals
from patroller.observe.silence import SilenceWatch, silent

alice, bob = named_user("alice"), named_user("bob")


def test_a_device_is_silent_only_while_another_is_heard():
    heard = {"a": 100.0, "b": 97.0, "c": 99.5}
    assert silent(heard, ["a", "b", "c"], 100.5, 2.0) == {"b"}
    assert silent(heard, ["a", "b", "c", "d"], 100.5, 2.0) == {"b", "d"}  # never heard
    assert silent(heard, ["a", "b"], 103.0, 2.0) == set()  # all quiet: the stream, not one
    assert silent(heard, ["b"], 99.0, 2.0) == set()  # exactly `quiet` ago is not yet silent


def test_the_watch_says_once_when_a_device_falls_silent_and_when_it_is_back():
    devices = Inventory([Device(f"GPU-{n}", n) for n in range(3)])
    signals, clock = Signals(), FakeClock(0.0)
    told, pokes = [], []
    signals.device_silent.connect(lambda sender, record: told.append(record), weak=False)
    signals.device_gone.connect(lambda sender, record: pokes.append(record), weak=False)
    watch = SilenceWatch(devices, signals, interval=1.0, quiet=2.0, clock=clock)
    watch.reconfigure()  # every device gets `quiet` s from now

    def sample(*uuids):
        for uuid in uuids:
            signals.sample.send(None, record=Sample(uuid, {}, 0.0))

    signals.sample.connect(watch._on_sample)
    for _ in range(5):
        clock.advance(1.0)
        sample("GPU-0", "GPU-2")
        watch.check()
    assert [(r.uuid, r.why is not None) for r in told] == [("GPU-1", True)]  # once
    assert len(pokes) == 1 and "GPU GPU-1 printed no statistics for 3s" in pokes[0]
    assert watch.metrics().to_json() == {"silent": 1, "silences": 1, "state": "up"}
    sample("GPU-1")  # heard again: said at once
    assert [(r.uuid, r.why) for r in told][-1] == ("GPU-1", None)
    assert watch.metrics().silent == 0


def test_a_withheld_device_is_granted_to_nobody_and_serves_the_queue_when_back():
    leases = lease_manager(FakeClock())
    uuid = leases.inventory.by_number(0).uuid
    leases.request(bob, {"gpu": 1})  # device 0, held: withholding leaves it to bob
    leases.withhold(uuid, "silent")
    assert leases.holder(uuid) == bob
    leases.release(bob)
    got = leases.request(alice, {"gpu": 7})
    assert uuid not in [d.uuid for d in got]
    granted = []
    leases.wait(alice, {"gpu": 1}, granted.append)
    assert granted == [] and claims(leases)[uuid]["withheld"] == "silent"
    leases.withhold(uuid, None)
    assert [d.uuid for d in granted[0]] == [uuid]


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}])


@async_test
async def test_a_gpu_that_falls_silent_is_withheld_and_the_inventory_read_at_once(scenario):
    async with gpu_running(scenario, inventory_every=3600) as h:
        services = h.services
        watch = [m for m in services.monitors if m.name == "inventory"][0]
        silent_uuid = h.uuids()[2]
        await until(lambda: all(not services.stats.view(u)["stale"] for u in h.uuids()))
        readings = watch.readings
        scenario.write(devices=[{}, {}, {"silent": True}, {}])
        await until(lambda: services.leases.holds[silent_uuid].withheld is not None)
        await until(lambda: watch.readings > readings)  # at once, not an hour on
        status, body = await h.call("/request?gpu=4")
        assert status == 409, body  # three free
        granted = await h.ok("/request?gpu=3")
        assert silent_uuid not in [g["uuid"] for g in granted]
        claim = (await h.ok("/status"))[silent_uuid]["claim"]
        assert claim["state"] == "free" and "printed no statistics" in claim["withheld"]
        metrics = (await h.http.fetch(h.url + "/metrics")).body.decode()
        assert "patroller_devices_silent 1.0" in metrics
        assert "patroller_silences_total 1.0" in metrics
        # Its rows come again: it may be granted again.
        scenario.write(devices=[{}, {}, {}, {}])
        await until(lambda: services.leases.holds[silent_uuid].withheld is None)
        assert [g["uuid"] for g in await h.ok("/request?gpu=1")] == [silent_uuid]


def test_each_silence_is_counted_and_said_with_how_long_the_device_was_quiet(caplog):
    devices = Inventory([Device(f"GPU-{n}", n) for n in range(2)])
    signals, clock = Signals(), FakeClock(100.0)
    told = []
    signals.device_silent.connect(lambda sender, record: told.append((sender, record)), weak=False)
    signals.device_gone.connect(lambda sender, record: told.append((sender, record)), weak=False)
    watch = SilenceWatch(devices, signals, interval=1.0, quiet=2.0, clock=clock)
    watch.reconfigure()
    signals.sample.connect(watch._on_sample)
    for _ in range(2):  # GPU-1 falls silent, is heard again, and falls silent again
        for _ in range(3):
            clock.advance(1.0)
            signals.sample.send(None, record=Sample("GPU-0", {}, 0.0))
            watch.check()
        signals.sample.send(None, record=Sample("GPU-1", {}, 0.0))
    watch.inventory = Inventory([*devices, Device("GPU-2", 2)])  # not told yet: never heard
    watch.check()
    assert watch.silences == 3 and all(sender is watch for sender, _ in told)
    said = [r.getMessage() for r in caplog.records if "granted to nobody" in r.getMessage()]
    assert said == [
        "GPU GPU-1 printed no statistics for 3s while the others did: granted to nobody until "
        "it is heard again; reading the inventory"
    ] * 2 + [
        "GPU GPU-2 printed no statistics for 0s while the others did: granted to nobody until "
        "it is heard again; reading the inventory"
    ]
    assert [
        r.getMessage()
        for r in caplog.records
        if "again" in r.getMessage() and "granted" not in r.getMessage()
    ] == ["GPU GPU-1 prints statistics again"] * 2
