"""Each notice's words, from an event of the lease rules (core/leases: the audit record's
events). Pure: no I/O, no clock but the event's time given.

A notice says what happened, on which GPU of which host, who and since when, and what to do,
in a few plain lines; text others chose (a user's label, a process's command) is made
printable first (core/text.py), so no control character reaches a message. Its words depend on
whom it is for (`Reader`): the admin reads every name; with --hide-users a user reads her own
name and "another user" for anyone else, as the API shows her, and a Slurm job's or pod's ids
and an account only where they are hers. Its key names its
episode: a trespass by one user on one GPU held by another is one episode, told once, however
many of her processes arrive (episodes.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from patroller.core.leases import Event
from patroller.core.text import printable
from patroller.durations import describe

NAME = 80  # characters of a user's name in a notice at most
COMMAND = 60  # characters of a process's name in a notice at most


@dataclass(frozen=True)
class Notice:
    """One thing to tell: its kind (config NOTIFY_KINDS), its episode, its words."""

    kind: str
    key: tuple[str, ...]  # the episode it belongs to
    user: str | None  # whom it is about (the trespasser, the waiter, the GPU's holder)
    devices: tuple[tuple[str, int], ...]  # (uuid, number) of the GPUs it is about
    title: str
    body: str
    ends: tuple[str, ...] = ()  # the key of an episode this notice ends (a GPU back)
    concerns: tuple[str, ...] = ()  # the users it is told to: trespasser and holder, waiter


@dataclass(frozen=True)
class Reader:
    """Whom a notice's words are for: everyone's names (`user` None: the admin, or anyone
    when names are not hidden), or one user's view under --hide-users."""

    user: str | None = None

    def name(self, who: str | None) -> str:
        if not who:
            return "an unknown user"
        if self.user is not None and who != self.user:
            return "another user"
        return printable(who, NAME)

    def sees(self, who: str | None) -> bool:
        """Whether facts that are `who`'s own (a job's ids, an account) are shown."""
        return self.user is None or who == self.user


EVERYONE = Reader()


class Told(NamedTuple):
    """A notice before its words: what the episodes and the rates need (its kind, its episode,
    the episode it ends, whom it is told to), cheap to make (a tuple: a storm makes a thousand a
    second). Its words are made by `notice`, only for a notice that is sent: in a storm most
    are held back, or wait to be escalated."""

    kind: str
    key: tuple[str, ...]  # the episode it belongs to
    event: Event
    host: str
    at: float
    ends: tuple[str, ...] = ()
    concerns: tuple[str, ...] = ()

    def notice(self, reader: Reader = EVERYONE) -> Notice:
        """The notice, in `reader`'s words."""
        return self._notice(*_words(self, reader))

    def unworded(self) -> Notice:
        """The notice without its words (no title, no body): all that a notice dropped at a
        full queue is counted and audited by."""
        return self._notice("", "")

    def _notice(self, title: str, body: str) -> Notice:
        event = self.event
        daemon = event.kind == "daemon"
        return Notice(
            self.kind,
            self.key,
            None if daemon else event.user,
            () if daemon else event.devices,
            title,
            body,
            ends=self.ends,
            concerns=self.concerns,
        )


class Words:
    """A told notice's words for each reader, made at the first need and then kept."""

    def __init__(self, told: Told) -> None:
        self.told = told
        self._made: dict[str | None, Notice] = {}

    def everyone(self) -> Notice:
        """In the admin's words (everyone's, when names are not hidden)."""
        return self.of(None)

    def of(self, user: str | None) -> Notice:
        """In `user`'s words (None: everyone's)."""
        made = self._made.get(user)
        if made is None:
            made = self._made[user] = self.told.notice(Reader(user))
        return made


def notices_of(event: Event, host: str, at: float, reader: Reader = EVERYONE) -> Sequence[Notice]:
    """What `event` tells, if anything, in `reader`'s words (tolds_of, each with its words)."""
    return [told.notice(reader) for told in tolds_of(event, host, at)]


def tolds_of(event: Event, host: str, at: float) -> Sequence[Told]:
    """What `event` tells, if anything, without the words (most events tell nobody: a grant
    asked and given at once, a release, a claim by its holder)."""
    kind, user, details, devices = event.kind, event.user, event.details, event.devices
    if kind == "trespass" and devices:  # a storm's kind: nothing made that it does not use
        concerns = _users(user, details.get("holder"))
        return [Told("trespass", _trespass_key(event), event, host, at, (), concerns)]
    mine = _users(user)
    if kind == "grant" and details.get("waited"):
        key = ("granted", *(uuid for uuid, _ in devices), f"{at:.3f}")
        return [Told("granted", key, event, host, at, concerns=mine)]
    if kind == "claim" and devices and user:
        return [Told("unreserved", ("unreserved", devices[0][0], user), event, host, at, (), mine)]
    if kind == "idle" and devices:
        return [Told("idle", ("idle", devices[0][0], user or ""), event, host, at, (), mine)]
    if kind == "expiring" and devices:
        key = ("expiring", devices[0][0], user or "", f"{details.get('until')}")
        return [Told("expiring", key, event, host, at, concerns=mine)]
    if kind == "escalated" and devices:
        key = ("escalated", *_trespass_key(event)[1:])
        return [Told("trespass", key, event, host, at)]
    if kind == "daemon":
        return [Told("daemon", ("daemon", str(details["trouble"])), event, host, at)]
    if kind in ("lost", "back") and devices:
        uuid = devices[0][0]
        if kind == "lost":
            return [Told("lost", ("lost", uuid), event, host, at, concerns=mine)]
        ends = ("lost", uuid)
        return [Told("lost", ("back", uuid, f"{at:.3f}"), event, host, at, ends, mine)]
    if kind in ("unhealthy", "healthy") and devices:
        uuid = devices[0][0]
        if kind == "unhealthy":
            return [Told("unhealthy", ("unhealthy", uuid), event, host, at, concerns=mine)]
        ends = ("unhealthy", uuid)
        return [Told("unhealthy", ("healthy", uuid, f"{at:.3f}"), event, host, at, ends, mine)]
    return []


def _trespass_key(event: Event) -> tuple[str, str, str, str]:
    """A trespass's episode: one user on one GPU, beyond a limit or on another's hold (however
    many of her processes arrive)."""
    details = event.details
    uuid, user = event.devices[0][0], event.user or ""
    if details.get("why") == "over_limit":
        return ("trespass", uuid, user, "over_limit")
    return ("trespass", uuid, user, str(details.get("holder") or ""))


def _words(told: Told, reader: Reader) -> tuple[str, str]:
    """A notice's title and body."""
    event, host, at = told.event, told.host, told.at
    gpus = _gpus(event.devices)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
    who = reader.name(event.user)
    details = event.details
    kind = event.kind
    if kind == "trespass":
        return _trespass(event, host, gpus, when, reader, details)
    if kind == "grant":
        waited = describe(float(details["waited"]), most=2)
        return (
            f"{host}: {gpus} granted to {who} after {waited}",
            f"{who} waited {waited} and now holds {gpus} of {host} (since {when}). "
            f"{_hold_words(details)}",
        )
    if kind == "claim":
        return (
            f"{host}: {gpus} used by {who} without a reservation",
            f"{who} runs process {details.get('pid')} on {gpus} of {host} (since "
            f"{when}) without having reserved it: it is held for {who} while it runs, "
            "and nobody was asked. Reserve first (`patroller run -n 1 -- ...`), so "
            "that the queue stays fair and nobody's run lands on it.",
        )
    if kind == "idle":
        return _idle(event, host, gpus, who, details)
    if kind == "expiring":
        ends = _clock(float(details["ends"]))
        return (
            f"{host}: the hold of {gpus} by {who} ends at {ends}",
            f"The hold of {gpus} of {host} that {who} asked for ends at {ends}, in "
            f"{describe(float(details['left']), most=2)}. Save what runs there: the "
            "GPU is then free for others (`patroller reserve --hold ...` asks again).",
        )
    if kind == "escalated":
        title, body = _trespass(event, host, gpus, when, reader, details)
        lasting = describe(float(details["lasting"]), most=2)
        return (
            f"{title}, for {lasting}",
            f"{body} It has gone on for {lasting}; the users concerned were told when it began.",
        )
    if kind == "daemon":
        since = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(details["since"])))
        return (
            f"{host}: {details['what']}",
            f"Patroller on {host}: {details['what']}, since {since}. {details['fix']}",
        )
    holder = f", held by {who}," if event.user else ""
    if kind == "lost":
        return (
            f"{host}: {gpus} is lost",
            f"{gpus} of {host}{holder} is gone from nvidia-smi's list or has "
            f"stopped reporting, since {when}. Nobody is granted it until it is "
            "back; its holder keeps it. Look at the kernel log (Xid errors) and "
            "`nvidia-smi` on the host; a reset or a reboot may be needed.",
        )
    if kind == "back":
        return (
            f"{host}: {gpus} is back",
            f"{gpus} of {host}{holder} is reported again since {when}, and is granted as before.",
        )
    if kind == "unhealthy":
        # A GPU unhealthy is granted to nobody until it is healthy again: the admin and its
        # holder are told, once an episode.
        reason = printable(str(details.get("reason") or "a fault"), 600)
        return (
            f"{host}: {gpus} is unhealthy",
            f"{gpus} of {host}{holder} is unhealthy since {when}: {reason}. Nobody "
            "is granted it until it is healthy again; its holder keeps it (save "
            "what runs there and release it). Patroller sees it healthy again when "
            "nvidia-smi no longer shows the fault, or after a reset; the host's root "
            f"may say so (`patroller release --healthy {event.devices[0][1]}`).",
        )
    return (
        f"{host}: {gpus} is healthy again",
        f"{gpus} of {host}{holder} is healthy again since {when}, and is granted as before.",
    )


def _trespass(
    event: Event, host: str, gpus: str, when: str, reader: Reader, details: Mapping[str, Any]
) -> tuple[str, str]:
    pid = details.get("pid")
    command = details.get("command")  # the process's name, as nvidia-smi shows it
    holder = details.get("holder")
    who = reader.name(event.user)
    named = f" ({printable(str(command), COMMAND)})" if command else ""
    runs = f"{who} runs process {pid}{named} on {gpus} of {host} (since {when})"
    if details.get("why") == "over_limit":
        held = ", ".join(str(n) for n in details.get("held", ()))
        account = details.get("account") if reader.sees(event.user) else None
        limit = f"the limit of {details.get('limit')} GPU(s)" + (
            f" of the account {printable(str(account), NAME)}" if account else ""
        )
        body = (
            f"{runs}, beyond {limit}"
            + (f" (holding GPU {held})" if held else "")
            + ". One run is to end, or a GPU to be released: `patroller status` shows which."
        )
    else:
        allocation = next(
            (
                f"{scheduler} {', '.join(str(i) for i in details[field])}"
                if reader.sees(holder)
                else f"a {scheduler}"
                for scheduler, field in (("Slurm job", "jobs"), ("pod", "pods"))
                if details.get(field)
            ),
            None,
        )
        whose = (
            f"allocated to {allocation}" + (f" of {reader.name(holder)}" if holder else "")
            if allocation
            else f"held by {reader.name(holder)}"
            if holder
            else "held by nobody"
        )
        body = (
            f"{runs}, which is {whose}. The run is to move to a free GPU (`patroller status` "
            "shows which), reserved first (`patroller run`)."
        )
    return f"{host}: trespass on {gpus} by {who}", body


def _idle(
    event: Event, host: str, gpus: str, who: str, details: Mapping[str, Any]
) -> tuple[str, str]:
    numbers = " ".join(str(number) for _, number in event.devices)
    idle = describe(float(details["idle"]), most=2)
    body = (
        f"{gpus} of {host}, which {who} holds, has computed nothing since "
        f"{_clock(float(details['since']))} ({idle}). If it is not needed, release it "
        f"(`patroller release {numbers}`) so that others may have it."
    )
    if details.get("released_at"):
        body += (
            f" It is released at {_clock(float(details['released_at']))} all the same "
            "(the host's --idle-release)."
        )
    return f"{host}: {gpus} held idle by {who} for {idle}", body


def _clock(at: float) -> str:
    return time.strftime("%H:%M UTC", time.gmtime(at))


def _users(user: Any, other: Any = None) -> tuple[str, ...]:
    """Whom a notice concerns: `user`, then `other` where another, each named once (a storm's
    trespasses make a thousand a second: no generator, no dictionary)."""
    first = str(user) if user else None
    second = str(other) if other else None
    if first is None:
        return () if second is None else (second,)
    return (first,) if second is None or second == first else (first, second)


def _gpus(devices: Sequence[tuple[str, int]]) -> str:
    numbers = [str(number) for _, number in devices]
    return ("GPU " if len(numbers) == 1 else "GPUs ") + ", ".join(numbers)


def _hold_words(details: Mapping[str, Any]) -> str:
    hold = details.get("hold")
    if hold == "duration":
        return f"The hold lasts {describe(float(details.get('seconds', 0)), most=2)}."
    if hold == "process":
        return f"It is held while process {details.get('pid')} runs."
    return (
        "Start the run now: the reservation is held for a short lease until its process "
        "shows up on the GPU."
    )
