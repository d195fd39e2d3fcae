"""Pseudonyms for user names (--hide-users): `user-` and the first 12 hex digits of an
HMAC-SHA256 of the name under a secret key, so that a user has the same pseudonym in every
answer and after a restart, two users have different ones (48 bits: among 1,000 users, two
share one with odds of about 1 in 500 million), and nobody without the key can turn one back
into the name, or check a guessed name against it.

The key is 32 random bytes, written once, in hex, to <state-dir>/pseudonyms.key (mode 0600, in
the book's private, locked directory) when a daemon first starts with --hide-users there, and
read at every start after. A daemon with no state directory makes a key for its run alone:
its pseudonyms change when it restarts. A key file that holds no key (a write cut short) is
replaced by a new key, with a warning: the pseudonyms change, nothing else does. A state
directory on a read-only filesystem with no key in it gets a key for the run alone, likewise
with a warning.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import stat

log = logging.getLogger(__name__)

KEY_FILE = "pseudonyms.key"
KEY_BYTES = 32
PREFIX = "user-"
DIGITS = 12  # hex digits of the digest kept: see the module's docstring for the odds
_HEX_KEY = re.compile(rb"[0-9a-f]{%d}\n?" % (2 * KEY_BYTES))


class PseudonymError(Exception):
    """The key cannot be read or written; the message says why, in one line."""


class Pseudonyms:
    """User name -> pseudonym, under the key `open` reads or makes."""

    def __init__(self, directory: str | None, remembered: int) -> None:
        self.directory = directory  # the state directory (made and locked by the book), or None
        self.path = os.path.join(directory, KEY_FILE) if directory is not None else None
        self.remembered = remembered  # pseudonyms kept, so that each is computed once
        self._key: bytes | None = None
        self._known: dict[str, str] = {}

    def open(self, read_only: bool = False) -> None:
        """Blocking: read the key, or make and write one; a key for this run when there is no
        state directory, or none in one on a read-only filesystem (`read_only`).
        PseudonymError if the file can be neither read nor written."""
        if self.path is None:
            self._key = os.urandom(KEY_BYTES)
            return
        key = self._read(self.path)
        if key is None:
            key = os.urandom(KEY_BYTES)
            if read_only:
                log.warning(
                    "no pseudonyms' key %s, and its directory is read-only: a key for "
                    "this run alone, so every pseudonym changes at the next start",
                    self.path,
                )
            else:
                self._write(self.path, key)
        self._key = key

    def of(self, name: str) -> str:
        """The pseudonym of `name`: the same for the same name, for as long as the key lasts."""
        known = self._known.get(name)
        if known is None:
            if self._key is None:
                raise RuntimeError("Pseudonyms.open() was not called")
            digest = hmac.new(self._key, name.encode("utf-8", "surrogatepass"), hashlib.sha256)
            known = PREFIX + digest.hexdigest()[:DIGITS]
            if len(self._known) >= self.remembered:
                self._known.clear()
            self._known[name] = known
        return known

    @staticmethod
    def _read(path: str) -> bytes | None:
        """The key in the file; None if there is no file, or one that holds no key (a
        warning: it is replaced)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise PseudonymError(
                f"cannot read the pseudonyms' key {path}: {exc.strerror or exc}"
            ) from None
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode):
                raise PseudonymError(
                    f"the pseudonyms' key {path} is not a regular file: "
                    "remove it, and a new key is made"
                )
            if found.st_mode & 0o077:  # the directory is private; the key stays so too
                os.fchmod(fd, 0o600)
            text = os.read(fd, 4 * KEY_BYTES)
        except OSError as exc:
            raise PseudonymError(
                f"cannot read the pseudonyms' key {path}: {exc.strerror or exc}"
            ) from None
        finally:
            os.close(fd)
        if not _HEX_KEY.fullmatch(text):
            log.warning(
                "the pseudonyms' key %s holds no key (%d bytes): a new one replaces it, "
                "and every pseudonym changes",
                path,
                len(text),
            )
            return None
        return bytes.fromhex(text.decode("ascii"))

    @staticmethod
    def _write(path: str, key: bytes) -> None:
        """Write the key whole or not at all: a new file, synced, renamed over the old."""
        fresh = path + ".new"
        try:
            try:
                os.unlink(fresh)  # left by a start that died before the rename
            except FileNotFoundError:
                pass
            fd = os.open(
                fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            try:
                os.write(fd, key.hex().encode("ascii") + b"\n")
                os.fsync(fd)  # once in the daemon's life: a crash must not leave it empty
            finally:
                os.close(fd)
            os.rename(fresh, path)
        except OSError as exc:
            raise PseudonymError(
                f"cannot write the pseudonyms' key {path}: {exc.strerror or exc}"
            ) from None
        log.info("made the pseudonyms' key %s", path)
