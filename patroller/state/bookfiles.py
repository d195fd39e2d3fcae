"""The lease book's files: each write whole or not at all, what a killed daemon left behind
tidied away at start, and a file that cannot be restored set aside.

A write is a new file `leases-N.json`, then the link `leases.json` swung over to it with a
rename, then the previous file removed (why a link rather than a temporary renamed over the
file: book.py). Every file is created 0600 in the book's private directory.
"""

from __future__ import annotations

import contextlib
import os
import re

FILE = "leases.json"  # a link to the newest leases-N.json (a plain file is read as well)
DATA = re.compile(r"leases-(\d+)\.json")


class LinkedFiles:
    """The numbered files of one book's directory and the link to the newest."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, FILE)
        self._current: str | None = None  # the leases-N.json that FILE links to
        self._next = 1  # N of the next file

    def publish(self, body: bytes) -> None:
        """Put `body` in a new file, swing the link to it, remove the previous one; OSError
        if it could not be done (the link then names what it named)."""
        name = self._create(body)
        link = self.path + ".tmp"
        try:
            try:
                os.symlink(name, link)
            except FileExistsError:  # left by a daemon killed at that very moment
                os.unlink(link)
                os.symlink(name, link)
            os.replace(link, self.path)
        except OSError:
            remove(os.path.join(self.directory, name))
            raise
        if self._current is not None:
            remove(os.path.join(self.directory, self._current))
        self._current = name

    def _create(self, body: bytes) -> str:
        """A new leases-N.json holding `body`; its name."""
        while True:
            name = f"leases-{self._next}.json"
            self._next += 1
            try:
                fd = os.open(
                    os.path.join(self.directory, name),
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                    0o600,
                )
            except FileExistsError:  # left by a daemon killed between writing and linking
                continue
            try:
                view = memoryview(body)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                os.close(fd)
                remove(os.path.join(self.directory, name))
                raise
            os.close(fd)
            return name

    def tidy(self) -> None:
        """Remove what a killed daemon may have left: files the link does not name, the new
        link."""
        try:
            target = os.readlink(self.path) if os.path.islink(self.path) else None
            names = os.listdir(self.directory)
        except OSError:
            return
        if target is not None and DATA.fullmatch(target):
            self._current = target
        for name in names:
            found = DATA.fullmatch(name)
            if found:
                self._next = max(self._next, int(found.group(1)) + 1)
                if name != self._current:
                    remove(os.path.join(self.directory, name))
        remove(self.path + ".tmp")

    def set_aside(self, stamp: str) -> str:
        """Rename the book (the file the link names, and drop the link) to a name of its own,
        `<path>.corrupt-<stamp>[-n]`, kept for a look; that name. OSError if it cannot be."""
        aside = f"{self.path}.corrupt-{stamp}"
        n = 1
        while os.path.lexists(aside):
            n += 1
            aside = f"{self.path}.corrupt-{stamp}-{n}"
        target = os.readlink(self.path) if os.path.islink(self.path) else ""
        if DATA.fullmatch(target) and os.path.exists(self.path):
            os.rename(os.path.join(self.directory, target), aside)  # the file, not the link
            os.unlink(self.path)
        else:
            os.rename(self.path, aside)
        return aside


def remove(path: str) -> None:
    """Remove a file if it is there; a failure leaves a stray that the next start removes."""
    with contextlib.suppress(OSError):
        os.unlink(path)
