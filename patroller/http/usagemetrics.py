"""/metrics' families of the usage store (state/usage/): whether it can be written, what it
wrote, dropped and refused, and the sampler's running GPU-seconds by user and category."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from patroller.services import Services

USAGE_STATES = ("off", "starting", "writable", "failing", "read_only", "stopped")
USAGE_TROUBLE = ("failing", "read_only")


def usage_families(services: Services, hide: Callable[[str], str] | None) -> Iterator[Metric]:
    """The usage store's state and counters, and the GPU-seconds by user and category
    (`hide`: a user's label under --hide-users)."""
    store = services.usage
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
    yield gpu_seconds(services, hide)


def gpu_seconds(services: Services, hide: Callable[[str], str] | None) -> Metric:
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
    sampler = services.sampler
    label = hide or (lambda user: user)
    for (user, category), seconds in sorted((sampler.seconds if sampler else {}).items()):
        family.add_metric([label(user) if user else "", category], seconds)
    return family
