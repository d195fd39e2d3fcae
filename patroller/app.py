"""One Patroller daemon: devices, monitors, leases and the API, with one ordered start and stop."""
from __future__ import annotations

import asyncio
import logging
import socket
from typing import List, Optional, Protocol, Sequence

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from .api import make_app
from .callers import CallerIdentifier, HostCallers, TestModeCallers
from .config import Config
from .devices import Inventory
from .leases import LeaseManager
from .nvsmi import gpuhost
from .resolver import HostResolver, ProcessResolver
from .signals import Signals
from .stats import StatsStore
from .testmode import INTERVAL, SyntheticMonitor, synthetic_inventory
from .timer import ExpiryTimer
from .tracker import ProcessTracker

log = logging.getLogger(__name__)

STALE_INTERVALS = 3  # statistics older than this many sampling intervals are stale


class StartError(Exception):
    """The daemon cannot start; the message says why, in one line."""


class Monitor(Protocol):
    """Something that emits the daemon's signals while it runs."""

    def start(self) -> None:
        """Begin emitting."""

    async def stop(self) -> None:
        """Stop, and leave nothing running."""


class Daemon:
    """Wires the parts together; `main` drives it."""

    def __init__(self, config: Config, inventory: Inventory, signals: Signals,
                 monitors: Sequence[Monitor], resolver: ProcessResolver,
                 callers: CallerIdentifier, interval: float, mode: str) -> None:
        self.config = config
        self.inventory = inventory
        self.signals = signals
        self.monitors = list(monitors)
        self.leases = LeaseManager(inventory, config.lease)
        self.stats = StatsStore(inventory, stale_after=STALE_INTERVALS * interval)
        self.stats.connect(signals)
        self.tracker = ProcessTracker(self.leases, resolver)
        self.tracker.connect(signals)
        self.timer = ExpiryTimer(self.leases)
        self.app = make_app(inventory, self.leases, self.stats, callers, mode)
        self.server: Optional[HTTPServer] = None
        self.sockets: List[socket.socket] = []

    def listen(self, port: int, address: str = "") -> List[str]:
        """Bind and serve; return the addresses as URLs. Raises OSError if it cannot bind."""
        self.sockets = bind_sockets(port, address or None)
        self.server = HTTPServer(self.app, xheaders=False)
        self.server.add_sockets(self.sockets)
        return [_url(s) for s in self.sockets]

    def start(self) -> None:
        """Start expiring leases and monitoring devices, on the current loop."""
        self.timer.start()
        for monitor in self.monitors:
            monitor.start()

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting, answer waiters, stop monitors, close connections: within `grace` s."""
        if self.server is not None:
            self.server.stop()
        self.leases.close()  # waiters are answered 503
        await asyncio.sleep(0)  # let their answers go out
        self.timer.stop()
        self.tracker.close()
        for monitor in self.monitors:
            try:
                await asyncio.wait_for(monitor.stop(), grace)
            except Exception:
                log.exception("stopping %s failed", monitor)
        if self.server is not None:
            try:
                await asyncio.wait_for(self.server.close_all_connections(), grace)
            except asyncio.TimeoutError:
                log.warning("some connections did not close in time")


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


async def build(config: Config) -> Daemon:
    """The daemon the configuration asks for. Raises StartError if it cannot be built."""
    signals = Signals()
    if config.test:
        inventory = synthetic_inventory()
        monitor = SyntheticMonitor(inventory, signals)
        return Daemon(config, inventory, signals, [monitor], HostResolver(), TestModeCallers(),
                      interval=INTERVAL, mode="test")
    argv = gpuhost.command(config.nvidia_smi)
    try:
        found = await gpuhost.discover(argv)
    except gpuhost.GpuHostError as exc:
        raise StartError(str(exc)) from None
    inventory = Inventory(found.devices)
    log.info("nvidia-smi: driver %s, %d GPU(s): %s", found.driver_version or "unknown",
             len(inventory), ", ".join(f"{d.number}={d.name}" for d in inventory))
    return Daemon(config, inventory, signals, gpuhost.monitors(inventory, signals, argv),
                  HostResolver(), HostCallers(), interval=gpuhost.INTERVAL, mode="gpu")
