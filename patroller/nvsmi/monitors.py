"""The dmon and pmon monitors: supervised nvidia-smi streams turned into the daemon's signals."""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from tornado.ioloop import IOLoop

from ..devices import Inventory
from ..signals import GpuProcess, ProcessList, Sample, Signals
from .child import Backoff, ChildStream
from .parsers import DmonParser, IntervalChange, PmonParser, PmonIntervals, PmonRow

log = logging.getLogger(__name__)

INTERVAL = 1.0  # nvidia-smi's default sampling interval, which Patroller uses
SKIP_LOG_EVERY = 60.0  # seconds between reports of unreadable lines
BURST_GAP = 0.03  # quiet after the last device's row that ends a pmon interval


def stream_env(base: Mapping[str, str]) -> Dict[str, str]:
    """The environment for dmon/pmon: all devices, not the default four."""
    return {**base, "NVSMI_SHOW_ALL_DEVICES": "1"}


def all_devices(inventory: Inventory) -> List[str]:
    """`-i` with every index, so that no device is silently left out."""
    return ["-i", ",".join(str(d.number) for d in inventory)]


class _SkipReport:
    """Logs unreadable lines now and then, never per line."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._reported = 0
        self._at = 0.0

    def check(self, parser: Any) -> None:
        now = time.monotonic()
        if parser.skipped > self._reported and now - self._at >= SKIP_LOG_EVERY:
            log.warning("%s: %d unreadable line(s) skipped, the last: %r", self.name,
                        parser.skipped - self._reported, (parser.last_skipped or "")[:200])
            self._reported, self._at = parser.skipped, now


class DmonMonitor:
    """Statistics of every device from `nvidia-smi dmon`, as `sample` signals.

    `silence` and `startup` are the ChildStream's: how long the stream may print nothing.
    """

    def __init__(self, inventory: Inventory, signals: Signals, nvidia_smi: List[str],
                 env: Mapping[str, str], backoff: Optional[Backoff] = None,
                 silence: Optional[float] = None, startup: Optional[float] = None) -> None:
        self.inventory = inventory
        self.signals = signals
        self.parser = DmonParser()
        self._skips = _SkipReport("dmon")
        argv = [*nvidia_smi, "dmon", *all_devices(inventory)]
        self.child = ChildStream("dmon", argv, self._line, on_start=self.parser.reset,
                                 env=stream_env(env), backoff=backoff, silence=silence,
                                 startup=startup)

    def start(self) -> None:
        self.child.start()

    async def stop(self, grace: float = 0.5) -> None:
        """Stop the stream, killing it after `grace` s; no child is left behind."""
        await self.child.stop(grace)

    def metrics(self) -> Dict[str, object]:
        """Counters for /metrics."""
        return {**self.child.metrics(), "skipped_lines": self.parser.skipped}

    def _line(self, line: str) -> None:
        row = self.parser.feed(line)
        if row is None:
            self._skips.check(self.parser)
            return
        device = self.inventory.by_number(row.gpu)
        if device is not None:
            record = Sample(uuid=device.uuid, values=dict(row.values), time=time.time())
            self.signals.sample.send(self, record=record)


class PmonMonitor:
    """Processes on every device from `nvidia-smi pmon`, as process_started/ended signals.

    A process is announced on its first row. It is reported gone when a complete interval
    lacks it; an interval completes when the next one begins or, sooner, when the stream falls
    quiet after the last device's rows (every device prints at least one row an interval).
    Each completed interval is announced as `processes_listed` for the devices it covered: how
    a reader of /status knows the process lists are current.
    """

    def __init__(self, inventory: Inventory, signals: Signals, nvidia_smi: List[str],
                 env: Mapping[str, str], backoff: Optional[Backoff] = None,
                 silence: Optional[float] = None, startup: Optional[float] = None) -> None:
        self.inventory = inventory
        self.signals = signals
        self.parser = PmonParser()
        self.intervals = PmonIntervals()
        self._skips = _SkipReport("pmon")
        self._last_number = max((d.number for d in inventory), default=0)
        self._announced: Dict[Tuple[int, int], GpuProcess] = {}
        self._covered: Set[int] = set()  # devices with a row in the current interval
        self._timer: Optional[object] = None
        argv = [*nvidia_smi, "pmon", *all_devices(inventory)]
        self.child = ChildStream("pmon", argv, self._line, on_start=self._restarted,
                                 env=stream_env(env), backoff=backoff, silence=silence,
                                 startup=startup)

    def start(self) -> None:
        self.child.start()

    async def stop(self, grace: float = 0.5) -> None:
        """Stop the stream, killing it after `grace` s; no child is left behind."""
        self._disarm()
        await self.child.stop(grace)

    def metrics(self) -> Dict[str, object]:
        """Counters for /metrics."""
        return {**self.child.metrics(), "skipped_lines": self.parser.skipped,
                "processes": len(self._announced)}

    def _restarted(self) -> None:
        # Keep what was known: a restart is not every process ending and starting again.
        self.parser.reset()
        self.intervals.reset()
        self._covered.clear()

    def _line(self, line: str) -> None:
        row = self.parser.feed(line)
        if row is None:
            self._skips.check(self.parser)
            return
        change = self.intervals.feed(row)
        if change is not None:
            self._settle(change)
        self._covered.add(row.gpu)
        if row.pid is not None:
            self._announce(row)
        self._arm(row.gpu)

    def _announce(self, row: PmonRow) -> None:
        if row.pid is None:
            return
        key = (row.gpu, row.pid)
        device = self.inventory.by_number(row.gpu)
        if key in self._announced or device is None:
            return
        record = GpuProcess(uuid=device.uuid, pid=row.pid, type=row.type, command=row.command)
        self._announced[key] = record
        self.signals.process_started.send(self, record=record)

    def _settle(self, change: IntervalChange) -> None:
        """After a complete interval: whatever was announced and is not in it has gone."""
        present = {(p.gpu, p.pid) for p in change.present}
        for key in [k for k in self._announced if k not in present]:
            self.signals.process_ended.send(self, record=self._announced.pop(key))
        covered = [self.inventory.by_number(gpu) for gpu in sorted(self._covered)]
        self._covered = set()
        uuids = tuple(d.uuid for d in covered if d is not None)
        if uuids:
            self.signals.processes_listed.send(self, record=ProcessList(uuids, time.time()))

    def _arm(self, gpu: int) -> None:
        self._disarm()
        # Rows after the last device's first row can only be more of that device's: a short
        # quiet ends the interval. Before that, a quiet stream is a stall, not an absence.
        if gpu >= self._last_number:
            self._timer = IOLoop.current().call_later(BURST_GAP, self._quiet)

    def _disarm(self) -> None:
        if self._timer is not None:
            IOLoop.current().remove_timeout(self._timer)
            self._timer = None

    def _quiet(self) -> None:
        self._timer = None
        change = self.intervals.end_interval()
        if change is not None:
            self._settle(change)
