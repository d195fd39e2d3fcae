"""The command line's words: pure formatting of what the server answered (and whether the
terminal takes colours); the status table is cli/status.py, tables in general cli/table.py."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, TextIO

from patroller import answers, durations
from patroller.safetext import printable


def user_line(name: str, usage: dict[str, Any]) -> str:
    """'user alice@example.org: 2 held (limit 4), 1 unused, 1 idle, 1 used without asking';
    '1 trespassing': GPUs another holds where their processes run (/users)."""
    limit = usage.get("limit")
    parts = [f"{usage.get('held', 0)} held" + (f" (limit {limit})" if limit is not None else "")]
    for key, words in (
        ("reserved_unused", "unused"),
        ("idle", "idle"),
        ("unreserved", "used without asking"),
        ("over_limit", "taken beyond the limit"),
        ("trespassing", "trespassing"),
        ("waiting", "waiting"),
    ):
        if usage.get(key):
            parts.append(f"{usage[key]} {words}")
    return f"user {name}: " + ", ".join(parts)


def amount(count: int, group: str) -> str:
    """'1 GPU', '2 GPUs'; other groups by their name: '2 fpga'."""
    return f"{count} GPU{'' if count == 1 else 's'}" if group == "gpu" else f"{count} {group}"


def queue_line(waiter: dict[str, Any]) -> str:
    """'waiting 1: carol wants 2 GPUs (for 12s)'; other groups by their name ('1 fpga')."""
    wants = ", ".join(amount(n, group) for group, n in (waiter.get("wants") or {}).items())
    wants += f" linked by {waiter['link']}" if waiter.get("link") else ""
    bound = f", while pid {waiter['pid']} lives" if waiter.get("pid") else ""
    return (
        f"waiting {waiter.get('position', '?')}: {waiter.get('user', '?')} wants {wants} "
        f"(for {duration(waiter.get('waited') or 0)}{bound})"
    )


def short_name(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100-SXM4-80GB'."""
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name or "-"


def user_name(user: dict[str, Any] | None) -> str:
    """The e-mail, else a container's name, else the user string (a host account), and a Slurm
    job's id: `alice (job 4242)`; a Kubernetes pod's user and its pod:
    `alice@example.org (pod research/train-7)`, or the pod alone when its namespace is all
    that names its user. A container's account (the uid it runs as) is not its user."""
    if not user:
        return "-"
    pod = user.get("pod") or {}
    if pod.get("namespace") and pod.get("name"):  # its container's name is not its user
        where = f"pod {pod['namespace']}/{pod['name']}"
        name = user.get("email") or user.get("user") or "?"
        return where if name == f"namespace:{pod['namespace']}" else f"{name} ({where})"
    if user.get("claimed"):  # its labels' e-mail is its own user's word: said as a claim
        said = f" (claims {user['email']})" if user.get("email") else ""
        return f"{user.get('user') or '?'}{said}"
    container = user.get("container") or {}
    name = user.get("email") or container.get("name") or user.get("user") or "?"
    job = user.get("job") or {}
    return f"{name} (job {job['id']})" if job.get("id") and name != f"job {job['id']}" else name


def duration(seconds: float) -> str:
    """A table's duration: patroller.durations.describe in two units (0.5s, 8s, 3m12s, 2h05m,
    3d04h)."""
    return durations.describe(seconds, most=2)


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def numbers_of(granted: Iterable[dict[str, Any]], group: str) -> list[str]:
    return [str(d["info"]["number"]) for d in granted if d.get("group") == group]


def device_label(info: dict[str, Any]) -> str:
    group = info.get("group", "gpu")
    return f"{'GPU' if group == 'gpu' else group} {info.get('number', '?')}"


def describe(granted: list[dict[str, Any]]) -> str:
    """'GPUs 0,1' or 'GPU 2' (other groups by name) for grant entries."""
    by_group: dict[str, list[str]] = {}
    for device in granted:
        by_group.setdefault(device.get("group", "gpu"), []).append(
            str((device.get("info") or {}).get("number", device.get("uuid")))
        )
    words = []
    for group, numbers in by_group.items():
        name = "GPU" if group == "gpu" else group
        words.append(f"{name}{'s' if len(numbers) > 1 else ''} {','.join(numbers)}")
    return " and ".join(words) or "nothing"


def progress_message(
    count: int,
    resource: str,
    pid: int,
    queued: list[dict[str, Any]] | None,
    claims: dict[str, Any] | None,
    inventory: dict[str, Any],
    waited: float | None,
) -> str:
    """'patroller: waiting for 2 GPUs (12s): 1st of 3 in the queue; held by ...'; the time
    first, so that a line cut to the terminal's width keeps it."""
    waiting = f" ({duration(waited)})" if waited is not None else ""
    parts = [f"patroller: waiting for {amount(count, resource)}{waiting}"]
    if queued is not None:
        mine = [w for w in queued if w.get("pid") == pid]
        if mine:
            parts.append(f"{ordinal(mine[0]['position'])} of {len(queued)} in the queue")
        else:
            parts.append(f"{len(queued)} in the queue")
    if claims is not None:
        parts.append(holders_summary(claims, inventory, resource))
    return parts[0] + (": " + "; ".join(parts[1:]) if parts[1:] else "")


def holders_summary(claims: dict[str, Any], inventory: dict[str, Any], resource: str) -> str:
    """'held by alice@example.org (0,1), bob (2); 1 free' for one device group (free as
    answers.free says: a silent or lost device is neither)."""
    held: dict[str, list[str]] = {}
    free = 0
    for uuid, info in inventory.items():
        if info.get("group", "gpu") != resource:
            continue
        entry = claims.get(uuid) or {}
        claim = entry.get("claim") or {}
        if answers.free(info, entry, resource):
            free += 1
        elif claim.get("state", "free") not in ("free", "lost"):
            held.setdefault(user_name(claim.get("user")), []).append(str(info.get("number", "?")))
    if not held:
        return f"{free} free"
    return (
        "held by "
        + ", ".join(f"{who} ({','.join(numbers)})" for who, numbers in held.items())
        + f"; {free} free"
    )


def release_message(body: dict[str, Any], named: str | None = None) -> str:
    """What /release answered, in words (for the device `named`, if one was)."""
    released = body.get("released") or []
    after = body.get("after_exit") or []
    lines = []
    if released:
        whose = f", {body['holder']}'s reservation" if body.get("holder") else ""
        lines.append(f"released {describe(released)}{whose}")
    if after:  # the holder's processes: another user's, when the host's root released it
        whose = f"{body['holder']}'s" if body.get("holder") else "your"
        lines.append(
            f"{describe(after)} will be free when {whose} processes on "
            f"{'it' if len(after) == 1 else 'them'} end"
        )
    for device in body.get("kept") or []:
        number = (device.get("info") or {}).get("number", "?")
        lines.append(
            f"kept {describe([device])}: held while pid {device.get('held_for_pid')} "
            f"runs (patroller release {number} releases it)"
        )
    if lines:  # each printable: a holder's name is the daemon's to say, and others chose it
        return "\n".join(printable(line) for line in lines)
    if named is not None:
        return printable(f"nothing released: {named} is not reserved by you")
    return "nothing to release: you hold no reservation"


def healthy_message(body: dict[str, Any], named: str) -> str:
    """What /release?healthy=1 answered, in words."""
    withheld = body.get("withheld")
    if withheld:
        return printable(f"{named} is marked healthy, but is still granted to nobody: {withheld}")
    return printable(f"{named} is marked healthy: it is granted again")


def use_colour(out: TextIO) -> bool:
    """Colours on a terminal, unless NO_COLOR is set (https://no-color.org) or TERM=dumb."""
    return out.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM", "") != "dumb"
