"""Who is calling the API: the identity behind an HTTP request."""
from __future__ import annotations

from typing import Optional, Protocol

from tornado.httputil import HTTPServerRequest

from .identity import Identity, named_user

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
