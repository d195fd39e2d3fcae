"""The host's fair-use policy, as its administrator sets it: how many GPUs one user may hold,
how long a waiting request may be overtaken, how long a reservation may be asked for, and when
a held GPU counts as idle. Pure: the lease manager and the idle watch read it; `main` builds it
from the configuration and the limits file, and builds it again on SIGHUP.

The limits file is a JSON object of per-user overrides of --max-per-user, by user (the `user` of
the identity: an e-mail, a host account, `container:<id>`); null means no limit for that user:

    {"alice@example.org": 4, "bob@example.org": 1, "ci-runner": null}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

MAX_LIMITS_BYTES = 1024 * 1024


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


def load_limits(path: str) -> Dict[str, Optional[int]]:
    """The per-user limits in `path`; ValueError says what is wrong with the file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LIMITS_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_LIMITS_BYTES:
        raise ValueError(f"{path} is over {MAX_LIMITS_BYTES} bytes")
    try:
        data: Any = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold an object of user: limit")
    limits: Dict[str, Optional[int]] = {}
    for user, limit in data.items():
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 0):
            raise ValueError(f"{path}: the limit of {user!r} must be a whole number of 0 or "
                             "more, or null")
        limits[user] = limit
    return limits
