"""Connects the monitors' process signals to the lease manager, through the process resolver.

A process whose owner could not be learned just now (a degraded identity: Docker unreachable)
is resolved again, every `retry` seconds (Config.owner_retry), until its owner is known or it
has gone.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Dict, Tuple

from patroller.core.identity import UNKNOWN, Identity
from patroller.core.leases import LeaseManager
from patroller.identify.resolver import ProcessResolver
from patroller.observe.signals import GpuProcess, Signals

log = logging.getLogger(__name__)


class ProcessTracker:
    """Resolves each new GPU process to an identity (off the loop) and tells the leases."""

    def __init__(self, leases: LeaseManager, resolver: ProcessResolver, retry: float) -> None:
        self.leases = leases
        self.resolver = resolver
        self.retry = retry
        self._pending: Dict[Tuple[str, int], "asyncio.Future[None]"] = {}
        self._degraded: Dict[Tuple[str, int], "asyncio.Future[None]"] = {}

    def connect(self, signals: Signals) -> None:
        """Listen to the daemon's process signals."""
        signals.process_started.connect(self._on_started)
        signals.process_ended.connect(self._on_ended)

    def close(self) -> None:
        """Stop resolving."""
        for task in [*self._pending.values(), *self._degraded.values()]:
            task.cancel()
        self._pending.clear()
        self._degraded.clear()

    def _on_started(self, sender: Any, record: GpuProcess) -> None:
        key = (record.uuid, record.pid)
        if key not in self._pending:
            self._pending[key] = asyncio.ensure_future(self._resolve(record))

    def _on_ended(self, sender: Any, record: GpuProcess) -> None:
        retry = self._degraded.pop((record.uuid, record.pid), None)
        if retry is not None:
            retry.cancel()
        task = self._pending.pop((record.uuid, record.pid), None)
        if task is not None:  # gone before we knew whose it was: the leases never saw it
            task.cancel()
        else:
            self.leases.process_ended(record.uuid, record.pid)

    async def _resolve(self, record: GpuProcess) -> None:
        try:
            owner: Identity = await self.resolver.resolve(record.pid)
        except asyncio.CancelledError:
            raise
        except Exception:  # a resolver's failure must not lose the process
            log.exception("resolving pid %d failed", record.pid)
            owner = UNKNOWN
        key = (record.uuid, record.pid)
        if self._pending.pop(key, None) is not None:
            self.leases.process_started(record.uuid, record.pid, owner, record.command)
            if owner.degraded:
                self._degraded[key] = asyncio.ensure_future(self._learn(record))

    async def _learn(self, record: GpuProcess) -> None:
        """Resolve a degraded owner again until it is known; then tell the leases."""
        key = (record.uuid, record.pid)
        try:
            while True:
                await asyncio.sleep(self.retry)
                try:
                    owner = await self.resolver.resolve(record.pid)
                except Exception:
                    log.exception("resolving pid %d failed", record.pid)
                    continue
                if not owner.degraded:
                    self.leases.update_owner(record.uuid, record.pid, owner)
                    return
        finally:
            if self._degraded.get(key) is asyncio.current_task():
                del self._degraded[key]
