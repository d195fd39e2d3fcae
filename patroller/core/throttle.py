"""A bound on how often something is logged: at most N events per window, the rest counted."""

from __future__ import annotations

import time
from collections.abc import Callable


class Throttle:
    """Lets `limit` events through per `window` seconds and counts the ones held back.

    The count of a window's held-back events is handed to the first event let through in a
    later window, so one log line can say how many were not logged.
    """

    def __init__(
        self, limit: int, window: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self._start: float | None = None
        self._passed = 0
        self._held = 0

    def admit(self) -> tuple[bool, int]:
        """(whether this event may be logged, how many were held back before it and not yet
        told)."""
        now = self.clock()
        told = 0
        if self._start is None or now - self._start >= self.window:
            told, self._held = self._held, 0
            self._start, self._passed = now, 0
        if self._passed < self.limit:
            self._passed += 1
            return True, told
        self._held += 1
        return False, 0
