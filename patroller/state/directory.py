"""The lease book's directory: made private, checked to be where it was meant to be, and
locked for the daemon's life (one daemon, one book).

Whoever else may write there, or could have put a link in its path, could make the daemon
rename or remove files elsewhere: such a directory is refused, as ssh refuses a key file others
may write (config/trust.py holds the rules, which the Slurm job map's directory shares).
"""
from __future__ import annotations

import errno
import fcntl
import os
from typing import Optional

from patroller.config.trust import Place, Untrusted, check, check_path

LOCK = "lock"  # holds the flock, and the pid of the daemon that holds it


class BookError(Exception):
    """The state directory cannot be used; the message says why, in one line."""


STATE_DIR = Place("the state directory", "--state-dir",
                  "choose another --state-dir, or make it ours and private (chmod 700)")


def lock(directory: str) -> int:
    """Make the directory (mode 0700) if missing and lock it; the lock's descriptor (held for
    the daemon's life). BookError if either fails, or if someone else could have chosen where
    it leads or what is in it (config/trust.py)."""
    try:
        check_path(directory, STATE_DIR)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise BookError(f"cannot use the state directory {directory}: "
                            f"{exc.strerror or exc}; choose another --state-dir") from None
        # Again: a link may have been slipped in meanwhile. Then whoever else may write there
        # could slip in a link for us to follow: refuse, as ssh does.
        check(directory, STATE_DIR)
    except Untrusted as exc:
        raise BookError(str(exc)) from None
    try:
        fd = os.open(os.path.join(directory, LOCK),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise BookError(f"cannot use the state directory {directory}: "
                        f"{exc.strerror or exc}; choose another --state-dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        owner = _pid_in(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise BookError(f"another patroller{f' (pid {owner})' if owner else ''} uses the "
                            f"state directory {directory}; stop it, or give this one "
                            "another --state-dir") from None
        raise BookError(f"cannot lock the state directory {directory}: "
                        f"{exc.strerror or exc}") from None
    try:  # the pid only names us to a second daemon: not worth failing for
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    return fd


def _pid_in(fd: int) -> Optional[int]:
    """The pid the lock file's holder wrote into it, if readable."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
