"""Sending notices, off the event loop: one thread and one bounded queue for each destination,
so that a destination that hangs or fails slows nothing else: not /status, not a grant, not
another destination.

A destination is an Apprise URL (the optional `notify` extra). Each notice is tried up to
`notify_tries` times, `notify_retry_first` seconds apart and doubling; each try may take
`notify_timeout` seconds to connect and as long to be answered. A notice that finds its
destination's queue full is dropped and counted. What became of each notice (sent, failed,
dropped) is handed to `told`, from the destination's thread: the caller hands it to its loop.
Each notice queued, each try begun and each notice done is written to the outbox (outbox.py),
so that a restart sends what was pending, once; a notice still queued when the daemon stops
stays there for the next start.

URLs hold passwords and tokens: they are never logged. A destination is named by its number
(1, 2, ... in the order given) and, where words are needed, by Apprise's privacy form of its
URL (`json://user:****@host/hook`); Apprise's own log, which names a URL it cannot parse in
full, is kept quiet.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from patroller.config import Config
from patroller.notify.messages import Notice
from patroller.notify.outbox import Outbox, tag_of

log = logging.getLogger(__name__)

QUEUED, SENT, FAILED, RETRIED, DROPPED = "queued", "sent", "failed", "retried", "dropped"
RESULTS = (QUEUED, SENT, FAILED, RETRIED, DROPPED)
EXTRA = "pip install 'patroller[notify]'"  # how to have Apprise


class NoApprise(Exception):
    """Apprise is not installed; the message says how to install it."""


class BadDestination(Exception):
    """A URL Apprise does not take; the message names it by number and scheme only."""


@dataclass(frozen=True)
class Outcome:
    """What became of one notice at one destination."""

    notice: Notice
    recipient: str  # "admin", or the user whose destination it is
    destination: int | str  # its number among the recipient's, from 1; or "terminal"
    result: str  # sent, failed (every try), dropped (its queue was full)
    tries: int
    key: str = ""  # the destination itself (a user's: its URL, never shown)


@dataclass(frozen=True)
class Item:
    """A notice queued for one destination, for one recipient."""

    notice: Notice
    recipient: str
    number: int
    ident: str = ""  # its id in the outbox ("": not kept)


Sender = Callable[[str, str], bool]  # (title, body) -> whether the destination took it


def apprise_senders(urls: Sequence[str], timeout: float) -> list[Any]:
    """One Apprise plugin for each URL, with `timeout` to connect and to be answered. NoApprise
    without the extra, BadDestination for a URL it does not take. Blocking (Apprise loads its
    plugins the first time, about 0.3 s): called at start, and in the router's thread."""
    found = []
    for n, url in enumerate(urls, 1):
        plugin = apprise_plugin(url, timeout)
        if plugin is None:
            scheme = url.partition("://")[0]
            raise BadDestination(
                f"--notify: URL {n} ({scheme}://...) is not one Apprise "
                "knows, or is missing a part its service needs (Apprise's "
                "list of services says what each URL holds)"
            )
        found.append(plugin)
    return found


def apprise_plugin(url: str, timeout: float) -> Any | None:
    """Apprise's plugin for `url`, or None if it takes no such URL; NoApprise without it."""
    try:
        import apprise
    except ImportError:
        raise NoApprise(f"Apprise is not installed: {EXTRA}") from None
    logging.getLogger("apprise").setLevel(logging.CRITICAL)  # it would log a bad URL whole
    plugin = apprise.Apprise.instantiate(url)
    if plugin is not None:
        plugin.socket_connect_timeout = timeout
        plugin.socket_read_timeout = timeout
    return plugin


def sender_of(plugin: Any) -> Sender:
    """A plugin's sender of plain text: said to be text, so that a service of HTML (e-mail)
    keeps its lines and reads no markup in names others chose, and one of Markdown shows
    them as they are."""
    return lambda title, body: bool(plugin.notify(body=body, title=title, body_format="text"))


def shown(plugin: Any) -> str:
    """A destination in words without its secrets (Apprise's privacy form)."""
    return str(plugin.url(privacy=True))


class Destination:
    """One destination's queue and thread."""

    def __init__(
        self,
        number: int,
        send: Sender,
        name: str,
        config: Config,
        told: Callable[[Outcome], None],
        counts: Counts,
        key: str = "",
        outbox: Outbox | None = None,
        tag: str = "",
    ) -> None:
        self.number = number
        self.key = key
        self.tag = tag  # its name in the outbox (tag_of its URL)
        self.outbox = outbox or Outbox(None, config)
        self.name = name
        self.send = send
        self.config = config
        self.told = told
        self.counts = counts
        self._queue: queue.Queue[Item | None] = queue.Queue(config.notify_queue)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"notify-{number}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(
        self, notice: Notice, recipient: str = "admin", number: int = 0, ident: str | None = None
    ) -> None:
        """Queue a notice (never blocks); dropped and counted when the queue is full. `ident`:
        its id in the outbox, where it is already (None: it is written there now)."""
        number = number or self.number
        if not self._queue.full():  # one thread puts: it stays so
            if ident is None:
                # the admin's destinations have no key (a user's: its URL)
                ident = self.outbox.queued(notice, recipient, self.tag, number, not self.key)
            self._queue.put_nowait(Item(notice, recipient, number, ident))
            self.counts.add(notice.kind, QUEUED)
            return
        self.drop(notice, recipient, number, ident)

    def full(self) -> bool:
        """Whether a notice put now is dropped (one thread puts: it stays so until it puts)."""
        return self._queue.full()

    def drop(
        self, notice: Notice, recipient: str = "admin", number: int = 0, ident: str | None = None
    ) -> None:
        """A notice dropped at the full queue: counted, its outcome told."""
        if ident:
            self.outbox.done(ident, DROPPED)
        self.counts.add(notice.kind, DROPPED)
        self.told(Outcome(notice, recipient, number or self.number, DROPPED, 0, self.key))

    def pending(self) -> int:
        return self._queue.qsize()

    def stop(self) -> None:
        """Ask the thread to end after the notice it is sending (tries left are given up)."""
        self._stopping.set()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass  # the thread sees _stopping after its notice

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopping.is_set():
            item = self._queue.get()
            if item is None:
                return
            self._deliver(item)

    def _deliver(self, item: Item) -> None:
        notice = item.notice
        delay = self.config.notify_retry_first
        for tries in range(1, self.config.notify_tries + 1):
            self.outbox.trying(item.ident)
            try:
                taken = bool(self.send(notice.title, notice.body))
            except Exception:  # a plugin's bug is one failed try, never the thread's end
                log.debug("notify destination %d raised", self.number, exc_info=True)
                taken = False
            if taken:
                self.outbox.done(item.ident, SENT)
                self.counts.add(notice.kind, SENT)
                self.told(Outcome(notice, item.recipient, item.number, SENT, tries, self.key))
                return
            if tries == self.config.notify_tries:
                break
            self.outbox.failed_try(item.ident)
            if self._stopping.wait(delay):
                return  # the daemon stops: tried again at the next start
            self.counts.add(notice.kind, RETRIED)
            delay *= 2
        self.outbox.done(item.ident, FAILED)
        self.counts.add(notice.kind, FAILED)
        self.told(Outcome(notice, item.recipient, item.number, FAILED, tries, self.key))


class Counts:
    """Notices by kind and result, for /metrics (written from the destinations' threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, kind: str, result: str) -> None:
        with self._lock:
            self._counts[(kind, result)] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """{kind: {result: count}} for every kind and result seen."""
        with self._lock:
            found: dict[str, dict[str, int]] = {}
            for (kind, result), count in self._counts.items():
                found.setdefault(kind, dict.fromkeys(RESULTS, 0))[result] = count
            return found


class Delivery:
    """Every destination's queue and thread."""

    def __init__(
        self,
        senders: Sequence[Sender],
        names: Sequence[str],
        config: Config,
        told: Callable[[Outcome], None],
        tags: Sequence[str] = (),
        outbox: Outbox | None = None,
    ) -> None:
        self.counts = Counts()
        tags = list(tags) or [f"destination-{n}" for n in range(1, len(senders) + 1)]
        self.destinations = [
            Destination(n, send, name, config, told, self.counts, tag=tag, outbox=outbox)
            for n, (send, name, tag) in enumerate(zip(senders, names, tags, strict=True), 1)
        ]

    def start(self) -> None:
        for destination in self.destinations:
            destination.start()

    def stop(self, timeout: float) -> int:
        """Blocking: stop every thread, waiting `timeout` seconds for all together; how many
        are still sending (a hung destination: its thread is a daemon's, it ends with us)."""
        for destination in self.destinations:
            destination.stop()
        deadline = time.monotonic() + timeout
        return sum(not d.join(max(0.0, deadline - time.monotonic())) for d in self.destinations)


class Router:
    """The users' destinations: each made from its URL in the router's own thread (Apprise's
    work never runs on the event loop), one Destination (thread and queue) each, kept while
    its URL is in use. A URL Apprise no longer takes (an older one, after an upgrade) fails
    its notices, counted."""

    def __init__(
        self,
        config: Config,
        told: Callable[[Outcome], None],
        counts: Counts,
        plugin_of: Callable[[str], Sender | None],
        outbox: Outbox | None = None,
    ) -> None:
        self.config = config
        self.outbox = outbox or Outbox(None, config)
        self.told = told
        self.counts = counts
        self.plugin_of = plugin_of  # the sender for a URL, or None (blocking)
        self._jobs: queue.Queue[Any] = queue.Queue(config.notify_queue * 10)
        self._destinations: dict[str, Destination] = {}
        self._thread = threading.Thread(target=self._run, name="notify-router", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(
        self,
        notice: Notice,
        recipient: str,
        urls: Sequence[str],
        numbers: Sequence[int] = (),
        idents: Sequence[str] = (),
    ) -> None:
        """Queue `notice` for `recipient`'s destinations (never blocks: dropped when full):
        `urls`, numbered from 1 unless `numbers` says; `idents`: their ids in the outbox
        where they are already (a restart's), else they are written there now."""
        numbers = tuple(numbers) or tuple(range(1, len(urls) + 1))
        idents = tuple(idents) or tuple(
            self.outbox.queued(notice, recipient, tag_of(url), n)
            for url, n in zip(urls, numbers, strict=True)
        )
        try:
            self._jobs.put_nowait(
                ("send", notice, recipient, tuple(zip(urls, numbers, idents, strict=True)))
            )
        except queue.Full:
            for url, number, ident in zip(urls, numbers, idents, strict=True):
                self.outbox.done(ident, DROPPED)
                self.counts.add(notice.kind, DROPPED)
                self.told(Outcome(notice, recipient, number, DROPPED, 0, url))

    def forget(self, url: str) -> None:
        """A URL nobody uses now: its thread ends."""
        self._jobs.put(("forget", url))

    def pending(self) -> int:
        return self._jobs.qsize() + sum(d.pending() for d in list(self._destinations.values()))

    def stop(self, timeout: float) -> int:
        """Blocking: end the router and every destination within `timeout` s; how many hang."""
        self._jobs.put(None)
        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        destinations = list(self._destinations.values())
        for destination in destinations:
            destination.stop()
        return sum(not d.join(max(0.0, deadline - time.monotonic())) for d in destinations)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job[0] == "forget":
                gone = self._destinations.pop(job[1], None)
                if gone is not None:
                    gone.stop()
                continue
            _, notice, recipient, targets = job
            for url, number, ident in targets:
                destination = self._destinations.get(url) or self._make(url, recipient)
                if destination is None:
                    self.outbox.done(ident, FAILED)
                    self.counts.add(notice.kind, FAILED)
                    self.told(Outcome(notice, recipient, number, FAILED, 0, url))
                else:
                    destination.put(notice, recipient, number, ident)

    def _make(self, url: str, recipient: str) -> Destination | None:
        try:
            send = self.plugin_of(url)
        except Exception:  # NoApprise, or a plugin that cannot be made: its notices fail
            log.debug("a destination of %s cannot be made", recipient, exc_info=True)
            send = None
        if send is None:
            return None
        made = Destination(
            0,
            send,
            recipient,
            self.config,
            self.told,
            self.counts,
            key=url,
            outbox=self.outbox,
            tag=tag_of(url),
        )
        made.start()
        self._destinations[url] = made
        return made
