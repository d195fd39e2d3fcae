"""A scrape's walk of the daemon's state shares the loop: once it has held the loop for its
slice (Config.loop_slice), what is ready is served before its next group of families, so that
/metrics at thousands of series never holds /status for the whole walk."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from helpers import async_test, running

from patroller.core.identity import Identity
from patroller.http import metrics
from patroller.http.access import Requests
from patroller.http.metrics import DaemonCollector, Registries
from patroller.observe.signals import ProcessSamples


async def _order(monkeypatch, slice_: float) -> list[str]:
    """What ran first: work made ready as the scrape began, or the walk's last group."""
    order: list[str] = []
    notification_families = metrics.notification_families

    def last_group(notifier):
        order.append("the last group")
        return notification_families(notifier)

    monkeypatch.setattr(metrics, "notification_families", last_group)
    async with running(test_devices=4) as h:
        registries = Registries(h.services, Requests(), None, slice_)
        asyncio.get_running_loop().call_soon(order.append, "other work")
        body, _ = await registries.exposition(None)
    assert b"patroller_gpu_utilization_ratio{" in body  # the whole scrape, all the same
    assert b"# TYPE patroller_user_gpus_held gauge" in body
    return order


@async_test
async def test_a_walk_past_its_slice_lets_ready_work_run_before_its_next_group(monkeypatch):
    assert await _order(monkeypatch, 0.0) == ["other work", "the last group"]


@async_test
async def test_a_walk_within_its_slice_holds_the_loop_to_its_end(monkeypatch):
    assert await _order(monkeypatch, 60.0) == ["the last group", "other work"]


@async_test
async def test_a_gpu_found_between_two_groups_of_a_walk_waits_for_the_next_scrape():
    async with running(test_devices=2) as h:
        inventory = h.services.inventory
        parts = DaemonCollector(h.services, Requests()).parts()
        before = list(iter(lambda: next(parts), None))  # the first group: the GPUs'
        first = next(iter(inventory))
        found = replace(first, uuid="GPU-found-meanwhile", number=7)
        change = inventory.update([*inventory, found])  # as a new discovery tells the daemon
        h.services.signals.inventory_changed.send(None, record=change)
        after = [family for family in parts if family is not None]
        gpus = {s.labels["gpu"] for f in before for s in f.samples if "gpu" in s.labels}
        assert gpus == {"0", "1"}
        names = {f.name for f in after}
        assert "patroller_process_gpu_memory_bytes" in names  # the walk went on to its end
        assert "patroller_user_gpus_held" in names


@async_test
async def test_the_walk_pauses_within_the_gpus_and_the_processes_and_leaves_none_out():
    async with running(test_devices=40) as h:
        devices = list(h.services.inventory)
        owner = Identity(user="ann@lab.example", source="host", account="ann", uid=2000)
        figures: dict[str, dict[int, dict[str, int]]] = {}
        for n in range(250):
            uuid = devices[n % 40].uuid
            h.services.leases.process_started(uuid, 100_000 + n, owner, "python")
            figures.setdefault(uuid, {})[100_000 + n] = {"sm": 50, "fb": 900}
        h.services.signals.process_sampled.send(None, record=ProcessSamples(figures, time.time()))
        parts = list(DaemonCollector(h.services, Requests()).parts())
    names = [part.name if part is not None else None for part in parts]
    first_gpu = names.index("patroller_gpu_utilization_ratio")
    memory = names.index("patroller_process_gpu_memory_bytes")
    last_gpu = names.index("patroller_gpu_idle_seconds")
    assert names[:first_gpu] == [None, None]  # after 16 and 32 of the 40 GPUs
    assert names[last_gpu + 1 : memory] == [None, None, None]  # the group's end; 100, 200
    assert len(parts[first_gpu].samples) == 40
    assert len(parts[memory].samples) == 250
