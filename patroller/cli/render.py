"""The command line's words and tables: pure formatting of what the server answered (and
whether the terminal takes colours)."""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, TextIO

CUT = "…"
WIDEST = {"NAME": 22, "USER": 32, "PROCESSES": 40}  # longer cells are cut
STATE_COLOURS = {"free": "32", "reserved": "33", "allocated": "34", "claimed": "36",
                 "shared": "1;31", "lost": "35"}
HEADERS = ("GPU", "NAME", "STATE", "USER", "PROCESSES", "UTIL", "MEMORY", "TEMP", "POWER", "TIME")


def format_status(claims: Dict[str, Any], inventory: Dict[str, Any],
                  queued: Optional[List[Dict[str, Any]]] = None, colour: bool = False,
                  users: Optional[Dict[str, Any]] = None) -> str:
    """The status table, then one line per waiting request, per user and notes on stale or
    idle devices."""
    rows = [device_row(uuid, info, claims.get(uuid) or {}) for uuid, info in inventory.items()]
    text = format_table(HEADERS, rows, colour)
    notes = []
    for uuid, info in inventory.items():
        entry = claims.get(uuid) or {}
        label = device_label(info)
        if entry.get("stale"):
            notes.append(f"{label}: statistics are stale (no sample for three intervals)")
        claim = entry.get("claim") or {}
        if claim.get("processes_stale"):
            notes.append(f"{label}: the process list is out of date; state and users may be wrong")
        if claim.get("idle_for") is not None:
            notes.append(f"{label}: idle for {duration(claim['idle_for'])} "
                         f"(held by {user_name(claim.get('user') or {})})")
        if claim.get("set_aside_for"):
            notes.append(f"{label}: free, set aside for {claim['set_aside_for']}, whose request "
                         "has waited past the starvation bound")
    notes.extend(queue_line(waiter) for waiter in queued or [])
    notes.extend(user_line(name, usage) for name, usage in (users or {}).items())
    return text + "".join(note + "\n" for note in notes)

def user_line(name: str, usage: Dict[str, Any]) -> str:
    """'user alice@example.org: 2 held (limit 4), 1 unused, 1 idle, 1 used without asking'."""
    limit = usage.get("limit")
    parts = [f"{usage.get('held', 0)} held" + (f" (limit {limit})" if limit is not None else "")]
    for key, words in (("reserved_unused", "unused"), ("idle", "idle"),
                       ("unreserved", "used without asking"),
                       ("over_limit", "taken beyond the limit"), ("waiting", "waiting")):
        if usage.get(key):
            parts.append(f"{usage[key]} {words}")
    return f"user {name}: " + ", ".join(parts)

def device_row(uuid: str, info: Dict[str, Any], entry: Dict[str, Any]) -> List[str]:
    """The cells of one device's row."""
    claim = entry.get("claim") or {}
    state = claim.get("state", "?")
    users = claim.get("users") or ([claim["user"]] if claim.get("user") else [])
    number = str(info.get("number", "?"))
    if info.get("group", "gpu") != "gpu":
        number = f"{info.get('group')} {number}"
    return [number, short_name(info.get("name") or ""), state,
            ", ".join(dict.fromkeys(user_name(u) for u in users)) or "-",
            processes_cell(claim), percent(entry.get("sm")),
            memory_cell(entry.get("fb"), entry.get("fb_total") or info.get("total_mem")),
            unit(entry.get("gtemp"), "C"), unit(entry.get("power"), "W"), time_cell(claim)]

def format_table(headers: Sequence[str], rows: List[List[str]], colour: bool = False) -> str:
    """Left-aligned columns two spaces apart, widths from the content; long cells cut."""
    rows = [[cut(cell, WIDEST.get(header, 40)) for header, cell in zip(headers, row)]
            for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    state = list(headers).index("STATE") if "STATE" in headers else -1

    def line(cells: Sequence[str], header: bool) -> str:
        out = []
        for i, cell in enumerate(cells):
            padded = cell.ljust(widths[i]) if i < len(cells) - 1 else cell
            if colour and header:
                padded = f"\033[1m{padded}\033[0m"
            elif colour and i == state and cell in STATE_COLOURS:
                padded = f"\033[{STATE_COLOURS[cell]}m{cell}\033[0m" + padded[len(cell):]
            out.append(padded)
        return "  ".join(out).rstrip()

    return "".join(line(cells, i == 0) + "\n" for i, cells in enumerate([list(headers)] + rows))

def amount(count: int, group: str) -> str:
    """'1 GPU', '2 GPUs'; other groups by their name: '2 fpga'."""
    return f"{count} GPU{'' if count == 1 else 's'}" if group == "gpu" else f"{count} {group}"


def queue_line(waiter: Dict[str, Any]) -> str:
    """'waiting 1: carol wants 2 GPUs (for 12s)'; other groups by their name ('1 fpga')."""
    wants = ", ".join(amount(n, group) for group, n in (waiter.get("wants") or {}).items())
    bound = f", while pid {waiter['pid']} lives" if waiter.get("pid") else ""
    return (f"waiting {waiter.get('position', '?')}: {waiter.get('user', '?')} wants {wants} "
            f"(for {duration(waiter.get('waited') or 0)}{bound})")

def short_name(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100-SXM4-80GB'."""
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name or "-"

def user_name(user: Optional[Dict[str, Any]]) -> str:
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
    container = user.get("container") or {}
    name = user.get("email") or container.get("name") or user.get("user") or "?"
    job = user.get("job") or {}
    return f"{name} (job {job['id']})" if job.get("id") and name != f"job {job['id']}" else name

def processes_cell(claim: Dict[str, Any]) -> str:
    detail = claim.get("process_detail")
    if detail:
        return ", ".join(" ".join([str(p["pid"]), *([p["command"]] if p.get("command") else []),
                                   *([f"{int(p['fb'])}MiB"] if p.get("fb") is not None else [])])
                         for p in detail)
    return ", ".join(str(pid) for pid in claim.get("processes") or []) or "-"

def time_cell(claim: Dict[str, Any]) -> str:
    if claim.get("held_for_pid"):
        return f"while pid {claim['held_for_pid']} lives"
    if claim.get("expires") is not None:
        return f"expires in {duration(claim['expires'])}"
    if claim.get("age") is not None:
        return f"for {duration(claim['age'])}"
    return "-"

def memory_cell(used: Any, total: Any) -> str:
    """'4096/81920 MiB' from the used MiB and the inventory's '81920 MiB'."""
    total_mib: Optional[int] = total if isinstance(total, int) else None
    if isinstance(total, str) and total.split() and total.split()[0].isdigit():
        total_mib = int(total.split()[0])
    if used is None and total_mib is None:
        return "-"
    shown = "-" if used is None else int(used) if isinstance(used, (int, float)) else used
    return f"{shown}/{'-' if total_mib is None else total_mib} MiB"

def percent(value: Any) -> str:
    return "-" if value is None else f"{value}%"

def unit(value: Any, suffix: str) -> str:
    return "-" if value is None else f"{value}{suffix}"

def duration(seconds: float) -> str:
    """0.5s, 8s, 3m12s, 2h05m, 3d04h."""
    if 0 < seconds < 9.95 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    whole = max(int(round(seconds)), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"

def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(width - 1, 0)] + CUT

def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"

def numbers_of(granted: Iterable[Dict[str, Any]], group: str) -> List[str]:
    return [str(d["info"]["number"]) for d in granted if d.get("group") == group]

def device_label(info: Dict[str, Any]) -> str:
    group = info.get("group", "gpu")
    return f"{'GPU' if group == 'gpu' else group} {info.get('number', '?')}"

def describe(granted: List[Dict[str, Any]]) -> str:
    """'GPUs 0,1' or 'GPU 2' (other groups by name) for grant entries."""
    by_group: Dict[str, List[str]] = {}
    for device in granted:
        by_group.setdefault(device.get("group", "gpu"), []).append(
            str((device.get("info") or {}).get("number", device.get("uuid"))))
    words = []
    for group, numbers in by_group.items():
        name = "GPU" if group == "gpu" else group
        words.append(f"{name}{'s' if len(numbers) > 1 else ''} {','.join(numbers)}")
    return " and ".join(words) or "nothing"

def progress_message(count: int, resource: str, pid: int, queued: Optional[List[Dict[str, Any]]],
                     claims: Optional[Dict[str, Any]], inventory: Dict[str, Any],
                     waited: Optional[float]) -> str:
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

def holders_summary(claims: Dict[str, Any], inventory: Dict[str, Any], resource: str) -> str:
    """'held by alice@example.org (0,1), bob (2); 1 free' for one device group."""
    held: Dict[str, List[str]] = {}
    free = 0
    for uuid, info in inventory.items():
        if info.get("group", "gpu") != resource:
            continue
        claim = (claims.get(uuid) or {}).get("claim") or {}
        if claim.get("state", "free") == "free":
            free += 1
            continue
        held.setdefault(user_name(claim.get("user")), []).append(str(info.get("number", "?")))
    if not held:
        return f"{free} free"
    return ("held by " + ", ".join(f"{who} ({','.join(numbers)})" for who, numbers in held.items())
            + f"; {free} free")


def release_message(body: Dict[str, Any], named: Optional[str] = None) -> str:
    """What /release answered, in words (for the device `named`, if one was)."""
    released = body.get("released") or []
    after = body.get("after_exit") or []
    lines = []
    if released:
        whose = f", {body['holder']}'s reservation" if body.get("holder") else ""
        lines.append(f"released {describe(released)}{whose}")
    if after:
        lines.append(f"{describe(after)} will be free when your processes on "
                     f"{'it' if len(after) == 1 else 'them'} end")
    for device in body.get("kept") or []:
        number = (device.get("info") or {}).get("number", "?")
        lines.append(f"kept {describe([device])}: held while pid {device.get('held_for_pid')} "
                     f"runs (patroller release {number} releases it)")
    if lines:
        return "\n".join(lines)
    if named is not None:
        return f"nothing released: {named} is not reserved by you"
    return "nothing to release: you hold no reservation"

def use_colour(out: TextIO) -> bool:
    """Colours on a terminal, unless NO_COLOR is set (https://no-color.org) or TERM=dumb."""
    return (out.isatty() and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM", "") != "dumb")
