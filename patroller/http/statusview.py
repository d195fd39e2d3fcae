"""The /status body, built a device at a time and served many times.

Each device's entry is kept in parts, each serialized once: its statistics (rebuilt when a
sample for it arrives), its claim (when its hold changed: a fingerprint of the hold tells) and
its processes with their figures, a row per process (processlist.py: when either changed, the
hold's `process_version` and the store's `figures_version` tell; a sample alone leaves them
be, and a new holder serializes no row again). What moves
with the clock alone (`age`, `expires`, `ends_at`, `idle_for`, `stale`, `processes_stale`)
is spliced in as the body is put together, at most every `max_age` seconds
(Config.status_max_age): a body that is only older costs a join of bytes, never a rebuild.

A lease change is shown at once: the next body checks every hold's fingerprint and rebuilds
the claims that changed (read your writes: a /status after a /request shows the grant). New
samples and process figures, which come every second for every device, are built off the
request path: a task on the event loop rebuilds the devices they changed, one at a time, and
lets the loop serve between them, and within a device between a few hundred of its processes
(a GPU with 5,000 processes is 50 steps); until it has, a body shows the figures before them.
A process list shown again before that (a process started) may show some processes' new
figures and others' before them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.core.leases import Hold, LeaseManager
from patroller.http.encoding import dumps
from patroller.http.processlist import Detail, ProcessList
from patroller.http.views import claim_static, topology_view
from patroller.observe.idle import IdleWatch
from patroller.observe.stats import StatsStore, iso_time

# Moved by the clock alone, as the claim shows them (the statistics' `stale` is another).
CLOCK_FIELDS = ("age", "expires", "processes_stale", "ends_at", "idle_for")
STALE_THEN_CLAIM = {True: b',"stale":true,"claim":', False: b',"stale":false,"claim":'}


@dataclass
class Part:
    """One device's entry, as data and as the JSON of each of its parts."""

    stats_version: int = -1  # StatsStore.sample_version when its statistics were built
    figures_version: int = -1  # StatsStore.figures_version when its processes were
    process_version: int = -1  # Hold.process_version when its processes were
    fingerprint: Any = None
    stats: dict[str, Any] = field(default_factory=dict)  # without `stale`
    claim: dict[str, Any] = field(default_factory=dict)  # without CLOCK_FIELDS, process_detail
    processes: ProcessList = field(default_factory=ProcessList)
    stats_json: bytes = b"{}"
    claim_json: bytes = b"{}"
    holder: Any = None  # the hold's holder and allocation when its processes were flagged


def fingerprint(hold: Hold, aside_for: str | None) -> tuple[Any, ...]:
    """Everything of a hold that its claim shows, except what moves with the clock: equal
    fingerprints, equal claims. Comparing two costs little (the same objects compare by
    identity; the processes by their version, not their thousands)."""
    return (
        hold.holder,
        hold.lost,
        hold.held_for,
        hold.until is None,
        hold.asked,
        hold.withheld,
        hold.health,
        hold.allocation,
        hold.process_version,
        aside_for,
    )


class StatusView:
    """The /status body (see the module)."""

    def __init__(
        self,
        inventory: Inventory,
        leases: LeaseManager,
        stats: StatsStore,
        idle: IdleWatch | None,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
        slice_: float = Config.loop_slice,
    ) -> None:
        self.inventory = inventory
        self.leases = leases
        self.stats = stats
        self.idle = idle
        self.clock = clock
        self.max_age = max_age
        self.slice = slice_  # seconds the background rebuild runs before it lets the loop serve
        self.builds = 0  # bodies put together
        self.parts_built = 0  # device parts serialized again
        self._parts: dict[str, Part] = {}
        self._body: bytes | None = None
        # What _body says, as data (hiding.py derives from it): made from _shown when asked
        self._data: dict[str, Any] | None = {}
        self._shown: list[tuple[Any, ...]] = []
        self._built = 0.0
        self._holds_changed = True  # check the fingerprints before the next body
        self._refreshing: asyncio.Task[None] | None = None
        # Each device's topology as shown, made once per reading of `topo -m` (or change of the
        # inventory: both invalidate), not at every sample: 255 links a device at 256 GPUs.
        self._topology: dict[str, dict[str, Any] | None] = {}
        leases.on_change(self._leases_changed)
        stats.on_change(self._stats_changed)

    @property
    def rows_built(self) -> int:
        """Processes' rows serialized in the process lists, all told (processlist.py)."""
        return sum(part.processes.rows_built for part in self._parts.values())

    # -- what changed --------------------------------------------------------------------------

    def invalidate(self, uuids: Iterable[str]) -> None:
        """The inventory changed: the parts of the devices `uuids` (added, lost, renumbered or
        updated) are built again, the others kept (a GPU falling off the bus at 256 GPUs and
        5,000 processes rebuilds one device's parts, not 256 devices' on the loop)."""
        for uuid in uuids:
            self._parts.pop(uuid, None)
        self._topology.clear()
        self._holds_changed = True
        self._body = None

    def _leases_changed(self) -> None:
        self._holds_changed = True
        self._body = None

    def _stats_changed(self) -> None:
        """A sample arrived (or a stale process list is fresh again): rebuild what it changed
        soon, off the request path; without a running loop (in-process tools), at the next
        body."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._body = None
            return
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh_soon())

    async def _refresh_soon(self) -> None:
        await asyncio.sleep(0)  # the rest of this interval's samples arrive meanwhile
        began = time.monotonic()
        for device in list(self.inventory):
            part = self._parts.get(device.uuid)
            if part is None:
                continue
            for _ in self._build_changed(device.uuid, part):  # a step: a few processes
                if time.monotonic() - began > self.slice:
                    await asyncio.sleep(0)
                    began = time.monotonic()
                    if self._parts.get(device.uuid) is not part:
                        break  # the device changed meanwhile: its parts are built anew
        self._body = None  # what changed (a list fresh again, at least) is shown at once

    # -- building ------------------------------------------------------------------------------

    def _update(self) -> None:
        """Build the parts that are missing, and the claims whose hold changed; and, without a
        loop to do it in the background, the statistics that changed."""
        check_holds, self._holds_changed = self._holds_changed, False
        background = self._refreshing is not None
        holds, aside = self.leases.holds, None
        for device in self.inventory:
            uuid = device.uuid
            part = self._parts.get(uuid)
            if part is None:
                part = self._parts[uuid] = Part()
                self._build_stats(uuid, part)
            elif not background:
                for _ in self._build_changed(uuid, part):
                    pass
            if check_holds or part.fingerprint is None:
                if aside is None:
                    aside = self._set_aside()
                hold = holds[uuid]
                found = fingerprint(hold, aside.get(uuid))
                if found != part.fingerprint:
                    part.fingerprint = found
                    claim = claim_static(hold)
                    claim["set_aside_for"] = aside.get(uuid)
                    part.claim, part.claim_json = claim, dumps(claim)
                    self.parts_built += 1
                    holder = (hold.holder, hold.allocation)
                    if part.process_version != hold.process_version or (
                        hold.processes and part.holder != holder
                    ):  # other processes, or their trespass flags for a new holder
                        self._build_detail(uuid, part)

    def _set_aside(self) -> dict[str, str | None]:
        """Who each free device set aside for a starving waiter is kept for."""
        waiter, set_aside = self.leases.set_aside()
        return {uuid: waiter.user.user if waiter is not None else None for uuid in set_aside}

    def _build_changed(self, uuid: str, part: Part) -> Iterator[None]:
        """Build again the statistics of a device with a new sample, and its processes if their
        figures changed, yielding between steps of a few processes."""
        if part.stats_version != self.stats.sample_version(uuid):
            self._build_stats(uuid, part)
            yield
        version = self.stats.figures_version(uuid)
        if part.figures_version != version:
            yield from self.stats.merging(uuid)
            hold = self.leases.holds[uuid]
            yield from part.processes.refigure(
                hold, lambda pid: self.stats.process_view(uuid, pid)
            )
            yield  # the list put together is a step of its own: a join of thousands of rows
            if self._parts.get(uuid) is part:
                self._build_detail(uuid, part, version)

    def _build_stats(self, uuid: str, part: Part) -> None:
        part.stats_version = self.stats.sample_version(uuid)
        stats = self.stats.view(uuid)
        del stats["stale"]
        if uuid not in self._topology:
            self._topology[uuid] = topology_view(self.leases, self.inventory, uuid)
        stats["topology"] = self._topology[uuid]
        part.stats, part.stats_json = stats, dumps(stats)
        self.parts_built += 1

    def _build_detail(self, uuid: str, part: Part, figures_version: int | None = None) -> None:
        """Put the device's process list together from its rows (processlist.py); with
        `figures_version`, the rows were all refigured when the store was at it."""
        if figures_version is not None:
            part.figures_version = figures_version
        elif part.figures_version == -1:  # the first list: every row is made with its figures
            part.figures_version = self.stats.figures_version(uuid)
        hold = self.leases.holds[uuid]
        part.process_version = hold.process_version
        part.holder = (hold.holder, hold.allocation)
        view = self.stats.process_view
        if part.processes.put_together(hold, lambda pid: view(uuid, pid)):
            self.parts_built += 1

    def _clock_fields(self, uuid: str, now: float, wall: float) -> dict[str, Any]:
        hold = self.leases.holds[uuid]
        expires = hold.expires(now)
        return {
            "age": round(now - hold.since, 3),
            "expires": expires,
            "processes_stale": self.stats.processes_stale(uuid),
            "ends_at": iso_time(wall + expires) if expires is not None else None,
            "idle_for": self.idle.idle_for(uuid) if self.idle is not None else None,
        }

    # -- reading -------------------------------------------------------------------------------

    def body(self) -> bytes:
        """/status as bytes: every lease change shown, the clock's fields at most `max_age`
        old, new figures as soon as the background has built them."""
        now = self.clock()
        if self._body is None or self._holds_changed or now - self._built >= self.max_age:
            self._update()
            self._assemble(self.leases.clock(), time.time())
            self._built = now
        assert self._body is not None
        return self._body

    def _assemble(self, now: float, wall: float) -> None:
        # The pieces are joined once: a device's processes (kilobytes at 5,000) are copied once.
        pieces: list[bytes] = []
        shown: list[tuple[str, dict[str, Any], bool, dict[str, Any], Detail, dict[str, Any]]] = []
        for device in self.inventory:
            uuid, part = device.uuid, self._parts[device.uuid]
            stale = self.stats.stale(uuid)
            timed = self._clock_fields(uuid, now, wall)
            pieces += (
                b"," if pieces else b"{",
                dumps(uuid),
                b":",
                part.stats_json[:-1],
                STALE_THEN_CLAIM[stale],
                part.claim_json[:-1],
                b',"process_detail":',
                part.processes.shown.json,
                b",",
                dumps(timed)[1:],
                b"}",
            )
            shown.append((uuid, part.stats, stale, part.claim, part.processes.shown, timed))
        pieces.append(b"}" if pieces else b"{}")
        self._body = b"".join(pieces)
        self._shown, self._data = shown, None
        self.builds += 1

    def data(self) -> dict[str, Any]:
        """/status as data, as the body says it now."""
        self.body()
        return self.latest()

    def latest(self) -> dict[str, Any]:
        """The data of the body `body()` last returned (never to be changed: it is shared).
        Made when first asked: most bodies are only sent."""
        if self._data is None:
            self._data = {
                uuid: {
                    **stats,
                    "stale": stale,
                    "claim": {**claim, "process_detail": detail.data(), **timed},
                }
                for uuid, stats, stale, claim, detail, timed in self._shown
            }
        return self._data
