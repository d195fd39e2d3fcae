"""What a reload (SIGHUP) may change in a running daemon: the fair-use policy (the limits, the
limits file, how long a request may be overtaken or a hold last, when a hold is idle) and the
log level. Every other setting is built into what runs (a port, a directory, a child's
command) and takes a restart. Pure."""

from __future__ import annotations

import dataclasses

from patroller.config.settings import Config

LIVE = (
    "max_per_user",
    "limits_file",
    "starvation_bound",
    "max_hold",
    "idle_sm",
    "idle_memory",
    "idle_after",
    "idle_release",
    "log_level",
)
KEYS = {"pod_user_keys": "pod-user-key"}  # fields not named after their key


def applied(running: Config, read: Config) -> tuple[Config, list[str]]:
    """The configuration to run with after a reload read `read` (the live settings its, the rest
    `running`'s), and the keys of the settings that differ but take a restart, in order."""
    changed = [
        field.name
        for field in dataclasses.fields(Config)
        if getattr(running, field.name) != getattr(read, field.name)
    ]
    now = dataclasses.replace(running, **{name: getattr(read, name) for name in LIVE})
    return now, [KEYS.get(name, name.replace("_", "-")) for name in changed if name not in LIVE]
