"""The lease rules' and the audit record's read endpoints: /queue (who waits), /users (who
holds what) and /history (the recent events), each as the caller may see it (--hide-users)."""

from __future__ import annotations

from collections.abc import Awaitable

from patroller.http import hiding, query
from patroller.http.handlers import View
from patroller.http.views import queue_view, users_view


class QueueHandler(View):
    def get(self) -> Awaitable[None] | None:
        return self.shown(lambda: queue_view(self.leases), hiding.queue)


class UsersHandler(View):
    def get(self) -> Awaitable[None] | None:
        return self.shown(lambda: users_view(self.leases, self.services.idle), hiding.users)


class HistoryHandler(View):
    """The recent events of the audit record, oldest first: ?since=<epoch seconds or ISO time>
    (default: all kept) and ?limit=N (default and most: 1000)."""

    def get(self) -> Awaitable[None] | None:
        ask = query.parse_history(self.args())
        return self.shown(lambda: self.services.audit.since(ask.since, ask.limit), hiding.events)
