"""Test mode: eight synthetic devices with live-looking statistics, for working without a GPU."""

from __future__ import annotations

import random
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass

from tornado.ioloop import PeriodicCallback

from patroller.core.devices import Device, Inventory
from patroller.observe.monitor import UP, Monitor, SyntheticMetrics
from patroller.observe.signals import (
    GpuProcess,
    ProcessList,
    ProcessSamples,
    Sample,
    Signals,
    Value,
)
from patroller.observe.testprocesses import Running, SyntheticProcesses

_NAMESPACE = uuidlib.UUID("6c1f3e0a-6d2c-4b8e-9a57-0d7f1e3c5b21")
# An 8-GPU HGX board: PCI buses as such hosts show them, in index (bus) order.
_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


def synthetic_inventory(count: int) -> Inventory:
    """The test-mode devices (`test_devices` of them in the daemon): stable uuids, so that they
    are the same after a restart."""
    devices = []
    for number in range(count):
        bus = _BUSES[number] if number < len(_BUSES) else format(number, "02X")
        devices.append(
            Device(
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
            )
        )
    return Inventory(devices)


@dataclass(frozen=True)
class Model:
    """What one GPU model's figures look like, idle and busy, within its limits."""

    memory_mib: float
    idle_power: float  # W
    max_power: float  # W: its power limit
    busy_sm: float  # % a training job keeps it at
    busy_fb: float  # MiB such a job uses
    max_temp: float  # degrees C


# Test mode's devices are A100-SXM4-80GB: 400 W, 81920 MiB, about 55 W idle.
MODELS = {"NVIDIA A100-SXM4-80GB": Model(81920, 55, 400, 85, 38000, 85)}
DEFAULT_MODEL = MODELS["NVIDIA A100-SXM4-80GB"]
PULL = 0.2  # how far each sample moves toward where the device is heading


class SyntheticMonitor(Monitor):
    """Emits a dmon-like sample per device every interval: a free device near idle (SM at most
    a few %, no memory used, idle power), a held one busy as if its job ran (test mode has no
    processes), each within its model's limits, moving toward its level a fifth of the way per
    sample with a little noise, so a device that changes hands settles within seconds.

    Test mode has no GPU processes unless `--test-processes` (testprocesses.py: then the
    statistics follow them, not the holds), so each interval also says every device's process
    list is current: ownership there is never stale.
    """

    name = "synthetic"

    def __init__(
        self,
        inventory: Inventory,
        signals: Signals,
        interval: float,
        seed: int | None = None,
        held: Callable[[str], bool] = lambda uuid: False,
        processes: SyntheticProcesses | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inventory = inventory
        self.signals = signals
        self.interval = interval
        self.held = held  # whether the device is held now (the lease manager's word)
        # --test-processes: the synthetic processes, whose computing the statistics follow
        self.processes = processes
        self.clock = clock
        self._running: dict[str, dict[int, Running]] = {}  # uuid -> pid -> what ran last tick
        self._random = random.Random(seed)
        self._state: dict[str, dict[str, float]] = {
            d.uuid: {"power": _model(d).idle_power, "gtemp": 31.0, "sm": 0.0, "fb": 0.0}
            for d in inventory
        }
        self._timer: PeriodicCallback | None = None
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

    def metrics(self) -> SyntheticMetrics:
        return SyntheticMetrics(state=UP, samples=self.samples)

    def _tick(self) -> None:
        self.sample()

    def sample(self) -> list[Sample]:
        """Emit one sample per device."""
        now = time.time()
        running = self._processes(now)
        samples = []
        for device in self.inventory:
            state = self._state.setdefault(
                device.uuid,
                {"power": _model(device).idle_power, "gtemp": 31.0, "sm": 0.0, "fb": 0.0},
            )
            if running is None:  # no processes: a held device looks busy
                busy = self.held(device.uuid)
                values = self._wander(state, _model(device), busy, None)
            else:
                here = running.get(device.uuid, ())
                values = self._wander(
                    state, _model(device), any(r.computing for r in here), sum(r.fb for r in here)
                )
            record = Sample(uuid=device.uuid, values=values, time=now)
            self.signals.sample.send(self, record=record)
            samples.append(record)
        self.samples += len(samples)
        listed = ProcessList(tuple(d.uuid for d in self.inventory), now)
        self.signals.processes_listed.send(self, record=listed)
        return samples

    def _processes(self, now: float) -> dict[str, tuple[Running, ...]] | None:
        """With --test-processes: each device's synthetic processes now, the ones that started
        and ended since the last tick told, and their figures; None without."""
        if self.processes is None:
            return None
        running = self.processes.at(self.clock())
        figures: dict[str, dict[int, dict[str, Value]]] = {}
        for device in self.inventory:
            before = self._running.get(device.uuid, {})
            now_here = {r.pid: r for r in running.get(device.uuid, ())}
            for pid in before.keys() - now_here.keys():
                self.signals.process_ended.send(
                    self, record=GpuProcess(device.uuid, pid, "C", "python")
                )
            for pid in sorted(now_here.keys() - before.keys()):
                self.signals.process_started.send(
                    self, record=GpuProcess(device.uuid, pid, "C", "python")
                )
            self._running[device.uuid] = now_here
            if now_here:
                figures[device.uuid] = {
                    pid: {"fb": round(r.fb), "sm": None} for pid, r in now_here.items()
                }
        self.signals.process_sampled.send(self, record=ProcessSamples(figures, now))
        return running

    def _wander(
        self, state: dict[str, float], model: Model, busy: bool, held_fb: float | None
    ) -> dict[str, Value]:
        noise = self._random.uniform
        sm_to, fb_to = (model.busy_sm, model.busy_fb) if busy else (0.0, 0.0)
        if held_fb is not None:  # the processes' own memory, computing or not
            fb_to = held_fb
        state["sm"] = _clamp(
            state["sm"]
            + (sm_to - state["sm"]) * PULL
            + (noise(-4, 4) if busy else noise(-0.3, 0.3)),
            0,
            100,
        )
        state["fb"] = _clamp(
            state["fb"] + (fb_to - state["fb"]) * PULL + (noise(-300, 300) if fb_to else 0),
            0,
            model.memory_mib,
        )
        power_to = model.idle_power + (model.max_power - model.idle_power) * state["sm"] / 100
        state["power"] = _clamp(
            state["power"] + (power_to - state["power"]) * PULL + noise(-2, 2),
            model.idle_power * 0.9,
            model.max_power,
        )
        temp_to = 30 + state["sm"] * 0.4
        state["gtemp"] = _clamp(
            state["gtemp"] + (temp_to - state["gtemp"]) * PULL, 28, model.max_temp
        )
        return {
            "power": round(state["power"]),
            "gtemp": round(state["gtemp"]),
            "mtemp": round(state["gtemp"]) + 5,
            "sm": round(state["sm"]),
            "mem": round(_clamp(state["sm"] * 0.6 + noise(-2, 2), 0, 100)) if busy else 0,
            "enc": 0,
            "dec": 0,
            "jpg": 0,
            "ofa": 0,
            "mclk": 1593,
            "pclk": 210 if state["sm"] < 1 else 1410,
            "fb": round(state["fb"]),
        }


def _model(device: Device) -> Model:
    return MODELS.get(device.name or "", DEFAULT_MODEL)


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))
