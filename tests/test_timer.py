"""Lease expiry driven by the event loop: one timer, moved to each new deadline."""

import time

from helpers import async_test, lease_manager, until

from patroller.core.identity import named_user
from patroller.state.timer import ExpiryTimer


@async_test
async def test_the_timer_follows_the_next_deadline_and_expires_on_it():
    leases = lease_manager(lease=0.3)
    timer = ExpiryTimer(leases)
    timer.start()
    [device] = leases.request(named_user("alice"), {"gpu": 1})
    uuid = device.uuid
    freed = []
    leases.on_change(
        lambda: freed.append(time.monotonic()) if leases.state(uuid) == "free" else None
    )
    deadline = leases.next_deadline()
    assert timer._at == deadline
    await until(lambda: leases.state(uuid) == "free", timeout=5)
    assert freed[0] >= deadline - 0.002  # never early: reserved until its deadline
    assert timer._at is None  # nothing left to expire
    timer.stop()


@async_test
async def test_a_claim_cancels_the_timer_and_a_new_reservation_moves_it():
    leases = lease_manager(lease=0.2)
    timer = ExpiryTimer(leases)
    timer.start()
    alice = named_user("alice")
    [first] = leases.request(alice, {"gpu": 1})
    leases.process_started(first.uuid, 1234, alice)
    assert timer._at is None
    [second] = leases.request(alice, {"gpu": 1})  # its deadline comes after the first's would
    assert timer._at == leases.next_deadline()
    await until(lambda: leases.state(second.uuid) == "free", timeout=5)
    assert leases.state(first.uuid) == "claimed"  # the first's deadline passed before it
    timer.stop()
