"""What every container directory does the same way (the Docker API's engines, containerd):
a container is fetched once, in the directory's own threads (concurrent lookups of one share
the fetch), and cached for a while; when the engine cannot be reached, lookups fail fast for a
few seconds, then it is asked again, so that nothing waits on a dead engine and it recovers by
itself. A fetch has a deadline for the whole of it, where the directory gives one: a client's
timeout bounds each read, and an engine that answers a byte at a time answers every read in
time; past the deadline the lookup fails as if the engine were down (its thread is left to end
when the engine lets it). What a fetch is, and what the engine's trouble is called, is each
directory's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

from cachetools import TTLCache

from patroller.durations import describe

T = TypeVar("T")


class SharedLookups(Generic[T]):
    """Values by key, fetched by `fetch` (blocking, run in `pool`), shared and cached."""

    def __init__(
        self,
        pool: Executor,
        fetch: Callable[[str], T | None],
        size: int,
        ttl: float,
        unavailable: Callable[[str], Exception],
        deadline: float | None = None,
        overdue: Callable[[], str] | None = None,
    ) -> None:
        self.pool = pool
        self.fetch = fetch
        self.deadline = deadline  # seconds a fetch may take in all; None: its client's own
        self.overdue = overdue  # marks the engine down past the deadline; says why, in words
        self.cache: TTLCache[str, T | None] = TTLCache(
            maxsize=size, ttl=ttl
        )  # key -> value (None: not known)
        self.unavailable = unavailable  # the exception a lookup raises while the engine is down
        self._inflight: dict[str, asyncio.Future[T | None]] = {}
        self._down_until = 0.0
        self.reason = ""  # why the engine was last down, in words

    async def get(self, key: str) -> T | None:
        """The value, cached or fetched now. Raises `unavailable` while the engine is down."""
        if key in self.cache:
            return self.cache[key]
        task = self._inflight.get(key)
        if task is None:
            self.check_up()
            task = asyncio.ensure_future(self._load(key))
            self._inflight[key] = task
            task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return await asyncio.shield(task)

    def check_up(self) -> None:
        """Raise `unavailable` if the engine was found down less than a while ago."""
        if time.monotonic() < self._down_until:
            raise self.unavailable(self.reason)

    def went_down(self, reason: str, for_seconds: float) -> bool:
        """The engine cannot be used: lookups fail fast for `for_seconds`. True the first time
        (until it is back), for the caller to say so once."""
        first = not self._down_until
        self.reason = reason
        self._down_until = time.monotonic() + for_seconds
        return first

    def came_up(self) -> bool:
        """The engine answered: True if it had been down (for the caller to say it is back)."""
        was_down = bool(self._down_until)
        self._down_until = 0.0
        return was_down

    async def _load(self, key: str) -> T | None:
        loop = asyncio.get_running_loop()
        value: T | None = await self.within_deadline(
            loop.run_in_executor(self.pool, self.fetch, key)
        )
        self.cache[key] = value
        return value

    async def within_deadline(self, fetching: asyncio.Future[Any]) -> Any:
        """What a fetch in the pool gives, or `unavailable` once it has taken the deadline."""
        if self.deadline is None:
            return await fetching
        try:
            return await asyncio.wait_for(asyncio.shield(fetching), self.deadline)
        except asyncio.TimeoutError:
            # its outcome, when the engine lets it end, is nobody's: taken, not warned of
            fetching.add_done_callback(lambda done: done.cancelled() or done.exception())
            reason = (
                self.overdue()
                if self.overdue is not None
                else f"no whole answer within {describe(self.deadline)}"
            )
            raise self.unavailable(reason) from None
