"""Test mode: eight synthetic devices with live-looking statistics, for working without a GPU."""
from __future__ import annotations

import random
import time
import uuid as uuidlib
from typing import Dict, List, Optional

from tornado.ioloop import PeriodicCallback

from patroller.core.devices import Device, Inventory
from patroller.observe.monitor import Monitor
from patroller.observe.signals import ProcessList, Sample, Signals, Value

_NAMESPACE = uuidlib.UUID("6c1f3e0a-6d2c-4b8e-9a57-0d7f1e3c5b21")
# An 8-GPU HGX board: PCI buses as such hosts show them, in index (bus) order.
_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


def synthetic_inventory(count: int) -> Inventory:
    """The test-mode devices (`test_devices` of them in the daemon): stable uuids, so that they
    are the same after a restart."""
    devices = []
    for number in range(count):
        bus = _BUSES[number] if number < len(_BUSES) else format(number, "02X")
        devices.append(Device(
            uuid="GPU-" + str(uuidlib.uuid5(_NAMESPACE, f"patroller-test-{number}")),
            number=number,
            name="NVIDIA A100-SXM4-80GB",
            brand="NVIDIA",
            arch="Ampere",
            pci_address=f"00000000:{bus}:00.0",
            total_mem="81920 MiB",
            group="gpu",
            minor_number=number,
            mig_mode="Disabled",
        ))
    return Inventory(devices)


class SyntheticMonitor(Monitor):
    """Emits a dmon-like sample per device every interval, wandering around idle values.

    Test mode has no GPU processes, so each interval also says every device's (empty) process
    list is current: ownership there is never stale.
    """

    name = "synthetic"

    def __init__(self, inventory: Inventory, signals: Signals, interval: float,
                 seed: Optional[int] = None) -> None:
        self.inventory = inventory
        self.signals = signals
        self.interval = interval
        self._random = random.Random(seed)
        self._state: Dict[str, Dict[str, float]] = {
            d.uuid: {"power": 62.0, "gtemp": 33.0, "mtemp": 38.0, "sm": 0.0, "mem": 0.0,
                     "fb": 0.0}
            for d in inventory
        }
        self._timer: Optional[PeriodicCallback] = None
        self.samples = 0

    def start(self) -> None:
        """Sample now, then every interval, on the current IOLoop."""
        self.sample()
        self._timer = PeriodicCallback(self._tick, self.interval * 1000)
        self._timer.start()

    async def stop(self, grace: float) -> None:
        """Stop sampling (at once: there is no child to wait for)."""
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def metrics(self) -> Dict[str, object]:
        return {"samples": self.samples}

    def _tick(self) -> None:
        self.sample()

    def sample(self) -> List[Sample]:
        """Emit one sample per device."""
        now = time.time()
        samples = []
        for device in self.inventory:
            values = self._wander(self._state[device.uuid])
            record = Sample(uuid=device.uuid, values=values, time=now)
            self.signals.sample.send(self, record=record)
            samples.append(record)
        self.samples += len(samples)
        listed = ProcessList(tuple(d.uuid for d in self.inventory), now)
        self.signals.processes_listed.send(self, record=listed)
        return samples

    def _wander(self, state: Dict[str, float]) -> Dict[str, Value]:
        step = self._random.uniform
        state["sm"] = min(100.0, max(0.0, state["sm"] + step(-8, 8)))
        state["mem"] = min(100.0, max(0.0, state["sm"] * 0.6 + step(-3, 3)))
        state["power"] = 60 + state["sm"] * 3.4 + step(-2, 2)
        state["gtemp"] = min(85.0, max(28.0, state["gtemp"] + (30 + state["sm"] * 0.45 - state["gtemp"]) * 0.2))
        state["mtemp"] = state["gtemp"] + 5
        state["fb"] = min(81000.0, max(0.0, state["fb"] + step(-500, 500)))
        return {
            "power": round(state["power"]),
            "gtemp": round(state["gtemp"]),
            "mtemp": round(state["mtemp"]),
            "sm": round(state["sm"]),
            "mem": round(state["mem"]),
            "enc": 0,
            "dec": 0,
            "jpg": 0,
            "ofa": 0,
            "mclk": 1593,
            "pclk": 210 if state["sm"] < 1 else 1410,
            "fb": round(state["fb"]),
        }
