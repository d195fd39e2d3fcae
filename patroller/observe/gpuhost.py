"""GPU host mode: discover the devices with `nvidia-smi -q -x`, then watch them with dmon/pmon,
read the inventory again now and then (GPUs fall off the bus, or are added), and cross-check the
processes of devices whose pmon cannot attribute them."""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import shlex
import subprocess
import time
from dataclasses import replace
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

from patroller.core.devices import Device, Inventory, InventoryChange, MigInstance
from patroller.observe.signals import Signals
from patroller.observe.nvsmi.discovery import Discovery, DiscoveryError, parse_inventory
from patroller.observe.monitors import INTERVAL, DmonMonitor, PmonMonitor

log = logging.getLogger(__name__)

__all__ = ["INTERVAL", "GpuHostError", "InventoryWatch", "Unattributed", "command", "devices",
           "discover", "monitors", "query"]

DISCOVERY_TIMEOUT = 120.0  # one query has been seen to take 15 s on a large host
HINT = "run with --test to try Patroller without a GPU"
REDISCOVER_EVERY = 60.0  # seconds between readings of the inventory
REDISCOVER_SOONEST = 5.0  # seconds at least between readings asked for by a failing stream
BUSY_MIB = 64  # MiB used on a device with no process listed: someone computes there unseen


class GpuHostError(Exception):
    """The GPUs cannot be discovered; the message is one line for the user."""


def command(nvidia_smi: str) -> List[str]:
    """The configured nvidia-smi command as argv (it may carry arguments of its own)."""
    return shlex.split(nvidia_smi)


def _one_line(text: str, limit: int = 300) -> str:
    words = " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return words if len(words) <= limit else words[:limit] + "..."


def query(argv: List[str], env: Optional[Mapping[str, str]] = None,
          timeout: float = DISCOVERY_TIMEOUT) -> Discovery:
    """Run `nvidia-smi -q -x` (blocking) and parse it; GpuHostError says what went wrong."""
    shown = " ".join([*argv, "-q", "-x"])
    try:
        result = subprocess.run([*argv, "-q", "-x"], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, errors="replace",
                                timeout=timeout, env=None if env is None else dict(env))
    except FileNotFoundError:
        raise GpuHostError(f"cannot list the GPUs: {argv[0]} was not found; {HINT}") from None
    except PermissionError:
        raise GpuHostError(f"cannot list the GPUs: {argv[0]} is not executable; {HINT}") from None
    except subprocess.TimeoutExpired:
        raise GpuHostError(f"cannot list the GPUs: `{shown}` did not answer in "
                           f"{timeout:.0f} s; {HINT}") from None
    if result.returncode != 0:
        said = _one_line(result.stderr) or _one_line(result.stdout) or "nothing"
        raise GpuHostError(f"cannot list the GPUs: `{shown}` failed with status "
                           f"{result.returncode}: {said}; {HINT}")
    try:
        found = parse_inventory(result.stdout)
    except DiscoveryError as exc:
        raise GpuHostError(f"cannot list the GPUs: {exc}; {HINT}") from None
    for warning in found.warnings:
        log.warning("discovery: %s", warning)
    if not found.devices:
        raise GpuHostError(f"cannot list the GPUs: `{shown}` lists no GPU with a uuid; {HINT}")
    return found


async def discover(argv: List[str], env: Optional[Mapping[str, str]] = None) -> Discovery:
    """`query` off the event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(query, argv, env))


def devices(found: Discovery) -> List[Device]:
    """The discovered devices, with their MIG instances."""
    out = []
    for device in found.devices:
        instances = tuple(MigInstance(m.index, m.gpu_instance_id, m.compute_instance_id,
                                      m.memory_mib) for m in found.mig.get(device.uuid) or ())
        out.append(replace(device, mig_instances=instances) if instances else device)
    return out


class InventoryWatch:
    """Reads `nvidia-smi -q -x` again every `every` seconds, and soon after `poke()` (a stream
    said a device is gone), then tells `on_change` what changed. A reading that fails changes
    nothing, except `No devices were found`, which means every device is lost."""

    def __init__(self, inventory: Inventory, argv: List[str],
                 env: Optional[Mapping[str, str]] = None, every: float = REDISCOVER_EVERY,
                 soonest: float = REDISCOVER_SOONEST) -> None:
        self.inventory = inventory
        self.argv = argv
        self.env = env
        self.every = every
        self.soonest = soonest
        self.on_change: Optional[Callable[[InventoryChange], None]] = None
        self.readings = 0
        self.failures = 0
        self.changes = 0
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional["asyncio.Future[None]"] = None
        self._last = time.monotonic()
        self._reported = 0.0

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self, grace: float = 0.5) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def metrics(self) -> Dict[str, object]:
        """Counters for /metrics."""
        return {"readings": self.readings, "failures": self.failures, "changes": self.changes,
                "lost": sum(1 for d in self.inventory if d.lost)}

    def poke(self, why: str = "") -> None:
        """Read the inventory again soon (at most once per `soonest` seconds)."""
        if self._wake is not None and not self._wake.is_set():
            log.info("reading the GPU inventory again: %s", why[:200] or "asked")
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.every)
            except asyncio.TimeoutError:
                pass
            else:  # poked: not more often than `soonest`
                pause = min(self.soonest, self.every) - (time.monotonic() - self._last)
                if pause > 0:
                    await asyncio.sleep(pause)
            self._wake.clear()
            await self.read()

    async def read(self) -> InventoryChange:
        """One reading, applied to the inventory; what changed."""
        self._last = time.monotonic()
        self.readings += 1
        try:
            found = devices(await discover(self.argv, self.env))
        except GpuHostError as exc:
            if "No devices were found" not in str(exc) and "lists no GPU" not in str(exc):
                self.failures += 1
                if time.monotonic() - self._reported >= 60:
                    self._reported = time.monotonic()
                    log.warning("reading the GPU inventory again failed (%s); keeping it as "
                                "it was", exc)
                return InventoryChange()
            found = []
        change = self.inventory.update(found)
        if change:
            self.changes += 1
            for uuid in change.lost:
                log.warning("GPU %s is gone from the host: lost, never granted", uuid)
            for uuid in change.added:
                device = self.inventory.get(uuid)
                log.warning("GPU %s (number %s) is on the host now", uuid,
                            device.number if device else "?")
            if self.on_change is not None:
                self.on_change(change)
        return change


class Unattributed:
    """The devices whose processes pmon cannot name now: MIG-enabled ones (pmon gives no
    per-process rows in MIG mode), and "blind" ones: busy (SM use, or more than BUSY_MIB of
    memory used) while pmon lists no process on them. A blind device stays one until pmon
    lists a process on it. The cross-check queries the processes of these devices."""

    def __init__(self, inventory: Inventory, busy: Callable[[str], bool], pmon: PmonMonitor) -> None:
        self.inventory = inventory
        self.busy = busy
        self.pmon = pmon
        self.blind: Set[str] = set()

    def __call__(self) -> Set[str]:
        seen = self.pmon.attributed()
        found = set()
        for device in self.inventory.present():
            if device.uuid in seen:
                self.blind.discard(device.uuid)
            elif device.mig:
                found.add(device.uuid)
            elif device.uuid in self.blind or self.busy(device.uuid):
                self.blind.add(device.uuid)
                found.add(device.uuid)
        return found


def monitors(inventory: Inventory, signals: Signals, argv: List[str],
             env: Optional[Mapping[str, str]] = None, silence: Optional[float] = None,
             startup: Optional[float] = None) -> Tuple[DmonMonitor, PmonMonitor]:
    """The dmon and pmon monitors over every device; a stream silent for `silence` s is hung."""
    base = dict(os.environ if env is None else env)
    return (DmonMonitor(inventory, signals, argv, base, silence=silence, startup=startup),
            PmonMonitor(inventory, signals, argv, base, silence=silence, startup=startup))
