"""GET /usage: GPU-hours per category over a range, by user, host account, Slurm job or
account, Kubernetes namespace or pod, GPU, day, weekday or hour of the day, or by two of these
(day,user; weekday,hour), from the usage store (state/usage), as the caller may see it.

SQLite sums the GPU-seconds in the store's reader thread, which hands them over as JSON texts;
on the event loop, their rows are parsed (state/usage/reader.py), the keys renamed (the loop
alone uses the pseudonyms), and the answer made and encoded here (`answered`), each in slices
of a millisecond or less with the loop free between two: a year by day is 21,500 rows, 20-40
ms of Python. One key of state/usage/queries.py, in UTC, is its
report; two keys, a weekday or an hour, or a time zone (tz=) are state/usage/groupings.py's.

With --hide-users a caller sees the users other than themselves as their pseudonyms, as
everywhere (hiding.py); a host account, Slurm job or account, namespace or pod is shown when
every user counted under it is one the caller may see, and otherwise as a pseudonym of its own
(`account` as /users shows it, the others `job-`, `pod-`,
... and 12 hex digits), so that its GPU-hours are still told apart but name no one. GPUs, days,
weekdays and hours name no one. Each of two keys is shown as it would be alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import tornado.web

from patroller.config import Config
from patroller.core.errors import Unavailable
from patroller.core.identity import Viewer
from patroller.core.usage import (
    BY,
    CATEGORIES,
    CYCLES,
    Grouped,
    GroupedSummary,
    Summary,
    Total,
)
from patroller.http import query
from patroller.http.encoding import dumps
from patroller.http.handlers import View
from patroller.http.hiding import Redaction
from patroller.observe.stats import iso_time
from patroller.state.pseudonyms import PREFIX, Pseudonyms
from patroller.state.usage.queries import Row, Totals
from patroller.state.usage.store import READ_ONLY

NAMELESS = ("gpu", "day", *CYCLES)  # groupings whose keys name no one


class UsageHandler(View):
    """The usage report: ?since=&until=&by=&tz= (query.parse_usage)."""

    async def get(self) -> None:
        store = self.services.usage
        if store is None:
            raise tornado.web.HTTPError(
                404,
                "no usage store here: it lives in the state "
                "directory; start the daemon with --state-dir (and "
                "without --usage none) to keep usage history",
            )
        if store.state == READ_ONLY:
            raise Unavailable(
                f"no usage store here: its directory {store.directory} is on a "
                "read-only filesystem"
            )
        args = self.args()
        asked = query.parse_usage(args, time.time())
        viewer: Viewer | None = None
        if self.api.hiding is not None:
            viewer = await self.viewer(query.parse_user(args))
        pseudonyms = self.services.pseudonyms
        config = self.services.config
        # A turn of the few reports answered at once (reader.py), held until the answer is
        # written: 8 clients asking for 20 MB answers at once took the daemon from 67 to
        # 146 MB and /status's median from 38 to 78 ms.
        async with store.reader.slot():
            if asked.by in BY and asked.tz == "UTC":  # one key of its own, in UTC
                totals = await store.report(asked.since, asked.until, asked.by)
                rename: Any = (
                    keys_seen(asked.by, viewer, pseudonyms)
                    if viewer is not None and pseudonyms is not None
                    else None
                )
            else:
                totals = await store.grouped(asked.since, asked.until, asked.keys, asked.zone)
                rename = (
                    pairs_seen(asked.keys, viewer, pseudonyms)
                    if viewer is not None and pseudonyms is not None
                    else None
                )
            body = await answered(totals, asked, config, rename)
            await self.send(body)


Rename = Callable[[list[Row]], list[Total]]


def keys_seen(by: str, viewer: Viewer, pseudonyms: Pseudonyms) -> Rename:
    """The totals' keys as `viewer` may see them (see the module)."""
    redaction = Redaction(viewer, pseudonyms)

    def rename(rows: list[Row]) -> list[Total]:
        if viewer.everything or by in NAMELESS:
            return [(key, category, seconds) for key, _, category, seconds in rows]
        if by == "user":
            return [(redaction.name(key), category, seconds) for key, _, category, seconds in rows]
        users: dict[str | None, set[str | None]] = {}
        for key, user, _, _ in rows:
            users.setdefault(key, set()).add(user)
        shown = {
            key: key
            if key is None or all(viewer.sees(u) for u in named)
            else pseudonym(by, key, pseudonyms)
            for key, named in users.items()
        }
        return [(shown[key], category, seconds) for key, _, category, seconds in rows]

    return rename


RenameGrouped = Callable[[list[Any]], list[Grouped]]


def pairs_seen(keys: tuple[str, ...], viewer: Viewer, pseudonyms: Pseudonyms) -> RenameGrouped:
    """The keys of a grouped report's totals as `viewer` may see them: each as `keys_seen`
    shows a key of its kind alone (a user by name or pseudonym; an account, job, ... by name
    when every user counted under it, in the whole range, is one the viewer may see)."""
    redaction = Redaction(viewer, pseudonyms)

    def rename(rows: list[Any]) -> list[Grouped]:
        if viewer.everything:
            return [(key, category, seconds) for key, _, category, seconds in rows]
        shown: list[dict[str | None, str | None]] = []
        for n, by in enumerate(keys):
            values = {key[n] for key, *_ in rows}
            if by in NAMELESS:
                shown.append({value: value for value in values})
            elif by == "user":
                shown.append({value: redaction.name(value) for value in values})
            else:
                users: dict[str | None, set[str | None]] = {}
                for key, user, _, _ in rows:
                    users.setdefault(key[n], set()).add(user)
                shown.append(
                    {
                        value: value
                        if value is None or all(viewer.sees(u) for u in named)
                        else pseudonym(by, value, pseudonyms)
                        for value, named in users.items()
                    }
                )
        return [
            (tuple(shown[n][value] for n, value in enumerate(key)), category, seconds)
            for key, _, category, seconds in rows
        ]

    return rename


def pseudonym(by: str, key: str, pseudonyms: Pseudonyms) -> str:
    """A hidden key: a host account as /users hides it, anything else `<by>-<12 hex>`."""
    if by == "account":
        return pseudonyms.of(key)
    return f"{by}-" + pseudonyms.of(f"{by}:{key}")[len(PREFIX) :]


async def answered(
    totals: Totals, asked: query.UsageRange, config: Config, rename: Any = None
) -> bytes:
    """The /usage answer, as JSON, made on the event loop in slices, the loop free between two
    (`_turn`): the summing (core/usage.py `Summary`), Config.usage_report_chunk_rows rows a
    slice; the order; the answer's rows made and encoded, Config.usage_report_chunk_entries a
    slice. The keys are renamed first, in one piece
    (`rename`: keys_seen or pairs_seen, which need every row; only for a viewer who may not
    see everything). `totals.rows` are let go once summed (`let_go`): the list is emptied."""
    size = config.usage_report_chunk_rows
    grouping = not (asked.by in BY and asked.tz == "UTC")
    summary = GroupedSummary(asked.keys) if grouping else Summary(asked.by == "day")
    if rename is not None:
        renamed = rename(totals.rows)
        await _turn()
        for start in range(0, len(renamed), size):
            summary.add(renamed[start : start + size])
            await _turn()
    else:
        rows = totals.rows
        for start in range(0, len(rows), size):
            summary.add(
                [
                    (key, category, seconds)
                    for key, _, category, seconds in rows[start : start + size]
                ]
            )
            await _turn()
    if rename is not None:
        await let_go(renamed, size)
    await let_go(totals.rows, size)  # made for this answer alone (reader.py keeps texts)
    for _ in summary.ordering(config.usage_report_chunk_entries):
        await _turn()
    ordered = summary.ordered()
    keys = asked.keys if grouping else (asked.by,)
    where = keys.index("gpu") if "gpu" in keys else None
    head = dumps(_head(totals, asked, config.usage_interval, config.usage_busy_sm))
    # the rows made and encoded a slice at a time, spliced as one encoding of the whole is
    parts = [head[:-1], b',"rows":[']
    size = config.usage_report_chunk_entries
    for start in range(0, len(ordered), size):
        entries = summary.entries(ordered[start : start + size])
        if where is not None:
            for row in entries:
                key = row["key"] if len(keys) > 1 else [row["key"]]
                row["number"] = totals.numbers.get(key[where])
        parts += [b"," if start else b"", dumps(entries)[1:-1]]
        await _turn()
    parts += [b'],"total":', dumps(summary.total()), b"}"]
    for _ in summary.letting_go(size):
        await _turn()
    return b"".join(parts)


async def let_go(rows: list[Any], size: int) -> None:
    """A report's rows let go `size` at a time, the loop free between two: 21,500 freed at
    once took 3 ms of it. The list is empty after."""
    while rows:
        del rows[-size:]
        await _turn()


async def _turn() -> None:
    """Let the event loop run what waits (a /status request) before the next slice."""
    await asyncio.sleep(0)


def _head(
    totals: Totals, asked: query.UsageRange, interval: float, busy_sm: float
) -> dict[str, Any]:
    return {
        "since": iso_time(asked.since),
        "until": iso_time(asked.until),
        "by": asked.by,
        "tz": asked.tz,
        "first": iso_time(totals.first) if totals.first is not None else None,
        "interval": interval,
        "busy_sm": busy_sm,
        "categories": list(CATEGORIES),
    }
