"""Everything the daemon writes is for its own user alone: each file 0600 and its own
directories 0700, whatever the umask and whatever mode a directory came with.

The usage history, the audit record and the lease book name every user, account, job and pod;
with --hide-users a copy that any local user can read would undo the pseudonyms, and a store
that others can open read-only lets them hold its locks and stall every write of the history.
A mode is asked for when a file is made (`create`), and a file or directory found open to
others is closed to them (`tighten`, `tighten_directory`): a state directory made by an older
version, or by systemd's StateDirectory= without a mode (0755), is made private at start.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
OTHERS = 0o077  # the bits of the group's and everyone else's access


def open_to_others(mode: int) -> bool:
    """Whether a file's or directory's mode lets anyone but its owner in (read, write or, for a
    directory, enter)."""
    return bool(mode & OTHERS)


def create(path: str, flags: int = os.O_WRONLY) -> int:
    """A descriptor of the file at `path`, made 0600 if missing, and made 0600 if it is there
    and ours but open to others (a file of an older version). The caller closes it."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        _close_to_others(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def touch(path: str) -> None:
    """Make the file at `path` private as `create` does, before a library that opens it with
    the umask's mode (SQLite) makes it; SQLite gives its -wal and -shm the main file's mode."""
    os.close(create(path, os.O_RDONLY | os.O_NOFOLLOW))


def replace(path: str, data: bytes | Iterable[bytes]) -> None:
    """Write `data` (bytes, or its parts one after another: a large file never whole in
    memory) as the whole file at `path`, private, at once: a temporary file beside it (0600),
    synced, then renamed over it; a reader sees the old file or the new, never a part.
    OSError if it cannot be written (the temporary file is removed)."""
    fresh = f"{path}.tmp-{os.getpid()}"
    fd = create(fresh, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in (data,) if isinstance(data, bytes) else data:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(fresh, path)
    except OSError:
        try:
            os.unlink(fresh)
        except OSError:
            pass
        raise


def tighten(path: str) -> bool:
    """Make a regular file of ours at `path` 0600 if it is open to others; True if it was.
    A link, anything but a regular file, a file of another user, or one that is gone is left
    as it is."""
    try:
        fd = os.open(
            path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        )
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return False
        return _close_to_others(fd)
    finally:
        os.close(fd)


@dataclass
class Tightened:
    """What `tighten_directory` closed to others: the directory's mode before (None: it was
    private already) and the names of the files."""

    directory_mode: int | None = None
    files: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.directory_mode is not None or bool(self.files)

    def words(self, directory: str) -> str:
        """`state directory /x was mode 755, and 2 file(s) in it (usage.sqlite3, ...)`."""
        said = []
        if self.directory_mode is not None:
            said.append(f"{directory} was mode {self.directory_mode:o}")
        if self.files:
            names = ", ".join(sorted(self.files)[:5]) + (", ..." if len(self.files) > 5 else "")
            said.append(f"{len(self.files)} file(s) in it were open to others ({names})")
        return "; ".join(said)


def tighten_directory(fd: int) -> Tightened:
    """Make the directory open at `fd` (ours: checked by the caller) 0700 and each regular
    file of ours in it 0600, where they are open to others. Its subdirectories are not
    entered: the daemon makes none."""
    done = Tightened()
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if open_to_others(mode):
        os.fchmod(fd, DIRECTORY_MODE)
        done.directory_mode = mode
    for name in os.listdir(fd):
        try:
            child = os.open(
                name,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                dir_fd=fd,
            )
        except OSError:  # a link, a socket, gone meanwhile: not a file we wrote
            continue
        try:
            if stat.S_ISREG(os.fstat(child).st_mode) and _close_to_others(child):
                done.files.append(name)
        finally:
            os.close(child)
    return done


def _close_to_others(fd: int) -> bool:
    """fchmod the open file 0600 if it is ours and open to others; True if it was changed."""
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or not open_to_others(info.st_mode):
        return False
    os.fchmod(fd, FILE_MODE)
    return True
