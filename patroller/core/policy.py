"""The host's fair-use policy, as its administrator sets it: how many GPUs one user may hold,
how long a waiting request may be overtaken, how long a reservation may be asked for, and when
a held GPU counts as idle. Pure: the lease manager and the idle watch read it; it is built from
the configuration and the limits file (`patroller.config.policy_of`), again on SIGHUP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Policy:
    """What the administrator allows. Built from Config (`patroller.config.policy_of`), which
    holds the defaults: none is repeated here."""

    max_per_user: int | None  # devices one user may hold at once; None: unlimited
    starvation_bound: float  # seconds a waiting request may be overtaken
    max_hold: float  # the longest reservation one may ask for (hold=<duration>)
    idle_sm: float  # % of SM below which a held device is idle ...
    idle_memory_mib: float  # ... when its memory used is below this too
    idle_after: float  # seconds idle before /status says so
    idle_release: float | None  # seconds idle, with no process, before it is released
    limits: Mapping[str, int | None] = field(default_factory=dict)  # per-user overrides
    # host accounts (uids) whose holds count by identity alone (core/leases/limits.py)
    uncounted_uids: frozenset[int] = frozenset()

    def limit_of(self, user: str) -> int | None:
        """The most devices `user` may hold at once, or None."""
        return self.limits.get(user, self.max_per_user)
