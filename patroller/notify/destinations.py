"""Each user's own destinations, set by the user (identified as every caller is) and kept in
the state directory (`notify.json`, 0600 as every file the daemon writes), so that they survive
a restart. A user reaches only her own: the API hands this module the caller's identity, never
a name the caller gives.

    {"version": 1, "users": {"alice": {"urls": ["mailtos://...", "ntfys://..."],
                                       "muted": ["granted"]}}}

The file is rewritten whole (a temporary, then a rename) at each change. One that cannot be
read is set aside (`notify.json.corrupt-<time>`) with one warning, and the users start with
none; without a state directory they are kept in memory only, and lost at a restart.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

from patroller.state import private

log = logging.getLogger(__name__)

FILE = "notify.json"
VERSION = 1
MAX_BYTES = 4 << 20  # the file's size at most: more is not read


class DestinationError(Exception):
    """A change a user may not make; the message says why, to her."""


@dataclass(frozen=True)
class Own:
    """One user's destinations, in the order she added them, and the kinds she muted."""

    urls: tuple[str, ...] = ()
    muted: tuple[str, ...] = ()
    extra: dict[str, object] = field(default_factory=dict)  # what a newer version wrote


NONE = Own()  # a user's who has none (shared: an Own is never changed, only replaced)


class UserDestinations:
    """Every user's own destinations; `directory` None: in memory only."""

    def __init__(self, directory: str | None, most: int, longest: int) -> None:
        self.directory = directory
        self.most = most  # destinations one user may have
        self.longest = longest  # characters of one URL at most
        self.writes = 0
        self.failures = 0
        self._users: dict[str, Own] = {}

    @property
    def path(self) -> str | None:
        return os.path.join(self.directory, FILE) if self.directory is not None else None

    def open(self) -> None:
        """Read the file, if there is one (blocking, once, at start)."""
        path = self.path
        if path is None or not os.path.exists(path):
            return
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
            if len(data) > MAX_BYTES:
                raise ValueError(f"over {MAX_BYTES} bytes")
            self._users = _decode(json.loads(data))
        except (OSError, ValueError, RecursionError) as exc:
            aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
            try:
                os.rename(path, aside)
            except OSError:
                aside = "(it could not be set aside)"
            log.warning(
                "the users' notification destinations %s cannot be read (%s); set aside "
                "as %s: every user starts with none",
                path,
                str(exc)[:200],
                aside,
            )
            self._users = {}

    def of(self, user: str) -> Own:
        return self._users.get(user) or NONE

    def users(self) -> tuple[str, ...]:
        return tuple(self._users)

    def anyone(self) -> bool:
        """Whether any user has settings of her own (destinations, kinds muted)."""
        return bool(self._users)

    def add(self, user: str, url: str) -> int:
        """Add `url` (checked by the caller) for `user`; its number, from 1."""
        own = self.of(user)
        if len(url) > self.longest:
            raise DestinationError(f"url: longer than {self.longest} characters")
        if url in own.urls:
            raise DestinationError(
                f"url: you have it already, as number {own.urls.index(url) + 1}"
            )
        if len(own.urls) >= self.most:
            raise DestinationError(
                f"you have {len(own.urls)} destinations, the most one may "
                f"have; remove one first (patroller notify remove N)"
            )
        self._set(user, Own(own.urls + (url,), own.muted, own.extra))
        return len(own.urls) + 1

    def remove(self, user: str, number: int) -> str:
        """Remove `user`'s destination `number` (from 1); the URL removed."""
        own = self.of(user)
        if not 1 <= number <= len(own.urls):
            raise DestinationError(
                f"n: you have no destination {number}"
                + (
                    f" (you have {len(own.urls)}: patroller notify list)"
                    if own.urls
                    else " (you have none)"
                )
            )
        url = own.urls[number - 1]
        self._set(user, Own(own.urls[: number - 1] + own.urls[number:], own.muted, own.extra))
        return url

    def mute(self, user: str, kind: str, muted: bool) -> tuple[str, ...]:
        """Mute (or unmute) a kind for `user`; the kinds muted now."""
        own = self.of(user)
        kinds = tuple(k for k in own.muted if k != kind) + ((kind,) if muted else ())
        self._set(user, Own(own.urls, tuple(sorted(kinds)), own.extra))
        return self.of(user).muted

    def _set(self, user: str, own: Own) -> None:
        before = self._users.get(user)
        if own.urls or own.muted or own.extra:
            self._users[user] = own
        else:
            self._users.pop(user, None)
        try:
            self._write()
        except OSError as exc:
            if before is None:
                self._users.pop(user, None)
            else:
                self._users[user] = before
            self.failures += 1
            raise DestinationError(
                f"the change cannot be kept: {exc.strerror or exc}; try again later"
            ) from None

    def _write(self) -> None:
        path = self.path
        if path is None:
            return
        body = {
            "version": VERSION,
            "users": {
                user: {"urls": list(own.urls), "muted": list(own.muted), **own.extra}
                for user, own in sorted(self._users.items())
            },
        }
        private.replace(
            path, json.dumps(body, separators=(",", ":"), sort_keys=True).encode("utf-8")
        )
        self.writes += 1


def _decode(data: object) -> dict[str, Own]:
    """The users of a file's JSON; ValueError if it is not one this version reads."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError("not a version 1 notification file")
    users = data.get("users")
    if not isinstance(users, dict):
        raise ValueError("users is not an object")
    found = {}
    for user, entry in users.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{user!r} is not an object")
        urls, muted = entry.get("urls", []), entry.get("muted", [])
        if not (
            isinstance(urls, list)
            and all(isinstance(u, str) for u in urls)
            and isinstance(muted, list)
            and all(isinstance(m, str) for m in muted)
        ):
            raise ValueError(f"{user!r}: urls and muted are lists of strings")
        extra = {k: v for k, v in entry.items() if k not in ("urls", "muted")}
        found[user] = Own(tuple(urls), tuple(muted), extra)
    return found
