"""What the daemon asks of every monitor: the dmon and pmon streams, the cross-check, the
inventory watch, and test mode's synthetic samples."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Dict

# How a monitor is doing, its metrics' `state`: working (its child runs, or it watches), idle by
# design (nothing to do now: the cross-check with no device to query, the inventory between
# readings), or failing (its child exited or hung and waits to restart, its last query failed).
UP, IDLE, FAILING = "up", "idle", "failing"
STATES = (UP, IDLE, FAILING)


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

    def reconfigure(self) -> None:
        """The host's devices changed (added, lost or renumbered). Nothing to do by default."""

    @abstractmethod
    def metrics(self) -> Dict[str, object]:
        """Counters for /metrics, under stable keys: `state` (one of STATES, always), `running`
        (its child runs now), `starts`, `hangs` (children killed for printing nothing, or for
        not answering in time), `skipped_lines`, and those of one monitor (`runs`,
        `failures`, `readings`, ...)."""
