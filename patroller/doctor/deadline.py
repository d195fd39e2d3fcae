"""A deadline on a whole answer, not on each read. A socket's timeout bounds one read or write:
a server that sends one byte every 2 s answers each read of a 3 s timeout and never finishes,
and a doctor that waits for its whole answer never ends. `bounded` gives a socket whose every
read and write may take only what is left until one point on the monotonic clock; past it,
`Overdue` (a TimeoutError, so that whatever catches a socket's timeout catches it), saying how
long it waited and how much came."""

from __future__ import annotations

import socket
import time
from typing import Any

from patroller.durations import describe


class Overdue(TimeoutError):
    """The deadline passed before the whole answer came."""


class _Bounded(socket.socket):
    """A socket whose reads and writes together end by `until`."""

    until = 0.0  # time.monotonic() by which the whole exchange must be done
    seconds = 0.0  # how long that was, from the start, to say so
    came = 0  # bytes received so far

    def _arm(self) -> None:
        left = self.until - time.monotonic()
        if left <= 0:
            raise self._overdue()
        self.settimeout(left)

    def _overdue(self) -> Overdue:
        return Overdue(
            f"no whole answer within {describe(self.seconds)} ({self.came} byte(s) came)"
        )

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._arm()
        try:
            data = super().recv(bufsize, flags)
        except TimeoutError:
            raise self._overdue() from None
        self.came += len(data)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        # what http.client's responses read through (socket.SocketIO)
        self._arm()
        try:
            count = super().recv_into(buffer, nbytes, flags)
        except TimeoutError:
            raise self._overdue() from None
        self.came += count
        return count

    def send(self, data: Any, flags: int = 0) -> int:
        self._arm()
        try:
            return super().send(data, flags)
        except TimeoutError:
            raise self._overdue() from None

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._arm()
        try:
            super().sendall(data, flags)
        except TimeoutError:
            raise self._overdue() from None


def deadline(seconds: float) -> float:
    """The point on the monotonic clock `seconds` from now."""
    return time.monotonic() + seconds


def left(until: float) -> float:
    """Seconds left until `until` (a little at least, for a timeout that must be positive)."""
    return max(until - time.monotonic(), 0.001)


def bounded(sock: socket.socket, until: float, seconds: float) -> socket.socket:
    """`sock`, connected, as a socket whose reads and writes all end by `until` (`seconds` from
    when the exchange began). The descriptor moves to the new object; `sock` is left empty."""
    made = _Bounded(sock.family, sock.type, sock.proto, fileno=sock.detach())
    made.until = until
    made.seconds = seconds
    return made
