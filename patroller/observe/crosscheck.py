"""The compute-apps cross-check: processes on devices where pmon cannot attribute any.

In MIG mode pmon gives no per-process attribution, and some GPUs and drivers print only `-`
rows while processes run: by pmon alone such a device looks free while people compute on it.
For those devices (the `candidates`, which the daemon works out: MIG-enabled devices, and
devices that dmon shows busy while pmon lists no process) this monitor runs
`nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name` and announces what it
lists as processes, with the same signals as pmon (process_started, process_ended, and
process_sampled with each process's used memory as `fb`). For devices pmon lists processes on
without any figure (`unmeasured`: 590-series drivers print `-` in every cell in MIG mode), it
gives the used memory alone: pmon announces those processes.

Why only for candidates, and slowly: a single nvidia-smi query has been measured at 7-15 s on
a large host (shared/NVIDIA-SMI.md, Cost), against a stream that costs nothing per sample. So
the query runs every `cross_check_every` seconds (10 by default) and only while some device is
a candidate or a process it announced is still listed; never two at once, never on the event
loop, and a run that takes longer than `cross_check_timeout` is killed.

The delay it adds: a process on a candidate device is announced, and reported gone, up to
`interval` plus the query's own time after the fact: about 10 s plus well under a second on
a small host, up to `interval + timeout` when the query is slow, and later still while it
fails (each failure costs another interval). A device that only just became a candidate
waits for the next tick as well.

A failing query (non-zero exit, nvidia-smi missing, killed for taking too long) is counted,
logged at most once a minute (`repeat_log_every`), and retried at the next tick; what was announced
stays
announced until a query that works no longer lists it: a driver hiccup is not every process
ending.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.core.throttle import Throttle
from patroller.durations import describe
from patroller.observe.monitor import FAILING, IDLE, UP, CrossCheckMetrics, Monitor
from patroller.observe.monitors import PmonMonitor
from patroller.observe.nvsmi.parsers import ComputeApp, parse_compute_apps
from patroller.observe.signals import GpuProcess, ProcessSamples, Signals, Value
from patroller.observe.supervisor import OneShotChild, problem

log = logging.getLogger(__name__)

QUERY = (
    "--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
    "--format=csv,noheader,nounits",
)
Key = tuple[str, int]  # (device uuid, pid)


class Listing(NamedTuple):
    """What one query listed, by device uuid, then pid (the last line of a pid counts): the
    processes, and their used memory as pmon's `fb` (MiB). Made off the loop."""

    apps: dict[str, dict[int, ComputeApp]]
    memory: dict[str, dict[int, dict[str, Value]]]


def listing(apps: list[ComputeApp]) -> Listing:
    """`apps` by device."""
    grouped: dict[str, dict[int, ComputeApp]] = {}
    memory: dict[str, dict[int, dict[str, Value]]] = {}
    for app in apps:
        grouped.setdefault(app.uuid, {})[app.pid] = app
        memory.setdefault(app.uuid, {})[app.pid] = {"fb": app.used_mib}
    return Listing(grouped, memory)


class CrossCheck(Monitor):
    """Announces the compute processes `--query-compute-apps` lists on candidate devices.

    `candidates()` is asked at every tick for the uuids of the devices pmon cannot attribute
    processes on now; it must be quick (it runs on the event loop).
    """

    name = "cross_check"

    def __init__(
        self,
        inventory: Inventory,
        signals: Signals,
        argv: list[str],
        env: Mapping[str, str],
        candidates: Callable[[], set[str]],
        config: Config,
        unmeasured: Callable[[], set[str]] = set,
    ) -> None:
        self.inventory = inventory
        self.signals = signals
        self.query = OneShotChild([*argv, *QUERY], dict(env), config.cross_check_timeout, config)
        self.shown = " ".join(self.query.argv)
        self.candidates = candidates
        self.unmeasured = unmeasured
        self.interval = config.cross_check_every
        self.runs = 0  # queries started
        self.failures = 0
        self.skipped = 0  # unreadable output lines
        self.announced_total = 0
        self.last_duration: float | None = None  # seconds the last query took
        self._announced: dict[Key, GpuProcess] = {}
        self._task: asyncio.Future[None] | None = None
        self._wake: asyncio.Event | None = None  # set by stop(): the tick ends
        self._stopping = False
        self._failing = 0  # failures since the last success
        self._failures_logged = Throttle(1, config.repeat_log_every)
        self._skips_logged = Throttle(1, config.repeat_log_every)
        self._skips_reported = 0

    def start(self) -> None:
        """Begin ticking on the running loop; the first query comes after one interval."""
        self._wake = asyncio.Event()  # made here: on Python 3.9 an Event binds to a loop
        self._task = asyncio.ensure_future(self._tick())

    async def stop(self, grace: float) -> None:
        """Stop ticking; a running query is terminated, and its group killed after `grace` s.

        The tick is told to end, never cancelled: on Python before 3.12 a cancellation that
        comes as the query it awaits ends is lost (asyncio.wait_for returns the result), and
        the tick would go on."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        await self.query.stop(grace)  # a query in progress ends; none starts after
        if self._task is not None:
            await asyncio.wait([self._task])

    def metrics(self) -> CrossCheckMetrics:
        return CrossCheckMetrics(
            state=FAILING if self._failing else UP if self.query.running else IDLE,
            running=self.query.running,
            hangs=self.query.hangs,
            skipped_lines=self.skipped,
            runs=self.runs,
            failures=self.failures,
            last_duration=self.last_duration,
            processes=len(self._announced),
            announced=self.announced_total,
        )

    async def _tick(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            if self._stopping:
                return
            try:
                if self._announced or self.candidates() or self.unmeasured():
                    await self._check()
            except Exception:  # a bug (here or in a receiver) must not end the timer
                log.exception("cross-check failed")

    async def _check(self) -> None:
        """One query, then the processes that came and went on the devices it watches."""
        self.runs += 1
        started = time.monotonic()
        answer = await self.query.run()
        self.last_duration = time.monotonic() - started
        if answer.stopped:
            return  # its output is incomplete
        if answer.error is not None or answer.timed_out or answer.status:
            self._failed(problem(answer, self.query))
            return
        if self._failing:
            log.info(
                "cross-check: `%s` answers again after %d failure(s)", self.shown, self._failing
            )
            self._failing = 0
        skipped: list[str] = []  # thousands of lines on a large host: read off the loop
        apps = await asyncio.get_running_loop().run_in_executor(
            None, lambda: listing(parse_compute_apps(answer.output, skipped))
        )
        self._count_skips(skipped)
        self._reconcile(apps)

    def _reconcile(self, listed_now: Listing) -> None:
        """Announce new processes on candidates; end announced ones no longer listed. Only the
        devices watched are looked through."""
        apps, wanted = listed_now.apps, self.candidates()
        listed: dict[Key, ComputeApp] = {}
        for uuid in wanted | {uuid for uuid, _ in self._announced}:
            watched = uuid in wanted and self.inventory.get(uuid) is not None
            for pid, app in apps.get(uuid, {}).items():
                if watched or (uuid, pid) in self._announced:
                    listed[(uuid, pid)] = app
        for key in [k for k in self._announced if k not in listed]:
            self.signals.process_ended.send(self, record=self._announced.pop(key))
        for key, app in listed.items():
            if key not in self._announced:
                record = GpuProcess(uuid=app.uuid, pid=app.pid, type="C", command=app.name)
                self._announced[key] = record
                self.announced_total += 1
                self.signals.process_started.send(self, record=record)
        # The used memory, under pmon's name for it (MiB), of the processes it announces and of
        # those pmon lists without figures.
        values: dict[str, dict[int, dict[str, Value]]] = {}
        for uuid, pid in listed:
            values.setdefault(uuid, {})[pid] = listed_now.memory[uuid][pid]
        for uuid in self.unmeasured():
            memory = listed_now.memory.get(uuid)
            if memory is not None and self.inventory.get(uuid) is not None:
                values.setdefault(uuid, {}).update(memory)
        if values:
            self.signals.process_sampled.send(self, record=ProcessSamples(values, time.time()))

    def _failed(self, problem: str) -> None:
        self.failures += 1
        self._failing += 1
        admitted, _ = self._failures_logged.admit()
        if admitted:
            log.warning(
                "cross-check: `%s` failed (%d time(s) in a row), %s; "
                "keeping the %d process(es) it announced, trying again every %s",
                self.shown,
                self._failing,
                problem,
                len(self._announced),
                describe(self.interval),
            )

    def _count_skips(self, skipped: list[str]) -> None:
        self.skipped += len(skipped)
        if self.skipped > self._skips_reported and self._skips_logged.admit()[0]:
            log.warning(
                "cross-check: %d unreadable line(s) skipped, the last: %r",
                self.skipped - self._skips_reported,
                skipped[-1][:200] if skipped else "",
            )
            self._skips_reported = self.skipped


class Unattributed:
    """The devices whose processes pmon cannot name now: MIG-enabled ones (pmon gives no
    per-process rows in MIG mode), and "blind" ones: busy (SM use, or at least `busy_mib` of
    memory used, by `figures`, the latest statistics) while pmon lists no process on them. A
    blind device stays one until pmon lists a process on it. The cross-check queries the
    processes of these devices."""

    def __init__(
        self,
        inventory: Inventory,
        figures: Callable[[str], Mapping[str, Any]],
        pmon: PmonMonitor,
        busy_mib: int,
    ) -> None:
        self.inventory = inventory
        self.figures = figures
        self.pmon = pmon
        self.busy_mib = busy_mib
        self.blind: set[str] = set()

    def __call__(self) -> set[str]:
        seen = self.pmon.attributed()
        found = set()
        for device in self.inventory.present():
            if device.uuid in seen:
                self.blind.discard(device.uuid)
            elif device.mig:
                found.add(device.uuid)
            elif device.uuid in self.blind or self.busy(device.uuid):
                self.blind.add(device.uuid)
                found.add(device.uuid)
        return found

    def busy(self, uuid: str) -> bool:
        """Whether the statistics show a device in use: SM busy, or memory used."""
        view = self.figures(uuid)
        sm, used = view.get("sm"), view.get("fb")
        return (isinstance(sm, (int, float)) and sm > 0) or (
            isinstance(used, (int, float)) and used >= self.busy_mib
        )
