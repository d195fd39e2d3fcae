"""What the watches of a scheduler's allocations share (Slurm's job map, the kubelet's
pod-resources): read every `every` seconds off the event loop, tell of each device whose
allocation changed (`scheduler_allocation`, with the source), and, when a reading fails, keep the
allocations known and show as failing until one succeeds: a GPU a job or a pod holds is never
handed out because a read failed.

Each watch says what a reading is (`read`), with `failed` and `read_well` to report how it went,
and hands what it found, by device uuid, to `tell`.
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from typing import Any

from patroller.core.devices import Inventory
from patroller.observe.monitor import FAILING, UP, AllocationMetrics, Monitor
from patroller.observe.signals import Allocated, Signals

log = logging.getLogger(__name__)


class AllocationWatch(Monitor):
    """A source of allocations, read again and again (see above)."""

    source: str  # the lease manager's name for it: "slurm", "kubernetes"

    def __init__(
        self, inventory: Inventory, signals: Signals, every: float, what: str, state: str = UP
    ) -> None:
        self.inventory = inventory
        self.signals = signals
        self.every = every
        self.what = what  # in the log: "the Slurm job map /run/...", "the kubelet's ..."
        self.readings = 0
        self.failures = 0
        self._state = state
        self._told: dict[str, Any] = {}  # uuid -> the allocation last told
        self._task: asyncio.Future[None] | None = None
        self._halt: asyncio.Event | None = None

    @abstractmethod
    async def read(self) -> None:
        """Read the source now (off the loop), report how it went, and `tell` what it says."""

    def closed(self) -> None:
        """Let go of what the watch holds, once stopped. Nothing by default."""

    def start(self) -> None:
        self._halt = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self, grace: float) -> None:
        if self._halt is not None:
            self._halt.set()  # told to end, never cancelled (see crosscheck.py)
        if self._task is not None:
            await asyncio.wait([self._task])
        self.closed()

    def metrics(self) -> AllocationMetrics:
        return AllocationMetrics(
            state=self._state,
            readings=self.readings,
            failures=self.failures,
            allocated=len(self._told),
        )

    def failed(self, why: object, anew: bool = False) -> None:
        """A reading failed: the allocations known are kept; said once until one succeeds, or
        again where `anew` (the watch's own reason to fail changed)."""
        self.failures += 1
        if self._state != FAILING or anew:
            log.warning("cannot read %s: %s; the allocations known are kept", self.what, why)
        self._state = FAILING

    def read_well(self, state: str = UP) -> None:
        """A reading succeeded (`state`: UP, or IDLE where there was nothing to read)."""
        if self._state == FAILING:
            log.warning("%s: read again", self.what)
        self._state = state
        self.readings += 1

    def tell(self, wanted: dict[str, Any]) -> None:
        """Tell of every device whose allocation is not what was last told (`wanted`: the
        allocation of every device the source lists, by uuid)."""
        for uuid in [u for u in self._told if u not in wanted]:
            del self._told[uuid]
            self.signals.scheduler_allocation.send(self, record=Allocated(uuid, None, self.source))
        for uuid, allocation in wanted.items():
            if self._told.get(uuid) != allocation:
                self._told[uuid] = allocation
                self.signals.scheduler_allocation.send(
                    self, record=Allocated(uuid, allocation, self.source)
                )

    async def _run(self) -> None:
        assert self._halt is not None
        while not self._halt.is_set():
            try:
                await self.read()
            except Exception:  # a receiver's bug must not end the watch
                log.exception("the watch of %s failed", self.what)
            try:
                await asyncio.wait_for(self._halt.wait(), self.every)
            except asyncio.TimeoutError:
                pass
