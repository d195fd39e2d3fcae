"""Who someone is: the identity of an API caller or of a GPU process.

Leases compare identities by `user` alone: the same person reserving from one container and
computing in another is one user.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class Identity:
    """A user, and where we learned who they are."""

    user: str  # the key that leases compare: an e-mail, a host account, a container, "unknown"
    source: str  # "test", "container", "host" or "unknown"
    email: Optional[str] = None
    account: Optional[str] = None  # host account name
    uid: Optional[int] = None
    container: Optional[Tuple[str, Optional[str]]] = None  # (short id, name)
    info: Tuple[Tuple[str, str], ...] = field(default=())  # extra labels, in configured order
    degraded: bool = False  # the user could not be learned just now (Docker unreachable)

    def same_user(self, other: Optional["Identity"]) -> bool:
        """Whether the two are the same user for the lease rules."""
        return other is not None and other.user == self.user

    def to_json(self) -> Dict[str, Any]:
        """The identity as /status shows it."""
        return {
            "user": self.user,
            "source": self.source,
            "email": self.email,
            "account": self.account,
            "uid": self.uid,
            "container": (
                {"id": self.container[0], "name": self.container[1]} if self.container else None
            ),
            "info": dict(self.info),
            "degraded": self.degraded,
        }


UNKNOWN = Identity(user="unknown", source="unknown")


def named_user(name: str) -> Identity:
    """The identity a test-mode caller gives itself with `user=`."""
    return Identity(user=name, source="test", email=name if "@" in name else None)

