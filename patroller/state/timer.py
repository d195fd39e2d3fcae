"""Drives lease expiry from the event loop: one timer, always set to the next deadline."""

from __future__ import annotations

from typing import Any

from tornado.ioloop import IOLoop

from patroller.core.leases import LeaseManager


class ExpiryTimer:
    """Keeps one IOLoop timeout at the lease manager's next deadline, so expiry is on time."""

    def __init__(self, leases: LeaseManager) -> None:
        self.leases = leases
        self._handle: Any | None = None
        self._at: float | None = None
        self._loop: IOLoop | None = None

    def start(self) -> None:
        """Follow the manager's changes on the current loop."""
        self._loop = IOLoop.current()
        self.leases.on_change(self.reschedule)
        self.reschedule()

    def stop(self) -> None:
        """Stop expiring."""
        self._cancel()
        self._loop = None

    def reschedule(self) -> None:
        """Move the timer to the next deadline, if that changed."""
        deadline = self.leases.next_deadline()
        if self._loop is None or deadline == self._at:
            return
        self._cancel()
        if deadline is not None:
            delay = max(0.0, deadline - self.leases.clock())
            self._handle = self._loop.call_later(delay, self._fire)
            self._at = deadline

    def _cancel(self) -> None:
        if self._handle is not None and self._loop is not None:
            self._loop.remove_timeout(self._handle)
        self._handle, self._at = None, None

    def _fire(self) -> None:
        self._handle, self._at = None, None
        self.leases.expire()
        self.reschedule()
