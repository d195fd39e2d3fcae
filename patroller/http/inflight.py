"""The requests being handled, so that a daemon that stops answers every one before it closes
what they use.

Tornado's server knows its connections, not its requests. A client that half-closes (sends its
request, then shuts its side, as `nc -N` does) has its connection ended at the end of its input
while its request is still handled (its caller looked up in /proc off the loop): a stop that
waited for the connections alone returned with that request still running, and the end of the
loop then cancelled it. What a cancelled handler gets depends on the Tornado release (6.5
answers nothing and logs the cancellation as an error; 6.6 answers 500), so the handler's own
methods answer it (`answered_on_stop`): the cancellation never reaches Tornado.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from patroller.core.errors import Unavailable

STOPPING = "the server is shutting down"  # a request cut short by the stop is answered 503
T = TypeVar("T")


class InFlight:
    """The handlers' tasks that have not ended, and whether the daemon is stopping."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
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


class Stoppable(Protocol):
    """A handler the stop may cut short: its in-flight set, and whether its client can still
    be answered (false: its connection is closed, counted 499)."""

    inflight: InFlight

    def unanswerable(self) -> bool: ...


def answered_on_stop(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T | None]]:
    """A handler's method whose cancellation by the stop is answered, the same on every Tornado
    release: 503 (Unavailable, raised to the handler's error path), or nothing if its client
    has left. Any other cancellation (one of what it awaits) goes on as it came."""

    @functools.wraps(method)
    async def answered(handler: Stoppable, *args: Any, **kwargs: Any) -> T | None:
        try:
            return await method(handler, *args, **kwargs)
        except asyncio.CancelledError:
            task: Any = asyncio.current_task()
            # Python 3.10 has neither Task.cancelling nor uncancel: there the stop's cancel is
            # taken for the one this request got
            if (
                not handler.inflight.stopping
                or task is None
                or (hasattr(task, "cancelling") and not task.cancelling())
            ):
                raise
            if hasattr(task, "uncancel"):
                task.uncancel()  # the stop's cancel is answered here, and ends with the request
            if handler.unanswerable():
                return None
            raise Unavailable(STOPPING) from None

    return answered
