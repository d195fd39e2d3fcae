"""The cycle collector on the daemon's schedule.

Python's cycle collector now and then walks every object the process holds (a full
collection): with thousands of processes on the GPUs, tens of milliseconds on the event loop,
several times a minute under load, each one a pause for every request in flight. Almost all
of those objects live as long as the daemon (its modules, its inventory, the processes it
watches), so walking them again finds nothing.

So what the daemon holds is frozen (`gc.freeze`): the collector leaves it out. It is frozen
after the daemon has started, and again after each full collection that Python makes by
itself: that one walked only what was made since the last, and what survived it is frozen
too. Every `Config.gc_refreeze_every` seconds everything is thawed, collected once (garbage
among the frozen objects is freed then) and frozen again.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

log = logging.getLogger(__name__)


class Heap:
    """Freezes the daemon's objects from `start()` (on the running loop) until `stop()`;
    `every` 0 leaves the collector as Python sets it."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.refreezes = 0  # thawed, collected and frozen again
        self.survivors_frozen = 0  # times the survivors of Python's own full collection were
        self.last_pause: float | None = None  # seconds the last refreeze took
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._freezing = False  # a freeze of survivors is on its way to the loop

    def start(self) -> None:
        if self.every <= 0:
            return
        self._loop = asyncio.get_running_loop()
        self.refreeze()
        gc.callbacks.append(self._collected)

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)
        if self._timer is not None:
            self._timer.cancel()
        self._loop = self._timer = None
        gc.unfreeze()

    def refreeze(self) -> None:
        """Thaw, collect everything once, freeze what is left; the next one in `every` s."""
        assert self._loop is not None
        began = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.last_pause = time.perf_counter() - began
        self.refreezes += 1
        log.debug(
            "heap: %d objects frozen after a full collection of %.1f ms",
            gc.get_freeze_count(),
            self.last_pause * 1000,
        )
        self._timer = self._loop.call_later(self.every, self.refreeze)

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        """After a full collection (in whichever thread made it), freeze its survivors on the
        loop: the next one walks only what is made after."""
        if phase == "stop" and info["generation"] == 2 and not self._freezing:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                self._freezing = True
                loop.call_soon_threadsafe(self._freeze_survivors)

    def _freeze_survivors(self) -> None:
        self._freezing = False
        if self._loop is not None:
            gc.freeze()
            self.survivors_frozen += 1
