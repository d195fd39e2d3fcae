"""What choosing the best-connected GPUs costs (core/topology.py), measured in-process: the
choice among every free GPU of 16 (8 asked for: 12,870 sets, past the exact bound, so the
greedy search) and of 64 (4 asked for: 635,376 sets), through the lease manager's own chooser
(the tie-breaks read the holds), on the simulator's shapes; and grants per second (a request
for 2 and its release) on 8 GPUs with the topology and without. Times are the thread's CPU
time, so that a shared machine's other work does not count.
"""

from __future__ import annotations

import random
import time
from typing import Any

from patroller.config import Config, policy_of
from patroller.core.identity import Identity
from patroller.core.leases import LeaseManager
from patroller.core.topology import Search, Topology
from patroller.observe.testmode import synthetic_inventory
from patroller.simulator.topo import shape

from .statusbuild import timed

CASES = [
    (16, 8, "pcie-pairs"),
    (16, 8, "nvlink-pairs"),
    (64, 4, "pcie-pairs"),
    (64, 4, "nvlink-pairs"),
    (64, 4, "two-numa"),
]


def manager(gpus: int, name: str, known: bool = True) -> LeaseManager:
    config = Config()
    inventory = synthetic_inventory(gpus)
    leases = LeaseManager(
        inventory,
        lease=config.lease,
        policy=policy_of(config),
        max_waiters=config.max_waiters,
        max_waiting_per_user=config.max_waiting_per_user,
    )
    leases.search = Search(config.topology_exact, config.topology_seeds, config.topology_near)
    if known:
        matrix, uuids = shape(name, gpus), [d.uuid for d in inventory]
        leases.topology = Topology(
            {(uuids[a], uuids[b]): matrix[a][b] for a in range(gpus) for b in range(a + 1, gpus)},
            {u: "0" if i < gpus // 2 else "1" for i, u in enumerate(uuids)},
        )
    return leases


def choice(gpus: int, count: int, name: str, repeats: int) -> dict[str, Any]:
    """The choice among all free GPUs, and among a random half of them."""
    leases = manager(gpus, name)
    user = Identity(user="bench", source="host", account="bench", uid=1000)
    choose = leases.chooser(user)
    every = leases.inventory.present()
    choose(every, count)  # the topology's kinds and orders, made once per reading
    rng = random.Random(1)
    halves = [sorted(rng.sample(every, gpus // 2), key=lambda d: d.number) for _ in range(repeats)]
    left = iter(halves)
    return {
        "gpus": gpus,
        "count": count,
        "shape": name,
        "all_free_ms": timed(lambda: choose(every, count), repeats, 3),
        "half_free_ms": timed(lambda: choose(next(left), count), repeats, 3),
    }


def grants(known: bool, repeats: int) -> float:
    """Requests for 2 of 8 GPUs (nvlink-pairs), each released at once: grants per second."""
    leases = manager(8, "nvlink-pairs", known)
    user = Identity(user="bench", source="host", account="bench", uid=1000)
    began = time.thread_time()
    for _ in range(repeats):
        leases.request(user, {"gpu": 2})
        leases.release(user)
    return round(repeats / (time.thread_time() - began))


def topology(ctx: Any) -> dict[str, Any]:
    repeats = 20 if ctx.quick else 200
    rows = [choice(gpus, count, name, repeats) for gpus, count, name in CASES]
    return {
        "choices": rows,
        "grants_per_s": {
            "with": grants(True, repeats * 10),
            "without": grants(False, repeats * 10),
        },
    }
