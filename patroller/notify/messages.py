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
from dataclasses import dataclass, replace
from typing import Any

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


def notices_of(event: Event, host: str, at: float, reader: Reader = EVERYONE) -> Sequence[Notice]:
    """What `event` tells, if anything (most events tell nobody: a grant asked and given at
    once, a release, a claim by its holder), in `reader`'s words."""
    gpus = _gpus(event.devices)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
    who = reader.name(event.user)
    details = event.details
    if event.kind == "trespass" and event.devices:
        return [_trespass(event, host, gpus, when, reader, details)]
    if event.kind == "grant" and details.get("waited"):
        uuids = tuple(uuid for uuid, _ in event.devices)
        waited = describe(float(details["waited"]), most=2)
        return [
            Notice(
                "granted",
                ("granted", *uuids, f"{at:.3f}"),
                event.user,
                event.devices,
                f"{host}: {gpus} granted to {who} after {waited}",
                f"{who} waited {waited} and now holds {gpus} of {host} (since {when}). "
                f"{_hold_words(details)}",
                concerns=_users(event.user),
            )
        ]
    if event.kind == "claim" and event.devices and event.user:
        return [
            Notice(
                "unreserved",
                ("unreserved", event.devices[0][0], event.user),
                event.user,
                event.devices,
                f"{host}: {gpus} used by {who} without a reservation",
                f"{who} runs process {details.get('pid')} on {gpus} of {host} (since "
                f"{when}) without having reserved it: it is held for {who} while it runs, "
                "and nobody was asked. Reserve first (`patroller run -n 1 -- ...`), so "
                "that the queue stays fair and nobody's run lands on it.",
                concerns=_users(event.user),
            )
        ]
    if event.kind == "idle" and event.devices:
        return [_idle(event, host, gpus, who, details)]
    if event.kind == "expiring" and event.devices:
        ends = _clock(float(details["ends"]))
        return [
            Notice(
                "expiring",
                ("expiring", event.devices[0][0], event.user or "", f"{details.get('until')}"),
                event.user,
                event.devices,
                f"{host}: the hold of {gpus} by {who} ends at {ends}",
                f"The hold of {gpus} of {host} that {who} asked for ends at {ends}, in "
                f"{describe(float(details['left']), most=2)}. Save what runs there: the "
                "GPU is then free for others (`patroller reserve --hold ...` asks again).",
                concerns=_users(event.user),
            )
        ]
    if event.kind == "escalated" and event.devices:
        [told] = (_trespass(replace(event, kind="trespass"), host, gpus, when, reader, details),)
        lasting = describe(float(details["lasting"]), most=2)
        return [
            replace(
                told,
                key=("escalated", *told.key[1:]),
                concerns=(),
                title=f"{told.title}, for {lasting}",
                body=f"{told.body} It has gone on for {lasting}; the users concerned "
                "were told when it began.",
            )
        ]
    if event.kind == "daemon":
        since = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(details["since"])))
        return [
            Notice(
                "daemon",
                ("daemon", str(details["trouble"])),
                None,
                (),
                f"{host}: {details['what']}",
                f"Patroller on {host}: {details['what']}, since {since}. {details['fix']}",
            )
        ]
    if event.kind in ("lost", "back") and event.devices:
        uuid = event.devices[0][0]
        holder = f", held by {who}," if event.user else ""
        if event.kind == "lost":
            return [
                Notice(
                    "lost",
                    ("lost", uuid),
                    event.user,
                    event.devices,
                    f"{host}: {gpus} is lost",
                    f"{gpus} of {host}{holder} is gone from nvidia-smi's list or has "
                    f"stopped reporting, since {when}. Nobody is granted it until it is "
                    "back; its holder keeps it. Look at the kernel log (Xid errors) and "
                    "`nvidia-smi` on the host; a reset or a reboot may be needed.",
                    concerns=_users(event.user),
                )
            ]
        return [
            Notice(
                "lost",
                ("back", uuid, f"{at:.3f}"),
                event.user,
                event.devices,
                f"{host}: {gpus} is back",
                f"{gpus} of {host}{holder} is reported "
                f"again since {when}, and is granted as before.",
                ends=("lost", uuid),
                concerns=_users(event.user),
            )
        ]
    if event.kind in ("unhealthy", "healthy") and event.devices:
        return [_health(event, host, gpus, who, when, at)]
    return []


def _health(event: Event, host: str, gpus: str, who: str, when: str, at: float) -> Notice:
    """A GPU unhealthy (granted to nobody until it is healthy again), or healthy again: the
    admin and its holder are told, once an episode."""
    uuid = event.devices[0][0]
    holder = f", held by {who}," if event.user else ""
    if event.kind == "unhealthy":
        reason = printable(str(event.details.get("reason") or "a fault"), 600)
        return Notice(
            "unhealthy",
            ("unhealthy", uuid),
            event.user,
            event.devices,
            f"{host}: {gpus} is unhealthy",
            f"{gpus} of {host}{holder} is unhealthy since {when}: {reason}. Nobody "
            "is granted it until it is healthy again; its holder keeps it (save "
            "what runs there and release it). Patroller sees it healthy again when "
            "nvidia-smi no longer shows the fault, or after a reset; the host's root "
            f"may say so (`patroller release --healthy {event.devices[0][1]}`).",
            concerns=_users(event.user),
        )
    return Notice(
        "unhealthy",
        ("healthy", uuid, f"{at:.3f}"),
        event.user,
        event.devices,
        f"{host}: {gpus} is healthy again",
        f"{gpus} of {host}{holder} is healthy again since {when}, and is granted as before.",
        ends=("unhealthy", uuid),
        concerns=_users(event.user),
    )


def _trespass(
    event: Event, host: str, gpus: str, when: str, reader: Reader, details: Mapping[str, Any]
) -> Notice:
    pid = details.get("pid")
    command = details.get("command")  # the process's name, as nvidia-smi shows it
    holder = details.get("holder")
    uuid = event.devices[0][0]
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
        key = ("trespass", uuid, event.user or "", "over_limit")
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
        key = ("trespass", uuid, event.user or "", str(holder or ""))
    return Notice(
        "trespass",
        key,
        event.user,
        event.devices,
        f"{host}: trespass on {gpus} by {who}",
        body,
        concerns=_users(event.user, holder),
    )


def _idle(event: Event, host: str, gpus: str, who: str, details: Mapping[str, Any]) -> Notice:
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
    return Notice(
        "idle",
        ("idle", event.devices[0][0], event.user or ""),
        event.user,
        event.devices,
        f"{host}: {gpus} held idle by {who} for {idle}",
        body,
        concerns=_users(event.user),
    )


def _clock(at: float) -> str:
    return time.strftime("%H:%M UTC", time.gmtime(at))


def _users(*names: str | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(name) for name in names if name))


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
