"""The requests being handled, so that a daemon that stops answers every one before it closes
what they use.

Tornado's server knows its connections, not its requests. A client that half-closes (sends its
request, then shuts its side, as `nc -N` does) has its connection ended at the end of its input
while its request is still handled (its caller looked up in /proc off the loop): a stop that
waited for the connections alone returned with that request still running, and the end of the
loop then cancelled it, which Tornado answers 500.
"""
from __future__ import annotations

import asyncio
from typing import Any, Set

STOPPING = "the server is shutting down"  # a request cut short by the stop is answered 503


class InFlight:
    """The handlers' tasks that have not ended, and whether the daemon is stopping."""

    def __init__(self) -> None:
        self.tasks: Set["asyncio.Task[Any]"] = set()
        self.stopping = False

    def add(self) -> None:
        """Count the current task (a handler's, from its prepare) until it ends."""
        task = asyncio.current_task()
        if task is not None and task not in self.tasks:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def drain(self, grace: float) -> int:
        """Wait up to `grace` s for the requests in flight to end; cancel those still running
        (a handler cancelled while stopping is answered 503, or counted 499 if its client
        left) and wait until they have. Returns how many were cancelled."""
        self.stopping = True
        if not self.tasks:
            return 0
        _, late = await asyncio.wait(set(self.tasks), timeout=max(0.0, grace))
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
        return len(late)
