"""What the daemon knows of one open connection: one typed object on the connection itself, and
the one place that finds a request's connection.

Every connection the server accepts is `Accepted` (the server's own `Connection`,
http/fastlane.py, is one): an IOStream that carries its `ConnectionFacts` from the accept to the
close. The server fills in who is at the other end as it accepts (a unix caller's credentials
and /proc facts, a TCP caller's address); the callers layer adds what it learns of a TCP caller
(one connection, one caller: its identity, and its process when it is local; and what to do
as the connection closes, `on_end`: forget where its client's socket was seen); the HTTP layer
adds who asked as far as names go (--hide-users), for the fast lane. The facts live exactly as
long as their connection, in no table to keep.

Tornado hands a handler the request's HTTP1Connection, not its stream: the stream is that
connection's `stream` attribute, which Tornado does not document (requirements.txt says so).
`stream_of` is the only reader of it; everything else asks `stream_of` or `facts_of`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tornado.iostream import IOStream

from patroller.core.identity import Identity, Viewer
from patroller.identify.peers import Peer
from patroller.identify.resolver import ProcFacts


@dataclass(eq=False)
class ConnectionFacts:
    """Who is at the other end of one connection, and what was learned of them on it."""

    peer: Peer | None = None  # a unix-socket caller: the kernel's word, and its /proc facts
    address: tuple[str, int] | None = None  # a TCP caller: where it came from, as accepted
    caller: Identity | None = None  # a TCP caller, once identified
    process: ProcFacts | None = None  # a TCP caller's process, when it is local and visible
    viewer: Viewer | None = None  # who asked, for the names they may see (http/hiding.py)
    on_end: Callable[[], None] | None = None  # told once, as the connection closes (`when_ended`)


class Accepted(IOStream):
    """A connection the server accepted: its stream, with its facts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.facts = ConnectionFacts()

    def close(self, exc_info: Any = False) -> None:
        """Close, then tell the facts' `on_end` (once)."""
        super().close(exc_info)
        ended, self.facts.on_end = self.facts.on_end, None
        if ended is not None:
            ended()


def stream_of(connection: Any) -> IOStream | None:
    """The stream under an HTTP connection (a request's `connection`): Tornado's
    HTTP1Connection keeps it as `stream`, undocumented; None when there is none."""
    return getattr(connection, "stream", None)


def facts_of(connection: Any) -> ConnectionFacts | None:
    """The facts of the connection under an HTTP connection; None for a stream the server did
    not accept (it has none)."""
    stream = stream_of(connection)
    return stream.facts if isinstance(stream, Accepted) else None


def when_ended(connection: Any, action: Callable[[], None]) -> None:
    """Do `action` once the connection under an HTTP connection has closed: now if it has (or
    is not one the server accepted), else as it closes. One action a connection: the last
    one given stands."""
    stream = stream_of(connection)
    if isinstance(stream, Accepted) and not stream.closed():
        stream.facts.on_end = action
    else:
        action()
