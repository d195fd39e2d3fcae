"""A device that falls silent: its dmon rows stop while the other devices' go on, and no stream
says it is lost (a GPU gone from the bus can do this). Until the next inventory reading it
would look free, with its last figures.

Every sampling interval, a device that printed nothing for `quiet` seconds (two intervals)
while another device printed within that time is silent: the watch says so once (a warning),
has the inventory read at once (`device_gone`, as a stream that says a device is lost does),
and tells the lease rules to grant it to nobody (`device_silent`). When its rows come again it
says so, and the device may be granted again. When every device is quiet, the stream itself is
down or hung: that is the stream's staleness (stats.py), not any one device's silence.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from patroller.core.devices import Inventory
from patroller.durations import describe
from patroller.observe.monitor import UP, Monitor, SilenceMetrics
from patroller.observe.signals import Sample, Signals, Silence

log = logging.getLogger(__name__)


def silent(
    heard: Mapping[str, float], devices: Iterable[str], now: float, quiet: float
) -> set[str]:
    """The devices last heard more than `quiet` s ago, while another was heard within it."""
    if not any(now - when <= quiet for when in heard.values()):
        return set()
    return {uuid for uuid in devices if now - heard.get(uuid, float("-inf")) > quiet}


class SilenceWatch(Monitor):
    """Finds silent devices among those dmon watches (see the module's docstring)."""

    name = "silence"

    def __init__(
        self,
        inventory: Inventory,
        signals: Signals,
        interval: float,
        quiet: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inventory = inventory
        self.signals = signals
        self.interval = interval
        self.quiet = quiet
        self.clock = clock
        self.silences = 0  # devices found silent, in all
        self._heard: dict[str, float] = {}  # uuid -> clock() of its last row
        self._silent: set[str] = set()
        self._task: asyncio.Future[None] | None = None
        self._halt: asyncio.Event | None = None

    def start(self) -> None:
        now = self.clock()
        for device in self.inventory:  # each device has `quiet` s from now to be heard
            self._heard.setdefault(device.uuid, now)
        self.signals.sample.connect(self._on_sample)
        self._halt = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self, grace: float) -> None:
        self.signals.sample.disconnect(self._on_sample)
        if self._halt is not None:
            self._halt.set()  # told to end, never cancelled (see crosscheck.py)
        if self._task is not None:
            await asyncio.wait([self._task])

    def reconfigure(self) -> None:
        """Devices were added, lost or renumbered: new ones get `quiet` s to be heard."""
        now = self.clock()
        for device in self.inventory:
            self._heard.setdefault(device.uuid, now)

    def metrics(self) -> SilenceMetrics:
        return SilenceMetrics(state=UP, silent=len(self._silent), silences=self.silences)

    def check(self) -> set[str]:
        """Look now: tell of devices that fell silent or were heard again; the silent ones."""
        now = self.clock()
        watched = [d.uuid for d in self.inventory if not d.lost]
        found = silent(
            {u: self._heard[u] for u in watched if u in self._heard}, watched, now, self.quiet
        )
        for uuid in sorted(found - self._silent):
            self.silences += 1
            said = (
                f"GPU {uuid} printed no statistics for "
                f"{describe(now - self._heard.get(uuid, now))} while the others did"
            )
            log.warning(
                "%s: granted to nobody until it is heard again; reading the inventory", said
            )
            self.signals.device_silent.send(self, record=Silence(uuid, said))
            self.signals.device_gone.send(self, record=said)
        for uuid in sorted(self._silent - found):
            log.warning("GPU %s prints statistics again", uuid)
            self.signals.device_silent.send(self, record=Silence(uuid, None))
        self._silent = found
        return found

    def _on_sample(self, sender: Any, record: Sample) -> None:
        self._heard[record.uuid] = self.clock()
        if record.uuid in self._silent:
            self.check()  # heard again: grantable at once, not at the next look

    async def _run(self) -> None:
        assert self._halt is not None
        while not self._halt.is_set():
            try:
                await asyncio.wait_for(self._halt.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            if self._halt.is_set():
                return
            try:
                self.check()
            except Exception:  # a receiver's bug must not end the watch
                log.exception("silence watch failed")
