"""Sending notices, off the event loop: one thread and one bounded queue for each destination,
so that a destination that hangs or fails slows nothing else: not /status, not a grant, not
another destination.

A destination is an Apprise URL (the optional `notify` extra). Each notice is tried up to
`notify_tries` times, `notify_retry_first` seconds apart and doubling; each try may take
`notify_timeout` seconds to connect and as long to be answered. A notice that finds its
destination's queue full is dropped and counted. What became of each notice (sent, failed,
dropped) is handed to `told`, from the destination's thread: the caller hands it to its loop.

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
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from patroller.config import Config
from patroller.notify.messages import Notice

log = logging.getLogger(__name__)

SENT, FAILED, RETRIED, DROPPED = "sent", "failed", "retried", "dropped"
RESULTS = (SENT, FAILED, RETRIED, DROPPED)
EXTRA = "pip install 'patroller[notify]'"  # how to have Apprise


class NoApprise(Exception):
    """Apprise is not installed; the message says how to install it."""


class BadDestination(Exception):
    """A URL Apprise does not take; the message names it by number and scheme only."""


@dataclass(frozen=True)
class Outcome:
    """What became of one notice at one destination."""

    notice: Notice
    destination: int  # its number, from 1
    result: str  # sent, failed (every try), dropped (its queue was full)
    tries: int


Sender = Callable[[str, str], bool]  # (title, body) -> whether the destination took it


def apprise_senders(urls: Sequence[str], timeout: float) -> List[Any]:
    """One Apprise plugin for each URL, with `timeout` to connect and to be answered. NoApprise
    without the extra, BadDestination for a URL it does not take. Blocking (Apprise loads its
    plugins the first time, about 0.3 s): called once at start."""
    try:
        import apprise
    except ImportError:
        raise NoApprise(f"Apprise is not installed: {EXTRA}") from None
    logging.getLogger("apprise").setLevel(logging.CRITICAL)  # it would log a bad URL whole
    found = []
    for n, url in enumerate(urls, 1):
        plugin = apprise.Apprise.instantiate(url)
        if plugin is None:
            scheme = url.partition("://")[0]
            raise BadDestination(f"--notify: URL {n} ({scheme}://...) is not one Apprise "
                                 "knows, or is missing a part its service needs (Apprise's "
                                 "list of services says what each URL holds)")
        plugin.socket_connect_timeout = timeout
        plugin.socket_read_timeout = timeout
        found.append(plugin)
    return found


def shown(plugin: Any) -> str:
    """A destination in words without its secrets (Apprise's privacy form)."""
    return str(plugin.url(privacy=True))


class Destination:
    """One destination's queue and thread."""

    def __init__(self, number: int, send: Sender, name: str, config: Config,
                 told: Callable[[Outcome], None], counts: "Counts") -> None:
        self.number = number
        self.name = name
        self.send = send
        self.config = config
        self.told = told
        self.counts = counts
        self._queue: "queue.Queue[Optional[Notice]]" = queue.Queue(config.notify_queue)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"notify-{number}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, notice: Notice) -> None:
        """Queue a notice (never blocks); dropped and counted when the queue is full."""
        try:
            self._queue.put_nowait(notice)
        except queue.Full:
            self.counts.add(notice.kind, DROPPED)
            self.told(Outcome(notice, self.number, DROPPED, 0))

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
            notice = self._queue.get()
            if notice is None:
                return
            self._deliver(notice)

    def _deliver(self, notice: Notice) -> None:
        delay = self.config.notify_retry_first
        for tries in range(1, self.config.notify_tries + 1):
            try:
                taken = bool(self.send(notice.title, notice.body))
            except Exception:  # a plugin's bug is one failed try, never the thread's end
                log.debug("notify destination %d raised", self.number, exc_info=True)
                taken = False
            if taken:
                self.counts.add(notice.kind, SENT)
                self.told(Outcome(notice, self.number, SENT, tries))
                return
            if tries == self.config.notify_tries or self._stopping.wait(delay):
                break
            self.counts.add(notice.kind, RETRIED)
            delay *= 2
        self.counts.add(notice.kind, FAILED)
        self.told(Outcome(notice, self.number, FAILED, tries))


class Counts:
    """Notices by kind and result, for /metrics (written from the destinations' threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter = Counter()

    def add(self, kind: str, result: str) -> None:
        with self._lock:
            self._counts[(kind, result)] += 1

    def snapshot(self) -> Dict[str, Dict[str, int]]:
        """{kind: {result: count}} for every kind and result seen."""
        with self._lock:
            found: Dict[str, Dict[str, int]] = {}
            for (kind, result), count in self._counts.items():
                found.setdefault(kind, dict.fromkeys(RESULTS, 0))[result] = count
            return found


class Delivery:
    """Every destination's queue and thread."""

    def __init__(self, senders: Sequence[Sender], names: Sequence[str], config: Config,
                 told: Callable[[Outcome], None]) -> None:
        self.counts = Counts()
        self.destinations = [Destination(n, send, name, config, told, self.counts)
                             for n, (send, name) in enumerate(zip(senders, names), 1)]

    def start(self) -> None:
        for destination in self.destinations:
            destination.start()

    def put(self, notice: Notice, numbers: Sequence[int]) -> None:
        """Queue `notice` for the destinations numbered so."""
        for number in numbers:
            self.destinations[number - 1].put(notice)

    def stop(self, timeout: float) -> int:
        """Blocking: stop every thread, waiting `timeout` seconds for all together; how many
        are still sending (a hung destination: its thread is a daemon's, it ends with us)."""
        for destination in self.destinations:
            destination.stop()
        deadline = time.monotonic() + timeout
        return sum(not d.join(max(0.0, deadline - time.monotonic()))
                   for d in self.destinations)
