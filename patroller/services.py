"""The daemon's services: one object that says what the daemon is made of.

`patroller.app.build` makes it once, with no I/O in any constructor; `Daemon.start` opens what
needs opening (the audit file, the lease book, the usage store) and starts what runs (monitors,
timers, the usage sampler). The HTTP layer takes it whole: the handlers, the views and the
Prometheus collector read their parts from it (through `patroller.http.api.Api`, which adds what
only HTTP needs).

Owns: the record of the daemon's parts, typed.
May import: `patroller.notify`, `patroller.state`, `patroller.identify`, `patroller.observe`,
`patroller.config`,
`patroller.core`.
"""

from __future__ import annotations

from dataclasses import dataclass

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.core.leases import LeaseManager
from patroller.identify.callers import CallerIdentifier
from patroller.identify.containers import ContainerDirectory
from patroller.identify.resolver import ProcessIdentifier
from patroller.identify.tracker import ProcessTracker
from patroller.notify import Notifier
from patroller.observe.health import HealthWatch
from patroller.observe.idle import IdleWatch
from patroller.observe.monitor import FAILING, Monitor
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
    monitors: tuple[Monitor, ...]
    leases: LeaseManager
    stats: StatsStore
    idle: IdleWatch
    identifier: ProcessIdentifier  # host pid -> identity
    callers: CallerIdentifier  # HTTP request -> identity
    tracker: ProcessTracker  # process signals -> identities -> leases
    timer: ExpiryTimer  # leases expire on time
    lifelines: Lifelines  # devices held for a process are freed when it ends
    audit: AuditLog
    book: LeaseBook | None  # None: no --state-dir, reservations do not survive a restart
    directory: ContainerDirectory | None  # the Docker Engine's labels; None in test mode
    pseudonyms: Pseudonyms | None = None  # others' names hidden (--hide-users); else None
    usage: UsageStore | None = None  # the usage history on disk; None: --usage none, or no
    # state directory
    sampler: UsageSampler | None = None  # its samples, every --usage-interval
    notifier: Notifier | None = None  # tells the admin (--notify) and the users concerned
    health: HealthWatch | None = None  # each GPU's health: -q -x's readings, the Xids

    def troubles(self) -> list[tuple[str, str, str]]:
        """The daemon's own trouble now, for the admin's `daemon` notices: (a key, what is
        wrong, what to do), one for each part that fails."""
        found = []
        book = self.book
        if book is not None and book.refusal() is not None:
            found.append(
                (
                    "lease-book",
                    f"the lease book {book.path} cannot be written: no GPU "
                    "is granted until it can",
                    "Free room under the state directory, or "
                    "look at the daemon's log for why (journalctl -u patroller).",
                )
            )
        usage = self.usage
        if usage is not None and usage.state == "failing":
            found.append(
                (
                    "usage-store",
                    f"the usage store cannot be written ({usage.why}): "
                    "intervals wait in memory, and the oldest are lost once it is full",
                    "Free room under the state directory, or look at the daemon's log.",
                )
            )
        for monitor in self.monitors:
            if monitor.metrics().state == FAILING:
                found.append(
                    (
                        f"monitor-{monitor.name}",
                        f"{monitor.name} is failing: what it watches is not seen",
                        "Run `patroller doctor` on the host, and "
                        "look at the daemon's log for how its command ends.",
                    )
                )
        return found
