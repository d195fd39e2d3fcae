"""What became of each notice at each destination (sent, failed, dropped), recorded on the loop:
the user's last result (`patroller notify`), one warning a `repeat_log_every` for those not
sent, and one line in the audit record for each notice at each destination.

A storm is bounded: past Config.notify_dropped_audited notices dropped at full queues in one
`repeat_log_every`, the rest are counted, not written one by one; their count, by kind,
recipient and destination, is written as one line each (`"count": N`) at the first notice
dropped in a later window, at the watch's next look, or at the stop. /metrics counts every
notice."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, MutableMapping
from typing import Any

from tornado.ioloop import IOLoop

from patroller.config import Config
from patroller.core.leases import Event
from patroller.core.throttle import Throttle
from patroller.notify.delivery import DROPPED, SENT, Outcome
from patroller.notify.terminal import TERMINAL
from patroller.state.audit import AuditLog

log = logging.getLogger("patroller.notify.notifier")  # the notifier's words, as before

Last = MutableMapping[tuple[str, str], tuple[str, float]]  # (user, destination) -> result, at


class Outcomes:
    """Records each outcome handed over by the destinations' threads (`told`)."""

    def __init__(
        self,
        config: Config,
        audit: AuditLog | None,
        last: Last,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.audit = audit
        self.last = last  # each user's last result at each destination of hers
        self._unsent = Throttle(1, config.repeat_log_every, monotonic)
        self._dropped = Throttle(config.notify_dropped_audited, config.repeat_log_every, monotonic)
        self._counted: Counter[tuple[str, str, int | str, bool]] = (
            Counter()
        )  # dropped, not written
        self._loop: IOLoop | None = None
        self._loop_thread: int | None = None  # the loop's thread: told from it, recorded at once

    def start(self) -> None:
        """From the loop, whose thread records."""
        self._loop = IOLoop.current()
        self._loop_thread = threading.get_ident()

    def told(self, outcome: Outcome) -> None:
        """What became of a notice: recorded on the loop (a notice dropped at a full queue is
        told on the loop itself, at once: a storm's drops do not wake it thousands of times)."""
        if threading.get_ident() == self._loop_thread:
            self.record(outcome)
        elif self._loop is not None:
            self._loop.add_callback(self.record, outcome)

    def flush_soon(self) -> None:
        """flush, on the loop (from the stop, in a thread of the executor's)."""
        if threading.get_ident() == self._loop_thread:
            self.flush()
        elif self._loop is not None:
            self._loop.add_callback(self.flush)

    def record(self, outcome: Outcome) -> None:
        if outcome.key:  # a user's own destination (the admin's have none), whatever her name
            self.last[(outcome.recipient, outcome.key)] = (outcome.result, round(time.time(), 3))
        if outcome.result != SENT and (
            outcome.destination != TERMINAL or outcome.result == DROPPED
        ):
            self._warn(outcome)
        if self.audit is None:
            return
        if outcome.result == DROPPED:
            written, _ = self._dropped.admit()
            if not written:
                kind = outcome.notice.kind
                key = (kind, outcome.recipient, outcome.destination, not outcome.key)
                self._counted[key] += 1
                return
            self.flush()  # a window begins: what the last one did not write, counted
        self._audit(outcome)

    def flush(self) -> None:
        """The notices dropped and not written one by one since the last flush: one line for
        each kind, recipient and destination, with their count (at the first notice dropped
        in a new window, at the watch's look, at the stop)."""
        counted, self._counted = self._counted, Counter()
        if self.audit is None:
            return
        for (kind, recipient, destination, admin), count in counted.items():
            details: dict[str, Any] = {
                "kind": kind,
                "recipient": recipient,
                "destination": destination,
                "result": DROPPED,
                "tries": 0,
                "count": count,
            }
            if admin:
                details["admin"] = True
            self.audit.record(Event("notify", None, (), details))

    def _warn(self, outcome: Outcome) -> None:
        logged, unlogged = self._unsent.admit()  # a storm is one line a repeat_log_every
        if logged:
            log.warning(
                "notifications: a %s notice %s at %s's destination %s%s",
                outcome.notice.kind,
                "was dropped: its queue was full"
                if outcome.result == DROPPED
                else f"could not be sent in {outcome.tries} tries",
                outcome.recipient,
                outcome.destination,
                f" ({unlogged} more not sent since the last such line; /metrics counts them all)"
                if unlogged
                else "",
            )

    def _audit(self, outcome: Outcome) -> None:
        assert self.audit is not None
        notice = outcome.notice
        details: dict[str, Any] = {
            "kind": notice.kind,
            "recipient": outcome.recipient,
            "destination": outcome.destination,
            "result": outcome.result,
            "tries": outcome.tries,
        }
        if not outcome.key:  # the admin's destination (a user's has a key), whatever her name
            details["admin"] = True
        self.audit.record(Event("notify", notice.user, notice.devices, details))
