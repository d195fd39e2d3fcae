"""The bodies of /status and /devices, serialized once and served many times.

/status changes with every sample and every lease event, and its `age`, `expires`, `stale` and
`processes_stale` move with the clock; it is rebuilt on demand when something changed or when it is older than
MAX_AGE, so a busy poller costs one serialization per change, not one per request.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, Optional

from patroller.core.devices import Inventory
from patroller.core.leases.manager import LeaseManager
from patroller.observe.idle import IdleWatch
from patroller.observe.stats import StatsStore, iso_time

MAX_AGE = 0.1  # seconds: how stale the clock-driven fields of a cached /status may be


def dumps(body: Any) -> bytes:
    """Compact JSON, as every answer is written."""
    return json.dumps(body, separators=(",", ":")).encode()


class StatusView:
    """The /status body, cached between changes."""

    def __init__(self, inventory: Inventory, leases: LeaseManager, stats: StatsStore,
                 clock: Callable[[], float] = time.monotonic, max_age: float = MAX_AGE,
                 idle: Optional[IdleWatch] = None) -> None:
        self.inventory = inventory
        self.leases = leases
        self.stats = stats
        self.idle = idle
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
        wall = time.time()
        for d in self.inventory:
            claim = {**claims[d.uuid], "processes_stale": self.stats.processes_stale(d.uuid)}
            expires = claim["expires"]
            claim["ends_at"] = iso_time(wall + expires) if expires is not None else None
            claim["idle_for"] = self.idle.idle_for(d.uuid) if self.idle is not None else None
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
        self._body = dumps(self.data())

    def data(self) -> Dict[str, Any]:
        """/devices as data."""
        return {d.uuid: d.info() for d in self.inventory}

    def invalidate(self) -> None:
        """The inventory changed."""
        self._body = dumps(self.data())

    def body(self) -> bytes:
        return self._body


def users_view(leases: LeaseManager, idle: Optional[IdleWatch]) -> Dict[str, Any]:
    """/users: per user, GPUs held, held with nothing running, used without asking, idle,
    requests waiting, and the limit that applies."""
    usage = leases.usage()
    waiting = leases.waiting_by_user()
    users: Dict[str, Any] = {}
    for user in sorted(set(usage) | set(waiting)):
        counts = usage.get(user, {"held": 0, "reserved_unused": 0, "unreserved": 0})
        held = leases.held_by(user)
        count, longest = waiting.get(user, (0, 0.0))
        users[user] = {
            **counts,
            "devices": [d.number for d in held],
            "idle": sum(1 for d in held if idle is not None and idle.idle_for(d.uuid) is not None),
            "waiting": count,
            "waited_max": round(longest, 3),
            "limit": leases.policy.limit_of(user),
        }
    return users
