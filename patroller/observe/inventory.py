"""The host's GPUs from `nvidia-smi -q -x`: read once at start (discovery), then again now and
then by the inventory watch (GPUs fall off the bus, or are added), always under a timeout: a
hung query is killed like a hung stream. While a GPU has MIG on, each reading also runs
`nvidia-smi -L` for its MIG devices' uuids (miguuids.py), which never fails the reading. Each
reading also says what it shows of every GPU's health (`health_read`)."""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from patroller.config import Config
from patroller.core.devices import Device, Inventory, InventoryChange
from patroller.core.throttle import Throttle
from patroller.durations import describe
from patroller.observe.child import status_text
from patroller.observe.miguuids import MigUuids
from patroller.observe.monitor import FAILING, IDLE, UP, InventoryMetrics, Monitor
from patroller.observe.nvsmi.discovery import Discovery, DiscoveryError, parse_inventory
from patroller.observe.signals import Signals
from patroller.observe.supervisor import OneShotChild

log = logging.getLogger(__name__)

HINT = "run with --test to try Patroller without a GPU"


class GpuHostError(Exception):
    """The GPUs cannot be discovered; the message is one line for the user."""


def command(nvidia_smi: str) -> list[str]:
    """The configured nvidia-smi command as argv (it may carry arguments of its own)."""
    return shlex.split(nvidia_smi)


def inventory_query(
    argv: list[str], env: Mapping[str, str] | None, config: Config
) -> OneShotChild:
    """`nvidia-smi -q -x`, killed after `discovery_timeout` s."""
    return OneShotChild([*argv, "-q", "-x"], env, config.discovery_timeout, config)


async def read_inventory(query: OneShotChild) -> Discovery:
    """One run of the query, parsed; GpuHostError says what went wrong."""
    answer = await query.run()
    name, shown = query.argv[0], " ".join(query.argv)
    if isinstance(answer.error, FileNotFoundError):
        raise GpuHostError(f"cannot list the GPUs: {name} was not found; {HINT}")
    if isinstance(answer.error, PermissionError):
        raise GpuHostError(f"cannot list the GPUs: {name} is not executable; {HINT}")
    if answer.error is not None:
        raise GpuHostError(
            f"cannot list the GPUs: cannot run {name}: "
            f"{answer.error.strerror or answer.error}; {HINT}"
        )
    if answer.timed_out:
        raise GpuHostError(
            f"cannot list the GPUs: `{shown}` did not answer in "
            f"{describe(query.timeout)}: killed; {HINT}"
        )
    if answer.stopped:
        raise GpuHostError(f"cannot list the GPUs: `{shown}` was stopped")
    if answer.status:
        raise GpuHostError(
            f"cannot list the GPUs: `{shown}` failed with "
            f"{status_text(answer.status)}: {answer.account()}; {HINT}"
        )
    try:
        found = parse_inventory(answer.output)
    except DiscoveryError as exc:
        raise GpuHostError(f"cannot list the GPUs: {exc}; {HINT}") from None
    for warning in found.warnings:
        log.warning("discovery: %s", warning)
    if not found.devices:
        raise GpuHostError(f"cannot list the GPUs: `{shown}` lists no GPU with a uuid; {HINT}")
    return found


async def discover(argv: list[str], env: Mapping[str, str] | None, config: Config) -> Discovery:
    """The GPUs at start; GpuHostError says why they cannot be listed."""
    return await read_inventory(inventory_query(argv, env, config))


def devices_of(found: Discovery) -> list[Device]:
    """The discovered devices, with their MIG instances."""
    return [
        replace(device, mig_instances=tuple(found.mig[device.uuid]))
        if found.mig.get(device.uuid)
        else device
        for device in found.devices
    ]


class InventoryWatch(Monitor):
    """Reads `nvidia-smi -q -x` again every `inventory_every` seconds, and soon after a stream
    says a device is gone (`device_gone`, or `poke()`), then sends `inventory_changed` with
    what changed. A reading that fails changes nothing, except `No devices were found`, which
    means every device is lost. `mig` gives the MIG instances their uuids (the one discovery
    used, so that a failing `-L` is logged once in all)."""

    name = "inventory"

    def __init__(
        self,
        inventory: Inventory,
        signals: Signals,
        argv: list[str],
        env: Mapping[str, str] | None,
        config: Config,
        mig: MigUuids | None = None,
    ) -> None:
        self.inventory = inventory
        self.signals = signals
        self.query = inventory_query(argv, env, config)
        self.mig = mig if mig is not None else MigUuids(argv, env, config)
        self.every = config.inventory_every
        self.soonest = config.rediscover_soonest
        self.readings = 0
        self.failures = 0
        self.changes = 0
        self._wake: asyncio.Event | None = None  # a poke, or stop()
        self._halt: asyncio.Event | None = None  # stop()
        self._task: asyncio.Future[None] | None = None
        self._last = time.monotonic()
        self._stopping = False
        self._failing = 0  # readings that failed since the last that worked
        self._failures_logged = Throttle(1, config.repeat_log_every)

    def start(self) -> None:
        self._wake, self._halt = asyncio.Event(), asyncio.Event()
        self._task = asyncio.ensure_future(self._run())
        self.signals.device_gone.connect(self._on_device_gone)

    def _on_device_gone(self, sender: Any, record: str) -> None:
        self.poke(record)

    async def stop(self, grace: float) -> None:
        """Stop reading; a reading in progress is ended. The loop is told to end, never
        cancelled (a cancellation that comes as the reading ends is lost before Python 3.12)."""
        self._stopping = True
        self.signals.device_gone.disconnect(self._on_device_gone)
        if self._wake is not None and self._halt is not None:
            self._wake.set()
            self._halt.set()
        await self.query.stop(grace)  # a reading in progress ends; none starts after
        await self.mig.stop(grace)
        if self._task is not None:
            await asyncio.wait([self._task])

    def metrics(self) -> InventoryMetrics:
        return InventoryMetrics(
            state=FAILING if self._failing else UP if self.query.running else IDLE,
            running=self.query.running,
            hangs=self.query.hangs,
            readings=self.readings,
            failures=self.failures,
            changes=self.changes,
            lost=sum(1 for d in self.inventory if d.lost),
            mig_list_failures=self.mig.failures,
        )

    def poke(self, why: str = "") -> None:
        """Read the inventory again soon (at most once per `soonest` seconds)."""
        if self._wake is not None and not self._wake.is_set():
            log.info("reading the GPU inventory again: %s", why[:200] or "asked")
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), self.every)
            except asyncio.TimeoutError:
                pass
            else:  # poked: not more often than `soonest`
                pause = min(self.soonest, self.every) - (time.monotonic() - self._last)
                if pause > 0:
                    await self._halted(pause)
            if self._stopping:
                return
            self._wake.clear()
            await self.read()

    async def _halted(self, seconds: float) -> None:
        """Wait `seconds`, or until stop()."""
        assert self._halt is not None
        try:
            await asyncio.wait_for(self._halt.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def read(self) -> InventoryChange:
        """One reading, applied to the inventory; what changed."""
        self._last = time.monotonic()
        self.readings += 1
        reading: Discovery | None = None
        try:
            reading = await read_inventory(self.query)
            found = await self.mig.attach(devices_of(reading))
        except GpuHostError as exc:
            if self._stopping:
                return InventoryChange()  # stopped mid-reading: not a failure
            if "No devices were found" not in str(exc) and "lists no GPU" not in str(exc):
                self.failures += 1
                self._failing += 1
                admitted, held = self._failures_logged.admit()
                if admitted:
                    log.warning(
                        "reading the GPU inventory again failed (%s); keeping it as it was%s",
                        exc,
                        f" ({held} more failures not logged)" if held else "",
                    )
                return InventoryChange()
            found = []
        self._failing = 0
        change = self.inventory.update(found)
        if change:
            self.changes += 1
            for uuid in change.lost:
                log.warning("GPU %s is gone from the host: lost, never granted", uuid)
            for uuid in change.added:
                device = self.inventory.get(uuid)
                log.warning(
                    "GPU %s (number %s) is on the host now", uuid, device.number if device else "?"
                )
            self.signals.inventory_changed.send(self, record=change)
        if reading is not None:
            self.signals.health_read.send(self, record=reading.health)
        return change
