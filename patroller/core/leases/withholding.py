"""A device granted to nobody: why, by cause (it fell silent; it is unhealthy), and the events
of an unhealthy episode (`unhealthy` when it begins, `healthy` when it ends: the notifier's
`unhealthy` kind, told to the admin and the holder once per episode)."""

from __future__ import annotations

import logging

from patroller.core.devices import Device
from patroller.core.health import Health
from patroller.core.leases.holds import Hold, Notices

log = logging.getLogger(__name__)


def apply(
    hold: Hold,
    why: str | None,
    cause: str,
    health: Health | None,
    device: Device | None,
    notices: Notices,
    by: str | None = None,
) -> bool:
    """Withhold the device for `cause` while `why` (None: no longer for it), and take its
    `health` if given (`by`: the host's root, who said it is healthy: the record says so);
    whether anything shown changed. Whoever holds it keeps it."""
    changed = False
    if health is not None and health != hold.health:
        was = hold.health.reason
        hold.health = health
        changed = True
        if (was is None) != (health.reason is None):
            holder = hold.holder.user if hold.holder else None
            if health.reason is not None:
                log.warning("GPU %s is unhealthy, granted to nobody: %s", hold.uuid, health.reason)
                notices.event(
                    "unhealthy",
                    holder,
                    [device],
                    reason=health.reason,
                    problems=[p.code for p in health.problems if p.grave],
                )
            else:
                log.warning(
                    "GPU %s is healthy again (was: %s)%s",
                    hold.uuid,
                    was,
                    f", as {by} said" if by else "",
                )
                notices.event("healthy", holder, [device], was=was, by=by)
    reasons = hold.withholds
    if reasons.get(cause) != why:
        if why is None:
            reasons.pop(cause, None)
        else:
            reasons[cause] = why
        hold.withheld = "; ".join(reasons.values()) or None
        changed = True
    return changed
