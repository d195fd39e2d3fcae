"""The one reader of a file the operator names for the daemon to read whole: the configuration
file (file.py) and the per-user limits file (policy.py).

Only a regular file is read (a FIFO or a device would block, or never end), without waiting to
open it, and at most a bound's worth of it: a larger file is refused, not cut.
"""

from __future__ import annotations

import os
import stat


def read_regular(path: str, most: int, what: str) -> bytes:
    """Blocking: the bytes of the regular file at `path`, at most `most` of them. ValueError
    names `what` the file is (`the configuration file`, or its path): `cannot read what: No
    such file or directory`, `what is not a regular file`, `what is over N bytes`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"cannot read {what}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{what} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(most + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > most:
        raise ValueError(f"{what} is over {most} bytes")
    return raw
