"""GET /usage: GPU-hours per category over a range, by user, host account, Slurm job or
account, Kubernetes namespace or pod, GPU or day, from the usage store (state/usage), as the
caller may see it.

The store's reader sums the GPU-seconds off the event loop; what is left here is small (a row
per key, user and category). With --hide-users a caller sees the users other than themselves
as their pseudonyms, as everywhere (hiding.py); a host account, Slurm job or account,
namespace or pod is shown when every user counted under it is one the caller may see, and
otherwise as a pseudonym of its own (`account` as /users shows it, the others `job-`, `pod-`,
... and 12 hex digits), so that its GPU-hours are still told apart but name no one. GPUs and
days name no one.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Set

import tornado.web

from patroller.core.errors import Unavailable
from patroller.core.usage import CATEGORIES, Total, summarize
from patroller.http import query
from patroller.http.handlers import View
from patroller.http.hiding import Redaction, Viewer
from patroller.observe.stats import iso_time
from patroller.state.pseudonyms import PREFIX, Pseudonyms
from patroller.state.usage.queries import Row, Totals
from patroller.state.usage.store import READ_ONLY

NAMELESS = ("gpu", "day")  # groupings whose keys name no one


class UsageHandler(View):
    """The usage report: ?since=&until=&by= (query.parse_usage)."""

    async def get(self) -> None:
        store = self.services.usage
        if store is None:
            raise tornado.web.HTTPError(404, "no usage store here: it lives in the state "
                                        "directory; start the daemon with --state-dir (and "
                                        "without --usage none) to keep usage history")
        if store.state == READ_ONLY:
            raise Unavailable(f"no usage store here: its directory {store.directory} is on a "
                              "read-only filesystem")
        args = self.args()
        asked = query.parse_usage(args, time.time())
        viewer: Optional[Viewer] = None
        if self.api.hiding is not None:
            viewer = await self.viewer(query.parse_user(args))
        totals = await store.report(asked.since, asked.until, asked.by)
        pseudonyms = self.services.pseudonyms
        rename = (keys_seen(asked.by, viewer, pseudonyms)
                  if viewer is not None and pseudonyms is not None else None)
        self.send(report(totals, asked, self.services.config.usage_interval,
                         self.services.config.usage_busy_sm, rename))


Rename = Callable[[List[Row]], List[Total]]


def keys_seen(by: str, viewer: Viewer, pseudonyms: Pseudonyms) -> Rename:
    """The totals' keys as `viewer` may see them (see the module)."""
    redaction = Redaction(viewer, pseudonyms)

    def rename(rows: List[Row]) -> List[Total]:
        if viewer.everything or by in NAMELESS:
            return [(key, category, seconds) for key, _, category, seconds in rows]
        if by == "user":
            return [(redaction.name(key), category, seconds) for key, _, category, seconds in rows]
        users: Dict[Optional[str], Set[Optional[str]]] = {}
        for key, user, _, _ in rows:
            users.setdefault(key, set()).add(user)
        shown = {key: key if key is None or all(viewer.sees(u) for u in named)
                 else pseudonym(by, key, pseudonyms) for key, named in users.items()}
        return [(shown[key], category, seconds) for key, _, category, seconds in rows]
    return rename


def pseudonym(by: str, key: str, pseudonyms: Pseudonyms) -> str:
    """A hidden key: a host account as /users hides it, anything else `<by>-<12 hex>`."""
    if by == "account":
        return pseudonyms.of(key)
    return f"{by}-" + pseudonyms.of(f"{by}:{key}")[len(PREFIX):]


def report(totals: Totals, asked: query.UsageRange, interval: float, busy_sm: float,
           rename: Optional[Rename] = None) -> Dict[str, Any]:
    """The /usage answer."""
    rows = (rename(totals.rows) if rename is not None
            else [(key, category, seconds) for key, _, category, seconds in totals.rows])
    summary = summarize(rows, chronological=asked.by == "day")
    if asked.by == "gpu":
        for row in summary["rows"]:
            row["number"] = totals.numbers.get(row["key"])
    return {"since": iso_time(asked.since), "until": iso_time(asked.until), "by": asked.by,
            "first": iso_time(totals.first) if totals.first is not None else None,
            "interval": interval, "busy_sm": busy_sm, "categories": list(CATEGORIES),
            **summary}
