"""Connects the monitors' process signals to the lease manager, through the process resolver.

A process is told to the leases the moment a monitor sees it, as one whose owner is being
looked up (`IDENTIFYING`: its GPU is held, not free, and nobody's claim yet), then, once /proc
is read, in its container and as its host account, still being looked up; then with its owner,
as soon as it is learned, however long an engine takes (core/leases/holds.py).

A process whose owner could not be learned just now (a degraded identity: Docker unreachable)
is resolved again, every `retry` seconds (Config.owner_retry), until its owner is known or it
has gone. So is a container's process whose engine's socket was not there (a pending identity:
Podman's service stopped, or never started), every `recheck` seconds (Config.engine_recheck):
named by its container's id meanwhile, it gets its user once the engine is there.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from patroller.core.identity import IDENTIFYING, UNKNOWN, Identity
from patroller.core.leases import LeaseManager
from patroller.identify.containers import unlabelled_identity
from patroller.identify.resolver import ProcessIdentifier, ProcFacts, runs_as
from patroller.observe.signals import GpuProcess, Signals

log = logging.getLogger(__name__)


def awaiting(facts: ProcFacts | None) -> Identity:
    """Who a process is shown to be while its owner is looked up: `unknown` (degraded), in its
    container, as its host account, as far as /proc told."""
    if facts is None or facts.container is None:
        return IDENTIFYING
    shown = runs_as(unlabelled_identity(facts.container.id, degraded=True), facts.host)
    return replace(shown, identifying=True)


class ProcessTracker:
    """Resolves each new GPU process to an identity (off the loop) and tells the leases."""

    def __init__(
        self, leases: LeaseManager, resolver: ProcessIdentifier, retry: float, recheck: float
    ) -> None:
        self.leases = leases
        self.resolver = resolver
        self.retry = retry
        self.recheck = recheck
        self._pending: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._unsettled: dict[tuple[str, int], asyncio.Future[None]] = {}

    def connect(self, signals: Signals) -> None:
        """Listen to the daemon's process signals."""
        signals.process_started.connect(self._on_started)
        signals.process_ended.connect(self._on_ended)

    def close(self) -> None:
        """Stop resolving."""
        for task in [*self._pending.values(), *self._unsettled.values()]:
            task.cancel()
        self._pending.clear()
        self._unsettled.clear()

    def _on_started(self, sender: Any, record: GpuProcess) -> None:
        key = (record.uuid, record.pid)
        if key not in self._pending and key not in self._unsettled:
            self.leases.process_started(record.uuid, record.pid, IDENTIFYING, record.command)
            self._pending[key] = asyncio.ensure_future(self._resolve(record))

    def _on_ended(self, sender: Any, record: GpuProcess) -> None:
        key = (record.uuid, record.pid)
        for tasks in (self._pending, self._unsettled):
            task = tasks.pop(key, None)
            if task is not None:
                task.cancel()
        self.leases.process_ended(record.uuid, record.pid)

    async def _resolve(self, record: GpuProcess) -> None:
        key = (record.uuid, record.pid)
        try:
            facts = await self.resolver.facts(record.pid)
        except asyncio.CancelledError:
            raise
        except Exception:  # a resolver's failure must not lose the process
            log.exception("resolving pid %d failed", record.pid)
            facts = None
        shown = awaiting(facts)
        if shown != IDENTIFYING:
            self.leases.update_owner(record.uuid, record.pid, shown)
        owner = await self._identify(record.pid, facts)
        del self._pending[key]
        self.leases.update_owner(record.uuid, record.pid, owner)
        if owner.degraded or owner.pending:
            self._unsettled[key] = asyncio.ensure_future(self._learn(record, owner))

    async def _identify(self, pid: int, facts: ProcFacts | None) -> Identity:
        if facts is None:
            return UNKNOWN
        try:
            return await self.resolver.identify(facts)
        except asyncio.CancelledError:
            raise
        except Exception:  # a resolver's failure must not lose the process
            log.exception("resolving pid %d failed", pid)
            return UNKNOWN

    async def _learn(self, record: GpuProcess, owner: Identity) -> None:
        """Resolve a degraded or pending owner again until it is known; tell the leases of each
        change."""
        key = (record.uuid, record.pid)
        try:
            while owner.degraded or owner.pending:
                await asyncio.sleep(self.retry if owner.degraded else self.recheck)
                try:
                    learned = await self.resolver.resolve(record.pid)
                except Exception:
                    log.exception("resolving pid %d failed", record.pid)
                    continue
                if learned.degraded:
                    continue  # still not known: the owner shown stays as it is
                if learned != owner:
                    self.leases.update_owner(record.uuid, record.pid, learned)
                owner = learned
        finally:
            if self._unsettled.get(key) is asyncio.current_task():
                del self._unsettled[key]
