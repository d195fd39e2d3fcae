"""Lease expiry driven by the event loop: one timer, moved to each new deadline."""
import asyncio
import time

from helpers import async_test, until
from patroller.core.identity import named_user
from patroller.core.leases.manager import LeaseManager
from patroller.observe.testmode import synthetic_inventory
from patroller.state.timer import ExpiryTimer


@async_test
async def test_the_timer_follows_the_next_deadline_and_expires_on_it():
    leases = LeaseManager(synthetic_inventory(8), lease=0.3)
    timer = ExpiryTimer(leases)
    timer.start()
    [device] = leases.request(named_user("alice"), {"gpu": 1})
    uuid = device.uuid
    freed = []
    leases.subscribe(lambda: freed.append(time.monotonic()) if leases.state(uuid) == "free" else None)
    deadline = leases.next_deadline()
    assert timer._at == deadline
    await asyncio.sleep(0.15)
    assert leases.state(uuid) == "reserved"
    await until(lambda: leases.state(uuid) == "free", timeout=5)
    assert freed[0] >= deadline - 0.002  # never early
    assert timer._at is None  # nothing left to expire
    timer.stop()


@async_test
async def test_a_claim_cancels_the_timer_and_a_new_reservation_moves_it():
    leases = LeaseManager(synthetic_inventory(8), lease=0.2)
    timer = ExpiryTimer(leases)
    timer.start()
    alice = named_user("alice")
    [first] = leases.request(alice, {"gpu": 1})
    leases.process_started(first.uuid, 1234, alice)
    assert timer._at is None
    await asyncio.sleep(0.3)
    assert leases.state(first.uuid) == "claimed"
    [second] = leases.request(alice, {"gpu": 1})
    assert timer._at == leases.next_deadline()
    await until(lambda: leases.state(second.uuid) == "free", timeout=5)
    assert leases.state(first.uuid) == "claimed"
    timer.stop()
