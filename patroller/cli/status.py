"""`patroller status`'s table: a row per GPU, a line per process under its GPU, fitted to the
terminal; utilisation, memory and temperature coloured by how high they are, the state by
what it is. Then the notes: stale or idle devices, waiting requests, users.

Pure formatting of what the server answered (/status, /devices, /queue, /users), shared by the
one-host table and the many-host one (cli/fleet.py): tested on bodies from live daemons, and
docs/command-line.md's examples are its output (tests/test_status_table.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from patroller.cli.render import (
    device_label,
    duration,
    queue_line,
    short_name,
    user_line,
    user_name,
)
from patroller.cli.table import Cell, Cut, Drop, Shorten, Step, cut, fit, printable

HEADERS = ("GPU", "NAME", "STATE", "USER", "UTIL", "MEMORY", "TEMP", "POWER", "TIME")
RIGHT = ("UTIL", "MEMORY", "TEMP", "POWER")  # numbers: to the right
WIDEST = {"NAME": 22, "USER": 32}  # longer cells are cut, whatever the width
GREEN, YELLOW, RED = "32", "33", "31"
STATE_COLOURS = {
    "free": GREEN,
    "reserved": YELLOW,
    "allocated": "34",
    "claimed": "36",
    "shared": "1;31",
    "lost": "35",
}
# Green below the first figure, yellow below the second, red from it on.
UTIL_LEVELS = (50, 90)  # SM utilisation, %
MEMORY_LEVELS = (50, 90)  # memory used, % of the total
TEMP_LEVELS = (60, 80)  # GPU temperature, °C
PROCESS_MARK = "└ "  # before each process line, under its GPU's row

Row = dict[str, str | Cell]


def plan(rows: Sequence[Row]) -> list[Step]:
    """What gives way, in order, when the table is wider than the terminal: the power, the
    model (left out when every GPU is the same model, which a line above then says; else cut),
    the time's words (`4m53s left`), long user names, the temperature, user names again, the
    memory's total. Narrower than about 52 columns, the rows wrap."""
    models = {row.get("NAME") for row in rows}
    return [
        Drop("POWER"),
        Drop("NAME") if len(models) <= 1 else Cut("NAME", 10),
        Shorten("TIME"),
        Cut("USER", 16),
        Drop("TEMP"),
        Cut("USER", 8),
        Shorten("MEMORY"),
    ]


def level(value: Any, levels: tuple[float, float]) -> str | None:
    """Green, yellow or red for a figure by the levels; None for one that is not a number."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return GREEN if value < levels[0] else YELLOW if value < levels[1] else RED


def device_row(info: dict[str, Any], entry: dict[str, Any]) -> Row:
    """One device's cells, by header."""
    claim = entry.get("claim") or {}
    state = claim.get("state", "?")
    users = claim.get("users") or ([claim["user"]] if claim.get("user") else [])
    number = str(info.get("number", "?"))
    if info.get("group", "gpu") != "gpu":
        number = f"{info.get('group')} {number}"
    used, total = entry.get("fb"), total_mib(entry.get("fb_total") or info.get("total_mem"))
    share = used / total * 100 if isinstance(used, (int, float)) and total else None
    return {
        "GPU": number,
        "NAME": short_name(info.get("name") or ""),
        "STATE": Cell(state, STATE_COLOURS.get(state)),
        "USER": ", ".join(dict.fromkeys(user_name(u) for u in users)) or "-",
        "UTIL": Cell(unit(entry.get("sm"), "%"), level(entry.get("sm"), UTIL_LEVELS)),
        "MEMORY": Cell(memory_cell(used, total), level(share, MEMORY_LEVELS), mib(used)),
        "TEMP": Cell(unit(entry.get("gtemp"), "C"), level(entry.get("gtemp"), TEMP_LEVELS)),
        "POWER": unit(entry.get("power"), "W"),
        "TIME": time_cell(claim),
    }


def processes(claim: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(pid, user, memory, command) of each process on the device, as /status orders them; a
    trespasser's user `nobody (trespassing)`, never the holder's name (on a Slurm job's GPU a
    process outside the job may be its user's: not `nobody (job 4242)`)."""
    names = {u.get("user"): user_name(u) for u in claim.get("users") or [] if isinstance(u, dict)}
    detail = claim.get("process_detail")
    if not detail:
        return [(str(pid), "", "", "") for pid in claim.get("processes") or []]
    return [
        (
            str(p["pid"]),
            process_user(p, names, claim.get("user")),
            mib(p.get("fb")),
            p.get("command") or "-",
        )
        for p in detail
    ]


def process_user(
    process: dict[str, Any], names: dict[Any, str], holder: dict[str, Any] | None
) -> str:
    """Whose a process is, in the table's words: the name its user goes by on the device, or,
    for a trespasser, its user and `(trespassing)`."""
    user = process.get("user") or "-"
    if not process.get("trespass"):
        return names.get(user, user)
    holders = user == (holder or {}).get("user")  # the holder's name says the holder's job
    return f"{user if holders else names.get(user, user)} (trespassing)"


def trespass_notes(label: str, claim: dict[str, Any]) -> list[str]:
    """'GPU 2: process 5678 of nobody runs outside job 4242: trespassing' (or `on a GPU alice
    holds`): a line per trespassing process."""
    jobs = [str(j.get("id")) for j in claim.get("jobs") or [] if isinstance(j, dict)]
    pods = [
        f"{p.get('namespace')}/{p.get('name')}"
        for p in claim.get("pods") or []
        if isinstance(p, dict)
    ]
    where = (
        f"outside job {', '.join(jobs)}"
        if jobs
        else f"outside pod {', '.join(pods)}"
        if pods
        else f"on a GPU {user_name(claim.get('user'))} holds"
    )
    return [
        f"{label}: process {p.get('pid')} of {p.get('user') or '?'} runs {where}: trespassing"
        for p in claim.get("process_detail") or []
        if p.get("trespass")
    ]


def process_lines(
    found: list[list[tuple[str, str, str, str]]], indent: int, width: int | None
) -> list[list[str]]:
    """Each device's process lines: pid, user, memory and command, aligned across the table,
    `indent` characters in; a line wider than `width` is cut (its command first)."""
    every = [p for device in found for p in device]
    pid_w, user_w, mem_w = (max([len(p[i]) for p in every] + [0]) for i in range(3))
    out = []
    for device in found:
        lines = []
        for pid, user, memory, command in device:
            text = (
                " " * indent
                + PROCESS_MARK
                + pid.rjust(pid_w)
                + "  "
                + user.ljust(user_w)
                + "  "
                + memory.rjust(mem_w)
                + "  "
                + command
            ).rstrip()
            text = printable(text)
            lines.append(cut(text, width) if width is not None else text)
        out.append(lines)
    return out


def format_status(
    claims: dict[str, Any],
    inventory: dict[str, Any],
    queued: list[dict[str, Any]] | None = None,
    colour: bool = False,
    users: dict[str, Any] | None = None,
    width: int | None = None,
    mine: str | None = None,
) -> str:
    """The status table fitted to `width`, then the notes, one line per waiting request and
    per user. `mine`: only the devices, requests and user line of this user (the caller's, as
    /whoami names them)."""
    devices = [(info, claims.get(uuid) or {}) for uuid, info in inventory.items()]
    if mine is not None:
        devices = [(info, entry) for info, entry in devices if is_mine(entry, mine)]
        queued = [w for w in queued or [] if w.get("user") == mine]
        users = {name: usage for name, usage in (users or {}).items() if name == mine}
    text = (
        tables([("", devices)], colour, width)
        if devices
        else (
            f"no GPU here is held or used by {printable(mine)}\n"
            if mine is not None
            else "no GPU here\n"
        )
    )
    notes = []
    for info, entry in devices:
        notes.extend(device_notes(info, entry))
    notes.extend(queue_line(waiter) for waiter in queued or [])
    notes.extend(user_line(name, usage) for name, usage in (users or {}).items())
    return text + "".join(printable(note) + "\n" for note in notes)


def tables(
    groups: list[tuple[str, list[tuple[dict[str, Any], dict[str, Any]]]]],
    colour: bool,
    width: int | None,
) -> str:
    """One table for the devices of every group (a host: its heading line first, unless it
    is ""), fitted to `width` together, so that their columns line up."""
    rows = [[device_row(info, entry) for info, entry in devices] for _, devices in groups]
    every = [row for group in rows for row in group]
    layout = fit(HEADERS, every, width, plan(every), RIGHT, WIDEST)
    indent = layout.offset(layout.headers[1]) if len(layout.headers) > 1 else 0
    found = [
        [processes(entry.get("claim") or {}) for _, entry in devices] for _, devices in groups
    ]
    procs = process_lines([p for group in found for p in group], indent, width)
    lines = [] if "NAME" in layout.headers else model_line(every)
    lines.append(layout.header_line(colour))
    n = 0
    for (heading, _), group in zip(groups, rows, strict=True):
        if heading:
            lines.append(heading)
        for row in group:
            lines.append(layout.line(row, colour))
            lines.extend(procs[n])
            n += 1
    return "".join(line + "\n" for line in lines)


def model_line(rows: list[Row]) -> list[str]:
    """'4 x A100-SXM4-80GB': the model of every GPU, when the table leaves its column out."""
    names = {str(row.get("NAME")) for row in rows}
    return [printable(f"{len(rows)} x {names.pop()}")] if len(names) == 1 and rows else []


def is_mine(entry: dict[str, Any], user: str) -> bool:
    """Whether `user` holds the device or runs a process on it."""
    claim = entry.get("claim") or {}
    holders = [claim.get("user") or {}] + list(claim.get("users") or [])
    return any(isinstance(u, dict) and u.get("user") == user for u in holders) or any(
        p.get("user") == user for p in claim.get("process_detail") or []
    )


def device_notes(info: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    """What the table cannot say of a device: stale figures, idleness, a starving waiter, why
    it is granted to nobody (silent, unhealthy), slowed clocks, the faults of its processes."""
    label = device_label(info)
    claim = entry.get("claim") or {}
    notes = []
    if entry.get("stale"):
        notes.append(f"{label}: statistics are stale (no sample for three intervals)")
    if claim.get("processes_stale"):
        notes.append(f"{label}: the process list is out of date; state and users may be wrong")
    if claim.get("idle_for") is not None:
        notes.append(
            f"{label}: idle for {duration(claim['idle_for'])} "
            f"(held by {user_name(claim.get('user') or {})})"
        )
    notes.extend(trespass_notes(label, claim))
    if claim.get("set_aside_for"):
        notes.append(
            f"{label}: free, set aside for {claim['set_aside_for']}, whose request "
            "has waited past the starvation bound"
        )
    if claim.get("withheld"):
        notes.append(f"{label}: granted to nobody: {claim['withheld']}")
    health = claim.get("health") or {}
    notes.extend(
        f"{label}: degraded: {p.get('words')}: {p.get('action')}"
        for p in health.get("problems") or []
        if not p.get("grave")
    )
    for fault in health.get("faults") or []:
        pid, words = fault.get("pid"), fault.get("words")
        whose = (
            "a fault of its process"
            if fault.get("kind") == "application"
            else "an Xid Patroller does not place"
        )
        notes.append(
            f"{label}: " + (f"pid {pid}: " if pid is not None else "") + f"{words} ({whose})"
        )
    return notes


def time_cell(claim: dict[str, Any]) -> Cell:
    """How long the state lasts: `while pid 1234 lives` (a process hold), `expires in 4m53s`
    (a lease), `for 3m12s` (since it began); shorter: `pid 1234`, `4m53s left`, `3m12s`."""
    if claim.get("held_for_pid"):
        pid = claim["held_for_pid"]
        return Cell(f"while pid {pid} lives", short=f"pid {pid}")
    if claim.get("expires") is not None:
        left = duration(claim["expires"])
        return Cell(f"expires in {left}", short=f"{left} left")
    if claim.get("age") is not None:
        return Cell(f"for {duration(claim['age'])}", short=duration(claim["age"]))
    return Cell("-")


def total_mib(total: Any) -> float | None:
    """The total memory in MiB: a number, or the inventory's '81920 MiB'."""
    if isinstance(total, (int, float)) and not isinstance(total, bool):
        return total
    if isinstance(total, str) and total.split() and total.split()[0].isdigit():
        return int(total.split()[0])
    return None


def memory_cell(used: Any, total: float | None) -> str:
    """'4096/81920 MiB'; '-' for what is not known."""
    return "-" if used is None and total is None else f"{whole(used)}/{whole(total)} MiB"


def mib(value: Any) -> str:
    """'4096 MiB'; '-' when not known."""
    return "-" if value is None else f"{whole(value)} MiB"


def whole(value: Any) -> str:
    """A figure in whole units; '-' when not known; a host's text as it is."""
    if value is None:
        return "-"
    return str(int(value)) if isinstance(value, (int, float)) else str(value)


def unit(value: Any, suffix: str) -> str:
    return "-" if value is None else f"{value}{suffix}"
