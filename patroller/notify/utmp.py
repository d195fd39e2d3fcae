"""Who is logged in on which terminal: glibc's login records (utmp, `/var/run/utmp`), as
`write` and `who` read them. Pure but for `read`, which reads the file's bytes.

A record is glibc's `struct utmp` on Linux x86-64 and aarch64 (both little-endian, both with
32-bit times in this struct): 384 bytes, of which Patroller reads the type, the pid, the line
(the terminal's name under /dev: `pts/3`, `tty1`) and the user. Only USER_PROCESS records are
logins; the others (boot time, run level, a login that ended: DEAD_PROCESS) are skipped. A
partial record at the end (a file being written) is left out."""

from __future__ import annotations

import struct
from dataclasses import dataclass

# ut_type (short, then 2 bytes of padding), ut_pid, ut_line[32], ut_id[4], ut_user[32],
# ut_host[256], ut_exit (2 shorts), ut_session, ut_tv (2 x int32), ut_addr_v6[4], 20 reserved
RECORD = struct.Struct("<h2xi32s4s32s256s2hi2i4i20s")
USER_PROCESS = 7


@dataclass(frozen=True)
class Login:
    """One user's login on one terminal, as its record says (nothing here is checked)."""

    user: str
    line: str  # the terminal under /dev, as written: a caller checks it before using it
    pid: int


def logins(data: bytes) -> list[Login]:
    """The logins (USER_PROCESS records) in utmp's bytes, in the file's order."""
    found = []
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        kind, pid, line, _, user = RECORD.unpack_from(data, offset)[:5]
        if kind != USER_PROCESS:
            continue
        found.append(Login(_text(user), _text(line), pid))
    return found


def read(path: str, most: int) -> bytes:
    """The first `most` bytes of the file at `path` (OSError if it cannot be read)."""
    with open(path, "rb") as f:
        return f.read(most)


def _text(field: bytes) -> str:
    """A fixed-size field: up to its first NUL, undecodable bytes kept as escapes."""
    return field.split(b"\0", 1)[0].decode("utf-8", "backslashreplace")
