"""The outbox's journal, line by line (outbox.py writes it): what each record says, how it is
written, and how a journal is read back at start, a version's lines as the next reads them.

    {"outbox": 1}                                              the first line: its version
    {"q": "9f3a..-1", "to": "alice", "admin": false, "tag": "5be0..", "n": 1, "notice": {...}}
                                                                queued
    {"s": "9f3a..-1"}     a try begins (on disk before the try does)
    {"f": "9f3a..-1"}     that try failed: it is tried again
    {"d": "9f3a..-1", "r": "sent"}                              done: sent, failed, dropped
    {"e": ["trespass", "GPU-..", "bob", "alice"], "at": 1765000000.0}   an episode told
    {"x": ["lost", "GPU-.."]}                                   an episode ended

`admin` says whether the recipient is the admin (--notify) or a user, whatever her name (an
account may be called `admin`); a line without it, written before it was kept, is the admin's
when its `to` is "admin". A line that is not one of these (a torn last line, another's) is
counted and skipped.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from patroller.config import Config
from patroller.notify.messages import Notice

VERSION = 1
LONGEST = 1 << 20  # characters of one line at most: a longer one is not read


@dataclass
class Pending:
    """A notice queued for one destination of one recipient and not yet done."""

    ident: str
    recipient: str  # "admin", or the user
    tag: str  # the destination's tag_of(url)
    number: int  # its number among the recipient's when it was queued
    notice: Notice
    trying: bool = False  # a try had begun and was not known to have failed
    admin: bool = False  # the admin's destination (--notify), not a user's of that name


@dataclass
class Restored:
    """What the journal held at start."""

    pending: list[Pending] = field(default_factory=list)  # to queue again
    interrupted: list[Pending] = field(default_factory=list)  # a try cut short: not again
    episodes: dict[tuple[str, ...], float] = field(default_factory=dict)  # key -> told at
    unreadable: int = 0  # lines that were not a record of this version (a torn last one)


def read(path: str, now: float, config: Config) -> Restored:
    """The journal at `path` as it stands: what is pending, the episodes told within
    --notify-repeat (the newest `notify_episodes`), the lines that are none of ours. OSError
    if it cannot be read; nothing when there is none."""
    restored = Restored()
    pending: dict[str, Pending] = {}
    episodes: dict[tuple[str, ...], float] = {}
    try:
        f = open(path, encoding="utf-8", errors="surrogateescape")  # noqa: SIM115 (with below)
    except FileNotFoundError:
        return restored
    with f:
        for text in f:
            try:
                record = json.loads(text) if len(text) <= LONGEST else None
                if not isinstance(record, dict) or not apply(record, pending, episodes):
                    restored.unreadable += 1
            except (ValueError, TypeError, KeyError, RecursionError):
                restored.unreadable += 1
    forget = now - config.notify_repeat
    kept = [(k, at) for k, at in episodes.items() if at >= forget]
    restored.episodes = dict(kept[max(0, len(kept) - config.notify_episodes) :])
    for item in pending.values():
        (restored.interrupted if item.trying else restored.pending).append(item)
    return restored


def apply(
    record: dict[str, Any], pending: dict[str, Pending], episodes: dict[tuple[str, ...], float]
) -> bool:
    """One record applied to what is pending and told; False if it is not one of ours."""
    if "q" in record:
        notice = record["notice"]
        recipient = str(record["to"])
        admin = record.get("admin", recipient == "admin")  # (not kept before: the name said)
        if not isinstance(admin, bool):
            raise ValueError("admin is true or false")
        pending[str(record["q"])] = Pending(
            str(record["q"]),
            recipient,
            str(record["tag"]),
            int(record["n"]),
            notice if isinstance(notice, Notice) else decode(notice),
            admin=admin,
        )
    elif "s" in record or "f" in record:
        found = pending.get(str(record.get("s") or record.get("f")))
        if found is not None:
            found.trying = "s" in record
    elif "d" in record:
        pending.pop(str(record["d"]), None)
    elif "e" in record:
        mark(episodes, key_of(record["e"]), record["at"])
    elif "x" in record:
        mark(episodes, key_of(record["x"]), None)
    else:
        return record.get("outbox") == VERSION
    return True


def mark(episodes: dict[tuple[str, ...], float], key: tuple[str, ...], at: Any) -> None:
    """The episode `key` told at `at` (the newest last: the first are forgotten first), or
    ended (`at` None)."""
    episodes.pop(key, None)
    if at is not None:
        episodes[key] = float(at)


def line(record: dict[str, Any]) -> str:
    return _ENCODER.encode(record) + "\n"


def key_of(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise ValueError("a key is a list")
    return tuple(str(part) for part in value)


def _encode(value: Any) -> dict[str, Any]:
    if not isinstance(value, Notice):
        raise TypeError(f"{type(value).__name__} is not a notice")
    return asdict(value)


# one encoder for every line (json.dumps with options would make one each time)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_encode)


def decode(value: Any) -> Notice:
    if not isinstance(value, dict):
        raise ValueError("a notice is an object")
    return Notice(
        kind=str(value["kind"]),
        key=key_of(value["key"]),
        user=None if value.get("user") is None else str(value["user"]),
        devices=tuple((str(uuid), int(number)) for uuid, number in value["devices"]),
        title=str(value["title"]),
        body=str(value["body"]),
        ends=key_of(value.get("ends", [])),
        concerns=key_of(value.get("concerns", [])),
    )
