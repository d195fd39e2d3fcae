"""/metrics for Prometheus: the daemon's state read at scrape time by one custom collector.

Nothing is recorded per sample: a scrape walks what the daemon already holds (the last sample of
each device, the lease manager's holds and queue, the monitors' counters) and builds the
families from it, so the metrics cost nothing between scrapes. The walk is on the event loop (the
state is the loop's), a part at a time: once it has held the loop for Config.loop_slice, the
loop serves what is ready before the next part (between the groups of families, and every
PAUSE_GPUS GPUs or PAUSE_PROCESSES processes within theirs: at 64 GPUs and 500 processes the
walk is some 13 ms, its GPUs' and its processes' groups a third of it each); writing the
text, three quarters of a scrape's cost, and the standard process and Python collectors (which
read /proc) run in the executor. Names follow Prometheus's
conventions: the `patroller_` prefix, base units (`_bytes`, `_watts`, `_celsius`, `_hertz`,
`_ratio`, `_seconds`), `_total` for counters, `_info` for a series whose labels are the value.

Cardinality: per GPU a fixed number of series; per process series exist only while the process
is on a GPU (pmon or the cross-check lists it), so they go when it ends; per user series exist
only for users who hold, use or wait for a GPU now, except the usage store's GPU-seconds by user
and category, a counter for each user seen since the daemon started (at most one per category);
requests are counted by endpoint (the routes, or `other`) and status.

With --hide-users, the scrapers (nobody in particular) see every user label as its pseudonym,
and no container, job or pod label of a user's (hiding.metric_labels).

The GPUs', processes' and users' families are built here; the daemon's own working's in
daemonmetrics.py, the GPUs' health's in healthmetrics.py, the usage store's in usagemetrics.py
and the notifications' in notifymetrics.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from patroller.config import Config
from patroller.http.access import Requests
from patroller.http.daemonmetrics import daemon_families
from patroller.http.healthmetrics import health_families
from patroller.http.hiding import Hiding, metric_labels
from patroller.http.notifymetrics import notification_families
from patroller.http.usagemetrics import usage_families
from patroller.http.views import device_holds, usage, waiting_by_user
from patroller.services import Services

MIB = 1024 * 1024
MHZ = 1_000_000
GPU_LABELS = ("gpu", "uuid", "model")
PROCESS_LABELS = ("gpu", "uuid", "pid", "user", "container", "command")
# within the GPUs' and the processes' groups, a point where the walk may pause after so many
# (either about a millisecond of the walk at 64 GPUs and 500 processes; Registries.exposition)
PAUSE_GPUS = 16
PAUSE_PROCESSES = 100
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
        for family in self.parts():
            if family is not None:
                yield family

    def parts(self) -> Iterator[Metric | None]:
        """Every family, in groups, with None between them and within the GPUs' and the
        processes' groups: a point where the walk may let the loop serve others
        (Registries.exposition), after which the walk reads the state as it is then (a process
        gone meanwhile is in the scrape; a GPU found meanwhile is in the next)."""
        holds = device_holds(self.services.leases)
        yield from self._gpus(holds)
        yield None
        yield from self._processes(holds)
        yield None
        yield from self._users()
        yield None
        yield from daemon_families(self.services, self.requests)
        yield None
        yield from health_families(self.services)
        yield None
        yield from usage_families(self.services, self.hide)
        yield None
        yield from notification_families(self.services.notifier)

    def _gpus(self, holds: dict[str, dict[str, Any]]) -> Iterator[Metric | None]:
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
        for n, device in enumerate(services.inventory, 1):
            if n % PAUSE_GPUS == 0:
                yield None  # (the devices iterated are those there were when the walk began)
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

    def _processes(self, holds: dict[str, dict[str, Any]]) -> Iterator[Metric | None]:
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
        rows = 0
        for device in services.inventory:
            hold = holds.get(device.uuid)  # (a GPU found since the holds were read: none yet)
            for pid, owner, command in hold["processes"] if hold is not None else ():
                rows += 1
                if rows % PAUSE_PROCESSES == 0:
                    yield None
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
        self,
        services: Services,
        requests: Requests,
        hiding: Hiding | None = None,
        slice_: float = Config.loop_slice,
    ) -> None:
        self.collector = DaemonCollector(services, requests, hiding)
        self.slice = slice_  # seconds the walk holds the loop before it lets others in
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
        """The daemon's state taken on the loop, a part at a time (the loop serves others at
        the walk's pause points once it has held it `slice` seconds: DaemonCollector.parts),
        then written out in the executor."""
        families: list[Metric] = []
        began = time.monotonic()
        for family in self.collector.parts():
            if family is not None:
                families.append(family)
            elif time.monotonic() - began >= self.slice:
                await asyncio.sleep(0)  # one turn of the loop: what is ready is served
                began = time.monotonic()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.encode, families, accept)
