"""The places the daemon writes to and reads from on disk: the state directory (trusted as
config/trust.py says, writable, with room) and the lease book in it, and the Slurm job map.

`probe_*` functions read (blocking: the doctor runs them in the executor); `check_*` functions
are pure, over what they read."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from patroller.config import Config
from patroller.config.trust import Untrusted, check
from patroller.doctor.results import Result, degraded, failed, ok
from patroller.durations import describe
from patroller.observe.jobmap import JOB_MAP, read_map
from patroller.state import schema
from patroller.state.book import MAX_SIZE
from patroller.state.bookfiles import FILE
from patroller.state.directory import LOCK, STATE_DIR
from patroller.state.usage.files import FILE as USAGE_FILE

MIB = 1 << 20
NO_BOOK = "--state-dir none"


@dataclass(frozen=True)
class StateFacts:
    """The state directory as the daemon would meet it at start."""

    directory: str | None  # None: no book
    untrusted: tuple[str, str] | None = None  # why it may not be trusted, and what to do
    exists: bool = False
    made_in: str | None = None  # not there: the nearest folder that is, where it is made
    unwritable: str | None = None  # why a file cannot be made there (or the folder made)
    free_mib: int | None = None
    book: str | None = None  # what the lease book holds, in words; None: no book there yet
    bad_book: str | None = None  # why the book there cannot be read: set aside at start
    holder: int | None = None  # the pid of the daemon that holds the directory's lock


def probe_state(directory: str | None, proc: str = "/proc") -> StateFacts:
    """Trust, existence, a real write, free space, the book and the lock's holder."""
    if directory is None:
        return StateFacts(None)
    try:
        info = check(directory, STATE_DIR)
    except Untrusted as exc:
        return StateFacts(directory, untrusted=(exc.said, exc.fix))
    if info is None:
        folder = os.path.dirname(os.path.abspath(directory))
        while not os.path.isdir(folder) and folder != os.sep:
            folder = os.path.dirname(folder)
        return StateFacts(
            directory, made_in=folder, unwritable=_cannot_make(folder), free_mib=_free(folder)
        )
    probe = os.path.join(directory, f".doctor-{os.getpid()}-{time.monotonic_ns()}")
    unwritable = None
    try:
        fd = os.open(
            probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(fd, b"doctor\n")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        unwritable = exc.strerror or str(exc)
    book, bad = _book(os.path.join(directory, FILE))
    return StateFacts(
        directory,
        exists=True,
        unwritable=unwritable,
        free_mib=_free(directory),
        book=book,
        bad_book=bad,
        holder=_holder(os.path.join(directory, LOCK), proc),
    )


READ_ONLY = os.strerror(errno.EROFS)  # "Read-only file system": why a probe there failed


def _cannot_make(folder: str) -> str | None:
    """Why a directory cannot be made in `folder`, found as the daemon would find it: by
    making one (empty, private, removed at once). Permissions alone do not say it: root may
    write anywhere by them, and /proc or a full inode table still refuse (as found: the doctor
    called --state-dir /proc/nope degraded, where the daemon refuses it)."""
    probe = os.path.join(folder, f".doctor-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(probe, 0o700)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            return f"{folder} is not writable by uid {os.geteuid()}"
        return exc.strerror or str(exc)
    try:
        os.rmdir(probe)
    except OSError:
        pass
    return None


def _free(folder: str, statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> int | None:
    """MiB the daemon may still write under `folder`: the blocks available to a user that is
    not root (those reserved for root are not the daemon's to count on), or None."""
    try:
        found = statvfs(folder)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize // MIB


def _book(path: str) -> tuple:
    """(what the book holds, why it cannot be read): read as the daemon reads it at start."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SIZE + 1)
    except FileNotFoundError:
        return None, (f"{path} links to a missing file" if os.path.islink(path) else None)
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror or exc})"
    try:
        if len(data) > MAX_SIZE:
            raise ValueError(f"over {MAX_SIZE} bytes")
        book = schema.decode(data)
    except (ValueError, RecursionError) as exc:
        return None, f"{path} is not a lease book ({str(exc)[:200]})"
    devices = book.get("devices")
    held = len(devices) if isinstance(devices, dict) else 0
    saved = book.get("saved")
    age = f", saved {describe(time.time() - saved)} ago" if isinstance(saved, (int, float)) else ""
    return f"{held} device(s) held{age}", None


def _holder(lock: str, proc: str) -> int | None:
    """The pid holding the lock file's flock, from /proc/locks (nothing is locked here)."""
    try:
        info = os.stat(lock)
        with open(os.path.join(proc, "locks"), encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    where = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not the holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == where:
            return int(fields[4]) if fields[4].isdigit() else None
    return None


def check_state(facts: StateFacts, config: Config) -> Result:
    """The state directory: trusted, writable, with room."""
    name = "state directory"
    where = facts.directory
    if where is None:
        return degraded(
            name,
            f"none ({NO_BOOK}): reservations do not survive a restart",
            "give --state-dir (the default as root: /var/lib/patroller)",
        )
    if facts.untrusted is not None:
        return failed(name, *facts.untrusted)
    if facts.unwritable is not None:
        said = (
            f"{where} cannot be made in {facts.made_in}"
            if not facts.exists
            else f"{where} is not writable"
        )
        if facts.unwritable == READ_ONLY:  # the daemon starts, and keeps nothing there
            return degraded(
                name,
                f"{said}: {facts.unwritable}: the daemon reads the lease book "
                "at start and writes nothing there: reservations do not survive a "
                "restart, and no usage history is kept",
                "mount it read-write, or choose another --state-dir",
            )
        return failed(
            name,
            f"{said}: {facts.unwritable}",
            "choose another --state-dir, or make it writable (read-only mount? under "
            "systemd: StateDirectory=patroller)",
        )
    said = (
        f"{where} is writable"
        if facts.exists
        else f"{where} is not there yet: it is made (private) at start, in {facts.made_in}"
    )
    if facts.free_mib is not None:
        said += f", {facts.free_mib} MiB free"
        reserve = config.usage_reserve // MIB
        if config.usage == "sqlite" and config.usage_dir is None and facts.free_mib < reserve:
            return degraded(
                name,
                f"{said}: under the {reserve} MiB the usage store leaves "
                "for the lease book: the usage store does not write (its history "
                "waits in memory, a day at most, then is dropped)",
                "free some room: the usage history resumes by itself",
            )
        if facts.free_mib < config.doctor_min_free_mib:
            return degraded(
                name,
                f"{said}: under {config.doctor_min_free_mib} MiB",
                "free some room: a lease book that cannot be written stops every grant",
            )
    return ok(name, said)


def check_usage(config: Config) -> Result:
    """The usage store: where it is kept, or why it is not (the daemon warns of it at start)."""
    name = "usage history"
    directory = config.usage_dir or config.state_dir
    if config.usage == "none":
        return ok(name, "off (--usage none): none is kept; `patroller report` has nothing here")
    if directory is None:
        return degraded(
            name,
            f"--usage {config.usage}, but there is no state directory "
            f"({'test mode' if config.test else NO_BOOK}): no usage history is "
            "kept, and `patroller report` and GET /usage have nothing to report",
            "give --state-dir DIR (the lease book and the usage store), or "
            "--usage none to keep none",
        )
    return ok(
        name,
        f"{os.path.join(directory, USAGE_FILE)}: a sample of every GPU every "
        f"{describe(config.usage_interval)}, kept {config.usage_days} days",
    )


def check_book(facts: StateFacts) -> Result:
    """The lease book: readable, and who holds the directory."""
    name = "lease book"
    if facts.directory is None or not facts.exists or facts.untrusted is not None:
        return ok(
            name,
            "none yet: made at start"
            if facts.directory is not None and facts.untrusted is None
            else "none (see the state directory)",
        )
    held = (
        ""
        if facts.holder is None
        else "; this daemon holds its directory"
        if facts.holder == os.getpid()
        else f"; patroller pid {facts.holder} holds its directory (a second one there would not "
        "start)"
    )
    if facts.bad_book is not None:
        return degraded(
            name,
            f"{facts.bad_book}: it is set aside at start, and the "
            f"reservations in it are lost{held}",
            "look at it; the daemon renames it *.corrupt-<time> and starts empty",
        )
    return ok(name, (facts.book or f"no {FILE} yet: written at the first change") + held)


@dataclass(frozen=True)
class JobMapFacts:
    path: str | None
    untrusted: tuple[str, str] | None = None  # why it may not be trusted, and what to do
    exists: bool = False
    unreadable: str | None = None
    files: int = 0
    jobs: int = 0
    problems: int = 0
    first_problem: str = ""


def probe_job_map(path: str | None, limit: int) -> JobMapFacts:
    """Read the Slurm job map once, as the watch reads it."""
    if path is None:
        return JobMapFacts(None)
    try:
        check(path, JOB_MAP)
        reading = read_map(path, limit, lambda uid: None)
    except Untrusted as exc:
        return JobMapFacts(path, untrusted=(exc.said, exc.fix))
    except OSError as exc:
        return JobMapFacts(path, exists=True, unreadable=exc.strerror or str(exc))
    if not os.path.isdir(path):
        return JobMapFacts(path)
    problems = dict(reading.problems)
    jobs = sum(len(found) for found in reading.entries.values())
    first = next(iter(sorted(problems.items())), ("", ""))
    return JobMapFacts(
        path,
        exists=True,
        files=len(reading.entries),
        jobs=jobs,
        problems=len(problems) + len(reading.unread),
        first_problem=f"{first[0]} {first[1]}".strip(),
    )


def check_job_map(facts: JobMapFacts) -> Result:
    name = "Slurm job map"
    if facts.path is None:
        return ok(name, "not given (--slurm-job-map): no GPU is a Slurm job's")
    if facts.untrusted is not None:
        return failed(name, *facts.untrusted)
    if facts.unreadable is not None:
        return failed(
            name,
            f"{facts.path} cannot be read: {facts.unreadable}",
            "make it readable by the daemon's user (root's, mode 755, as "
            "contrib/slurm's prolog makes it)",
        )
    if not facts.exists:
        return degraded(
            name,
            f"{facts.path} is not there yet: no GPU is a job's until the prolog makes it",
            "check that slurm.conf runs contrib/slurm's prolog (docs/slurm.md)",
        )
    said = f"{facts.path}: {facts.files} file(s), {facts.jobs} job(s)"
    if facts.problems:
        return degraded(
            name,
            f"{said}; {facts.problems} file(s) not read as a map: {facts.first_problem}",
            "see docs/slurm.md for the files' format",
        )
    return ok(name, said)
