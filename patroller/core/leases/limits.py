"""Fair use by two counts: how many devices a holder has, by identity and by host account.

Every hold counts under its holder's identity (`user`: a label's e-mail, a host account,
`container:<id>`) and, when the kernel said which host account the holder's process runs as
(`uid`), under that account as well, unless the policy leaves the account uncounted (root by
default: containers run as root unless told otherwise, whoever starts them). Each count has
its limit, the policy's limit for the identity's name and for the account's name. The
stricter decides: a new identity (another e-mail on a container's label, or none) on the same
account gets no more.

Devices a Slurm job holds (core/jobs.py) count under neither: Slurm has limits of its own.

Pure: the lease manager asks, with its holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from patroller.core.devices import Device, Inventory
from patroller.core.identity import Identity
from patroller.core.leases.holds import Hold
from patroller.core.policy import Policy


@dataclass(frozen=True)
class Count:
    """What one limit counts for a holder: the devices held under it, and how many it allows."""

    kind: str  # "user" (the identity) or "account" (the host account it runs as)
    name: str  # the identity's user, or the account's name
    uid: int | None  # the account's uid ("account" only)
    limit: int
    held: list[Device]
    holders: list[str]  # the user holding each of `held`

    def room(self) -> int:
        """How many more devices it allows (negative: that many over)."""
        return self.limit - len(self.held)

    def describe(self, who: Identity) -> str:
        """Whom the count is of, in words: `alice@example.org`, or `account alice (uid 1001),
        which alice+2@example.org runs as`."""
        if self.kind == "user":
            return who.user
        return f"account {self.name} (uid {self.uid}), which {who.user} runs as,"


def counted_uid(who: Identity, policy: Policy) -> int | None:
    """The host account `who` counts under as well, or None (not known, or left uncounted)."""
    if who.uid is None or who.uid in policy.uncounted_uids:
        return None
    return who.uid


def counts(
    who: Identity, policy: Policy, holds: Mapping[str, Hold], inventory: Inventory
) -> list[Count]:
    """The limits that apply to `who` (none when the policy sets none), identity first."""
    present = [d for d in inventory if not d.lost]
    out: list[Count] = []
    limit = policy.limit_of(who.user)
    if limit is not None:
        held = _held(present, holds, lambda h: h.user == who.user)
        out.append(Count("user", who.user, None, limit, held, [who.user] * len(held)))
    uid = counted_uid(who, policy)
    if uid is not None:
        name = who.account or f"uid:{uid}"
        limit = policy.limit_of(name)
        if limit is not None:
            held = _held(present, holds, lambda h: counted_uid(h, policy) == uid)
            out.append(Count("account", name, uid, limit, held, [_holder(holds, d) for d in held]))
    return out


def exceeded(
    who: Identity, asked: int, policy: Policy, holds: Mapping[str, Hold], inventory: Inventory
) -> Count | None:
    """The first count that `asked` more devices would take past its limit, or None."""
    for count in counts(who, policy, holds, inventory):
        if count.room() < asked:
            return count
    return None


def _held(
    devices: Iterable[Device], holds: Mapping[str, Hold], whose: Callable[[Identity], bool]
) -> list[Device]:
    """The devices whose holder is `whose` (a Slurm job's are Slurm's to count, not ours)."""
    return [
        d
        for d in devices
        if (holder := holds[d.uuid].holder) is not None
        and whose(holder)
        and holds[d.uuid].allocation is None
    ]


def _holder(holds: Mapping[str, Hold], device: Device) -> str:
    holder = holds[device.uuid].holder
    assert holder is not None  # _held lists held devices only
    return holder.user
