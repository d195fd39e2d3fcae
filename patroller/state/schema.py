"""The lease book's format on disk: what a book holds, how it is read back, and what a restart
makes of each entry. book.py keeps the file; this module says what is in it.

    {"version": 1, "saved": <epoch s>, "boot": <the boot's id>, "devices": {uuid: entry}}

with one entry per held device:

    {"holder": <Identity.to_json()>, "state": "reserved", "releasing": false,
     "deadline": <epoch s, or null while no lease runs>,
     "asked": true,                  (false: taken by computing on it, not by a grant; a book
                                      written before it was kept says nothing: true)
     "pid": 4242, "start": 123456,   (held for a process: its pid and start time)
     "until": <epoch s>}             (held for a duration)

A device a Slurm job holds is not kept: the job map says so again at start.

Times go to disk on the wall clock (the manager's clock + an offset), as the monotonic clock
means nothing to the next process after a reboot. `state` is for people reading the file; a
restart does not use it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from patroller.core.identity import Identity, ProcessRef
from patroller.core.leases import LeaseManager
from patroller.core.leases.holds import EARLY

log = logging.getLogger(__name__)

VERSION = 1
DROPPED_SHOWN = 5  # devices named in the one line that says some were dropped


@dataclass
class Restored:
    """What `restore` did with each device of the book, by uuid."""

    held: list[str] = field(default_factory=list)  # given back to their holder
    expired: list[str] = field(default_factory=list)  # the lease ran out during the downtime
    dropped: list[str] = field(default_factory=list)  # no such device on this host any more
    ended: list[str] = field(default_factory=list)  # the process it was held for has ended


def encode(devices: dict[str, dict[str, Any]], saved: float, boot: str | None) -> bytes:
    """A whole book: the entries of `snapshot`, written at `saved` (epoch s) in boot `boot`."""
    return json.dumps(
        {"version": VERSION, "saved": round(saved, 3), "boot": boot, "devices": devices},
        separators=(",", ":"),
    ).encode()


def decode(data: bytes) -> dict[str, Any]:
    """The book in `data`; ValueError if it is not one of this version (JSON and UTF-8 errors
    are ValueErrors too)."""
    book = json.loads(data)
    if not isinstance(book, dict):
        raise ValueError("not an object")
    if book.get("version") != VERSION:
        raise ValueError(f"version {book.get('version')!r}, not {VERSION}")
    return book


def snapshot(leases: LeaseManager, offset: float) -> dict[str, dict[str, Any]]:
    """Every held device as the book keeps it; times as epoch seconds (clock() + offset)."""
    return {
        uuid: {
            "holder": hold.holder.to_json(),
            "state": hold.state,
            "releasing": hold.releasing,
            "asked": hold.asked,
            "deadline": None if hold.deadline is None else round(hold.deadline + offset, 3),
            **({"pid": hold.held_for.pid, "start": hold.held_for.start} if hold.held_for else {}),
            **({"until": round(hold.until + offset, 3)} if hold.until is not None else {}),
        }
        for uuid, hold in leases.holds.items()
        # the job map says those again; a process being identified is seen again by pmon
        if hold.holder is not None and hold.allocation is None and not hold.holder.identifying
    }


def ended(ref: ProcessRef) -> bool:
    """No process of another boot is alive."""
    return False


def restore(
    leases: LeaseManager, held: Any, offset: float, alive: Callable[[ProcessRef], bool] = ended
) -> Restored:
    """Give held devices back to their holders at start; ValueError, and no change, if bad.

    A reservation keeps its deadline, and is not restored if that passed while the daemon was
    down. A device its holder's processes were on comes back reserved with a fresh lease: the
    processes claim it again when the monitors see them, and if they died the lease runs out as
    any other. A device held for a process comes back held for it if `alive(process)` says it
    still runs, else it is not restored.
    """
    if not isinstance(held, Mapping):
        raise ValueError("devices must be an object")
    entries = [(uuid, *_book_entry(uuid, value)) for uuid, value in held.items()]
    now = leases.clock()
    restored = Restored()
    gone: list[str] = []  # devices this host no longer has: one log line for all of them
    for uuid, holder, deadline, releasing, held_for, until, asked in entries:
        if uuid not in leases.holds:
            restored.dropped.append(uuid)
            gone.append(f"{uuid} ({holder.user})")
            continue
        if leases.holder(uuid) is not None:  # already held again (restore runs before serving)
            continue
        if held_for is not None:
            if not alive(held_for):
                log.info(
                    "pid %d of %s, which held %s, ended while the daemon was down",
                    held_for.pid,
                    holder.user,
                    uuid,
                )
                restored.ended.append(uuid)
                continue
            deadline, until = None, None
        elif until is not None:  # never longer than the longest hold one may ask for
            until = min(until - offset, now + leases.policy.max_hold)
            if until <= now + EARLY:
                log.info(
                    "the reservation of %s on %s ended while the daemon was down",
                    holder.user,
                    uuid,
                )
                restored.expired.append(uuid)
                continue
            deadline = None
        elif deadline is None:
            deadline = now + leases.lease
        else:  # never more than a full lease: the wall clock may have been set back
            deadline = min(deadline - offset, now + leases.lease)
            if deadline <= now + EARLY:
                log.info("lease of %s on %s ran out while the daemon was down", holder.user, uuid)
                restored.expired.append(uuid)
                continue
        leases.give_back(uuid, holder, deadline, until, held_for, releasing, asked)
        restored.held.append(uuid)
    if gone:
        shown = ", ".join(gone[:DROPPED_SHOWN]) + (", ..." if len(gone) > DROPPED_SHOWN else "")
        log.warning(
            "the lease book holds %d device(s) this host no longer has: dropped: %s",
            len(gone),
            shown,
        )
    return restored


def _time(uuid: Any, name: str, value: Any) -> float | None:
    """A time of the book (epoch seconds), or None; ValueError if it is not one."""
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        value = float(value)  # an int too big for a float: OverflowError
        if not math.isfinite(value):
            raise TypeError
    except (TypeError, OverflowError):
        raise ValueError(f"device {uuid!r} has a {name} that is not a time") from None
    return float(value)


def _book_entry(
    uuid: Any, value: Any
) -> tuple[Identity, float | None, bool, ProcessRef | None, float | None, bool]:
    """(holder, deadline, releasing, process, until, asked) of one device in the book;
    ValueError if it is not one."""
    if not isinstance(value, Mapping):
        raise ValueError(f"device {uuid!r} must be an object")
    deadline, releasing = value.get("deadline"), value.get("releasing", False)
    deadline = _time(uuid, "deadline", deadline)
    until = _time(uuid, "end", value.get("until"))
    if not isinstance(releasing, bool):
        raise ValueError(f"device {uuid!r} has a releasing flag that is not true or false")
    asked = value.get("asked", True)  # not kept before: as a restart took it then
    if not isinstance(asked, bool):
        raise ValueError(f"device {uuid!r} has an asked flag that is not true or false")
    pid, start = value.get("pid"), value.get("start")
    held_for = None
    if pid is not None or start is not None:
        if not (_count(pid) and _count(start)):
            raise ValueError(f"device {uuid!r} has a process that is not a pid and a start time")
        held_for = ProcessRef(pid, start)
    holder: Any = value.get("holder")  # from_json says what is wrong with it
    return Identity.from_json(holder), deadline, releasing, held_for, until, asked


def _count(value: Any) -> TypeGuard[int]:
    """Whether `value` is a whole number, 0 or more (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
