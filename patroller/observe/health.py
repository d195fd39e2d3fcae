"""The GPUs' health watched: each `-q -x` reading (`health_read`), each Xid of the kernel log
(`xid`, mapped to a GPU by its PCI address) and each change of the inventory (a GPU that left
and came back was reset: its Xids end) go into the health book (core/health.py); each change
of a GPU's health is told to `on_change` (the lease rules withhold an unhealthy GPU)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from patroller.config import Config
from patroller.core.devices import Device, Inventory, InventoryChange
from patroller.core.health import APPLICATION, RESET, Health, HealthBook, Reading, xid_kind
from patroller.core.text import printable
from patroller.core.throttle import Throttle
from patroller.observe.signals import Signals
from patroller.observe.xid import XidLine, pci_key

log = logging.getLogger(__name__)


class HealthWatch:
    """Every GPU's health, kept up to date from the signals (see the module)."""

    def __init__(
        self, inventory: Inventory, config: Config, clock: Callable[[], float] = time.time
    ) -> None:
        self.inventory = inventory
        self.book = HealthBook(config.health_faults_kept)
        self.clock = clock
        # (uuid, its health, who said so: the host's root, or None when the GPU did)
        self.on_change: Callable[[str, Health, str | None], None] = lambda uuid, health, by: None
        self.first: Mapping[str, Reading] = {}  # discovery's reading, taken at start()
        self.xids = 0  # Xid lines that named a GPU of the host
        self.unmatched = 0  # Xid lines that named none
        self._unmatched_logged = Throttle(1, config.repeat_log_every)

    def connect(self, signals: Signals) -> None:
        signals.health_read.connect(self._on_read)
        signals.xid.connect(self._on_xid)
        signals.inventory_changed.connect(self._on_inventory)

    def start(self) -> None:
        """Take discovery's reading (the daemon starts: the audit record and the notifier
        hear what it finds)."""
        first, self.first = self.first, {}
        self.read(first)

    def _on_read(self, sender: Any, record: Mapping[str, Reading]) -> None:
        self.read(record)

    def _on_xid(self, sender: Any, record: XidLine) -> None:
        self.xid(record)

    def _on_inventory(self, sender: Any, record: InventoryChange) -> None:
        for uuid in record.added:  # a GPU back (or new): reset, as far as its Xids go
            self._tell(uuid, self.book.reset(uuid))

    def get(self, uuid: str) -> Health:
        return self.book.get(uuid)

    def read(self, readings: Mapping[str, Reading]) -> None:
        """A `-q -x` reading's health of each GPU (those lost are not read)."""
        for uuid, reading in readings.items():
            device = self.inventory.get(uuid)
            if device is not None and not device.lost:
                self._tell(uuid, self.book.read(uuid, device.number, reading))

    def xid(self, line: XidLine) -> None:
        """An Xid line: the GPU's problem (a fault of the GPU or the driver), or a fault of the
        process it names, or only a log line (an Xid the catalogue does not place)."""
        device = self._by_pci().get(line.pci)
        if device is None:
            self.unmatched += 1
            admitted, held = self._unmatched_logged.admit()
            if admitted:
                log.warning(
                    "Xid %d on PCI %s, which is no GPU of the inventory%s",
                    line.xid,
                    line.pci,
                    f" ({held} more not logged)" if held else "",
                )
            return
        self.xids += 1
        kind = xid_kind(line.xid)
        name = printable(line.name, 40) if line.name else None
        detail = printable(line.text, 120)
        if kind == RESET:
            log.warning(
                "GPU %d (%s): Xid %d, a fault of the GPU or its driver: %s",
                device.number,
                device.uuid,
                line.xid,
                detail,
            )
        else:
            log.warning(
                "GPU %d (%s): Xid %d%s: %s",
                device.number,
                device.uuid,
                line.xid,
                f" of pid {line.pid} ({name})"
                if line.pid is not None and kind == APPLICATION
                else "",
                detail,
            )
        self._tell(
            device.uuid,
            self.book.xid(
                device.uuid, device.number, line.xid, line.pid, name, detail, self.clock()
            ),
        )

    def declare_healthy(self, uuid: str, by: str) -> Health:
        """The host's root (`by`) says the GPU is fine (`patroller release --healthy`)."""
        self._tell(uuid, self.book.declare_healthy(uuid), by)
        return self.book.get(uuid)

    def _by_pci(self) -> dict[str | None, Device]:
        return {pci_key(d.pci_address): d for d in self.inventory.present() if d.pci_address}

    def _tell(self, uuid: str, health: Health | None, by: str | None = None) -> None:
        if health is not None:
            self.on_change(uuid, health, by)
