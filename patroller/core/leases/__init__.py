"""The lease rules: who holds which device, reservations that expire, waiters served in order.

Owns: the hold of each device and its states (holds), the queue of waiting requests (queue),
which free devices go to whom (serving), the limits by user and by host account (limits), why a
request is refused (refusals), the queries others need (state), what the host tells the rules
and how every change ends (observed) and the commands the callers give (manager).
May import: the rest of `patroller.core`.
"""

from patroller.core.leases.holds import Clock, Event, Hold, Shape, Wants, is_admin
from patroller.core.leases.manager import LeaseManager
from patroller.core.leases.queue import Waiter, WaitQueue
from patroller.core.leases.state import LeaseState

__all__ = [
    "Clock",
    "Event",
    "Hold",
    "LeaseManager",
    "LeaseState",
    "Shape",
    "WaitQueue",
    "Waiter",
    "Wants",
    "is_admin",
]
