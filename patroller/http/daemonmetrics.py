"""/metrics' families of the daemon's own working: its build and mode, its devices, each
monitor's state and counters (found by kind, not by name), the identity lookups, the lease
book's writes and the HTTP answers by endpoint and status."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from patroller import __version__
from patroller.http.access import Requests
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


def daemon_families(services: Services, requests: Requests) -> Iterator[Metric]:
    """The daemon's own working: its build, its devices, each monitor's state and counters,
    the identity lookups, the lease book's writes and the HTTP answers."""
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
            "Calls to the container engines' Docker API (Docker, Podman, users' rootless engines)",
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
            requests.identity_failures,
        ),
        (
            "accept_failures",
            "accept() calls that failed for want of descriptors (each "
            "followed by a pause without accepting)",
            requests.accept_failures,
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
    for (endpoint, status), count in sorted(requests.answers.items()):
        answers.add_metric([endpoint, str(status)], count)
    yield answers
