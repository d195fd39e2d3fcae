"""Connects the monitors' process signals to the lease manager, through the process resolver."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Dict, Tuple

from .identity import UNKNOWN, Identity
from .leases import LeaseManager
from .resolver import ProcessResolver
from .signals import GpuProcess, Signals

log = logging.getLogger(__name__)


class ProcessTracker:
    """Resolves each new GPU process to an identity (off the loop) and tells the leases."""

    def __init__(self, leases: LeaseManager, resolver: ProcessResolver) -> None:
        self.leases = leases
        self.resolver = resolver
        self._pending: Dict[Tuple[str, int], "asyncio.Future[None]"] = {}

    def connect(self, signals: Signals) -> None:
        """Listen to the daemon's process signals."""
        signals.process_started.connect(self._on_started)
        signals.process_ended.connect(self._on_ended)

    def close(self) -> None:
        """Stop resolving."""
        for task in self._pending.values():
            task.cancel()
        self._pending.clear()

    def _on_started(self, sender: Any, record: GpuProcess) -> None:
        key = (record.uuid, record.pid)
        if key not in self._pending:
            self._pending[key] = asyncio.ensure_future(self._resolve(record))

    def _on_ended(self, sender: Any, record: GpuProcess) -> None:
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
        if self._pending.pop((record.uuid, record.pid), None) is not None:
            self.leases.process_started(record.uuid, record.pid, owner)
