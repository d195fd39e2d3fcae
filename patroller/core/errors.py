"""Domain errors. Each carries a message and data; the HTTP layer maps classes to statuses."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Private:
    """What an error says that is other users' (their Slurm jobs, their pods, the devices they
    hold under the caller's host account): whose it is, and the message and data a caller who
    may not see one of them (--hide-users) is told instead."""

    users: tuple[str, ...]
    message: str
    data: dict[str, Any]


class PatrollerError(Exception):
    """Base: a message for people and data for programs."""

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = data
        self.private: Private | None = None  # None: nothing in it is another user's

    def naming(self, users: Iterable[str], message: str, **data: Any) -> PatrollerError:
        """This error, noting that some of what it says is `users`': `message` and `data` say
        it without that."""
        self.private = Private(tuple(users), message, data)
        return self


class BadRequest(PatrollerError):
    """The request is malformed (HTTP 400)."""


class Unidentified(PatrollerError):
    """The caller could not be identified, so nothing can be reserved for it (HTTP 403)."""


class NotYours(PatrollerError):
    """The caller asked to act on another user's device (HTTP 403)."""


class Unsatisfiable(PatrollerError):
    """The request can never be satisfied on this host (HTTP 422)."""


class Busy(PatrollerError):
    """The devices asked for are not free now (HTTP 409)."""


class Unavailable(PatrollerError):
    """The daemon cannot take the request now: shutting down, or too many waiting (HTTP 503)."""


class TooManyWaiting(PatrollerError):
    """The caller already has as many requests waiting as one user may (HTTP 429)."""


class TooManyReports(PatrollerError):
    """As many usage reports as may run at once are running; try again after `retry_after`
    seconds (HTTP 429, with Retry-After)."""


class NoCallerProcess(PatrollerError):
    """A hold for the caller's process, asked by a caller whose process cannot be known
    (HTTP 422)."""


class NotHeld(PatrollerError):
    """The caller asked to renew a device it does not hold (any more) (HTTP 409)."""


class OverLimit(PatrollerError):
    """The user would hold more devices than the host's policy allows one user (HTTP 403)."""
