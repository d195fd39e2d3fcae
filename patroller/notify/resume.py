"""What the outbox held at start, sent on (outbox.py keeps it): each notice queued again at its
destination if its recipient still has it and has not muted its kind, else recorded as `gone`;
a notice whose try was cut short by the end of the daemon is not tried again (its destination
may have it already), and is recorded as `interrupted`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from patroller.core.leases import Event
from patroller.notify.delivery import Destination, Router
from patroller.notify.journal import Pending, Restored
from patroller.notify.outbox import Outbox, tag_of
from patroller.state.audit import AuditLog

log = logging.getLogger(__name__)

ADMIN = "admin"


def resume(
    restored: Restored,
    admins: Sequence[Destination],
    router: Router,
    urls_for: Callable[[str, str], tuple[str, ...]],
    outbox: Outbox,
    audit: AuditLog | None,
) -> None:
    """Queue again what was pending (`admins`: the admin's destinations now; `urls_for`: a
    user's destinations now for a kind), and record what is not sent."""
    by_tag = {d.tag: d for d in admins}
    for item in restored.pending:
        notice = item.notice
        if item.admin:  # (a user may be called "admin": her notices are hers)
            destination = by_tag.get(item.tag)
            if destination is not None:
                destination.put(notice, ADMIN, destination.number, item.ident)
                continue
        else:
            found = [
                (n, url)
                for n, url in enumerate(urls_for(item.recipient, notice.kind), 1)
                if tag_of(url) == item.tag
            ]
            if found:
                number, url = found[0]
                router.put(notice, item.recipient, [url], [number], [item.ident])
                continue
        outbox.done(item.ident, "gone")
        _note(audit, item, "gone")
    for item in restored.interrupted:
        _note(audit, item, "interrupted")
    if restored.pending or restored.interrupted:
        log.info(
            "notifications: %d notice(s) pending before the restart queued again, %d cut "
            "short while being sent not sent again",
            len(restored.pending),
            len(restored.interrupted),
        )


def _note(audit: AuditLog | None, item: Pending, result: str) -> None:
    if audit is not None:
        details: dict[str, Any] = {
            "kind": item.notice.kind,
            "recipient": item.recipient,
            "destination": item.number,
            "result": result,
            "tries": 0,
        }
        if item.admin:  # the admin's destination, whatever a user's name
            details["admin"] = True
        audit.record(Event("notify", item.notice.user, item.notice.devices, details))
