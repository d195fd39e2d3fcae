"""Background threads yield the CPU to serving.

A thread that works beside the event loop for long (reading a year-long report) takes a CPU
from the loop, or from the clients it serves, whenever it runs. Lowering its own scheduling
priority (on Linux a thread's niceness is its own) makes the kernel run it when serving leaves
a CPU free. It is only ever lowered, never raised above the daemon's own (a daemon started at
nice 19 keeps its threads there, root or not). Lowering is always allowed on Linux; where the
system refuses (another kernel, a seccomp profile), the thread keeps the daemon's priority and
says so once.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)
_said: set[str] = set()  # the threads whose priority could not be lowered, said once each


def lower_priority(niceness: int, what: str) -> bool:
    """In the thread to lower: its niceness made `niceness` (0-19), never lower than the
    daemon's own (a daemon started nice keeps its threads there); whether it changed. `what`
    names the thread in the log line when it cannot be."""
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        if niceness <= now:
            return False
        os.setpriority(os.PRIO_PROCESS, tid, min(19, niceness))
    except (OSError, AttributeError) as exc:  # AttributeError: no setpriority on this platform
        if what not in _said:
            _said.add(what)
            log.info("%s keeps the daemon's priority: %s", what, exc)
        return False
    return True
