"""The bodies of /status and /devices, serialized once and served many times.

/status changes with every sample and every lease event, and its `age`, `expires`, `stale` and
`processes_stale` move with the clock; it is rebuilt on demand when something changed or when it is older than
MAX_AGE, so a busy poller costs one serialization per change, not one per request.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, Optional

from .devices import Inventory
from .leases import LeaseManager
from .stats import StatsStore

MAX_AGE = 0.1  # seconds: how stale the clock-driven fields of a cached /status may be


def dumps(body: Any) -> bytes:
    """Compact JSON, as every answer is written."""
    return json.dumps(body, separators=(",", ":")).encode()


class StatusView:
    """The /status body, cached between changes."""

    def __init__(self, inventory: Inventory, leases: LeaseManager, stats: StatsStore,
                 clock: Callable[[], float] = time.monotonic, max_age: float = MAX_AGE) -> None:
        self.inventory = inventory
        self.leases = leases
        self.stats = stats
        self.clock = clock
        self.max_age = max_age
        self.builds = 0  # how many times the body was serialized
        self._body: Optional[bytes] = None
        self._built = 0.0
        leases.subscribe(self.invalidate)
        stats.subscribe(self.invalidate)

    def invalidate(self) -> None:
        """Something changed: build the body again when it is next asked for."""
        self._body = None

    def data(self) -> Dict[str, Any]:
        """/status as data."""
        claims = self.leases.claims()
        data = {}
        for d in self.inventory:
            claim = {**claims[d.uuid], "processes_stale": self.stats.processes_stale(d.uuid)}
            claim["process_detail"] = [{**p, **self.stats.process_view(d.uuid, p["pid"])}
                                       for p in claim["process_detail"]]
            data[d.uuid] = {**self.stats.view(d.uuid), "claim": claim}
        return data

    def body(self) -> bytes:
        """/status as bytes, at most MAX_AGE old and never older than the last change."""
        now = self.clock()
        if self._body is None or now - self._built >= self.max_age:
            self._body, self._built = dumps(self.data()), now
            self.builds += 1
        return self._body


class DevicesView:
    """The /devices body, built again when the inventory changes (`invalidate`)."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self._body = dumps({d.uuid: d.info() for d in inventory})

    def invalidate(self) -> None:
        """The inventory changed."""
        self._body = dumps({d.uuid: d.info() for d in self.inventory})

    def body(self) -> bytes:
        return self._body
