"""What is being told, kept on disk so that a restart, even a kill -9, neither loses a notice
waiting to be sent nor sends one twice, nor tells again an episode told before it.

`<state-dir>/notify-outbox.jsonl` (0600, as every file the daemon writes) is a journal, one
JSON object a line (journal.py says what each says and reads it back). A destination is named
by a tag, the first 16 hex digits of its URL's SHA-256: never the URL (users' URLs stay in
notify.json alone). At start the journal is read: a notice queued and not done is queued again,
at its recipient's destination with that tag if she still has it; one whose try had begun when
the daemon died (`s` last) is not tried again, as the destination may have it already: its
audit line says `interrupted`. Episodes told within --notify-repeat are not told again. Then
the journal is written anew with only what is still pending, and again whenever it has grown
past Config.notify_outbox_lines and four times what it holds.

Writes are made by one thread, in the order they were asked for: the loop only hands a line
over. A line that comes after a quiet (nothing written within Config.notify_outbox_gather) is
written at once; in a storm, the writer gathers what comes until that time after its last
write before it takes it (a storm's thousand lines a second are 20 writes, each one wakeup of
the writer), so a kill -9 may lose the last notify_outbox_gather of a storm's lines. The
episodes told and ended, a line for each event of a storm, come to the writer in a queue of
their own, the key and the time as they are: the loop appends them and cues the writer once for
all those it appends before the writer takes them, and their lines are made without a
dictionary or the encoder's walk. Their order among themselves is kept (an episode ended, then
told again); against the notices' lines it does not matter, as neither changes what the other
says. A try's `s` is written at once and
waited for (by the destination's thread, up to Config.notify_outbox_wait), so that a kill
during a try is known at the restart. A line that cannot be written (a full disk) is counted
and logged once a `repeat_log_every`; what is in memory goes on, and the next rewrite puts the
journal right again. Without a state directory nothing is kept.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import os
import queue
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from json.encoder import encode_basestring  # what the journal's encoder writes strings with
from operator import itemgetter
from typing import Any

from patroller.config import Config
from patroller.core.throttle import Throttle
from patroller.notify.journal import VERSION, Pending, Restored, apply, line, read
from patroller.notify.messages import Notice
from patroller.state import private

log = logging.getLogger(__name__)

FILE = "notify-outbox.jsonl"
_EPISODES: dict[str, Any] = {"episodes": True}  # the writer's cue: episodes wait to be taken


def tag_of(url: str) -> str:
    """A destination's name on disk: never its URL, which holds secrets."""
    return hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:16]


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
        # episodes told (key, when) and ended (key, None), appended by the loop and taken by
        # the writer; `_cued`: the writer is cued to take them (appending cues it once more)
        self._marks: deque[tuple[tuple[str, ...], float | None]] = deque()
        self._cued = False
        self._pending: dict[str, Pending] = {}  # the writer thread's alone
        # the writer thread's alone: each episode told, when, and its line as written (a
        # rewrite writes them again as they are: 10,000 made anew held the interpreter for 55
        # ms); the first told first (an OrderedDict: a plain dict's first key, after many
        # taken from its front, is found by a scan past every slot emptied)
        self._episodes: OrderedDict[tuple[str, ...], tuple[float, str]] = OrderedDict()
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
            restored = read(self.path, now, self.config)
        except OSError as exc:
            log.warning(
                "notifications: the outbox %s cannot be read (%s): notices pending "
                "before the restart are not sent",
                self.path,
                exc.strerror or exc,
            )
        self._pending = {p.ident: p for p in restored.pending}
        self._episodes = OrderedDict(
            (key, (at, episode_line("e", key, at))) for key, at in restored.episodes.items()
        )
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

    def queued(
        self, notice: Notice, recipient: str, tag: str, number: int, admin: bool = False
    ) -> str:
        """A notice queued for a destination (`admin`: one of the admin's): its id ("" when
        nothing is kept)."""
        if self.path is None:
            return ""
        ident = f"{self._prefix}-{next(self._count)}"
        self._put(
            {
                "q": ident,
                "to": recipient,
                "admin": admin,
                "tag": tag,
                "n": number,
                "notice": notice,
            }
        )
        return ident

    def told(self, key: tuple[str, ...], at: float) -> None:
        if self.path is not None:
            self._mark(key, at)  # rounded by the writer: the loop hands it over as it is

    def ended(self, key: tuple[str, ...]) -> None:
        if self.path is not None:
            self._mark(key, None)

    def _mark(self, key: tuple[str, ...], at: float | None) -> None:
        self._marks.append((key, at))  # before the cue is looked at: the writer takes it
        if not self._cued:
            self._cued = True
            self._lines.put((_EPISODES, None))

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
        gather = self.config.notify_outbox_gather
        while True:
            # a storm (a write within `gather`): what comes until `gather` after that write is
            # gathered before it is taken, one wakeup a write; after a quiet, a line is taken
            # as soon as it comes; a line waited for hurries it
            since = self._clock() - self._last_write
            if since < gather:
                self._hurry.wait(gather - since)
            self._hurry.clear()
            batch = [self._lines.get()]
            while len(batch) < 4096:  # what else is waiting, written in one go
                try:
                    batch.append(self._lines.get_nowait())
                except queue.Empty:
                    break
            ending = None in batch
            items = [item for item in batch if item is not None]
            texts: list[str] = []
            for record, _ in items:
                if record is _EPISODES:
                    self._take_marks(texts)
                elif record:  # {}: a flush's, no line (never an episode's: _take_marks)
                    apply(record, self._pending, {})
                    texts.append(line(record))
            while len(self._episodes) > self.config.notify_episodes:
                self._episodes.popitem(last=False)
            if texts:
                self._write(texts)
                self._last_write = self._clock()
            for _, written in items:
                if written is not None:
                    written.set()
            if ending:
                self._close()
                return

    def _take_marks(self, texts: list[str]) -> None:
        """The episodes appended so far, applied and their lines added to `texts`."""
        self._cued = False  # before taking: one appended from now on cues the writer again
        marks, episodes = self._marks, self._episodes
        while marks:
            key, at = marks.popleft()
            episodes.pop(key, None)  # told again: the newest last
            if at is None:
                texts.append(episode_line("x", key))
            else:
                at = round(at, 3)
                text = episode_line("e", key, at)
                episodes[key] = (at, text)
                texts.append(text)

    def _write(self, texts: list[str]) -> None:
        try:
            if self._fd is None:
                self._rewrite()  # from memory, which holds these records already
                return
            data = "".join(texts).encode("utf-8", "surrogatepass")
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            self._written += len(texts)
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
        episodes = self._episodes
        # the oldest first: those told before `forget` are at the front (a clock set back may
        # leave one behind a newer one, forgotten at a later rewrite or at the next start)
        while episodes and next(iter(episodes.values()))[0] < forget:
            episodes.popitem(last=False)
        counted = [0]

        def pending() -> Iterator[str]:
            for pending in self._pending.values():
                yield line(
                    {
                        "q": pending.ident,
                        "to": pending.recipient,
                        "admin": pending.admin,
                        "tag": pending.tag,
                        "n": pending.number,
                        "notice": pending.notice,
                    }
                )
                if pending.trying:
                    yield line({"s": pending.ident})

        def parts() -> Iterator[bytes]:  # a thousand lines a write: never the whole in memory
            # the episodes' lines as written, taken in C (no step of Python's a line)
            every = itertools.chain(
                (line({"outbox": VERSION}),), map(itemgetter(1), episodes.values()), pending()
            )
            while batch := list(itertools.islice(every, 1000)):
                counted[0] += len(batch)
                yield "".join(batch).encode("utf-8", "surrogatepass")

        private.replace(self.path, parts())
        self._fd = private.create(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        self._written = counted[0]
        self.rewrites += 1

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


def episode_line(kind: str, key: Iterable[str], at: float | None = None) -> str:
    """An episode's line, `e` (told at `at`) or `x` (ended), as journal.line writes it (the
    same encoder's strings and floats), without the dictionary and the encoder's walk."""
    try:
        parts = ",".join(map(encode_basestring, key))
        if at is None:
            return f'{{"{kind}":[{parts}]}}\n'
        if type(at) is float and math.isfinite(at):
            return f'{{"{kind}":[{parts}],"at":{float.__repr__(at)}}}\n'
    except TypeError:  # a part that is not a string
        pass
    # as the encoder writes it: a part that is no string, an integer, no number JSON has
    return line({kind: list(key)} if at is None else {kind: list(key), "at": at})
