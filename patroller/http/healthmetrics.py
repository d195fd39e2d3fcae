"""/metrics' families of the GPUs' health (core/health.py): whether each GPU may be granted,
and why not, and the kernel log's Xid lines."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from patroller.core.health import UNHEALTHY
from patroller.services import Services


def health_families(services: Services) -> Iterator[Metric]:
    """`patroller_gpu_healthy`: 1 healthy or degraded (granted as usual), 0 unhealthy (granted
    to nobody); `reason` the problems' codes, comma-separated ("" for none), `state` its word.
    Then the Xid lines that named a GPU of the host, and those that named none."""
    healthy = GaugeMetricFamily(
        "patroller_gpu_healthy",
        "1 while the GPU may be granted "
        "(healthy, or degraded: slowed clocks), 0 while it is unhealthy "
        "and granted to nobody; reason: the problems' codes "
        "(remap_pending, xid_79, slowdown, ...)",
        labels=["gpu", "uuid", "model", "state", "reason"],
    )
    holds = services.leases.holds
    for device in services.inventory.present():
        health = holds[device.uuid].health
        healthy.add_metric(
            [str(device.number), device.uuid, device.name or "", health.state, health.codes],
            0.0 if health.state == UNHEALTHY else 1.0,
        )
    yield healthy
    watch = services.health
    yield CounterMetricFamily(
        "patroller_xids",
        "Xid lines of the kernel log that named a GPU of the host",
        value=watch.xids if watch is not None else 0,
    )
    yield CounterMetricFamily(
        "patroller_xids_unmatched",
        "Xid lines of the kernel log that named no GPU of the inventory",
        value=watch.unmatched if watch is not None else 0,
    )
