"""Whether a directory the command line names may be trusted with what the daemon does there:
the lease book's (--state-dir), where it renames and removes files, and the Slurm job map's
(--slurm-job-map), whose word decides who holds a GPU.

As ssh refuses a key file others may write, a directory is refused when someone other than
root or the daemon's own user could have chosen what is in it, or where its path leads:

- a link on its path (any part of it) that another user made: it could lead anywhere (root's
  links and our own are trusted: only root or we could have made them);
- a parent that others may write to without the sticky bit: they could replace it at any time;
- the directory itself owned by another user, or writable by its group or by others: they
  could put in it what they like, a link to a secret among it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass


class Untrusted(Exception):
    """The directory cannot be trusted, or its path cannot be looked at: `said` what is wrong,
    `fix` what to do (each may hold a `; `: a path, `chown root; chmod 755`); the message is
    both, in one line."""

    def __init__(self, said: str, fix: str) -> None:
        super().__init__(f"{said}; {fix}")
        self.said = said
        self.fix = fix


@dataclass(frozen=True)
class Place:
    """What a directory is for, in the words of its messages."""

    what: str  # "the state directory", "the Slurm job map"
    flag: str  # "--state-dir"
    fix: str  # how to make it right: "make it ours and private (chmod 700)"
    root_may_own: bool = False  # root may own it as well as the daemon's own user

    def owners(self) -> frozenset[int]:
        """The uids that may own the directory."""
        return frozenset({os.geteuid()} | ({0} if self.root_may_own else set()))


def check_path(directory: str, place: Place) -> None:
    """Untrusted if another user could have chosen where the directory's path leads: a link
    they made (any part of the path), or a parent they may write to that is not sticky. What
    is missing of the path is not looked at (whoever makes it, the directory is checked once
    there: `check_directory`)."""
    path = os.path.abspath(directory)
    current = os.sep
    for part in path.split(os.sep)[1:]:
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            break
        except OSError as exc:
            raise Untrusted(
                f"cannot use {place.what} {directory}: {exc.strerror or exc}",
                f"choose another {place.flag}",
            ) from None
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (0, os.geteuid()):
            raise Untrusted(
                f"{place.what} {directory} is reached through {current}, a link "
                f"another user (uid {info.st_uid}) made",
                f"choose another {place.flag}",
            )
    try:
        around = os.stat(os.path.dirname(path))
    except OSError:
        return  # not there yet: whoever makes it, the directory is checked once there
    if around.st_mode & 0o022 and not around.st_mode & stat.S_ISVTX:
        raise Untrusted(
            f"{place.what} {directory} is in {os.path.dirname(path)}, which others "
            f"may write to (mode {around.st_mode & 0o7777:o}, not sticky)",
            f"choose a {place.flag} in a directory only its owner writes to",
        )


def check_directory(info: os.stat_result, directory: str, place: Place) -> None:
    """Untrusted unless the directory (`info`: its stat, or better its open descriptor's)
    belongs to one of its owners and neither its group nor others may write to it."""
    if not stat.S_ISDIR(info.st_mode):
        raise Untrusted(f"{place.what} {directory} is not a directory", place.fix)
    others = info.st_mode & 0o022
    if info.st_uid in place.owners() and not others:
        return
    whose = "not ours" if not place.root_may_own else "not root's or ours"
    raise Untrusted(
        f"{place.what} {directory} is {'writable by others' if others else whose} "
        f"(mode {info.st_mode & 0o7777:o}, uid {info.st_uid})",
        place.fix,
    )


def check(directory: str, place: Place) -> os.stat_result | None:
    """Both checks, on the directory as it is now: its stat, or None if it is not there (yet).
    Untrusted if either fails."""
    check_path(directory, place)
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Untrusted(
            f"cannot use {place.what} {directory}: {exc.strerror or exc}",
            f"choose another {place.flag}",
        ) from None
    check_directory(info, directory, place)
    return info
