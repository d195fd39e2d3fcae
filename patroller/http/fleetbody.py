"""/fleet.json as it is sent: each body the fleet view builds (fleet.Fleet.body), compressed
once, in a thread, together with its version, and sent to each client in the encoding its
Accept-Encoding takes.

At 1,010 hosts the body is 2.1 MB; gzip makes it a seventh of that (level 6: 34 ms of a core
for a body whose hosts all differ, 12 ms at level 1), and an answer is then a copy of the bytes
already made: nothing is compressed or hashed per answer. A body is served only once it is
packed whole (`Packed`: its bytes, its gzip and their ETags), so that every answer, whatever
its encoding, is of the same body: the newest body waits for its packing (at most one at a
time, never queued behind another), and its askers meanwhile get the one before. Only the
daemon's first body is waited for, since there is none before it.

Only gzip: browsers offer brotli and zstd over HTTPS alone (a page of a daemon on http:// is
never sent them), and each costs a dependency; at 1,010 hosts zstd's level 1 made 296 KB in 6 ms
and brotli's quality 4 298 KB in 34 ms, against gzip's 324 KB in 34 ms (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
from concurrent.futures import Executor
from dataclasses import dataclass

from patroller.http.encoding import accepts_gzip


@dataclass(frozen=True)
class Packed:
    """One body in each encoding it is sent in, and each one's ETag (a strong one: the
    encodings' bytes differ, so their tags do too)."""

    body: bytes
    gzipped: bytes
    tag: str  # the body's version: a hash of its bytes

    def answer(self, accept_encoding: str) -> tuple[bytes, str | None, str]:
        """(bytes, Content-Encoding or None, ETag) for a client that sent `accept_encoding`."""
        if accepts_gzip(accept_encoding):
            return self.gzipped, "gzip", f'"{self.tag}-gzip"'
        return self.body, None, f'"{self.tag}"'


def pack(body: bytes, level: int) -> Packed:
    """Blocking (a thread's): `body` gzipped at `level`, and its version."""
    tag = hashlib.blake2b(body, digest_size=12).hexdigest()
    return Packed(body, gzip.compress(body, level, mtime=0), tag)


class Packer:
    """The newest body packed (`packed`), and the next one being packed in `executor`: at most
    one at a time, the newest asked for when it is done."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.made = 0  # bodies packed
        self.packed: Packed | None = None
        self._packing: asyncio.Future[Packed] | None = None
        self._of: bytes | None = None  # the body being packed

    async def of(self, body: bytes, executor: Executor | None = None) -> Packed:
        """`body` packed once it is, else the last body packed; packing `body` meanwhile
        unless another is under way. The first body is waited for."""
        if self.packed is not None and self.packed.body is body:
            return self.packed
        if self._packing is None:
            loop = asyncio.get_running_loop()
            self._of = body
            self._packing = loop.run_in_executor(executor, pack, body, self.level)
            self._packing.add_done_callback(self._done)
        if self.packed is None:
            return await asyncio.shield(self._packing)
        return self.packed

    def _done(self, future: asyncio.Future[Packed]) -> None:
        self._packing = self._of = None
        if not future.cancelled() and future.exception() is None:
            self.packed = future.result()
            self.made += 1
