"""The cycle collector on the daemon's schedule.

Python's cycle collector now and then walks every object the process holds (a full
collection): with thousands of processes on the GPUs, tens of milliseconds on the event loop,
several times a minute under load, each one a pause for every request in flight. Almost all
of those objects live as long as the daemon (its modules, its inventory, the processes it
watches), so walking them again finds nothing. After the daemon has started, its objects are
frozen (`gc.freeze`): the collector leaves them out and walks only what was made since. Every
`Config.gc_refreeze_every` seconds they are thawed, collected once (what became garbage among
them is freed then) and frozen again: one full collection in that time, not one every few
seconds.
"""
from __future__ import annotations

import gc
import logging
import time
from typing import Any, Optional

from tornado.ioloop import IOLoop

log = logging.getLogger(__name__)


class Heap:
    """Freezes the daemon's objects at `start()` and again every `every` s (0: never; the
    collector is left as Python sets it); `stop()` thaws them."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.refreezes = 0  # full collections made here
        self.last_pause: Optional[float] = None  # seconds the last one took
        self._timer: Optional[Any] = None

    def start(self) -> None:
        if self.every > 0:
            self.refreeze()

    def stop(self) -> None:
        if self._timer is not None:
            IOLoop.current().remove_timeout(self._timer)
            self._timer = None
        if self.refreezes:
            gc.unfreeze()

    def refreeze(self) -> None:
        """Thaw, collect everything once, freeze what is left; the next one in `every` s."""
        began = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.last_pause = time.perf_counter() - began
        self.refreezes += 1
        log.debug("heap: %d objects frozen after a full collection of %.1f ms",
                  gc.get_freeze_count(), self.last_pause * 1000)
        self._timer = IOLoop.current().call_later(self.every, self.refreeze)
