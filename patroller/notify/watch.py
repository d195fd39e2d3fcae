"""What no event of the lease rules says, looked for every `notify_check_every` seconds: a hold
that has computed nothing for --notify-idle-after, a hold for a duration that ends within
--notify-before, and a trespass still going on --notify-escalate after it began (then the
admin is told). Each is handed to the notifier as an Event of its own kind (`idle`,
`expiring`, `escalated`), which messages.py words. Pure: the lease state, the idle times and
the clocks are given."""
from __future__ import annotations

from typing import Callable, Iterable, List, Mapping, Optional, Tuple

from patroller.config import Config
from patroller.core.leases import Event, Hold

HELD = ("reserved", "allocated", "claimed", "shared")  # the states in which someone holds it


def due(holds: Mapping[str, Hold], numbers: Mapping[str, int], state: Callable[[str], str],
        quiet_for: Callable[[str], Optional[float]], config: Config, wall: float,
        clock: float) -> List[Event]:
    """The idle and expiring holds to tell of now (the notifier's episodes tell each once).
    `clock` is the lease manager's (deadlines, `until`); `wall` is epoch seconds, for words."""
    found = []
    for uuid, hold in holds.items():
        number = numbers.get(uuid)
        if number is None or hold.holder is None or state(uuid) not in HELD:
            continue
        device = ((uuid, number),)
        user = hold.holder.user
        quiet = quiet_for(uuid)
        if quiet is not None and quiet >= config.notify_idle_after:
            release = None
            if config.idle_release is not None and state(uuid) == "reserved":  # no process
                release = wall + max(0.0, config.idle_release - quiet)
            found.append(Event("idle", user, device, {
                "idle": round(quiet, 1), "since": round(wall - quiet, 3),
                "released_at": release}))
        if hold.until is not None and 0 < hold.until - clock <= config.notify_before:
            found.append(Event("expiring", user, device, {
                "ends": round(wall + hold.until - clock, 3),
                "left": round(hold.until - clock, 1), "until": hold.until}))
    return found


def still_trespassing(holds: Mapping[str, Hold], uuid: str, trespasser: Optional[str],
                      holder: Optional[str]) -> bool:
    """Whether `trespasser` still runs a process on the device `holder` (still) holds."""
    hold = holds.get(uuid)
    if hold is None or trespasser is None:
        return False
    held_by = hold.holder.user if hold.holder is not None else None
    if holder is not None and held_by != holder:
        return False
    return any(owner.user == trespasser for owner in hold.processes.values())


def escalations(pending: Iterable[Tuple[float, Event]], now: float
                ) -> Tuple[List[Event], List[Tuple[float, Event]]]:
    """(the trespasses whose time to reach the admin has come, those still to wait)."""
    listed = list(pending)
    return ([event for when, event in listed if when <= now],
            [(when, event) for when, event in listed if when > now])
