"""What is being told, kept on disk so that a restart, even a kill -9, neither loses a notice
waiting to be sent nor sends one twice, nor tells again an episode told before it.

`<state-dir>/notify-outbox.jsonl` (0600, as every file the daemon writes) is a journal, one
JSON object a line:

    {"outbox": 1}                                              the first line: its version
    {"q": "9f3a..-1", "to": "alice", "tag": "5be0..", "n": 1, "notice": {...}}   queued
    {"s": "9f3a..-1"}     a try begins (on disk before the try does)
    {"f": "9f3a..-1"}     that try failed: it is tried again
    {"d": "9f3a..-1", "r": "sent"}                              done: sent, failed, dropped
    {"e": ["trespass", "GPU-..", "bob", "alice"], "at": 1765000000.0}   an episode told
    {"x": ["lost", "GPU-.."]}                                   an episode ended

A destination is named by a tag, the first 16 hex digits of its URL's SHA-256: never the URL
(users' URLs stay in notify.json alone). At start the journal is read: a notice queued and not
done is queued again, at its recipient's destination with that tag if she still has it; one
whose try had begun when the daemon died (`s` last) is not tried again, as the destination may
have it already: its audit line says `interrupted`. Episodes told within --notify-repeat are
not told again. Then the journal is written anew with only what is still pending, and again
whenever it has grown past Config.notify_outbox_lines and four times what it holds.

Writes are made by one thread, in the order they were asked for: the loop only hands a line
over. A line that comes after a quiet (nothing written within Config.notify_outbox_gather) is
written at once; in a storm, the writer gathers what comes within that time before it writes
(a storm's thousand lines a second are a few writes), so a kill -9 may lose the last
notify_outbox_gather of a storm's lines. A try's `s` is written at once and
waited for (by the destination's thread, up to Config.notify_outbox_wait), so that a kill
during a try is known at the restart. A line that cannot be written (a full disk) is counted
and logged once a `repeat_log_every`; what is in memory goes on, and the next rewrite puts the
journal right again. Without a state directory nothing is kept.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import queue
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from patroller.config import Config
from patroller.core.throttle import Throttle
from patroller.notify.messages import Notice
from patroller.state import private

log = logging.getLogger(__name__)

FILE = "notify-outbox.jsonl"
VERSION = 1
LONGEST = 1 << 20  # characters of one line at most: a longer one is not read


def tag_of(url: str) -> str:
    """A destination's name on disk: never its URL, which holds secrets."""
    return hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass
class Pending:
    """A notice queued for one destination of one recipient and not yet done."""

    ident: str
    recipient: str  # "admin", or the user
    tag: str  # the destination's tag_of(url)
    number: int  # its number among the recipient's when it was queued
    notice: Notice
    trying: bool = False  # a try had begun and was not known to have failed


@dataclass
class Restored:
    """What the journal held at start."""

    pending: list[Pending] = field(default_factory=list)  # to queue again
    interrupted: list[Pending] = field(default_factory=list)  # a try cut short: not again
    episodes: dict[tuple[str, ...], float] = field(default_factory=dict)  # key -> told at
    unreadable: int = 0  # lines that were not a record of this version (a torn last one)


class Outbox:
    """The journal of `directory` (None: nothing is kept)."""

    def __init__(
        self,
        directory: str | None,
        config: Config,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = os.path.join(directory, FILE) if directory is not None else None
        self.config = config
        self.failures = 0  # lines that could not be written
        self.rewrites = 0
        self._prefix = secrets.token_hex(4)
        self._count = itertools.count(1)
        self._lines: queue.SimpleQueue[tuple[dict[str, Any], threading.Event | None] | None] = (
            queue.SimpleQueue()
        )
        self._pending: dict[str, Pending] = {}  # the writer thread's alone
        # the writer thread's alone; the first told first (an OrderedDict: a plain dict's first
        # key, after many taken from its front, is found by a scan past every slot emptied)
        self._episodes: OrderedDict[tuple[str, ...], float] = OrderedDict()
        self._written = 0  # lines in the file now
        self._hurry = threading.Event()  # a line waited for was handed over: written at once
        self._clock = clock
        self._last_write = -float("inf")  # when the writer last wrote (the clock's reading)
        self._fd: int | None = None
        self._thread: threading.Thread | None = None
        self._failing = Throttle(1, config.repeat_log_every)

    @property
    def on(self) -> bool:
        return self.path is not None

    # -- at start and at the end (blocking) ---------------------------------------------------

    def open(self, now: float) -> Restored:
        """Read the journal, write it anew with what is still pending, and start the writer."""
        restored = Restored()
        if self.path is None:
            return restored
        try:
            restored = self._read(now)
        except OSError as exc:
            log.warning(
                "notifications: the outbox %s cannot be read (%s): notices pending "
                "before the restart are not sent",
                self.path,
                exc.strerror or exc,
            )
        self._pending = {p.ident: p for p in restored.pending}
        self._episodes = OrderedDict(restored.episodes)
        try:
            self._rewrite()
        except OSError as exc:
            self._failed(exc)
        self._thread = threading.Thread(target=self._run, name="notify-outbox", daemon=True)
        self._thread.start()
        return restored

    def stop(self, timeout: float) -> None:
        """Write what was handed over, and end the writer (blocking, up to `timeout` s)."""
        if self._thread is None:
            return
        self._lines.put(None)
        self._hurry.set()
        self._thread.join(timeout)
        self._thread = None

    # -- from the loop: never blocks -----------------------------------------------------------

    def queued(self, notice: Notice, recipient: str, tag: str, number: int) -> str:
        """A notice queued for a destination: its id ("" when nothing is kept)."""
        if self.path is None:
            return ""
        ident = f"{self._prefix}-{next(self._count)}"
        self._put({"q": ident, "to": recipient, "tag": tag, "n": number, "notice": notice})
        return ident

    def told(self, key: tuple[str, ...], at: float) -> None:
        if self.path is not None:
            self._put({"e": list(key), "at": round(at, 3)})

    def ended(self, key: tuple[str, ...]) -> None:
        if self.path is not None:
            self._put({"x": list(key)})

    # -- from the destinations' threads --------------------------------------------------------

    def trying(self, ident: str) -> None:
        """A try of `ident` begins: returns once that is on disk (or after notify_outbox_wait)."""
        if ident and self._thread is not None:
            written = threading.Event()
            self._lines.put(({"s": ident}, written))
            self._hurry.set()
            written.wait(self.config.notify_outbox_wait)

    def flush(self, timeout: float) -> bool:
        """Wait until every line handed over before is written; whether it was in time."""
        if self._thread is None:
            return True
        written = threading.Event()
        self._lines.put(({}, written))
        self._hurry.set()
        return written.wait(timeout)

    def failed_try(self, ident: str) -> None:
        if ident:
            self._put({"f": ident})

    def done(self, ident: str, result: str) -> None:
        if ident:
            self._put({"d": ident, "r": result})

    def _put(self, record: dict[str, Any]) -> None:
        self._lines.put((record, None))

    # -- the writer's thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = [self._lines.get()]
            if (
                batch[0] is not None
                and batch[0][1] is None  # nobody waits for it
                and self._clock() - self._last_write < self.config.notify_outbox_gather
            ):  # a storm: the lines after it are gathered (a line after a quiet, written now)
                self._hurry.wait(self.config.notify_outbox_gather)
            self._hurry.clear()
            while len(batch) < 4096:  # what else is waiting, written in one go
                try:
                    batch.append(self._lines.get_nowait())
                except queue.Empty:
                    break
            ending = None in batch
            items = [item for item in batch if item is not None]
            records = [record for record, _ in items if record]  # {}: a flush's, no line
            for record in records:
                _apply(record, self._pending, self._episodes)
            while len(self._episodes) > self.config.notify_episodes:
                self._episodes.popitem(last=False)
            if records:
                self._write(records)
                self._last_write = self._clock()
            for _, written in items:
                if written is not None:
                    written.set()
            if ending:
                self._close()
                return

    def _write(self, records: list[dict[str, Any]]) -> None:
        try:
            if self._fd is None:
                self._rewrite()  # from memory, which holds these records already
                return
            data = "".join(_line(r) for r in records).encode("utf-8", "surrogatepass")
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            self._written += len(records)
            if self._grown():
                self._rewrite()
        except OSError as exc:
            self._close()  # the next batch rewrites the whole journal
            self._failed(exc)

    def _grown(self) -> bool:
        held = len(self._pending) + len(self._episodes)
        return self._written > max(self.config.notify_outbox_lines, 4 * held)

    def _rewrite(self) -> None:
        """The journal anew: a temporary file, then a rename (the episodes no longer needed
        left out)."""
        assert self.path is not None
        self._close()
        forget = time.time() - self.config.notify_repeat
        for key in [k for k, at in self._episodes.items() if at < forget]:
            del self._episodes[key]
        counted = [0]

        def records() -> Iterator[dict[str, Any]]:
            yield {"outbox": VERSION}
            for key, at in self._episodes.items():
                yield {"e": list(key), "at": at}
            for pending in self._pending.values():
                yield {
                    "q": pending.ident,
                    "to": pending.recipient,
                    "tag": pending.tag,
                    "n": pending.number,
                    "notice": pending.notice,
                }
                if pending.trying:
                    yield {"s": pending.ident}

        def parts() -> Iterator[bytes]:  # a thousand lines a write: never the whole in memory
            every = records()
            while batch := list(itertools.islice(every, 1000)):
                counted[0] += len(batch)
                yield "".join(_line(r) for r in batch).encode("utf-8", "surrogatepass")

        private.replace(self.path, parts())
        self._fd = private.create(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        self._written = counted[0]
        self.rewrites += 1
        self._last_write = self._clock()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _failed(self, exc: OSError) -> None:
        self.failures += 1
        if self._failing.admit()[0]:
            log.warning(
                "notifications: the outbox %s cannot be written (%s): a restart now "
                "may lose or repeat notices",
                self.path,
                exc.strerror or exc,
            )

    def _read(self, now: float) -> Restored:
        assert self.path is not None
        restored = Restored()
        pending: dict[str, Pending] = {}
        episodes: dict[tuple[str, ...], float] = {}
        try:
            f = open(self.path, encoding="utf-8", errors="surrogateescape")  # noqa: SIM115 (with below)
        except FileNotFoundError:
            return restored
        with f:
            for line in f:
                try:
                    record = json.loads(line) if len(line) <= LONGEST else None
                    if not isinstance(record, dict) or not _apply(record, pending, episodes):
                        restored.unreadable += 1
                except (ValueError, TypeError, KeyError, RecursionError):
                    restored.unreadable += 1
        forget = now - self.config.notify_repeat
        kept = [(k, at) for k, at in episodes.items() if at >= forget]
        restored.episodes = dict(kept[max(0, len(kept) - self.config.notify_episodes) :])
        for item in pending.values():
            (restored.interrupted if item.trying else restored.pending).append(item)
        return restored


def _apply(
    record: dict[str, Any], pending: dict[str, Pending], episodes: dict[tuple[str, ...], float]
) -> bool:
    """One record applied to what is pending and told; False if it is not one of ours."""
    if "q" in record:
        notice = record["notice"]
        pending[str(record["q"])] = Pending(
            str(record["q"]),
            str(record["to"]),
            str(record["tag"]),
            int(record["n"]),
            notice if isinstance(notice, Notice) else _decode(notice),
        )
    elif "s" in record or "f" in record:
        found = pending.get(str(record.get("s") or record.get("f")))
        if found is not None:
            found.trying = "s" in record
    elif "d" in record:
        pending.pop(str(record["d"]), None)
    elif "e" in record:
        key = _key(record["e"])
        episodes.pop(key, None)  # the newest last: the first are forgotten first
        episodes[key] = float(record["at"])
    elif "x" in record:
        episodes.pop(_key(record["x"]), None)
    else:
        return record.get("outbox") == VERSION
    return True


def _line(record: dict[str, Any]) -> str:
    return _ENCODER.encode(record) + "\n"


def _key(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise ValueError("a key is a list")
    return tuple(str(part) for part in value)


def _encode(value: Any) -> dict[str, Any]:
    if not isinstance(value, Notice):
        raise TypeError(f"{type(value).__name__} is not a notice")
    return asdict(value)


# one encoder for every line (json.dumps with options would make one each time)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_encode)


def _decode(value: Any) -> Notice:
    if not isinstance(value, dict):
        raise ValueError("a notice is an object")
    return Notice(
        kind=str(value["kind"]),
        key=_key(value["key"]),
        user=None if value.get("user") is None else str(value["user"]),
        devices=tuple((str(uuid), int(number)) for uuid, number in value["devices"]),
        title=str(value["title"]),
        body=str(value["body"]),
        ends=_key(value.get("ends", [])),
        concerns=_key(value.get("concerns", [])),
    )
