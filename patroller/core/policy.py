"""The host's fair-use policy, as its administrator sets it: how many GPUs one user may hold,
how long a waiting request may be overtaken, how long a reservation may be asked for, and when
a held GPU counts as idle. Pure: the lease manager and the idle watch read it; it is built from
the configuration and the limits file (`patroller.config.policy_of`), again on SIGHUP.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional


@dataclass(frozen=True)
class Policy:
    """What the administrator allows. The defaults change nothing but the starvation bound."""

    max_per_user: Optional[int] = None  # devices one user may hold at once; None: unlimited
    limits: Mapping[str, Optional[int]] = field(default_factory=dict)  # per-user overrides
    starvation_bound: float = 600.0  # seconds a waiting request may be overtaken
    max_hold: float = 12 * 3600.0  # the longest reservation one may ask for (hold=<duration>)
    idle_sm: float = 5.0  # % of SM below which a held device is idle ...
    idle_memory_mib: float = 1024.0  # ... when its memory used is below this too
    idle_after: float = 1800.0  # seconds idle before /status says so
    idle_release: Optional[float] = None  # seconds idle, with no process, before it is released

    def limit_of(self, user: str) -> Optional[int]:
        """The most devices `user` may hold at once, or None."""
        return self.limits[user] if user in self.limits else self.max_per_user
