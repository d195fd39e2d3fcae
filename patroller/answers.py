"""Another host's /status and /devices, checked before the fleet views use them.

The daemon's fleet view (--fleet) and the command line's (`patroller status --hosts`) draw what
other hosts answer. A host may answer anything: `check` holds each answer to the schema
Patroller itself publishes (openapi.json's Devices and Status), for every field those views
read, with its type, and to at most so many GPUs. A field may be absent (an older daemon leaves
out what it did not have yet: the views take null, empty or false); present, it has the type the
schema gives it. tests/test_fleet_answers.py checks these tables against openapi.json.

Pure and standard library only: the client side uses it too. The cost is bounded by the size of
the answer, which the caller bounds (the daemon's --fleet-max-bytes).
"""

from __future__ import annotations

import math
from typing import Any

Kinds = tuple[str, ...]  # JSON types, as the schema names them

# What the fleet views read of each object, and its JSON types (openapi.json's component, or
# the part of one, in the comment).
DEVICE: dict[str, Kinds] = {  # DeviceInfo: one GPU of /devices
    "number": ("integer",),
    "group": ("string",),
    "name": ("string", "null"),
    "total_mem": ("string", "null"),
    "lost": ("boolean",),
}
STATISTICS: dict[str, Kinds] = {  # DeviceStatus: one GPU of /status
    "sm": ("number", "string", "null"),
    "fb": ("number", "string", "null"),
    "fb_total": ("number", "string", "null"),
    "gtemp": ("number", "string", "null"),
    "power": ("number", "string", "null"),
    "stale": ("boolean",),
    "claim": ("object",),
}
CLAIM: dict[str, Kinds] = {  # Claim
    "state": ("string",),
    "user": ("object", "null"),
    "users": ("array",),
    "processes": ("array",),
    "process_detail": ("array",),
    "age": ("number",),
    "expires": ("number", "null"),
    "held_for_pid": ("integer", "null"),
    "processes_stale": ("boolean",),
    "withheld": ("string", "null"),
    "set_aside_for": ("string", "null"),
    "idle_for": ("number", "null"),
}
PROCESS: dict[str, Kinds] = {  # Claim.process_detail's items
    "pid": ("integer",),
    "command": ("string", "null"),
    "fb": ("number", "null"),
    "trespass": ("boolean",),
}
IDENTITY: dict[str, Kinds] = {  # Identity: Claim.user, and Claim.users' items
    "user": ("string",),
    "email": ("string", "null"),
    "container": ("object", "null"),
    "job": ("object", "null"),
    "pod": ("object", "null"),
}
CONTAINER: dict[str, Kinds] = {"name": ("string", "null")}  # Identity.container
JOB: dict[str, Kinds] = {"id": ("string",)}  # Identity.job
POD: dict[str, Kinds] = {"namespace": ("string",), "name": ("string",)}  # Identity.pod
REQUIRED = {"pid"}  # the views cannot do without these (the schema requires them too)
STATES = ("free", "reserved", "allocated", "claimed", "shared", "lost")  # Claim.state's enum
SHOWN = 64  # characters of a host's own text (a uuid, a state) quoted in a message at most


class BadAnswer(ValueError):
    """An answer that is not what Patroller's schema says; the message says where and why."""


def check(status: Any, devices: Any, max_gpus: int) -> None:
    """Whether /status and /devices, decoded, are as Patroller publishes them, in every field
    the fleet views read, with at most `max_gpus` GPUs; BadAnswer saying the first thing that
    is not."""
    for path, answer in (("/devices", devices), ("/status", status)):
        if not isinstance(answer, dict):
            raise BadAnswer(f"{path} is {kind(answer)}, not an object")
        if len(answer) > max_gpus:
            raise BadAnswer(f"{path} lists {len(answer)} GPUs, more than {max_gpus}")
    for uuid, info in devices.items():
        fields(info, DEVICE, f"/devices {quoted(uuid)}")
    for uuid, entry in status.items():
        where = f"/status {quoted(uuid)}"
        fields(entry, STATISTICS, where)
        if "claim" in entry:
            check_claim(entry["claim"], where + ": claim")


def check_claim(claim: dict[str, Any], where: str) -> None:
    fields(claim, CLAIM, where)
    if "state" in claim and claim["state"] not in STATES:
        raise BadAnswer(
            f"{where}.state is {quoted(claim['state'])}, not one of " + ", ".join(STATES)
        )
    if claim.get("user") is not None:
        identity(claim["user"], where + ".user")
    for n, user in enumerate(claim.get("users", ())):
        identity(user, f"{where}.users[{n}]")
    for n, pid in enumerate(claim.get("processes", ())):
        if not is_kind(pid, "integer"):
            raise BadAnswer(f"{where}.processes[{n}] is {kind(pid)}, not an integer")
    for n, process in enumerate(claim.get("process_detail", ())):
        fields(process, PROCESS, f"{where}.process_detail[{n}]")


def free(info: dict[str, Any], entry: dict[str, Any], group: str = "gpu") -> bool:
    """Whether one could reserve a device there now: of `group`, not lost, free and not
    withheld, from its /devices `info` and its /status `entry` (as `check` passed them; a claim
    with no state counts as free, as the views show it). The one rule of every view of another
    daemon's answers: /fleet.json and /fleet, `patroller status --free`, and the holders that
    `patroller run --wait` names while it waits. The daemon grants by the same rule over its
    own holds (core/leases/serving.py's `free_devices`): written twice because the client side
    imports nothing of the daemon; tests/test_free_rule.py holds the two to each other."""
    claim = entry.get("claim") or {}
    return (
        info.get("group", "gpu") == group
        and not info.get("lost")
        and claim.get("state", "free") == "free"
        and not claim.get("withheld")
    )


def identity(user: Any, where: str) -> None:
    fields(user, IDENTITY, where)
    for name, table in (("container", CONTAINER), ("job", JOB), ("pod", POD)):
        if user.get(name) is not None:
            fields(user[name], table, f"{where}.{name}")


def fields(value: Any, table: dict[str, Kinds], where: str) -> None:
    """`value` is an object whose fields in `table` have its types (the required ones there).
    A decoder's own types are looked up (`passing`); anything else is asked of `is_kind`."""
    if not isinstance(value, dict):
        raise BadAnswer(f"{where} is {kind(value)}, not an object")
    for name, kinds in table.items():
        if name not in value:
            if name in REQUIRED:
                raise BadAnswer(f"{where} has no {name}")
            continue
        item = value[name]
        exact, floats = PASSING.get(kinds) or passing(kinds)
        if type(item) in exact or (floats and type(item) is float and math.isfinite(item)):
            continue
        if not any(is_kind(item, k) for k in kinds):
            raise BadAnswer(
                f"{where}.{name} is {kind(value[name])}, not "
                + " or ".join(article(k) for k in kinds)
            )


# The types a JSON decoder gives for each of the schema's types, where the type alone says that
# a value is of it (a float is a number only when finite: `passing`).
DECODED: dict[str, type] = {
    "null": type(None),
    "boolean": bool,
    "integer": int,
    "number": int,
    "string": str,
    "object": dict,
    "array": list,
}
PASSING: dict[Kinds, tuple[frozenset[type], bool]] = {}  # passing's answers, kept


def passing(kinds: Kinds) -> tuple[frozenset[type], bool]:
    """(the decoded types that are of one of `kinds` whatever their value, whether a finite
    float is): what `fields` looks up before it asks `is_kind`, which has the last word."""
    found = PASSING[kinds] = (frozenset(DECODED[k] for k in kinds), "number" in kinds)
    return found


def is_kind(value: Any, name: str) -> bool:
    """Whether a decoded JSON value is of the schema's type `name` (a boolean is no number, and
    NaN or infinity, which JSON has not, is none either)."""
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
        )
    return isinstance(value, {"string": str, "object": dict, "array": list}[name])


def kind(value: Any) -> str:
    """What a decoded JSON value is, in words: 'an object', 'null', 'a string'."""
    for name in ("null", "boolean", "integer", "number", "string", "object", "array"):
        if is_kind(value, name):
            return "null" if name == "null" else article(name)
    return "NaN or infinite"  # which JSON has not, and a decoder may still give


def article(name: str) -> str:
    return "null" if name == "null" else ("an " if name[0] in "aeiou" else "a ") + name


def quoted(text: Any) -> str:
    """A host's text as a message quotes it: short, whatever the host sent."""
    shown = repr(text)
    return shown if len(shown) <= SHOWN else shown[: SHOWN - 1] + "…"
