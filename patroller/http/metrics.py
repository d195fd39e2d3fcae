"""/metrics for Prometheus: the daemon's state read at scrape time by one custom collector.

Nothing is recorded per sample: a scrape walks what the daemon already holds (the last sample of
each device, the lease manager's holds and queue, the monitors' counters) and builds the
families from it, so the metrics cost nothing between scrapes. The walk is on the event loop (the
state is the loop's); writing the text, three quarters of a scrape's cost, and the standard
process and Python collectors (which read /proc) run in the executor. Names follow Prometheus's
conventions: the `patroller_` prefix, base units (`_bytes`, `_watts`, `_celsius`, `_hertz`,
`_ratio`, `_seconds`), `_total` for counters, `_info` for a series whose labels are the value.

Cardinality: per GPU a fixed number of series; per process series exist only while the process
is on a GPU (pmon or the cross-check lists it), so they go when it ends; per user series exist
only for users who hold, use or wait for a GPU now, except the usage store's GPU-seconds by user
and category, a counter for each user seen since the daemon started (at most one per category);
requests are counted by endpoint (the routes, or `other`) and status.

With --hide-users, the scrapers (nobody in particular) see every user label as its pseudonym,
and no container, job or pod label of a user's (hiding.metric_labels).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from patroller import __version__
from patroller.http.access import Requests
from patroller.http.healthmetrics import health_families
from patroller.http.hiding import Hiding, metric_labels
from patroller.http.notifymetrics import notification_families
from patroller.http.views import device_holds, usage, waiting_by_user
from patroller.observe.monitor import (
    FAILING,
    IDLE,
    STATES,
    CrossCheckMetrics,
    InventoryMetrics,
    MonitorMetrics,
    SilenceMetrics,
    first,
)
from patroller.services import Services

MIB = 1024 * 1024
USAGE_STATES = ("off", "starting", "writable", "failing", "read_only", "stopped")
USAGE_TROUBLE = ("failing", "read_only")
MHZ = 1_000_000
GPU_LABELS = ("gpu", "uuid", "model")
PROCESS_LABELS = ("gpu", "uuid", "pid", "user", "container", "command")
# (family, help, statistic, scale, extra label and its value)
GPU_FIGURES = (
    ("utilization_ratio", "SM utilisation (0-1)", "sm", 0.01, None),
    ("memory_utilization_ratio", "Memory-controller utilisation (0-1)", "mem", 0.01, None),
    ("encoder_utilization_ratio", "Video encoder utilisation (0-1)", "enc", 0.01, None),
    ("decoder_utilization_ratio", "Video decoder utilisation (0-1)", "dec", 0.01, None),
    ("memory_used_bytes", "GPU memory in use, bytes", "fb", MIB, None),
    ("memory_total_bytes", "GPU memory in all, bytes", "fb_total", MIB, None),
    ("power_watts", "Power draw, watts", "power", 1, None),
    ("temperature_celsius", "Temperature, degrees Celsius", "gtemp", 1, ("sensor", "gpu")),
    ("temperature_celsius", "", "mtemp", 1, ("sensor", "memory")),
    ("clock_hertz", "Clock frequency, hertz", "pclk", MHZ, ("clock", "sm")),
    ("clock_hertz", "", "mclk", MHZ, ("clock", "memory")),
)


def _number(value: Any) -> float | None:
    return (
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    )


class DaemonCollector:
    """Every family Patroller exposes, built from the services' state at each scrape."""

    def __init__(
        self, services: Services, requests: Requests, hiding: Hiding | None = None
    ) -> None:
        self.services = services
        self.requests = requests  # the HTTP answers counted
        self.hide = hiding.label if hiding is not None else None  # user -> its label

    def collect(self) -> Iterator[Metric]:
        holds = device_holds(self.services.leases)
        yield from self._gpus(holds)
        yield from self._processes(holds)
        yield from self._users()
        yield from self._health()
        yield from health_families(self.services)
        yield from self._usage()
        yield from notification_families(self.services.notifier)

    def _gpus(self, holds: dict[str, dict[str, Any]]) -> Iterator[Metric]:
        services = self.services
        families: dict[str, GaugeMetricFamily] = {}
        for suffix, text, _, _, extra in GPU_FIGURES:
            if suffix not in families:
                labels = GPU_LABELS + ((extra[0],) if extra else ())
                families[suffix] = GaugeMetricFamily(
                    f"patroller_gpu_{suffix}", text, labels=labels
                )
        stale = GaugeMetricFamily(
            "patroller_gpu_stale",
            "1 when the device's statistics (or process list) are out of date",
            labels=GPU_LABELS + ("data",),
        )
        holder = InfoMetricFamily(
            "patroller_gpu_holder",
            "Who holds each GPU, and its state "
            "(job: the Slurm job of the holder's process, if any; pod: "
            "its Kubernetes pod, namespace/name)",
            labels=GPU_LABELS + ("state", "user", "container", "job", "pod"),
        )
        age = GaugeMetricFamily(
            "patroller_gpu_state_seconds", "Seconds in the current state", labels=GPU_LABELS
        )
        expiry = GaugeMetricFamily(
            "patroller_gpu_lease_expiry_seconds",
            "Seconds until the reservation's lease runs out (only while a lease runs)",
            labels=GPU_LABELS,
        )
        idle = GaugeMetricFamily(
            "patroller_gpu_idle_seconds",
            "Seconds a held GPU has been idle (only once past --idle-after)",
            labels=GPU_LABELS,
        )
        for device in services.inventory:
            ids = [str(device.number), device.uuid, device.name or ""]
            view = services.stats.view(device.uuid)
            for suffix, _, key, scale, extra in GPU_FIGURES:
                value = _number(view.get(key))
                if value is not None:
                    families[suffix].add_metric(ids + ([extra[1]] if extra else []), value * scale)
            stale.add_metric(ids + ["statistics"], 1.0 if view.get("stale") else 0.0)
            stale.add_metric(
                ids + ["processes"], 1.0 if services.stats.processes_stale(device.uuid) else 0.0
            )
            hold = holds[device.uuid]
            who = hold["holder"]
            holder.add_metric(ids, {"state": hold["state"], **metric_labels(who, self.hide)})
            age.add_metric(ids, hold["age"])
            if hold["expires"] is not None:
                expiry.add_metric(ids, hold["expires"])
            idle_for = services.idle.idle_for(device.uuid)
            if idle_for is not None:
                idle.add_metric(ids, idle_for)
        yield from families.values()
        yield from (stale, holder, age, expiry, idle)

    def _processes(self, holds: dict[str, dict[str, Any]]) -> Iterator[Metric]:
        services = self.services
        memory = GaugeMetricFamily(
            "patroller_process_gpu_memory_bytes",
            "GPU memory of a process on a GPU, bytes",
            labels=PROCESS_LABELS,
        )
        busy = GaugeMetricFamily(
            "patroller_process_gpu_utilization_ratio",
            "SM utilisation of a process on a GPU (0-1)",
            labels=PROCESS_LABELS,
        )
        for device in services.inventory:
            for pid, owner, command in holds[device.uuid]["processes"]:
                named = metric_labels(owner, self.hide)
                labels = [
                    str(device.number),
                    device.uuid,
                    str(pid),
                    named["user"],
                    named["container"],
                    command or "",
                ]
                figures = services.stats.process_view(device.uuid, pid)
                fb, sm = _number(figures.get("fb")), _number(figures.get("sm"))
                if fb is not None:
                    memory.add_metric(labels, fb * MIB)
                if sm is not None:
                    busy.add_metric(labels, sm / 100)
        yield memory
        yield busy

    def _users(self) -> Iterator[Metric]:
        leases = self.services.leases
        families = {
            "held": GaugeMetricFamily(
                "patroller_user_gpus_held",
                "GPUs the user holds (reserved, claimed or shared)",
                labels=["user"],
            ),
            "reserved_unused": GaugeMetricFamily(
                "patroller_user_gpus_reserved_unused",
                "GPUs the user holds with no process of theirs running on them",
                labels=["user"],
            ),
            "unreserved": GaugeMetricFamily(
                "patroller_user_gpus_unreserved",
                "GPUs the user computes on without having asked for them",
                labels=["user"],
            ),
            "over_limit": GaugeMetricFamily(
                "patroller_user_gpus_over_limit",
                "GPUs the user took by computing beyond their limit, or their account's",
                labels=["user"],
            ),
            "trespassing": GaugeMetricFamily(
                "patroller_user_gpus_trespassing",
                "GPUs the user runs a process on that are not theirs: another user holds them, "
                "or a Slurm job their process is not in",
                labels=["user"],
            ),
        }
        label = self.hide or (lambda user: user)
        for user, counts in sorted(usage(leases).items()):
            for key, family in families.items():
                family.add_metric([label(user)], counts[key])
        yield from families.values()
        waiting = GaugeMetricFamily(
            "patroller_user_requests_waiting",
            "Requests of the user waiting in the queue",
            labels=["user"],
        )
        longest = GaugeMetricFamily(
            "patroller_user_wait_seconds_max",
            "Seconds the user's longest waiting request has waited",
            labels=["user"],
        )
        queued = waiting_by_user(leases)
        for user, (count, seconds) in sorted(queued.items()):
            waiting.add_metric([label(user)], count)
            longest.add_metric([label(user)], seconds)
        yield waiting
        yield longest
        yield GaugeMetricFamily(
            "patroller_requests_waiting",
            "Requests waiting in the queue",
            value=len(leases.waiters),
        )
        yield GaugeMetricFamily(
            "patroller_wait_seconds_max",
            "Seconds the longest waiting request has waited",
            value=max((s for _, s in queued.values()), default=0.0),
        )

    def _health(self) -> Iterator[Metric]:
        services = self.services
        yield InfoMetricFamily(
            "patroller_build",
            "The daemon's version and mode",
            value={"version": __version__, "mode": services.mode},
        )
        yield GaugeMetricFamily(
            "patroller_devices",
            "Devices known (lost ones included)",
            value=len(services.inventory),
        )
        up = GaugeMetricFamily(
            "patroller_monitor_up",
            "1 while the monitor works: its child "
            "runs, or it is idle by design (the cross-check with nothing to "
            "query, the inventory between readings); 0 while it fails",
            labels=["monitor"],
        )
        states = GaugeMetricFamily(
            "patroller_monitor_state",
            "1 for the monitor's state: up, idle (by design) or failing",
            labels=["monitor", "state"],
        )
        starts = CounterMetricFamily(
            "patroller_monitor_starts",
            "Times the monitor's child was started (restarts included)",
            labels=["monitor"],
        )
        hangs = CounterMetricFamily(
            "patroller_monitor_hangs",
            "Times the monitor's child was killed as hung: printing nothing, or no answer in time",
            labels=["monitor"],
        )
        skipped = CounterMetricFamily(
            "patroller_monitor_skipped_lines",
            "Unreadable lines the monitor skipped",
            labels=["monitor"],
        )
        found: list[MonitorMetrics] = []
        for monitor in services.monitors:
            name = monitor.name
            counters = monitor.metrics()
            found.append(counters)
            up.add_metric([name], 0.0 if counters.state == FAILING else 1.0)
            for each in STATES:
                states.add_metric([name, each], 1.0 if counters.state == each else 0.0)
            if counters.starts is not None:
                starts.add_metric([name], counters.starts)
            if counters.hangs is not None:
                hangs.add_metric([name], counters.hangs)
            if counters.skipped_lines is not None:
                skipped.add_metric([name], counters.skipped_lines)
        yield from (up, states, starts, hangs, skipped)
        # Found by kind, not by name: a monitor renamed keeps its series (zeros where none runs).
        check = first(found, CrossCheckMetrics) or CrossCheckMetrics(state=IDLE)
        inventory = first(found, InventoryMetrics) or InventoryMetrics(state=IDLE)
        quiet = first(found, SilenceMetrics) or SilenceMetrics(state=IDLE)
        yield GaugeMetricFamily(
            "patroller_devices_silent",
            "GPUs that print no statistics while the others do: granted to nobody",
            value=quiet.silent,
        )
        for name, text, value in (
            ("cross_check_runs", "Compute-apps queries run", check.runs),
            ("cross_check_failures", "Compute-apps queries that failed", check.failures),
            (
                "inventory_readings",
                "Readings of the GPU inventory after the first",
                inventory.readings,
            ),
            (
                "inventory_changes",
                "Readings that found GPUs lost, added or renumbered",
                inventory.changes,
            ),
            ("silences", "Times a GPU fell silent while the others printed", quiet.silences),
            (
                "docker_calls",
                "Calls to the container engines' Docker API (Docker, Podman, "
                "users' rootless engines)",
                services.identifier.docker_calls,
            ),
            ("proc_reads", "/proc entries of processes read", services.identifier.proc_reads),
            (
                "caller_lookups",
                "TCP callers looked up in the kernel's socket table",
                services.callers.lookups,
            ),
            (
                "caller_descriptors_read",
                "Descriptors read to find the processes of TCP callers",
                services.callers.descriptors_read,
            ),
            (
                "identity_failures",
                "Requests refused because the caller could not be identified",
                self.requests.identity_failures,
            ),
            (
                "accept_failures",
                "accept() calls that failed for want of descriptors (each "
                "followed by a pause without accepting)",
                self.requests.accept_failures,
            ),
        ):
            yield CounterMetricFamily(f"patroller_{name}", text, value=value)
        book = services.book.metrics() if services.book is not None else {}
        yield CounterMetricFamily(
            "patroller_lease_book_writes", "Writes of the lease book", value=book.get("writes", 0)
        )
        yield CounterMetricFamily(
            "patroller_lease_book_failures",
            "Writes of the lease book that failed",
            value=book.get("failures", 0),
        )
        yield GaugeMetricFamily(
            "patroller_lease_book_writable",
            "1 while the lease book can be "
            "written (else no reservation is handed out, but on a read-only "
            "filesystem); 1 with no book",
            value=1.0 if book.get("writable", True) else 0.0,
        )
        yield GaugeMetricFamily(
            "patroller_lease_book_read_only",
            "1 when the state directory is "
            "on a read-only filesystem: the book was read at start and is "
            "never written, reservations do not survive a restart",
            value=1.0 if book.get("read_only") else 0.0,
        )
        answers = CounterMetricFamily(
            "patroller_http_requests",
            "HTTP requests answered, by endpoint and status",
            labels=["endpoint", "status"],
        )
        for (endpoint, status), count in sorted(self.requests.answers.items()):
            answers.add_metric([endpoint, str(status)], count)
        yield answers

    def _usage(self) -> Iterator[Metric]:
        store = self.services.usage
        found: dict[str, Any] = store.metrics() if store is not None else {"state": "off"}
        state = found["state"]
        yield GaugeMetricFamily(
            "patroller_usage_writable",
            "1 while the usage store can be "
            "written; 0 while writes fail, or with no store because its "
            "directory is read-only; 1 with none asked for",
            value=0.0 if state in USAGE_TROUBLE else 1.0,
        )
        states = GaugeMetricFamily(
            "patroller_usage_state",
            "1 for the usage store's state: off "
            "(none asked for), starting, writable, failing, read_only "
            "(none: its directory is read-only) or stopped",
            labels=["state"],
        )
        for each in USAGE_STATES:
            states.add_metric([each], 1.0 if state == each else 0.0)
        yield states
        for name, text, key in (
            ("rows_written", "Usage samples written: one row per GPU per interval", "rows"),
            ("intervals_written", "Usage intervals written, each in one transaction", "intervals"),
            ("failures", "Writes (or openings) of the usage store that failed", "failures"),
            (
                "set_aside",
                "Usage store files set aside: corrupt, or of a newer schema",
                "set_aside",
            ),
            (
                "dropped_intervals",
                "Usage intervals dropped: past the backlog kept in "
                "memory while the store could not be written, or refused by it",
                "dropped",
            ),
        ):
            yield CounterMetricFamily(f"patroller_usage_{name}", text, value=found.get(key, 0))
        yield GaugeMetricFamily(
            "patroller_usage_pending_intervals",
            "Usage intervals kept in memory, not yet written",
            value=found.get("pending", 0),
        )
        yield GaugeMetricFamily(
            "patroller_usage_saving_room",
            "1 while the usage store does "
            "not write: the room left on its filesystem (usage_reserve) is "
            "kept for the lease book",
            value=float(bool(found.get("saving_room"))),
        )
        if found.get("free") is not None:
            yield GaugeMetricFamily(
                "patroller_usage_free_bytes",
                "Bytes free on the usage store's filesystem at its last write",
                value=found["free"],
            )
        refused = CounterMetricFamily(
            "patroller_usage_reports_refused",
            "Usage reports "
            "refused: busy (as many as may run at once were running: "
            "429) or too_large (more rows than a report may hold: "
            "400)",
            labels=["reason"],
        )
        for reason in ("busy", "too_large"):
            refused.add_metric([reason], found.get(f"reports_{reason}", 0))
        yield refused
        yield CounterMetricFamily(
            "patroller_usage_parties_overflow",
            "Parties over the bound "
            "of new ones per interval (usage_new_parties), counted under "
            "their host account alone",
            value=found.get("parties_overflow", 0),
        )
        yield self._gpu_seconds()

    def _gpu_seconds(self) -> Metric:
        """GPU-seconds by user and category, as the usage store counts them (the sampler's
        running totals): what contrib/prometheus's recording rules turn into GPU-hours."""
        family = CounterMetricFamily(
            "patroller_usage_gpu_seconds",
            "GPU-seconds since the daemon started, by user and "
            "usage category (active, idle_held, reserved_unused, trespass, unreserved, free, "
            "lost), split as the usage store splits them and added at each --usage-interval; "
            "user is empty for GPU-time nobody had",
            labels=["user", "category"],
        )
        sampler = self.services.sampler
        label = self.hide or (lambda user: user)
        for (user, category), seconds in sorted((sampler.seconds if sampler else {}).items()):
            family.add_metric([label(user) if user else "", category], seconds)
        return family


class Collected:
    """Families already collected, as a registry the encoders take."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class Registries:
    """The daemon's collector (read on the loop) and the standard ones (read anywhere).

    The standard collectors read /proc as they are made: they are made at the first scrape, in
    the executor, not when the daemon is built.
    """

    def __init__(
        self, services: Services, requests: Requests, hiding: Hiding | None = None
    ) -> None:
        self.collected = CollectorRegistry(auto_describe=False)
        self.collected.register(DaemonCollector(services, requests, hiding))
        self._standard: CollectorRegistry | None = None
        self._lock = threading.Lock()  # two scrapes at once make them once

    def standard(self) -> CollectorRegistry:
        """Blocking: the process, platform and garbage collector registries."""
        with self._lock:
            if self._standard is None:
                registry = CollectorRegistry(auto_describe=False)
                ProcessCollector(registry=registry)
                PlatformCollector(registry=registry)
                GCCollector(registry=registry)
                self._standard = registry
            return self._standard

    def encode(self, families: list[Metric], accept: str | None) -> tuple[bytes, str]:
        """Blocking: (body, content type), OpenMetrics when `accept` asks for it."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(Collected(families + list(self.standard().collect()))), content_type

    async def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The daemon's state taken on the loop, written out in the executor."""
        families = list(self.collected.collect())
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.encode, families, accept)
