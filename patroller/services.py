"""The daemon's services: one object that says what the daemon is made of.

`patroller.app.build` makes it once, with no I/O in any constructor; `Daemon.start` opens what
needs opening (the audit file, the lease book, the usage store) and starts what runs (monitors,
timers, the usage sampler). The HTTP layer takes it whole: the handlers, the views and the
Prometheus collector read their parts from it (through `patroller.http.api.Api`, which adds what
only HTTP needs).

Owns: the record of the daemon's parts, typed.
May import: `patroller.notify`, `patroller.state`, `patroller.identify`, `patroller.observe`, `patroller.config`,
`patroller.core`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.core.leases import LeaseManager
from patroller.identify.callers import CallerIdentifier
from patroller.notify import Notifier
from patroller.identify.containers import ContainerDirectory
from patroller.identify.resolver import ProcessIdentifier
from patroller.identify.tracker import ProcessTracker
from patroller.observe.idle import IdleWatch
from patroller.observe.monitor import Monitor
from patroller.observe.signals import Signals
from patroller.observe.stats import StatsStore
from patroller.state.audit import AuditLog
from patroller.state.book import LeaseBook
from patroller.state.lifetimes import Lifelines
from patroller.state.pseudonyms import Pseudonyms
from patroller.state.timer import ExpiryTimer
from patroller.state.usage.sampler import UsageSampler
from patroller.state.usage.store import UsageStore


@dataclass(frozen=True)
class Services:
    """Every part of one daemon, built once and shared."""

    config: Config
    mode: str  # "test" (synthetic devices) or "gpu" (nvidia-smi)
    started: float  # monotonic time the daemon was built: its uptime counts from here
    inventory: Inventory
    signals: Signals  # what the monitors emit, and the others connect to
    monitors: Tuple[Monitor, ...]
    leases: LeaseManager
    stats: StatsStore
    idle: IdleWatch
    identifier: ProcessIdentifier  # host pid -> identity
    callers: CallerIdentifier  # HTTP request -> identity
    tracker: ProcessTracker  # process signals -> identities -> leases
    timer: ExpiryTimer  # leases expire on time
    lifelines: Lifelines  # devices held for a process are freed when it ends
    audit: AuditLog
    book: Optional[LeaseBook]  # None: no --state-dir, reservations do not survive a restart
    directory: Optional[ContainerDirectory]  # the Docker Engine's labels; None in test mode
    pseudonyms: Optional[Pseudonyms] = None  # others' names hidden (--hide-users); else None
    usage: Optional[UsageStore] = None  # the usage history on disk; None: --usage none, or no
    # state directory
    sampler: Optional[UsageSampler] = None  # its samples, every --usage-interval
    notifier: Optional[Notifier] = None  # tells the admin (--notify) and the users concerned
