"""What no event of the lease rules says, looked for every `notify_check_every` seconds: a hold
that has computed nothing for --notify-idle-after, a hold for a duration that ends within
--notify-before, and a trespass still going on --notify-escalate after it began (then the
admin is told). Each is handed to the notifier as an Event of its own kind (`idle`,
`expiring`, `escalated`), which messages.py words. Pure: the lease state, the idle times and
the clocks are given."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence

from patroller.config import Config
from patroller.core.leases import Event, Hold, LeaseManager

HELD = ("reserved", "allocated", "claimed", "shared")  # the states in which someone holds it


def due(
    holds: Mapping[str, Hold],
    numbers: Mapping[str, int],
    state: Callable[[str], str],
    quiet_for: Callable[[str], float | None],
    config: Config,
    wall: float,
    clock: float,
) -> list[Event]:
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
            found.append(
                Event(
                    "idle",
                    user,
                    device,
                    {
                        "idle": round(quiet, 1),
                        "since": round(wall - quiet, 3),
                        "released_at": release,
                    },
                )
            )
        if hold.until is not None and 0 < hold.until - clock <= config.notify_before:
            found.append(
                Event(
                    "expiring",
                    user,
                    device,
                    {
                        "ends": round(wall + hold.until - clock, 3),
                        "left": round(hold.until - clock, 1),
                        "until": hold.until,
                    },
                )
            )
    return found


def still_trespassing(
    holds: Mapping[str, Hold], uuid: str, trespasser: str | None, holder: str | None
) -> bool:
    """Whether `trespasser` still runs a process on the device `holder` (still) holds."""
    hold = holds.get(uuid)
    if hold is None or trespasser is None:
        return False
    held_by = hold.holder.user if hold.holder is not None else None
    if holder is not None and held_by != holder:
        return False
    return any(owner.user == trespasser for owner in hold.processes.values())


def escalations(
    pending: Iterable[tuple[float, Event]], now: float
) -> tuple[list[Event], list[tuple[float, Event]]]:
    """(the trespasses whose time to reach the admin has come, those still to wait)."""
    listed = list(pending)
    return (
        [event for when, event in listed if when <= now],
        [(when, event) for when, event in listed if when > now],
    )


class Escalations:
    """The trespasses to tell the admin of once they have lasted `after` seconds (0: none are
    held back), each episode (its notice's key) waiting once; `most` wait at most (the first
    added are forgotten first, as the episodes are: a storm of trespasses is bounded)."""

    def __init__(self, after: float, most: int) -> None:
        self.after = after
        self.most = most
        # key -> (when, trespass), the first added first (an OrderedDict: a plain dict's first
        # key, after many taken from its front, is found by a scan past every slot emptied)
        self._waiting: OrderedDict[tuple[str, ...], tuple[float, Event]] = OrderedDict()

    def add(self, event: Event, key: tuple[str, ...], since: float) -> None:
        """The trespass `event`, of the episode `key` told at `since`, unless it waits already."""
        if self.after > 0 and key not in self._waiting:
            self._waiting[key] = (since + self.after, event)
            if len(self._waiting) > self.most:
                self._waiting.popitem(last=False)

    def ripe(self, now: float) -> list[Event]:
        """Those whose time has come (no longer waiting)."""
        ripe = [key for key, (when, _) in self._waiting.items() if when <= now]
        return [self._waiting.pop(key)[1] for key in ripe]


class Troubles:
    """The daemon's own trouble (services.troubles: (key, what, what to do) each), told once it
    has lasted `after` seconds."""

    def __init__(self, after: float) -> None:
        self.after = after
        self._since: dict[str, float] = {}

    def look(
        self, current: Sequence[tuple[str, str, str]], now: float
    ) -> tuple[list[str], list[Event]]:
        """(the keys of the trouble gone since the last look, the `daemon` events to tell)."""
        found = {key: (what, fix) for key, what, fix in current}
        gone = [key for key in self._since if key not in found]
        for key in gone:
            del self._since[key]
        events = []
        for key, (what, fix) in found.items():
            since = self._since.setdefault(key, now)
            if now - since >= self.after:
                events.append(
                    Event(
                        "daemon",
                        None,
                        (),
                        {"trouble": key, "what": what, "fix": fix, "since": since},
                    )
                )
        return gone, events


def look(
    leases: LeaseManager,
    quiet_for: Callable[[str], float | None],
    troubles: Troubles,
    trouble: Sequence[tuple[str, str, str]],
    waiting: Escalations,
    config: Config,
    wall: float,
) -> tuple[list[tuple[str, ...]], list[Event]]:
    """One look (`wall`: epoch seconds): (the episodes of the daemon's trouble now over, the
    events to tell in order: holds idle or ending, `trouble` that has lasted, trespasses still
    going on --notify-escalate after they were told)."""
    holds = leases.holds
    numbers = {device.uuid: device.number for device in leases.inventory}
    events = due(holds, numbers, leases.state, quiet_for, config, wall, leases.clock())
    gone, lasting = troubles.look(trouble, wall)
    events += lasting
    for event in waiting.ripe(wall):
        if still_trespassing(holds, event.devices[0][0], event.user, event.details.get("holder")):
            details = {**event.details, "lasting": config.notify_escalate}
            events.append(Event("escalated", event.user, event.devices, details))
    return [("daemon", key) for key in gone], events
