"""One Patroller daemon built: `build` discovers the devices (GPU host mode) or makes the
test mode's, `assemble` makes the services and the API over them with no I/O, and `connect`
says who hears whom (the monitors' signals, the lease rules' events and their receivers)."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from patroller.app.daemon import Daemon, StartError
from patroller.config import Config, policy_of
from patroller.config.trust import Untrusted
from patroller.core.devices import Inventory, InventoryChange
from patroller.core.leases import LeaseManager
from patroller.core.policy import Policy
from patroller.core.topology import Search, Topology
from patroller.http.routes import make_api
from patroller.identify.callers import CallerIdentifier, SystemCallers, TestModeCallers
from patroller.identify.containers import ContainerDirectory
from patroller.identify.resolver import ProcessIdentifier, TestModeIdentifier
from patroller.identify.tracker import ProcessTracker
from patroller.notify import Notifier
from patroller.observe.crosscheck import CrossCheck, Unattributed
from patroller.observe.health import HealthWatch
from patroller.observe.idle import IdleWatch
from patroller.observe.inventory import GpuHostError, InventoryWatch, command, devices_of, discover
from patroller.observe.jobmap import JobMapWatch, check_map
from patroller.observe.kernlog import KernelLog
from patroller.observe.miguuids import MigUuids
from patroller.observe.monitor import Monitor
from patroller.observe.monitors import DmonMonitor, PmonMonitor
from patroller.observe.podresources import PodResourcesWatch
from patroller.observe.signals import Allocated, Signals, Silence
from patroller.observe.silence import SilenceWatch
from patroller.observe.stats import StatsStore
from patroller.observe.tally import Tally
from patroller.observe.testmode import MODELS, SyntheticMonitor, synthetic_inventory
from patroller.observe.testprocesses import SyntheticProcesses, asking_holder
from patroller.observe.topology import TopologyWatch
from patroller.services import Services
from patroller.state.audit import AuditLog
from patroller.state.book import LeaseBook
from patroller.state.lifetimes import Lifelines
from patroller.state.pseudonyms import Pseudonyms
from patroller.state.timer import ExpiryTimer
from patroller.state.usage.sampler import UsageSampler
from patroller.state.usage.store import store_for

log = logging.getLogger(__name__)


async def build(config: Config) -> Daemon:
    """The daemon the configuration asks for, built but not started: in GPU host mode, the
    devices are discovered first (`nvidia-smi -q -x`). Raises StartError if it cannot be, or
    if the Slurm job map is not to be trusted (observe/jobmap.py)."""
    if config.slurm_job_map is not None:
        try:
            check_map(config.slurm_job_map)
        except Untrusted as exc:
            raise StartError(str(exc)) from None
    signals = Signals()
    if config.test:
        inventory = synthetic_inventory(config.test_devices)
        # Its statistics follow the leases (a held device looks busy), which assemble() makes;
        # with --test-processes, its processes follow the holders, and the statistics them.
        processes = (
            SyntheticProcesses(
                inventory,
                lambda uuid: asking_holder(daemon.services.leases.holds[uuid]),
                config.test_process_cycle,
                config.test_process_after,
                MODELS["NVIDIA A100-SXM4-80GB"].busy_fb,
            )
            if config.test_processes
            else None
        )
        synthetic = SyntheticMonitor(
            inventory,
            signals,
            config.test_interval,
            held=lambda uuid: daemon.services.leases.state(uuid) not in ("free", "lost"),
            processes=processes,
        )
        identifier = (
            ProcessIdentifier(config)
            if processes is None
            else TestModeIdentifier(config, processes.owner)
        )
        daemon = assemble(
            config,
            inventory,
            signals,
            [synthetic] + schedulers(inventory, signals, config),
            identifier,
            TestModeCallers(config),
        )
        return daemon
    argv = command(config.nvidia_smi)
    try:
        found = await discover(argv, None, config)
    except GpuHostError as exc:
        raise StartError(str(exc)) from None
    mig = MigUuids(argv, None, config)  # the MIG devices' uuids (nvidia-smi -L), if any
    inventory = Inventory(await mig.attach(devices_of(found)))
    log.info(
        "nvidia-smi: driver %s, %d GPU(s): %s",
        found.driver_version or "unknown",
        len(inventory),
        ", ".join(f"{d.number}={d.name}" for d in inventory),
    )
    directory = ContainerDirectory(config)
    identifier = ProcessIdentifier(config, directory)
    pmon = PmonMonitor(inventory, signals, argv, os.environ, config)
    # The cross-check reads the statistics, which the daemon assembled below holds.
    unattributed = Unattributed(
        inventory, lambda uuid: daemon.services.stats.view(uuid), pmon, config.busy_mib
    )
    monitors = [
        DmonMonitor(inventory, signals, argv, os.environ, config),
        pmon,
        CrossCheck(
            inventory, signals, argv, os.environ, unattributed, config, unmeasured=pmon.figureless
        ),
        InventoryWatch(inventory, signals, argv, None, config, mig),
        TopologyWatch(inventory, signals, argv, None, config),
        SilenceWatch(
            inventory,
            signals,
            config.sample_interval,
            config.silent_intervals * config.sample_interval,
        ),
    ]
    monitors += schedulers(inventory, signals, config)
    if config.kernel_log is not None:
        monitors.append(KernelLog(signals, config))
    daemon = assemble(
        config,
        inventory,
        signals,
        monitors,
        identifier,
        SystemCallers(identifier, directory, config),
        directory,
    )
    if daemon.services.health is not None:  # what discovery read, taken at start
        daemon.services.health.first = found.health
    return daemon


def schedulers(inventory: Inventory, signals: Signals, config: Config) -> list[Monitor]:
    """The watches of the schedulers' allocations the configuration asks for: Slurm's job map
    (--slurm-job-map) and the kubelet's pod-resources (--kubelet-socket), or none."""
    watches: list[Monitor] = []
    if config.slurm_job_map is not None:
        watches.append(JobMapWatch(inventory, signals, config))
    if config.kubelet_socket is not None:
        watches.append(PodResourcesWatch(inventory, signals, config))
    return watches


def assemble(
    config: Config,
    inventory: Inventory,
    signals: Signals,
    monitors: Sequence[Monitor],
    identifier: ProcessIdentifier,
    callers: CallerIdentifier,
    directory: ContainerDirectory | None = None,
) -> Daemon:
    """The daemon around these devices, monitors and identities: its services, connected, and
    the API over them. No I/O: `Daemon.start` opens the files."""
    interval = config.test_interval if config.test else config.sample_interval
    leases = LeaseManager(
        inventory,
        lease=config.lease,
        policy=make_policy(config),
        max_waiters=config.max_waiters,
        max_waiting_per_user=config.max_waiting_per_user,
    )
    leases.search = Search(config.topology_exact, config.topology_seeds, config.topology_near)
    usage = store_for(config)
    audit = AuditLog(config.audit_log, config.audit_keep, config.repeat_log_every)
    services = Services(
        config=config,
        mode="test" if config.test else "gpu",
        started=time.monotonic(),
        inventory=inventory,
        signals=signals,
        monitors=tuple(monitors),
        leases=leases,
        stats=StatsStore(
            inventory,
            config.stale_intervals * interval,
            config.history_every,
            config.history_points,
            backlog=config.figures_backlog,
        ),
        idle=IdleWatch(leases),
        identifier=identifier,
        callers=callers,
        tracker=ProcessTracker(leases, identifier, config.owner_retry, config.engine_recheck),
        timer=ExpiryTimer(leases),
        lifelines=Lifelines(leases, config),
        audit=audit,
        book=LeaseBook(config.state_dir, config) if config.state_dir is not None else None,
        directory=directory,
        pseudonyms=Pseudonyms(config.state_dir, config.pseudonyms_remembered)
        if config.hide_users
        else None,
        usage=usage,
        sampler=UsageSampler(
            inventory, leases, Tally(inventory, config.usage_busy_sm), usage, config.usage_interval
        )
        if usage is not None
        else None,
        notifier=Notifier(config, socket.gethostname(), audit, config.state_dir, leases),
        health=HealthWatch(inventory, config),
    )
    connect(services)
    return Daemon(services, make_api(services))


def connect(services: Services) -> None:
    """Who hears whom: the monitors' signals reach the statistics, the idle watch and (through
    the tracker) the leases; every lease event reaches the audit record; a change of the host's
    devices reaches the leases and the streams; a device that falls silent, or is unhealthy,
    is withheld; a device the Slurm job map or the kubelet allocates is its jobs' or pods'; the
    links `topo -m` says choose among free devices."""
    services.stats.connect(services.signals)
    services.idle.connect(services.signals)
    services.tracker.connect(services.signals)
    if services.sampler is not None:
        services.sampler.tally.connect(services.signals)
    services.leases.on_event(services.audit.record)
    if services.notifier is not None:
        services.leases.on_event(services.notifier.turns.put)  # a few a turn of the loop
        services.notifier.quiet_for = services.idle.quiet_for
        services.notifier.troubles = services.troubles
        services.notifier.usage = services.usage
    if services.book is not None:  # nothing is handed out that the book cannot keep
        services.leases.gate = services.book.refusal

    def devices_changed(sender: Any, record: InventoryChange) -> None:
        services.leases.devices_changed()
        if record.added or record.lost or record.renumbered:
            for monitor in services.monitors:
                monitor.reconfigure()

    services.signals.inventory_changed.connect(devices_changed, weak=False)

    def topology_read(sender: Any, record: Topology) -> None:
        services.leases.topology = record  # which free devices go to whom, from now on
        services.leases.serve()

    services.signals.topology_read.connect(topology_read, weak=False)

    def device_silent(sender: Any, record: Silence) -> None:
        services.leases.withhold(record.uuid, record.why)

    services.signals.device_silent.connect(device_silent, weak=False)

    health = services.health
    if health is not None:  # an unhealthy device is withheld, and its health shown
        health.connect(services.signals)
        health.on_change = lambda uuid, now, by: services.leases.withhold(
            uuid, now.reason, "health", now, by
        )

    def scheduler_allocation(sender: Any, record: Allocated) -> None:
        services.leases.allocate(record.uuid, record.allocation, record.source)

    services.signals.scheduler_allocation.connect(scheduler_allocation, weak=False)


def make_policy(config: Config) -> Policy:
    """The fair-use policy the configuration and its limits file set. Raises StartError if the
    limits file is unusable (at start; a reload keeps the old policy instead)."""
    try:
        return policy_of(config)
    except ValueError as exc:
        raise StartError(f"--limits-file: {exc}") from None
