"""How the GPUs are linked, from `nvidia-smi topo -m`: read at start and again after each change
of the inventory (GPUs renumbered, lost, added), through the supervisor's OneShotChild (killed
after `topology_timeout` s), parsed by nvsmi/topo.py, and bound to the devices by their
nvidia-smi index. Each reading sends `topology_read` with a core Topology.

A reading that fails (an old driver without `topo`, no permission, a hang, output that is not
a matrix, or a matrix whose GPUs are not the inventory's) gives an empty Topology that says
why: the lease rules then choose the lowest free numbers, as without a topology, and refuse a
request that insists on a link. It is logged once, until a reading works again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.core.topology import Topology
from patroller.observe.monitor import IDLE, UP, Monitor, MonitorMetrics
from patroller.observe.nvsmi.topo import TopoError, TopoMatrix, parse_topology
from patroller.observe.signals import Signals
from patroller.observe.supervisor import OneShotChild, problem

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TopologyMetrics(MonitorMetrics):
    """The topology watch: readings, those that failed, and whether the links are known."""

    readings: int = 0
    failures: int = 0
    known: bool = False


def bind(matrix: TopoMatrix, inventory: Inventory) -> Topology:
    """The matrix on the devices present, by index; an empty Topology saying why if its GPUs
    are not exactly the inventory's."""
    present = {d.number: d for d in inventory.present()}
    if sorted(matrix.gpus) != sorted(present):
        return Topology(
            why=f"`topo -m` lists GPUs {sorted(matrix.gpus)}, the inventory {sorted(present)}"
        )
    return Topology(
        {
            (present[a].uuid, present[b].uuid): word
            for (a, b), word in matrix.links.items()
            if a < b
        },
        {present[g].uuid: n for g, n in matrix.numa.items()},
        {present[g].uuid: c for g, c in matrix.cpus.items()},
    )


def topology_query(argv: list[str], env: Mapping[str, str] | None, config: Config) -> OneShotChild:
    """`nvidia-smi topo -m`, killed after `topology_timeout` s."""
    return OneShotChild([*argv, "topo", "-m"], env, config.topology_timeout, config)


async def read_topology(query: OneShotChild, inventory: Inventory) -> Topology:
    """One reading, bound to the inventory; an empty Topology that says why if it failed.
    Read, bound and prepared in a thread: at 256 GPUs that is some 0.4 s, never the loop's."""
    answer = await query.run()
    if answer.stopped:
        return Topology(why="stopped")
    shown = " ".join(query.argv)
    if answer.error is not None or answer.timed_out or answer.status:
        return Topology(why=f"`{shown}` failed, {problem(answer, query)}")
    return await asyncio.get_running_loop().run_in_executor(
        None, made, answer.output, inventory, shown
    )


def made(output: str, inventory: Inventory, shown: str) -> Topology:
    """The Topology `topo -m` printed, bound to the inventory and ready to choose with."""
    try:
        topology = bind(parse_topology(output), inventory)
    except TopoError as exc:
        return Topology(why=f"`{shown}` printed no matrix to read: {exc}")
    topology.prepare()
    return topology


class TopologyWatch(Monitor):
    """Reads `topo -m` at start and after every change of the inventory (see above)."""

    name = "topology"

    def __init__(
        self,
        inventory: Inventory,
        signals: Signals,
        argv: list[str],
        env: Mapping[str, str] | None,
        config: Config,
    ) -> None:
        self.inventory = inventory
        self.signals = signals
        self.query = topology_query(argv, env, config)
        self.topology = Topology(why="not read yet")
        self.readings = 0
        self.failures = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Future[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._wake.set()  # the first reading, at once
        self._task = asyncio.ensure_future(self._run())
        self.signals.inventory_changed.connect(self._on_inventory)

    def _on_inventory(self, sender: Any, record: Any) -> None:
        if self._wake is not None:
            self._wake.set()

    async def stop(self, grace: float) -> None:
        """Stop reading; a reading in progress is ended."""
        self._stopping = True
        self.signals.inventory_changed.disconnect(self._on_inventory)
        if self._wake is not None:
            self._wake.set()
        await self.query.stop(grace)
        if self._task is not None:
            await asyncio.wait([self._task])

    def metrics(self) -> TopologyMetrics:
        # Not known is no failure of the watch: old drivers have no `topo` (said by `known`).
        return TopologyMetrics(
            state=UP if self.query.running else IDLE,
            running=self.query.running,
            hangs=self.query.hangs,
            readings=self.readings,
            failures=self.failures,
            known=bool(self.topology),
        )

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            await self._wake.wait()
            if self._stopping:
                return
            self._wake.clear()
            await self.read()

    async def read(self) -> Topology:
        """One reading, sent as `topology_read`."""
        self.readings += 1
        topology = await read_topology(self.query, self.inventory)
        if self._stopping:
            return topology
        if not topology:
            self.failures += 1
            if self.topology or self.readings == 1:  # told once (patroller doctor says it too)
                (log.warning if self.topology else log.info)(
                    "how the GPUs are linked is not known (%s): they are granted lowest "
                    "numbers first, and a request for a link is refused",
                    topology.why,
                )
        elif not self.topology:
            log.info("GPU topology read: %d GPU(s)", len(topology.links))
        self.topology = topology
        self.signals.topology_read.send(self, record=topology)
        return topology
