"""`patroller history`, `patroller users` and `patroller queue`: the audit record, who holds,
uses and waits, and the waiting requests, as tables (or, with --json, the server's own JSON).

Formatting is pure (tested on bodies from a live daemon); the commands only ask and print.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.parse
from typing import Any

from patroller import client, durations
from patroller.cli.exits import EX_OK, EX_USAGE, Failure
from patroller.cli.render import amount, duration
from patroller.cli.table import Cell, Cells, Cut, Rest, Shorten, format_table, width_of
from patroller.safetext import json_text

# An event's own fields, which the table shows in columns of their own; the rest is DETAIL.
_SHOWN = ("time", "at", "event", "user", "devices")
# What gives way, in order, when a table is wider than the terminal (table.py): the times and
# headers in short words, names past 24 characters, the words that run on, and last the users'
# names, cut to what the other columns leave them (a name that fits is never cut).
NAMES_CUT = (Cut("USER", 24), Rest("USER"))
HISTORY_PLAN = (Shorten("TIME"), Cut("USER", 24), Rest("DETAIL"), Rest("USER"))
USERS_PLAN = (
    Shorten("TRESPASS", "TRESP"),
    Shorten("UNASKED", "UNASK"),
    Rest("JOBS/PODS"),
    *NAMES_CUT,
)
QUEUE_PLAN = (Rest("HOLD"), *NAMES_CUT)
ISO = re.compile(r"\d{4}-(\d\d-\d\d)T(\d\d:\d\d:\d\d)")


def time_cell(text: str) -> Cell:
    """An event's time, '2026-12-04T05:20:15.397Z'; shorter, '12-04 05:20:15'."""
    found = ISO.match(text)
    return Cell(text, short=f"{found.group(1)} {found.group(2)}" if found else None)


def since_of(text: str | None, now: float) -> str | None:
    """--since as the server takes it: `2h` (a duration before now) as epoch seconds, an ISO
    time as it is; None for all."""
    if text is None:
        return None
    try:
        return f"{now - durations.parse(text):.3f}"
    except ValueError:
        pass
    if "T" in text or "-" in text:
        return text  # an ISO time: the server checks it, and names it if it is not one
    raise Failure(
        f"--since: {text!r} is neither a duration (2h, 90m, 7d) nor an ISO time", EX_USAGE
    )


def detail(event: dict[str, Any]) -> str:
    """What an event says beyond its time, kind, user and GPUs, as `key=value` words; a hold for
    a duration as that duration (`hold=1h`, not `hold=duration seconds=3600.0`), and any other
    count of seconds as a duration too."""
    words = []
    timed = event.get("hold") == "duration" and _is_number(event.get("seconds"))
    for key, value in event.items():
        if key in _SHOWN or value is None or value == [] or value == {}:
            continue
        if timed and key in ("hold", "seconds"):
            if key == "hold":
                words.append(f"hold={durations.describe(float(event['seconds']))}")
            continue
        if _is_number(value) and (key == "seconds" or key.endswith("_seconds")):
            value = durations.describe(value)
        shown = ",".join(map(str, value)) if isinstance(value, list) else value
        words.append(f"{key}={shown}")
    return " ".join(words)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def history_table(
    events: list[dict[str, Any]],
    user: str | None = None,
    colour: bool = False,
    width: int | None = None,
) -> str:
    """One row per event, oldest first; only those naming `user` (as its user, holder or by);
    fitted to `width`."""
    rows: list[Cells] = []
    for event in events:
        if user is not None and user not in (
            event.get("user"),
            event.get("holder"),
            event.get("by"),
        ):
            continue
        gpus = ",".join(str(d.get("number", "?")) for d in event.get("devices") or [])
        rows.append(
            [
                time_cell(str(event.get("time", "?")).replace("+00:00", "Z")),
                str(event.get("event")),
                str(event.get("user") or "-"),
                gpus or "-",
                detail(event),
            ]
        )
    if not rows:
        return "no events" + (f" of {user}" if user else "") + "\n"
    return format_table(
        ["TIME", "EVENT", "USER", "GPUS", "DETAIL"], rows, colour, width, HISTORY_PLAN
    )


def users_table(
    users: dict[str, dict[str, Any]], colour: bool = False, width: int | None = None
) -> str:
    """One row per user, most GPUs held first; fitted to `width`."""
    rows: list[Cells] = []
    for name, u in sorted(users.items(), key=lambda item: (-item[1].get("held", 0), item[0])):
        limit = u.get("limit")
        waiting = u.get("waiting", 0)
        waits = f"{waiting} ({duration(u.get('waited_max') or 0)})" if waiting else "0"
        schedulers = [
            *(f"job {j}" for j in u.get("jobs") or []),
            *(f"pod {p}" for p in u.get("pods") or []),
        ]
        rows.append(
            [
                name,
                str(u.get("held", 0)),
                str(u.get("reserved_unused", 0)),
                str(u.get("unreserved", 0)),
                str(u.get("idle", 0)),
                waits,
                str(u.get("trespassing", 0)),
                "-" if limit is None else str(limit),
                ", ".join(schedulers) or "-",
            ]
        )
    if not rows:
        return "nobody holds, uses or waits for a GPU\n"
    return format_table(
        ["USER", "HELD", "UNUSED", "UNASKED", "IDLE", "WAITING", "TRESPASS", "LIMIT", "JOBS/PODS"],
        rows,
        colour,
        width,
        USERS_PLAN,
    )


def queue_table(
    waiters: list[dict[str, Any]], colour: bool = False, width: int | None = None
) -> str:
    """One row per waiting request, in arrival order; fitted to `width`."""
    rows = [
        [
            str(w.get("position", "?")),
            str(w.get("user", "?")),
            ", ".join(amount(n, group) for group, n in (w.get("wants") or {}).items())
            + (f" ({w['link']})" if w.get("link") else ""),
            duration(w.get("waited") or 0),
            f"process {w['pid']}" if w.get("pid") else str(w.get("hold") or "lease"),
        ]
        for w in waiters
    ]
    if not rows:
        return "nobody is waiting\n"
    return format_table(["#", "USER", "WANTS", "WAITED", "HOLD"], rows, colour, width, QUEUE_PLAN)


def history_command(options: argparse.Namespace) -> int:
    params = {"limit": options.limit}
    since = since_of(options.since, time.time())
    if since is not None:
        params["since"] = since
    events = client.get_json(options.server, "/history?" + urllib.parse.urlencode(params))
    if options.json:
        chosen = [
            e
            for e in events
            if options.user in (None, e.get("user"), e.get("holder"), e.get("by"))
        ]
        print(json_text(chosen, indent=2))
    else:
        print(history_table(events, options.user, options.colour, width_of(sys.stdout)), end="")
    return EX_OK


def users_command(options: argparse.Namespace) -> int:
    users = client.users(options.server)
    print(
        json_text(users, indent=2)
        if options.json
        else users_table(users, options.colour, width_of(sys.stdout)),
        end="\n" if options.json else "",
    )
    return EX_OK


def queue_command(options: argparse.Namespace) -> int:
    waiters = client.queue(options.server)
    print(
        json_text(waiters, indent=2)
        if options.json
        else queue_table(waiters, options.colour, width_of(sys.stdout)),
        end="\n" if options.json else "",
    )
    return EX_OK
