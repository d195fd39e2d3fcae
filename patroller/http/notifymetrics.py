"""/metrics' families of notifications (notify/): the notices by kind and what became of
them, and those waiting now."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from patroller.notify import Notifier


def notification_families(notifier: Notifier | None) -> Iterator[Metric]:
    """Notices by kind and result (queued, sent, failed, retried, dropped), and those
    waiting now."""
    found = notifier.metrics() if notifier is not None else {}
    family = CounterMetricFamily(
        "patroller_notifications",
        "Notices to the admin's "
        "and the users' destinations by kind (trespass, idle, ...) "
        "and result: queued, sent, failed (every try), retried (a "
        "try that failed and was tried again), dropped (a full "
        "queue)",
        labels=["kind", "result"],
    )
    for kind, results in sorted(found.get("by_kind", {}).items()):
        for result, count in results.items():
            family.add_metric([kind, result], count)
    yield family
    yield GaugeMetricFamily(
        "patroller_notifications_pending",
        "Notices queued for the destinations, not yet sent",
        value=found.get("pending", 0),
    )
