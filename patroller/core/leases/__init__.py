"""The lease rules: who holds which device, reservations that expire, waiters served in order.

Owns: the hold of each device and its states, the queue of waiting requests, and the manager's
commands (request, wait, release, renew, expire, and what the monitors see).
May import: the rest of `patroller.core`.
"""
