"""The cycle collector on the daemon's schedule (patroller/heap.py): what the daemon holds is
frozen after it starts, so the collector's full passes do not walk it; it is thawed, collected
and frozen again every Config.gc_refreeze_every seconds, so garbage among it is still freed.
And the interpreter's switch interval the daemon sets while it runs."""

import asyncio
import gc
import sys
import weakref

import pytest
from helpers import async_test, running

from patroller.heap import Heap


class Node:
    """An object in a reference cycle: only the cycle collector frees it."""

    def __init__(self) -> None:
        self.me = self


@async_test
async def test_the_heap_is_frozen_at_start_and_thawed_at_stop():
    heap = Heap(every=600)
    try:
        heap.start()
        assert gc.get_freeze_count() > 1000  # this process's modules, at least
        assert heap.refreezes == 1 and heap.last_pause is not None
    finally:
        heap.stop()
    assert gc.get_freeze_count() == 0


@async_test
async def test_garbage_among_frozen_objects_is_freed_at_the_next_refreeze():
    freed = asyncio.Event()
    node = Node()
    weakref.finalize(node, freed.set)
    heap = Heap(every=0.2)
    try:
        heap.start()
        del node  # garbage now, but frozen: no collection frees it until the refreeze
        gc.collect()
        assert not freed.is_set()
        await asyncio.wait_for(freed.wait(), 10)
        assert heap.refreezes >= 2
        assert gc.get_freeze_count() > 1000  # frozen again after the collection
    finally:
        heap.stop()


@async_test
async def test_what_survives_a_full_collection_is_frozen_too():
    heap = Heap(every=600)
    try:
        heap.start()
        frozen = gc.get_freeze_count()
        kept = [Node() for _ in range(5000)]  # made after the start: not frozen yet
        gc.collect()  # as Python's own full collection would
        await asyncio.sleep(0)  # the freeze comes on the loop
        assert heap.survivors_frozen == 1
        assert gc.get_freeze_count() >= frozen + len(kept)
    finally:
        heap.stop()
    assert heap._collected not in gc.callbacks


@async_test
async def test_zero_leaves_the_collector_as_python_sets_it():
    heap = Heap(every=0)
    heap.start()
    gc.collect()
    await asyncio.sleep(0)
    assert gc.get_freeze_count() == 0 and heap.refreezes == 0 and heap.survivors_frozen == 0
    heap.stop()
    assert gc.get_freeze_count() == 0


@async_test
async def test_the_daemon_freezes_what_it_made_to_start_and_thaws_it_when_it_stops():
    async with running(gc_refreeze_every=600) as h:
        assert h.daemon.heap.refreezes == 1
        assert gc.get_freeze_count() > 1000
    assert gc.get_freeze_count() == 0


@async_test
async def test_the_daemon_hands_the_interpreter_back_to_the_loop_sooner_and_restores_it():
    """A thread writing /metrics' text or reading a report holds the interpreter at most
    Config.gil_switch_interval before the event loop gets it back; after the stop, Python's
    own interval again."""
    before = sys.getswitchinterval()
    async with running(gil_switch_interval=0.0007):
        assert sys.getswitchinterval() == pytest.approx(0.0007)
    assert sys.getswitchinterval() == before
