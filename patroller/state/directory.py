"""The lease book's directory: made private, checked to be where it was meant to be, and
locked for the daemon's life (one daemon, one book).

Whoever else may write there, or could have put a link in its path, could make the daemon
rename or remove files elsewhere: such a directory is refused, as ssh refuses a key file others
may write.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import Optional

LOCK = "lock"  # holds the flock, and the pid of the daemon that holds it


class BookError(Exception):
    """The state directory cannot be used; the message says why, in one line."""


def lock(directory: str) -> int:
    """Make the directory (mode 0700) if missing and lock it; the lock's descriptor (held for
    the daemon's life). BookError if either fails, or if someone else could have chosen where
    it leads (see `check_path`)."""
    check_path(directory)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        check_path(directory)  # again: a link may have been slipped in meanwhile
        found = os.stat(directory)
    except OSError as exc:
        raise BookError(f"cannot use the state directory {directory}: "
                        f"{exc.strerror or exc}; choose another --state-dir") from None
    # Whoever else may write there could slip in a link for us to follow: refuse, as ssh does.
    if found.st_uid != os.geteuid() or found.st_mode & 0o022:
        raise BookError(f"the state directory {directory} is "
                        f"{'writable by others' if found.st_mode & 0o022 else 'not ours'} "
                        f"(mode {found.st_mode & 0o7777:o}, uid {found.st_uid}); choose "
                        "another --state-dir, or make it ours and private (chmod 700)")
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


def check_path(directory: str) -> None:
    """Refuse a directory another user could have chosen where it leads: one reached
    through a link that user made (any part of the path; root's and our own links are
    trusted), or one whose parent others may write to without the sticky bit (they could
    replace it at any time). The book renames and removes files in it: it must be where we
    meant. Checked before the directory is made and again after."""
    path = os.path.abspath(directory)
    current = os.sep
    for part in path.split(os.sep)[1:]:
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            break  # what is missing, we make
        except OSError as exc:
            raise BookError(f"cannot use the state directory {directory}: "
                            f"{exc.strerror or exc}; choose another --state-dir") from None
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (0, os.geteuid()):
            raise BookError(f"the state directory {directory} is reached through "
                            f"{current}, a link another user (uid {info.st_uid}) made; "
                            "choose another --state-dir")
    try:
        around = os.stat(os.path.dirname(path))
    except OSError:
        return  # not there yet: makedirs makes it, ours
    if around.st_mode & 0o022 and not around.st_mode & stat.S_ISVTX:
        raise BookError(f"the state directory {directory} is in "
                        f"{os.path.dirname(path)}, which others may write to (mode "
                        f"{around.st_mode & 0o7777:o}, not sticky); choose a --state-dir "
                        "in a directory only its owner writes to")


def _pid_in(fd: int) -> Optional[int]:
    """The pid the lock file's holder wrote into it, if readable."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
