"""The lease rules: who holds which device, reservations that expire, waiters served in order.

Owns: the hold of each device and its states (holds), the queue of waiting requests (queue),
which free devices go to whom (serving), why a request is refused (refusals), and the manager's
commands and the few queries others need (manager).
May import: the rest of `patroller.core`.
"""
from patroller.core.leases.holds import Clock, Event, Hold, Shape, Wants, is_admin
from patroller.core.leases.manager import LeaseManager, LeaseState
from patroller.core.leases.queue import WaitQueue, Waiter

__all__ = ["Clock", "Event", "Hold", "LeaseManager", "LeaseState", "Shape", "WaitQueue", "Waiter",
           "Wants", "is_admin"]
