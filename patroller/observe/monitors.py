"""The dmon and pmon monitors: supervised nvidia-smi streams turned into the daemon's signals.

dmon is asked for the column groups Patroller reports (`-s pucvmt`: power and temperatures,
utilisation, clocks, violations, memory, PCIe throughput), pmon for utilisation and memory per
process (`-s um`). Where a driver or GPU refuses a group (it prints `Failed to process command
line` or `Not supported on the device(s)` and exits before any row), the monitor asks for fewer
(`-s pucm`, then the tool's default) and says so once.

A stream that ends saying a device is gone (`GPU is lost`, `Unable to determine the device
handle`) calls `on_lost`: the daemon reads the inventory again. `reconfigure()` restarts a
stream over the inventory as it is now (devices added, lost or renumbered).
"""

from __future__ import annotations

import logging
import re
import time
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, TypeVar

from tornado.ioloop import IOLoop

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.core.throttle import Throttle
from patroller.observe.monitor import FAILING, UP, DmonMetrics, Monitor, PmonMetrics, StreamMetrics
from patroller.observe.nvsmi.intervals import IntervalChange, PmonIntervals
from patroller.observe.nvsmi.parsers import DmonParser, DmonRow, PmonParser, PmonRow
from patroller.observe.signals import (
    NOTHING,
    GpuProcess,
    ProcessList,
    ProcessSamples,
    Sample,
    Signals,
)
from patroller.observe.supervisor import RestartingChild

log = logging.getLogger(__name__)
S = TypeVar("S", bound=StreamMetrics)  # the metrics of one kind of stream

DMON_SELECTS = ("pucvmt", "pucm", "")  # column groups asked of dmon, most first; "": the default
PMON_SELECTS = ("um", "")
REFUSED = re.compile(
    r"Failed to process command line|Not supported on the device|"
    r"Invalid combination of input arguments",
    re.I,
)
DEVICE_GONE = re.compile(
    r"GPU is lost|Unable to determine the device handle|"
    r"No devices were found",
    re.I,
)


def stream_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment for dmon/pmon: all devices, not the default four."""
    return {**base, "NVSMI_SHOW_ALL_DEVICES": "1"}


def all_devices(inventory: Inventory) -> list[str]:
    """`-i` with every index, so that no device is silently left out."""
    return ["-i", ",".join(str(d.number) for d in inventory.present())]


class StreamMonitor(Monitor):
    """What the dmon and pmon monitors share: their child, restarted for as long as the daemon
    runs; the argv over the inventory; the column groups asked for, fewer when they are
    refused; telling the daemon when a device is gone; reporting unreadable lines now and then.
    """

    selects: tuple[str, ...] = ("",)

    def __init__(
        self,
        inventory: Inventory,
        signals: Signals,
        nvidia_smi: list[str],
        env: Mapping[str, str],
        config: Config,
        parser: Any,
    ) -> None:
        self.inventory = inventory
        self.signals = signals
        self.nvidia_smi = nvidia_smi
        self.parser = parser
        self.rows = 0  # data rows read in the current run
        self._select = 0
        self._ignoring = False  # lines of a child being replaced (a stale device mapping)
        self._skips_reported = 0
        self._skips_logged = Throttle(1, config.repeat_log_every)
        self.child = RestartingChild(
            self.name,
            self.argv(),
            self._line,
            config,
            env=stream_env(env),
            on_start=self._restarted,
            on_exit=self._exited,
        )

    def argv(self) -> list[str]:
        select = self.selects[self._select]
        return [
            *self.nvidia_smi,
            self.name,
            *(["-s", select] if select else []),
            *all_devices(self.inventory),
        ]

    @property
    def select(self) -> str:
        """The column groups asked for now ("" for the tool's default)."""
        return self.selects[self._select]

    def start(self) -> None:
        self.child.start()

    async def stop(self, grace: float) -> None:
        await self.child.stop(grace)

    def metrics(self) -> StreamMetrics:
        return self._metrics(StreamMetrics)

    def _metrics(self, kind: type[S], **own: Any) -> S:
        """The stream's figures as a `kind`, with the figures of its own kind (`own`)."""
        child = self.child
        return kind(
            state=UP if child.running else FAILING,
            running=child.running,
            starts=child.starts,
            hangs=child.hangs,
            last_exit=child.last_exit,
            skipped_lines=self.parser.skipped,
            **own,
        )

    def reconfigure(self) -> None:
        """The inventory changed: run again over the devices it has now."""
        self._ignoring = True
        self.child.argv = self.argv()
        self.child.restart()

    def _line(self, line: str) -> None:
        """One line of the child's output: a row for `_row`, or a header, or skipped."""
        if self._ignoring:
            return
        row = self.parser.feed(line)
        if row is None:
            self._skipped()
            return
        self.rows += 1
        self._row(row)

    @abstractmethod
    def _row(self, row: Any) -> None:
        """One data row of the stream."""

    def _restarted(self) -> None:
        self.rows = 0
        self._ignoring = False
        self.parser.reset()

    def _exited(self, status: int, said: str) -> None:
        if self.rows == 0 and REFUSED.search(said) and self._select + 1 < len(self.selects):
            self._select += 1
            log.warning(
                "%s: the driver refused the column groups asked for (%s); asking for %s",
                self.name,
                said[:200],
                f"-s {self.select}" if self.select else "its default columns",
            )
            self.child.argv = self.argv()
        if DEVICE_GONE.search(said):
            self.signals.device_gone.send(self, record=said)

    def _skipped(self) -> None:
        """A line could not be read: say so now and then, never per line."""
        parser = self.parser
        if parser.skipped > self._skips_reported and self._skips_logged.admit()[0]:
            log.warning(
                "%s: %d unreadable line(s) skipped, the last: %r",
                self.name,
                parser.skipped - self._skips_reported,
                (parser.last_skipped or "")[:200],
            )
            self._skips_reported = parser.skipped


class DmonMonitor(StreamMonitor):
    """Statistics of every device from `nvidia-smi dmon`, as `sample` signals."""

    name = "dmon"
    selects = DMON_SELECTS

    def __init__(
        self,
        inventory: Inventory,
        signals: Signals,
        nvidia_smi: list[str],
        env: Mapping[str, str],
        config: Config,
    ) -> None:
        super().__init__(inventory, signals, nvidia_smi, env, config, DmonParser())

    def metrics(self) -> DmonMetrics:
        return self._metrics(DmonMetrics, columns=self.select or "default")

    def _row(self, row: DmonRow) -> None:
        device = self.inventory.by_number(row.gpu)
        if device is not None:
            record = Sample(uuid=device.uuid, values=dict(row.values), time=time.time())
            self.signals.sample.send(self, record=record)


class PmonMonitor(StreamMonitor):
    """Processes on every device from `nvidia-smi pmon`, as process_started/ended signals.

    A process is announced on its first row. It is reported gone when a complete interval
    lacks it; an interval completes when the next one begins or, sooner, when the stream falls
    quiet after the last device's rows (every device prints at least one row an interval).
    Each completed interval is announced as `processes_listed` for the devices it covered: how
    a reader of /status knows the process lists are current.
    """

    name = "pmon"
    selects = PMON_SELECTS

    def __init__(
        self,
        inventory: Inventory,
        signals: Signals,
        nvidia_smi: list[str],
        env: Mapping[str, str],
        config: Config,
    ) -> None:
        super().__init__(inventory, signals, nvidia_smi, env, config, PmonParser())
        self.intervals = PmonIntervals()
        self.burst_gap = config.burst_gap
        self._last_number = max((d.number for d in inventory.present()), default=0)
        # By uuid, then pid: a device renumbered when another falls off keeps its processes.
        self._announced: dict[str, dict[int, GpuProcess]] = {}
        self._covered: set[int] = set()  # devices with a row in the current interval
        # This interval's figures, by uuid, then pid: of announced processes only
        self._values: dict[str, dict[int, Mapping[str, Any]]] = {}
        self._figured: set[str] = set()  # the devices with a figure in this interval's rows
        self._figureless: set[str] = set()  # devices whose rows carried no figure, last interval
        self._timer: object | None = None

    async def stop(self, grace: float) -> None:
        self._disarm()
        await super().stop(grace)

    def metrics(self) -> PmonMetrics:
        return self._metrics(
            PmonMetrics, processes=sum(len(on) for on in self._announced.values())
        )

    def reconfigure(self) -> None:
        self._last_number = max((d.number for d in self.inventory.present()), default=0)
        super().reconfigure()

    def attributed(self) -> set[str]:
        """The devices pmon lists a process on."""
        return set(self._announced)

    def figureless(self) -> set[str]:
        """The devices pmon lists processes on without a figure for any (`-` in every cell, as
        590-series drivers print in MIG mode), in the last complete interval."""
        return set(self._figureless)

    def _restarted(self) -> None:
        # Keep what was known: a restart is not every process ending and starting again.
        super()._restarted()
        self.intervals.reset()
        self._covered.clear()
        self._values.clear()
        self._figured.clear()

    def _row(self, row: PmonRow) -> None:
        change = self.intervals.feed(row)
        if change is not None:
            self._interval_completed(change)
        self._covered.add(row.gpu)
        if row.pid is not None:
            self._announce(row)
        self._arm(row.gpu)

    def _announce(self, row: PmonRow) -> None:
        if row.pid is None:
            return
        device = self.inventory.by_number(row.gpu)
        if device is None:
            return
        uuid = device.uuid
        values = self._values.get(uuid)
        if values is None:
            values = self._values[uuid] = {}
        values[row.pid] = row.values
        if uuid not in self._figured and not NOTHING.issuperset(row.values.values()):
            self._figured.add(uuid)
        on = self._announced.get(uuid)
        if on is None:
            on = self._announced[uuid] = {}
        elif row.pid in on:
            return
        record = GpuProcess(uuid=uuid, pid=row.pid, type=row.type, command=row.command)
        on[row.pid] = record
        self.signals.process_started.send(self, record=record)

    def _interval_completed(self, change: IntervalChange) -> None:
        """After a complete interval: whatever was announced and is not in it has gone.

        Thousands of processes an interval on a large host, and this runs on the event loop:
        it costs a few set operations per device (the rows were counted as they came), and
        a pass over a device's processes only when one of them has gone."""
        values, self._values = self._values, {}
        figured, self._figured = self._figured, set()
        for uuid in [u for u, on in self._announced.items() if len(on) != len(values.get(u, ()))]:
            on, listed = self._announced[uuid], values.get(uuid, {})  # listed: some of on
            for pid in [p for p in on if p not in listed]:
                self.signals.process_ended.send(self, record=on.pop(pid))
            if not on:
                del self._announced[uuid]
        covered = [self.inventory.by_number(gpu) for gpu in sorted(self._covered)]
        self._covered = set()
        now = time.time()
        self._figureless = values.keys() - figured
        if values:
            self.signals.process_sampled.send(self, record=ProcessSamples(values, now, figured))
        uuids = tuple(d.uuid for d in covered if d is not None)
        if uuids:
            self.signals.processes_listed.send(self, record=ProcessList(uuids, now))

    def _arm(self, gpu: int) -> None:
        self._disarm()
        # Rows after the last device's first row can only be more of that device's: a short
        # quiet ends the interval. Before that, a quiet stream is a stall, not an absence.
        if gpu >= self._last_number:
            self._timer = IOLoop.current().call_later(self.burst_gap, self._quiet)

    def _disarm(self) -> None:
        if self._timer is not None:
            IOLoop.current().remove_timeout(self._timer)
            self._timer = None

    def _quiet(self) -> None:
        self._timer = None
        change = self.intervals.end_interval()
        if change is not None:
            self._interval_completed(change)
