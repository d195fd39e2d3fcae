"""One Patroller daemon: devices, monitors, leases and the API, with one ordered start and stop."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any, Dict, List, Optional, Protocol, Sequence

from patroller.http.handlers import make_app
from patroller.state.book import BookError, LeaseBook
from patroller.identify.callers import CallerIdentifier, SystemCallers, TestModeCallers
from patroller.config import Config
from patroller.identify.containers import ContainerDirectory
from patroller.core.devices import Inventory, InventoryChange
from patroller.http.fastlane import FastLane
from patroller.core.leases.manager import LeaseManager
from patroller.state.audit import AuditLog
from patroller.observe.idle import IdleWatch
from patroller.state.lifetimes import Lifelines
from patroller.core.policy import Policy, load_limits
from patroller.http.live import LiveFeed
from patroller.http.metrics import Registries, Requests
from patroller.http.server import (PeerServer, SocketFile, SocketPathError, remove_unix_socket,
                        tcp_sockets, unix_socket)
from patroller.observe import gpuhost
from patroller.observe.crosscheck import CrossCheck
from patroller.identify.resolver import ProcessIdentifier
from patroller.observe.signals import Signals
from patroller.observe.stats import StatsStore
from patroller.observe.testmode import INTERVAL, SyntheticMonitor, synthetic_inventory
from patroller.state.timer import ExpiryTimer
from patroller.identify.tracker import ProcessTracker
from patroller.observe.stats import HISTORY_EVERY, iso_time
from patroller.http.views import DevicesView, StatusView, users_view

log = logging.getLogger(__name__)

STALE_INTERVALS = 3  # statistics older than this many sampling intervals are stale


class StartError(Exception):
    """The daemon cannot start; the message says why, in one line."""


class Monitor(Protocol):
    """Something that emits the daemon's signals while it runs."""

    def start(self) -> None:
        """Begin emitting."""

    async def stop(self, grace: float) -> None:
        """Stop, killing what did not end after `grace` s, and leave nothing running."""

    def metrics(self) -> Dict[str, Any]:
        """Counters for /metrics."""


class Daemon:
    """Wires the parts together; `main` drives it."""

    def __init__(self, config: Config, inventory: Inventory, signals: Signals,
                 monitors: Sequence[Monitor], identifier: ProcessIdentifier,
                 callers: CallerIdentifier, interval: float, mode: str,
                 directory: Optional[ContainerDirectory] = None,
                 book: Optional[LeaseBook] = None) -> None:
        self.config = config
        self.inventory = inventory
        self.signals = signals
        self.monitors = list(monitors)
        self.identifier = identifier
        self.directory = directory
        self.callers = callers
        self.leases = LeaseManager(inventory, config.lease,
                                   max_waiting_per_user=config.max_waiting_per_user,
                                   policy=make_policy(config))
        self.audit = AuditLog(config.audit_log)
        try:
            self.audit.open()
        except OSError as exc:
            raise StartError(f"cannot open the audit log {config.audit_log}: "
                             f"{exc.strerror or exc}") from None
        self.leases.listen(self.audit.record)
        self.idle = IdleWatch(self.leases)
        self.stats = StatsStore(inventory, stale_after=STALE_INTERVALS * interval)
        self.stats.connect(signals)
        self.idle.connect(signals)
        self.tracker = ProcessTracker(self.leases, identifier)
        self.tracker.connect(signals)
        self.book = book
        if book is not None:  # last run's reservations, before anything is served
            book.attach(self.leases)
        self.timer = ExpiryTimer(self.leases)
        self.lifelines = Lifelines(self.leases)  # frees what was held for a process that ended
        self.status = StatusView(inventory, self.leases, self.stats, idle=self.idle)
        self.devices = DevicesView(inventory)
        self.mode = mode
        self.requests = Requests()  # HTTP answers counted, for /metrics
        self.registries = Registries(self)
        self.feed = LiveFeed(self.snapshot)  # the web page's
        self.leases.subscribe(self.feed.changed)
        self.stats.subscribe(self.feed.changed)
        self.app = make_app(inventory, self.leases, self.status, self.devices, callers, mode,
                            self.metrics, self.requests, self.registries, self.audit, self.idle,
                            self.feed)
        self.server: Optional[PeerServer] = None
        self.unix_path: Optional[str] = None
        self.unix_file: Optional[SocketFile] = None  # what we bound there, removed at stop
        self.started = time.monotonic()

    def snapshot(self) -> Dict[str, Any]:
        """Everything the web page shows, for its live feed."""
        return {
            "time": iso_time(time.time()),
            "mode": self.mode,
            "status": self.status.data(),
            "devices": self.devices.data(),
            "queue": self.leases.queue(),
            "users": users_view(self.leases, self.idle),
            "events": self.audit.since(0.0, 10),
            "history": self.stats.history(),
            "interval": HISTORY_EVERY,
        }

    def inventory_changed(self, change: InventoryChange) -> None:
        """The host's GPUs changed (the inventory is updated already): leases, views, streams."""
        self.leases.devices_changed()
        self.devices.invalidate()
        self.status.invalidate()
        for monitor in self.monitors:
            reconfigure = getattr(monitor, "reconfigure", None)
            if reconfigure is not None and (change.added or change.lost or change.renumbered):
                reconfigure()

    def metrics(self) -> Dict[str, Any]:
        """The daemon's own counters as JSON (/metrics.json): what it costs, how its parts fare."""
        return {
            "uptime": round(time.monotonic() - self.started, 3),
            "devices": len(self.inventory),
            "waiting": self.leases.waiting,
            "status_builds": self.status.builds,
            "proc_reads": self.identifier.proc_reads,
            "docker_calls": self.directory.calls if self.directory is not None else 0,
            "caller_lookups": getattr(self.callers, "lookups", 0),
            "monitors": {type(m).__name__: m.metrics() for m in self.monitors},
            "lease_book": self.book.metrics() if self.book is not None else None,
            "held_for_processes": self.lifelines.metrics(),
        }

    def busy(self, uuid: str) -> bool:
        """Whether the statistics show a device in use: SM busy, or memory used."""
        view = self.stats.view(uuid)
        sm, used = view.get("sm"), view.get("fb")
        return (isinstance(sm, (int, float)) and sm > 0) or (
            isinstance(used, (int, float)) and used >= gpuhost.BUSY_MIB)

    def listen(self, port: int, address: str = "", unix_path: Optional[str] = None) -> List[str]:
        """Bind and serve; return where, as URLs. Raises OSError if it cannot bind, StartError
        if another daemon serves on `unix_path` or that path is not a socket."""
        sockets = tcp_sockets(port, address)
        if unix_path:
            try:
                sock, self.unix_file = unix_socket(unix_path)
            except (OSError, SocketPathError) as exc:
                for sock in sockets:
                    sock.close()
                if isinstance(exc, SocketPathError):
                    raise StartError(str(exc)) from None
                raise
            sockets.append(sock)
            self.unix_path = unix_path
        lane = FastLane(self.app, {"/status": self.status.body, "/devices": self.devices.body},
                        self.requests.count)
        self.server = PeerServer(lane, config=self.config, read_facts=self.identifier.facts)
        self.server.add_sockets(sockets)
        return [_url(s) for s in sockets]

    def start(self) -> None:
        """Start expiring leases and monitoring devices, on the current loop."""
        self.timer.start()
        self.lifelines.start()
        self.feed.start()
        for monitor in self.monitors:
            monitor.start()

    async def stop(self, grace: float = 2.0) -> None:
        """Stop accepting, answer waiters, stop monitors, close connections: within `grace` s.

        The monitors get half of it, all stopped together; each child has half of that to
        answer SIGTERM before its group is killed, so no child outlives the stop. Connections
        get the rest.
        """
        deadline = time.monotonic() + grace
        if self.server is not None:
            self.server.stop()
        if self.unix_file is not None:
            remove_unix_socket(self.unix_file)  # only if it is still ours
        self.leases.close()  # waiters are answered 503
        self.feed.stop()  # pages' streams end (browsers reconnect by themselves)
        await asyncio.sleep(0)  # let their answers go out
        self.timer.stop()
        self.lifelines.stop()
        self.tracker.close()
        await self._stop_monitors(grace / 2)
        if self.server is not None:
            try:
                await asyncio.wait_for(self.server.close_all_connections(),
                                       max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                log.warning("some connections did not close in time")
        if self.directory is not None:
            self.directory.shutdown()
        if self.book is not None:
            self.book.close()
        self.audit.close()

    async def _stop_monitors(self, bound: float) -> None:
        """Start every monitor's stop, then await them together (terminado's kill_all)."""
        stops = {asyncio.ensure_future(m.stop(bound / 2)): m for m in self.monitors}
        if not stops:
            return
        done, late = await asyncio.wait(stops, timeout=bound)
        for task in late:  # a child stuck in the kernel: it dies when it returns
            task.cancel()
            log.warning("%s did not stop within %.1f s", type(stops[task]).__name__, bound)
        for task in done:
            if task.exception() is not None:
                log.error("stopping %s failed", type(stops[task]).__name__,
                          exc_info=task.exception())


def _url(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        return f"unix://{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


async def build(config: Config) -> Daemon:
    """The daemon the configuration asks for. Raises StartError if it cannot be built."""
    signals = Signals()
    if config.test:
        inventory = synthetic_inventory()
        monitor = SyntheticMonitor(inventory, signals)
        return Daemon(config, inventory, signals, [monitor], ProcessIdentifier(),
                      TestModeCallers(), interval=INTERVAL, mode="test", book=_book(config))
    argv = gpuhost.command(config.nvidia_smi)
    try:
        found = await gpuhost.discover(argv)
    except gpuhost.GpuHostError as exc:
        raise StartError(str(exc)) from None
    inventory = Inventory(gpuhost.devices(found))
    book = _book(config)
    log.info("nvidia-smi: driver %s, %d GPU(s): %s", found.driver_version or "unknown",
             len(inventory), ", ".join(f"{d.number}={d.name}" for d in inventory))
    directory = ContainerDirectory(config.docker_host)
    identifier = ProcessIdentifier(directory, config.user_labels, config.user_info_labels)
    dmon, pmon = gpuhost.monitors(inventory, signals, argv, silence=config.stream_silence,
                                  startup=config.stream_startup)
    watch = gpuhost.InventoryWatch(inventory, argv, every=config.inventory_every)
    unattributed = gpuhost.Unattributed(inventory, lambda uuid: daemon.busy(uuid), pmon)
    check = CrossCheck(inventory, signals, argv, os.environ, unattributed,
                       interval=config.cross_check_every)
    daemon = Daemon(config, inventory, signals, [dmon, pmon, check, watch],
                    identifier, SystemCallers(identifier, directory),
                    interval=gpuhost.INTERVAL, mode="gpu", directory=directory, book=book)
    watch.on_change = daemon.inventory_changed
    dmon.on_lost = pmon.on_lost = watch.poke
    return daemon


def make_policy(config: Config) -> Policy:
    """The fair-use policy the configuration and its limits file set. Raises StartError if the
    limits file is unusable (at start; a reload keeps the old policy instead)."""
    limits = {}
    if config.limits_file:
        try:
            limits = load_limits(config.limits_file)
        except ValueError as exc:
            raise StartError(f"--limits-file: {exc}") from None
    return Policy(max_per_user=config.max_per_user, limits=limits,
                  starvation_bound=config.starvation_bound, max_hold=config.max_hold,
                  idle_sm=config.idle_sm, idle_memory_mib=config.idle_memory,
                  idle_after=config.idle_after, idle_release=config.idle_release)


def _book(config: Config) -> Optional[LeaseBook]:
    """The locked lease book the configuration asks for, if any. Raises StartError."""
    if config.state_dir is None:
        return None
    book = LeaseBook(config.state_dir)
    try:
        book.open()
    except BookError as exc:
        raise StartError(str(exc)) from None
    return book
