"""The fair-use policy as the configuration sets it, with the per-user limits file.

The limits file is a JSON object of per-user overrides of --max-per-user, by user (the `user` of
the identity: an e-mail, a host account, `container:<id>`); null means no limit for that user:

    {"alice@example.org": 4, "bob@example.org": 1, "ci-runner": null}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from patroller.config.regular import read_regular
from patroller.config.settings import Config
from patroller.core.policy import Policy

MAX_LIMITS_BYTES = 1024 * 1024  # a bigger file is not a limits file


def policy_of(config: Config, limits: Mapping[str, int | None] | None = None) -> Policy:
    """The policy `config` sets, with `limits`, or those of its limits file when not given.
    Raises ValueError, saying what is wrong with the file, if it cannot be used."""
    if limits is None:
        limits = load_limits(config.limits_file) if config.limits_file else {}
    return Policy(
        max_per_user=config.max_per_user,
        limits=dict(limits),
        uncounted_uids=frozenset(config.limits_uncounted_uids),
        starvation_bound=config.starvation_bound,
        max_hold=config.max_hold,
        idle_sm=config.idle_sm,
        idle_memory_mib=config.idle_memory,
        idle_after=config.idle_after,
        idle_release=config.idle_release,
    )


def load_limits(path: str) -> dict[str, int | None]:
    """Blocking: the per-user limits in `path`; ValueError says what is wrong with the file.

    Only a regular file is read (a FIFO or a device would block, or never end), at most
    MAX_LIMITS_BYTES of it; the object it holds is flat, so nesting is refused, not recursed into.
    """
    raw = read_regular(path, MAX_LIMITS_BYTES, path)
    try:
        data: Any = json.loads(raw)
    except RecursionError:
        raise ValueError(
            f"{path} is nested too deeply: it holds one object of user: limit"
        ) from None
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold an object of user: limit")
    limits: dict[str, int | None] = {}
    for user, limit in data.items():
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
        ):
            raise ValueError(
                f"{path}: the limit of {user!r} must be a whole number of 0 or more, or null"
            )
        limits[user] = limit
    return limits
