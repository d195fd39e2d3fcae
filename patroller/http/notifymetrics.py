"""/metrics' families of notifications (notify/): the notices by kind and what became of
them, those waiting now, and the events waiting for a turn of the loop."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from patroller.notify import Notifier


def notification_families(notifier: Notifier | None) -> Iterator[Metric]:
    """Notices by kind and result (queued, sent, failed, retried, dropped), those
    waiting now, and the events waiting to be handled and dropped before."""
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
    yield GaugeMetricFamily(
        "patroller_notification_events_waiting",
        "The lease rules' events waiting for a turn of the loop to be handled",
        value=found.get("events_waiting", 0),
    )
    yield CounterMetricFamily(
        "patroller_notification_events_dropped",
        "The lease rules' events dropped, not handled: too many waited for a turn",
        value=found.get("events_dropped", 0),
    )
