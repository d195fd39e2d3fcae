"""The lease book's directory: made private, checked to be where it was meant to be, and
locked for the daemon's life (one daemon, one book).

Whoever else may write there, or could have put a link in its path, could make the daemon
rename or remove files elsewhere: such a directory is refused, as ssh refuses a key file others
may write (config/trust.py holds the rules, which the Slurm job map's directory shares).

The directory is made private at start (0700, and each file of ours in it 0600: private.py)
whatever mode it came with: systemd's StateDirectory= makes it 0755 unless told otherwise, and
an older version left its usage store 0644. `LockedDirectory.tightened` says what was closed to
others.

A directory on a read-only filesystem (a read-only mount or bind mount) passes the same checks
and is `read_only`: the daemon reads it but writes nothing there, and holds the lock file's lock
when there is one to open (a flock needs no write access), so a second daemon is still refused.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass, field

from patroller.config.trust import Place, Untrusted, check, check_path
from patroller.state.private import Tightened, open_to_others, tighten_directory

LOCK = "lock"  # holds the flock, and the pid of the daemon that holds it


class BookError(Exception):
    """The state directory cannot be used; the message says why, in one line."""


STATE_DIR = Place(
    "the state directory",
    "--state-dir",
    "choose another --state-dir, or make it ours and private (chmod 700)",
)


@dataclass(frozen=True)
class LockedDirectory:
    """A state directory, checked and locked for the daemon's life."""

    fd: int | None  # the lock's descriptor; None: read-only, with no lock file to hold
    read_only: bool = False  # on a read-only filesystem: read, never written
    tightened: Tightened = field(
        default_factory=Tightened
    )  # what was open to others, and closed to them now
    open_mode: int | None = None  # read-only, and others may enter: its mode (not fixable)


def lock(directory: str) -> LockedDirectory:
    """Make the directory (mode 0700) if missing, or private if others may enter it or read a
    file of ours in it, and lock it (held for the daemon's life). BookError if any of this
    fails, or if someone else could have chosen where it leads or what is in it
    (config/trust.py). On a read-only filesystem, the same checks, and nothing is written."""
    try:
        check_path(directory, STATE_DIR)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            if exc.errno == errno.EROFS:  # not there, and cannot be made: nothing in it to read
                return LockedDirectory(None, read_only=True)
            raise BookError(
                f"cannot use the state directory {directory}: "
                f"{exc.strerror or exc}; choose another --state-dir"
            ) from None
        # Again: a link may have been slipped in meanwhile. Then whoever else may write there
        # could slip in a link for us to follow: refuse, as ssh does.
        check(directory, STATE_DIR)
    except Untrusted as exc:
        raise BookError(str(exc)) from None
    read_only = on_read_only(directory)
    tightened, open_mode = Tightened(), None
    if read_only:
        mode_now = os.stat(directory).st_mode & 0o7777
        open_mode = mode_now if open_to_others(mode_now) else None
    else:
        tightened = make_private(directory)
    mode = os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT
    try:
        fd = os.open(os.path.join(directory, LOCK), mode | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if read_only and exc.errno == errno.ENOENT:  # no lock file, and none can be made
            return LockedDirectory(None, read_only=True)
        raise BookError(
            f"cannot use the state directory {directory}: "
            f"{exc.strerror or exc}; choose another --state-dir"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        owner = _pid_in(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise BookError(
                f"another patroller{f' (pid {owner})' if owner else ''} uses the "
                f"state directory {directory}; stop it, or give this one "
                "another --state-dir"
            ) from None
        raise BookError(
            f"cannot lock the state directory {directory}: {exc.strerror or exc}"
        ) from None
    if read_only:
        return LockedDirectory(fd, read_only=True, open_mode=open_mode)
    try:  # the pid only names us to a second daemon: not worth failing for
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    return LockedDirectory(fd, tightened=tightened)


def make_private(directory: str) -> Tightened:
    """The directory 0700 and each file of ours in it 0600, through a descriptor of the
    directory itself (no link followed); BookError if it cannot be."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return tighten_directory(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise BookError(
            f"cannot make the state directory {directory} private: "
            f"{exc.strerror or exc}; make it ours and private (chmod 700), or "
            "choose another --state-dir"
        ) from None


def on_read_only(directory: str) -> bool:
    """Whether the directory is on a filesystem mounted read-only (a read-only bind mount
    too: statvfs says the mount's flags)."""
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _pid_in(fd: int) -> int | None:
    """The pid the lock file's holder wrote into it, if readable."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
