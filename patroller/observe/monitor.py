"""What the daemon asks of every monitor: the dmon and pmon streams, the cross-check, the
inventory watch, the silence watch, the allocation watches, and test mode's synthetic samples.

Each monitor's `metrics()` is a typed object, one class per kind of monitor: /metrics finds the
cross-check's, the inventory's and the silence watch's figures by their type, not by the
monitor's name, so a monitor renamed keeps its series; `to_json()` is what /metrics.json shows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import ClassVar, TypeVar

# How a monitor is doing, its metrics' `state`: working (its child runs, or it watches), idle by
# design (nothing to do now: the cross-check with no device to query, the inventory between
# readings), or failing (its child exited or hung and waits to restart, its last query failed).
UP, IDLE, FAILING = "up", "idle", "failing"
STATES = (UP, IDLE, FAILING)


@dataclass(frozen=True, kw_only=True)
class MonitorMetrics:
    """What every monitor says of itself: `state` (one of STATES); and, for a monitor with a
    child, `running` (its child runs now), `starts`, `hangs` (children killed for printing
    nothing, or for not answering in time), `skipped_lines` (unreadable lines). A figure a
    monitor does not have is None and left out of `to_json()`."""

    state: str
    running: bool | None = None
    starts: int | None = None
    hangs: int | None = None
    skipped_lines: int | None = None

    def to_json(self) -> dict[str, object]:
        """The figures for /metrics.json: the common ones the monitor has, and all its own."""
        common = {f.name for f in fields(MonitorMetrics)}
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in common or getattr(self, f.name) is not None
        }


@dataclass(frozen=True, kw_only=True)
class StreamMetrics(MonitorMetrics):
    """A dmon or pmon stream: how its last child ended (None before any exit)."""

    last_exit: int | None = None


@dataclass(frozen=True, kw_only=True)
class DmonMetrics(StreamMetrics):
    """The dmon stream: the column groups asked for (`default` for the tool's own)."""

    columns: str = "default"


@dataclass(frozen=True, kw_only=True)
class PmonMetrics(StreamMetrics):
    """The pmon stream: the processes it lists now."""

    processes: int = 0


@dataclass(frozen=True, kw_only=True)
class CrossCheckMetrics(MonitorMetrics):
    """The compute-apps cross-check: queries run and failed, the last one's duration (s), the
    processes it lists now and how many it announced in all."""

    runs: int = 0
    failures: int = 0
    last_duration: float | None = None
    processes: int = 0
    announced: int = 0


@dataclass(frozen=True, kw_only=True)
class InventoryMetrics(MonitorMetrics):
    """The inventory watch: readings after the first, failed ones, those that found a change,
    the devices lost now, and failed listings of MIG devices."""

    readings: int = 0
    failures: int = 0
    changes: int = 0
    lost: int = 0
    mig_list_failures: int = 0


@dataclass(frozen=True, kw_only=True)
class SilenceMetrics(MonitorMetrics):
    """The silence watch: the devices silent now, and how many times one fell silent."""

    silent: int = 0
    silences: int = 0


@dataclass(frozen=True, kw_only=True)
class AllocationMetrics(MonitorMetrics):
    """A watch of a scheduler's allocations: readings, failed ones, devices allocated now."""

    readings: int = 0
    failures: int = 0
    allocated: int = 0


@dataclass(frozen=True, kw_only=True)
class KernelLogMetrics(MonitorMetrics):
    """The kernel log's follower: lines read, Xid lines found, opens and reads that failed."""

    lines: int = 0
    xids: int = 0
    failures: int = 0


@dataclass(frozen=True, kw_only=True)
class SyntheticMetrics(MonitorMetrics):
    """Test mode's synthetic monitor: the samples it made up."""

    samples: int = 0


M = TypeVar("M", bound=MonitorMetrics)


def first(found: Iterable[MonitorMetrics], kind: type[M]) -> M | None:
    """The first of `found` that is a `kind`, whatever its monitor is named; None if none."""
    return next((each for each in found if isinstance(each, kind)), None)


class Monitor(ABC):
    """Something that emits the daemon's signals while it runs.

    `name` is stable: /metrics uses it as the value of the `monitor` label (`dmon`, `pmon`,
    `cross_check`, `inventory`, `silence`, `synthetic`), and so do the log lines about stopping
    it.
    """

    name: ClassVar[str]

    @abstractmethod
    def start(self) -> None:
        """Begin, on the running event loop."""

    @abstractmethod
    async def stop(self, grace: float) -> None:
        """Stop, ending its child (its group killed after `grace` s): nothing is left running."""

    def reconfigure(self) -> None:  # noqa: B027 (a hook with a default: not abstract)
        """The host's devices changed (added, lost or renumbered). Nothing to do by default."""

    @abstractmethod
    def metrics(self) -> MonitorMetrics:
        """Its figures for /metrics: a MonitorMetrics of the monitor's own kind (above)."""
