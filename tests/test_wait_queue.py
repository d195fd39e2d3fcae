"""The queue of waiting requests on its own (core/leases/queue.py): arrival order across shapes,
the limits per user and in all (their messages), who comes first, who starves, and what a
waiter keeps of its request."""

import pytest

from patroller.core.errors import TooManyWaiting, Unavailable
from patroller.core.identity import ProcessRef, named_user
from patroller.core.leases.queue import Waiter, WaitQueue

alice, bob = named_user("alice"), named_user("bob")


def waiter(user=alice, wants=None, link=None):
    return Waiter(user, wants or {"gpu": 1}, lambda devices: None, link=link)


def test_a_waiter_keeps_its_request_as_asked():
    grant, abort = (lambda devices: None), (lambda error: None)
    ref = ProcessRef(pid=42, start=7)
    asked = {"gpu": 2, "mig": 1}
    w = Waiter(bob, asked, grant, abort, held_for=ref, duration=90.0, link="numa")
    asked["gpu"] = 5  # the caller's dict is not the waiter's
    assert (w.user, w.wants, w.link) == (bob, {"gpu": 2, "mig": 1}, "numa")
    assert w.shape == ((("gpu", 2), ("mig", 1)), "numa")
    assert (w.on_grant, w.on_abort, w.held_for, w.duration) == (grant, abort, ref, 90.0)
    plain = waiter()
    assert (plain.on_abort, plain.held_for, plain.duration, plain.link) == (None,) * 4


def test_the_queue_keeps_arrival_order_across_shapes_and_counts_each_user():
    queue = WaitQueue(max_waiters=10, max_waiting_per_user=3)
    first, second, third = waiter(alice), waiter(bob, {"gpu": 2}), waiter(alice)
    for n, w in enumerate((first, second, third)):
        queue.add(w, now=100.0 + n)
    assert queue.in_order() == [first, second, third]
    assert [w.since for w in queue.in_order()] == [100.0, 101.0, 102.0]
    assert len(queue) == 3 and queue.count_of("alice") == 2 and queue.count_of("bob") == 1
    assert first in queue and waiter() not in queue
    assert waiter(bob, {"gpu": 9}) not in queue  # a shape nobody waits for
    assert queue.remove(first) is True
    assert first not in queue and queue.remove(first) is False
    assert queue.remove(waiter(bob, {"gpu": 7})) is False  # a shape nobody waits for
    assert len(queue) == 2 and queue.count_of("alice") == 1
    assert queue.remove(third) is True
    assert queue.count_of("alice") == 0 and len(queue) == 1
    again = waiter(alice)
    queue.add(again, now=103.0)
    assert queue.count_of("alice") == 1
    assert queue.in_order() == [second, again]


def test_clear_empties_the_queue_and_gives_its_waiters_in_arrival_order():
    queue = WaitQueue(max_waiters=3, max_waiting_per_user=3)
    waiters = [waiter(bob, {"gpu": 2}), waiter(alice), waiter(bob)]
    for w in waiters:
        queue.add(w, now=0.0)
    assert queue.clear() == waiters
    assert len(queue) == 0 and queue.in_order() == [] and queue.count_of("bob") == 0
    for w in waiters:  # room for as many again
        queue.add(w, now=1.0)
    assert len(queue) == 3


def test_a_user_with_as_many_waiting_as_allowed_is_told_so():
    queue = WaitQueue(max_waiters=10, max_waiting_per_user=2)
    queue.add(waiter(alice), now=0.0)
    queue.add(waiter(alice), now=0.0)
    with pytest.raises(TooManyWaiting) as refused:
        queue.add(waiter(alice), now=0.0)
    assert refused.value.message == (
        "alice already has 2 requests waiting, the most one user may have"
    )
    assert refused.value.data == {"limit": 2, "waiting": 2}
    queue.add(waiter(bob), now=0.0)  # another user still may
    assert queue.count_of("alice") == 2 and len(queue) == 3


def test_a_full_queue_is_unavailable_saying_how_many_wait():
    queue = WaitQueue(max_waiters=2, max_waiting_per_user=5)
    queue.add(waiter(alice), now=0.0)
    queue.add(waiter(bob), now=0.0)
    with pytest.raises(Unavailable) as full:
        queue.add(waiter(alice), now=0.0)
    assert full.value.message == "too many waiting requests (2)"
    assert len(queue) == 2


def test_the_first_that_fits_is_the_earliest_arrival_not_the_first_shape():
    queue = WaitQueue(max_waiters=10, max_waiting_per_user=5)
    late_shape_first = waiter(alice, {"gpu": 4})
    early, later = waiter(bob, {"gpu": 1}), waiter(alice, {"gpu": 2})
    queue.add(late_shape_first, now=0.0)
    queue.add(early, now=1.0)
    queue.add(later, now=2.0)
    small = lambda w: sum(w.wants.values()) < 4
    assert queue.first(small) is early
    assert queue.first(small, passed=[early]) is later
    assert queue.first(lambda w: False) is None
    assert queue.starving(now=5.0, bound=5.0) is late_shape_first
    assert queue.starving(now=4.9, bound=5.0) is None
    assert WaitQueue(1, 1).starving(now=9.0, bound=0.0) is None  # nobody waits
    later_queue = WaitQueue(max_waiters=1, max_waiting_per_user=1)
    later_queue.add(waiter(), now=100.0)
    assert later_queue.starving(now=104.0, bound=5.0) is None  # 4 s waited of 5
    assert later_queue.starving(now=105.0, bound=5.0) is not None
