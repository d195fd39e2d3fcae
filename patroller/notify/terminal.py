"""Notices on the users' own terminals (--notify-terminal), as `write` writes a message: a
trespass or an ending hold, in plain text, on every terminal where the user it concerns is
logged in and accepts messages.

A user's terminals are found as `write` finds them: her logins in utmp (utmp.py), each line a
name under /dev that stays under /dev (no `..`, not absolute), whose device is a character
device owned by her uid (her name looked up in the local accounts: a name that is not one has
no terminal) and writable by its group (`mesg y`). The terminal is opened write-only,
non-blocking, never as a controlling terminal and never through a symlink, and checked again
once open (the same device, still hers): a terminal whose output is held up (a stalled
connection, ^S) gets what fits, never a wait. The text is made plain: every escape sequence and
control character is removed, lines are wrapped, and the whole is bounded (Config). Which
notices, at what rate, honouring the user's mute, is the notifier's (notifier.py); this is one
more destination, with its thread and queue (delivery.py), that users cannot add themselves."""

from __future__ import annotations

import errno
import logging
import os
import pwd
import re
import stat
import textwrap
import time
from collections.abc import Callable

from patroller.config import Config
from patroller.notify.delivery import FAILED, SENT, Counts, Destination, Item, Outcome
from patroller.notify.messages import Notice
from patroller.notify.utmp import logins, read

log = logging.getLogger(__name__)

TERMINAL = "terminal"  # the destination's name, and the kind a user mutes to turn it off
KINDS = ("trespass", "expiring")  # what is written on a terminal
NO_TERMINAL = "no_terminal"  # a result: the user has no terminal that accepts messages
DEV = "/dev"

# An escape sequence: CSI (ESC [ or the one-byte CSI), OSC, DCS, SOS, PM and APC strings up to
# their terminator (BEL or ST), or ESC and one more character.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])"  # a string's start,
    r"[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"  # up to its end
    r"|\x1b.?",
    re.DOTALL,
)


def plain(text: str) -> str:
    """`text` with escape sequences and control characters removed, a tab made a space; line
    feeds are kept (a carriage return is not: it would let a line overwrite another)."""
    text = _ESCAPES.sub("", text).replace("\t", " ")
    return "".join(c for c in text if c == "\n" or c.isprintable())


def message(notice: Notice, host: str, at: float, config: Config) -> bytes:
    """What is written on a terminal: a header as `write` prints one, the notice's title and
    body made plain and wrapped, and how to turn it off; at most `notify_terminal_lines` lines
    and `notify_terminal_bytes` bytes, in UTF-8, lines ended with CR LF."""
    width = config.notify_terminal_width
    header = (
        f"Message from patroller@{plain(host)[:64]} at "
        f"{time.strftime('%H:%M UTC', time.gmtime(at))} ..."
    )
    lines = [header, ""]
    for paragraph in (plain(notice.title), *plain(notice.body).split("\n")):
        lines.extend(textwrap.wrap(paragraph, width, break_on_hyphens=False) or [""])
    footer = "(patroller notify mute terminal: no more of these)"
    most = max(1, config.notify_terminal_lines - 1)
    if len(lines) > most:
        lines = lines[: most - 1] + ["..."]
    text = "\r\n".join(["", *lines, footer, ""])
    data = text.encode("utf-8")
    if len(data) > config.notify_terminal_bytes:
        cut = data[: config.notify_terminal_bytes - 7].decode("utf-8", "ignore").rstrip("\r")
        data = (cut + "...\r\n").encode("utf-8")
    return data


def usable_line(line: str) -> bool:
    """Whether a record's line names a file under /dev: not empty, not absolute, no `..`."""
    return (
        bool(line)
        and not line.startswith("/")
        and ".." not in line.split("/")
        and all(c.isprintable() and not c.isspace() for c in line)
    )


def terminals_of(user: str, data: bytes, most: int, dev: str = DEV) -> tuple[int, list[str]]:
    """`user`'s uid and her terminals in utmp's bytes that accept messages (at most `most`,
    each once), as paths; (-1, []) for a name that is no local account."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except (KeyError, UnicodeEncodeError, ValueError):
        return -1, []
    found: list[str] = []
    for login in logins(data):
        if login.user != user or not usable_line(login.line):
            continue
        path = os.path.join(dev, login.line)
        if path in found:
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if accepts(info, uid):
            found.append(path)
            if len(found) >= most:
                break
    return uid, found


def accepts(info: os.stat_result, uid: int) -> bool:
    """A character device of `uid`'s that takes messages (group-writable: `mesg y`)."""
    return stat.S_ISCHR(info.st_mode) and info.st_uid == uid and bool(info.st_mode & stat.S_IWGRP)


def write_on(path: str, uid: int, data: bytes) -> bool:
    """Write `data` on the terminal at `path` if it is still `uid`'s and accepts messages,
    without waiting: whether all of it went (a terminal that takes less gets what fits)."""
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        )
    except OSError:
        return False
    try:
        if not accepts(os.fstat(fd), uid):  # changed since it was looked at
            return False
        done = 0
        while done < len(data):
            try:
                written = os.write(fd, data[done:])
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    log.debug("a terminal could not be written", exc_info=True)
                return False
            if written <= 0:
                return False
            done += written
        return True
    finally:
        os.close(fd)


class Terminals(Destination):
    """The users' terminals, as one destination: one thread and queue for every user's
    (writing never waits, so a terminal nobody reads holds up no other), each notice written
    once, on each of the recipient's terminals. Its result: sent (at least one terminal took
    it whole), no_terminal (none accepts messages), failed (none took it whole)."""

    def __init__(
        self,
        config: Config,
        host: str,
        told: Callable[[Outcome], None],
        counts: Counts,
        clock: Callable[[], float] = time.time,
        dev: str = DEV,
    ) -> None:
        super().__init__(
            0, lambda title, body: False, TERMINAL, config, told, counts, key=TERMINAL
        )
        self._thread.name = "notify-terminal"
        self.host = host
        self.clock = clock
        self.dev = dev

    def _deliver(self, item: Item) -> None:
        result = self.deliver(item.notice, item.recipient)
        self.counts.add(item.notice.kind, result)
        self.told(Outcome(item.notice, item.recipient, TERMINAL, result, 1, TERMINAL))

    def deliver(self, notice: Notice, user: str) -> str:
        """Blocking (a file read, a few writes that never wait): the result for `user`."""
        try:
            data = read(self.config.notify_utmp, self.config.notify_utmp_bytes)
        except OSError as exc:
            log.debug("the login records cannot be read: %s", exc)
            return NO_TERMINAL
        uid, paths = terminals_of(user, data, self.config.notify_terminal_most, self.dev)
        if not paths:
            return NO_TERMINAL
        text = message(notice, self.host, self.clock(), self.config)
        taken = sum(write_on(path, uid, text) for path in paths)
        return SENT if taken else FAILED


def utmp_problem(config: Config) -> str | None:
    """Why the login records cannot be read, or None (blocking: the doctor's probe)."""
    try:
        read(config.notify_utmp, 1)
    except OSError as exc:
        return f"{config.notify_utmp} cannot be read ({exc.strerror or exc})"
    return None
