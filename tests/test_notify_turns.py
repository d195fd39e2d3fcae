"""The lease rules' events reach the notifier a few at each turn of the loop (notify/turns.py):
a quiet event is handled at once; a burst is handled `each` a turn, in order, with the loop's
sockets served between two turns; the backlog is bounded, what it drops counted and logged
once; the stop handles what waits; and a real daemon hands its events through it."""

import asyncio
import logging
import socket
from dataclasses import replace

import pytest
from helpers import async_test, find, scrape, serving, until

from patroller.config import Config
from patroller.core.leases import Event
from patroller.notify.turns import Turns


def events(count, start=0):
    return [
        Event("trespass", f"user{n}", (("GPU-0", 0),), {"pid": n})
        for n in range(start, start + count)
    ]


def made(seen, each, most=1000):
    config = Config(notify_per_turn=each, notify_backlog=most, repeat_log_every=60)
    return Turns(seen.append, config)


def started(each, most=1000):
    seen = []
    turns = made(seen, each, most)
    turns.start()
    return turns, seen


async def turned(turns, most=1000):
    """Turns of the loop until nothing waits: how many it took."""
    for n in range(most):
        if not turns.waiting:
            return n
        await asyncio.sleep(0)
    raise AssertionError(f"{turns.waiting} events still wait after {most} turns")


@async_test
async def test_a_quiet_event_is_handled_at_once():
    turns, seen = started(each=2)
    [event] = events(1)
    turns.put(event)
    assert seen == [event] and turns.waiting == 0
    await asyncio.sleep(0)  # a new turn: one more is handled at once
    [later] = events(1, start=1)
    turns.put(later)
    assert seen == [event, later]


@async_test
async def test_a_burst_is_handled_a_few_a_turn_in_order_with_the_sockets_served_between():
    loop = asyncio.get_running_loop()
    turns, seen = started(each=2)
    reader, writer = socket.socketpair()
    served = []  # how many events were handled when the socket was served
    loop.add_reader(reader.fileno(), lambda: served.append(len(seen)) or reader.recv(16))
    try:
        burst = events(12)
        for event in burst:  # in one callback of the loop, as a reading's events come
            turns.put(event)
        writer.send(b"x")  # a request comes meanwhile
        assert seen == burst[:2] and turns.waiting == 10
        took = await turned(turns)
        assert seen == burst  # all of them, in the order they came
        assert took >= 5  # two a turn: five more turns at least
        # the socket was served while events still waited, not after the whole burst
        assert served and served[0] < len(burst), served
    finally:
        loop.remove_reader(reader.fileno())
        reader.close()
        writer.close()


@async_test
async def test_an_event_in_a_full_turn_waits_behind_those_waiting():
    turns, seen = started(each=1)
    first, second, third, fourth = events(4)
    turns.put(first)
    turns.put(second)  # the turn has had its one: it waits
    assert seen == [first]
    await asyncio.sleep(0)
    turns.put(third)  # this turn handled `second`: `third` waits for the next
    assert seen == [first, second] and turns.waiting == 1
    await turned(turns)
    assert seen == [first, second, third]
    await asyncio.sleep(0)  # a turn in which nothing waited: quiet again
    turns.put(fourth)
    assert seen == [first, second, third, fourth]


@async_test
async def test_the_backlog_is_bounded_and_what_it_drops_is_counted_and_logged_once(caplog):
    turns, seen = started(each=1, most=3)
    burst = events(7)
    with caplog.at_level(logging.WARNING, logger="patroller.notify.turns"):
        for event in burst:
            turns.put(event)
    assert turns.waiting == 3 and turns.dropped == 3
    warnings = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    await turned(turns)
    assert seen == burst[:4]  # the first at once, three waited; the last three dropped


@async_test
async def test_the_stop_handles_every_event_waiting_and_later_ones_as_they_come():
    turns, seen = started(each=1)
    burst = events(5)
    for event in burst:
        turns.put(event)
    assert len(seen) == 1
    turns.finish()
    assert seen == burst and turns.waiting == 0
    [late] = events(1, start=5)
    turns.put(late)
    assert seen[-1] is late


@pytest.mark.errors_expected
@async_test
async def test_a_bug_in_one_events_handling_is_logged_once_and_the_others_are_handled(caplog):
    seen = []
    burst = events(6)

    def handle(event):
        if event.user in ("user1", "user3", "user5"):
            raise RuntimeError(f"a bug at {event.user}")
        seen.append(event)

    turns = Turns(handle, Config(notify_per_turn=1, repeat_log_every=60))
    turns.start()
    with caplog.at_level(logging.ERROR, logger="patroller.notify.turns"):
        for event in burst[:4]:  # the first at once, three wait; one fails at once
            turns.put(event)
        await turned(turns)
        turns.put(burst[4])
        turns.put(burst[5])  # waits, and fails at the stop
        turns.finish()
    assert seen == [burst[0], burst[2], burst[4]]
    [logged] = [r for r in caplog.records if "could not be handled" in r.getMessage()]
    assert logged.exc_info is not None and "a bug at user1" in str(logged.exc_info[1])


@pytest.mark.errors_expected
def test_without_a_loop_each_event_is_handled_as_it_comes_a_bug_logged():
    seen = []
    burst = events(4)

    def handle(event):
        if event is burst[1]:
            raise RuntimeError("a bug")
        seen.append(event)

    turns = Turns(handle, Config(notify_per_turn=1, notify_backlog=10))
    turns.start()  # no loop runs: a notifier off any loop
    for event in burst:
        turns.put(event)
    assert seen == [burst[0], *burst[2:]] and turns.waiting == 0


@async_test
async def test_a_daemons_lease_events_reach_the_notifier_through_its_turns_and_are_counted():
    config = replace(
        Config(test=True, port=0, address="127.0.0.1"),
        notify=("json://127.0.0.1:9/x",),
        notify_per_turn=1,
        notify_backlog=2,
    )
    late = [Event("release", f"late{n}", (("GPU-1", 1),)) for n in range(2000)]
    async with serving(config) as h:
        turns = h.services.notifier.turns
        through = []
        handle = turns.handle
        turns.handle = lambda event: through.append(event.kind) or handle(event)
        await h.ok("/request?gpu=1")
        await until(lambda: "grant" in through)
        await asyncio.sleep(0)  # a quiet turn
        for n in range(6):  # one at once, two wait, three dropped
            turns.put(Event("release", f"user{n}", (("GPU-1", 1),)))
        assert h.services.notifier.metrics()["events_waiting"] == 2
        samples, _, _ = await scrape(h)
        assert find(samples, "patroller_notification_events_dropped_total") == [3.0]
        assert find(samples, "patroller_notification_events_waiting") == [0.0]
        assert through.count("release") == 3
        turns.most = len(late)
        for event in late:  # more than the stop's own turns would handle
            turns.put(event)
    # the stop handled every event that waited
    assert through.count("release") == 3 + len(late)
