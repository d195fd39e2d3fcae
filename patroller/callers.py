"""Who is calling the API: the identity behind an HTTP request."""
from __future__ import annotations

import asyncio
from typing import Optional, Protocol, Tuple

from tornado.httputil import HTTPServerRequest

from .errors import BadRequest, Unidentified
from .identity import Identity, named_user
from .peers import Address, find_client, is_loopback
from .resolver import host_identity

DEFAULT_TEST_USER = "test-user"


class CallerIdentifier(Protocol):
    """Turns a request into the caller's identity, or raises errors.Unidentified."""

    async def identify(self, request: HTTPServerRequest, claimed: Optional[str]) -> Identity:
        """`claimed` is the request's user= (already checked for form), or None."""


class TestModeCallers:
    """Test mode: callers are who they say they are (`user=`), or one default user."""

    def __init__(self, default: str = DEFAULT_TEST_USER) -> None:
        self.default = default

    async def identify(self, request: HTTPServerRequest, claimed: Optional[str]) -> Identity:
        """The user named in the request, or the default test user."""
        return named_user(claimed or self.default)


class HostCallers:
    """GPU host mode: a loopback caller is the local process that owns the connection.

    Its host account is read from the kernel's socket table, which the caller cannot forge.
    Callers from other addresses cannot be identified yet.
    """

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc

    async def identify(self, request: HTTPServerRequest, claimed: Optional[str]) -> Identity:
        """The account that owns the client socket, or Unidentified."""
        if claimed is not None:
            raise BadRequest("user= is accepted in test mode only: callers are identified "
                             "by the system")
        peer, server = _ends(request)
        if peer is None or server is None:
            raise Unidentified("the connection has no address to identify the caller by")
        if not is_loopback(peer[0]):
            raise Unidentified(f"cannot identify a caller at {peer[0]}: call from the GPU host "
                               "itself (loopback)")
        loop = asyncio.get_running_loop()
        entry = await loop.run_in_executor(None, find_client, peer, server, self.proc)
        if entry is None:
            raise Unidentified(f"no local process owns the connection from {peer[0]}:{peer[1]}")
        return host_identity(entry.uid)


def _ends(request: HTTPServerRequest) -> Tuple[Optional[Address], Optional[Address]]:
    """(peer, our end) of the request's TCP connection."""
    address = getattr(request.connection.context, "address", None)  # type: ignore[union-attr]
    stream = getattr(request.connection, "stream", None)
    sock = getattr(stream, "socket", None)
    if not isinstance(address, tuple) or sock is None:
        return None, None
    try:
        local = sock.getsockname()
    except OSError:
        return None, None
    return (address[0], address[1]), (local[0], local[1])
