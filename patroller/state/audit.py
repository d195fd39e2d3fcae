"""The audit record: who had which GPU when, one JSON object per event.

Every grant, release (by whom, and an administrator's with the reason), expiry, claim by a
process on a free device, trespass, end of a process a reservation was held for, idle release,
and GPU lost or back is one line:

    {"time": "2026-12-03T08:40:01.512+00:00", "event": "grant", "user": "alice@example.org",
     "devices": [{"uuid": "GPU-...", "number": 2}], "hold": "process", "pid": 4242}

The lines go to the daemon's log (logger `patroller.audit`, so to the journal under systemd),
and, with --audit-log, also to a file (appended, one line per event; `-` is standard output),
which is private (0600) as every file the daemon writes.
The last `keep` events stay in memory for /history.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from patroller.core.leases import Event
from patroller.core.throttle import Throttle
from patroller.observe.stats import iso_time
from patroller.state import private

log = logging.getLogger("patroller.audit")


class AuditLog:
    """Writes each event as a JSON line, and keeps the last `keep` for /history.

    A file that cannot be written (a full disk) is logged once per `report_every` seconds, with
    the count of failures so far; the daemon goes on.
    """

    def __init__(
        self,
        path: str | None,
        keep: int,
        report_every: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.clock = clock
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self.failures = 0
        self._file: TextIO | None = None
        self._reports = Throttle(1, report_every)

    def open(self) -> None:
        """Open the file (append), made 0600, or made 0600 if it is ours and others may read
        it (it names every user and job); OSError if it cannot be."""
        if self.path == "-":
            self._file = sys.stdout
        elif self.path:
            fd = private.create(self.path, os.O_WRONLY | os.O_APPEND)
            self._file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def close(self) -> None:
        """Close the file; what it could not write (a full disk) is counted, not raised."""
        file, self._file = self._file, None
        if file is None or file is sys.stdout:
            return
        try:
            file.close()
        except OSError:  # the last lines could not be flushed: the close is done all the same
            self.failures += 1

    def record(self, event: Event) -> None:
        """One event: in memory, in the log, in the file."""
        entry: dict[str, Any] = {
            "time": iso_time(self.clock()),
            "at": round(self.clock(), 3),
            "event": event.kind,
            "user": event.user,
            "devices": [{"uuid": uuid, "number": number} for uuid, number in event.devices],
            **event.details,
        }
        self.recent.append(entry)
        line = json.dumps(entry, separators=(",", ":"))
        log.info("%s", line)
        if self._file is not None:
            try:
                self._file.write(line + "\n")
            except OSError as exc:  # a full disk must not stop the daemon
                self.failures += 1
                if self._reports.admit()[0]:
                    logging.getLogger(__name__).warning(
                        "cannot write the audit log %s: %s (%d failures)",
                        self.path,
                        exc.strerror or exc,
                        self.failures,
                    )

    def since(self, when: float, limit: int) -> list[dict[str, Any]]:
        """The kept events at or after `when` (epoch seconds), the most recent `limit`."""
        found = [e for e in self.recent if e["at"] >= when]
        return found[-limit:]
