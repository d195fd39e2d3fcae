"""The two endpoints pollers ask most, /devices and /status, as Tornado answers them (the fast
lane, fastlane.py, answers their simplest requests with the same bodies and headers): each
carries the inventory's version, /devices as its ETag (a matching If-None-Match is answered
304) and /status as X-Devices-ETag, so that a fleet daemon asks /devices only when it changed."""

from __future__ import annotations

from collections.abc import Awaitable

from patroller.http.handlers import View


class DevicesHandler(View):
    def get(self) -> None:
        self.send(self.api.devices.body())

    def compute_etag(self) -> str | None:
        """The view's own (Tornado sends it, and answers a matching If-None-Match with 304)."""
        return self.api.devices.etag


class StatusHandler(View):
    def get(self) -> Awaitable[None] | None:
        self.set_header("X-Devices-ETag", self.api.devices.etag)  # /devices' version now
        hidden = self.api.hiding
        if hidden is None:
            self.send(self.api.status.body())
            return None
        return self.shown_to_caller(hidden.status_body)
