"""The Slurm job map: which jobs each GPU is allocated to, from the files a prolog writes.

The directory (`--slurm-job-map`) holds one file per allocated GPU, named by its index as
nvidia-smi numbers it (`2`), or `<index>.<GPU instance>` for a MIG device (its GPU counts as
allocated). Each line names one job: its id first, then, where the prolog wrote them,
`key=value` words (`uid=`, `user=`, `account=`, `partition=`, `sluid=`). A bare number after
the id is a uid, as some exporters' prologs write it. A file of bare ids is the format other
GPU exporters read, so one prolog can serve both. Names starting with a dot (a prolog's file
being written) and any other name are ignored; a line that names no job is skipped.

The map decides who holds a GPU, so it is trusted as the state directory is (config/trust.py):
owned by root or by the daemon's user, writable by nobody else, reached through no other user's
link. A map that is not is refused at start (exit status 1). One that stops being trusted while
the daemon runs is not read: the watch is failing, says why once, and keeps the allocations
it last read, as for a map that cannot be read (below).

Each file is read with care, and spoils itself alone: a link is never followed and anything not
a regular file (a FIFO, a device) is never read, both ignored; a file is read up to
`job_map_file_limit` bytes (the complete lines in them); one that cannot be read keeps the jobs
last read of it. Each such file is told of once, in one line for all that are new, until what
is wrong with it changes. What the map says is taken in known shapes only, never echoed as it
is: a job id is digits, or a SLUID (`s` and 13 of [0-9A-Z]); a uid digits; a user, an account
or a partition 1 to 64 of [0-9A-Za-z._@+$-]. A word of another shape is dropped, and a line
whose first word is no job id names no job.

The watch reads the directory every `job_map_every` seconds, off the event loop, and tells of
every device whose allocation changed (`scheduler_allocation`). A directory that is not there
holds no allocation (the prolog makes it at the first job). One that cannot be read keeps the
last allocations known, and the watch is failing until it reads again: a GPU a job holds is
never handed out because a read failed.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import pwd
import re
import stat
from collections.abc import Callable, Iterable
from typing import NamedTuple

from patroller.config import Config
from patroller.config.trust import Place, Untrusted, check, check_directory, check_path
from patroller.core.devices import Inventory
from patroller.core.jobs import Allocation, Job
from patroller.observe.allocwatch import AllocationWatch
from patroller.observe.signals import Signals

log = logging.getLogger(__name__)

_NAME = re.compile(r"([0-9]+)(?:\.([0-9]+))?")
_ID = re.compile(r"[0-9]{1,20}|s[0-9A-Z]{13}")  # a job id, or a SLUID
_UID = re.compile(r"[0-9]{1,10}")
_VALUE = re.compile(r"[0-9A-Za-z._@+$-]{1,64}")  # a user, an account, a partition
_SHAPES = {
    "uid": _UID,
    "user": _VALUE,
    "account": _VALUE,
    "partition": _VALUE,
    "sluid": re.compile(r"s[0-9A-Z]{13}"),
}
SHOWN = 5  # files or GPUs named in one warning; the others are counted
JOB_MAP = Place(
    "the Slurm job map",
    "--slurm-job-map",
    "make it root's and writable by root alone (chown root; chmod 755), as "
    "contrib/slurm's prolog makes it",
    root_may_own=True,
)

Allocations = dict[int, Allocation]  # GPU index -> its jobs
Jobs = tuple[Job, ...]


class Reading(NamedTuple):
    """What one reading of the map found."""

    entries: dict[str, Jobs]  # each file read, by name: its jobs
    unread: frozenset[str]  # files there that could not be read now: their last jobs stand
    problems: dict[str, str]  # each file ignored, read in part or not read: why

    @property
    def allocations(self) -> Allocations:
        return merge(self.entries)


def gpu_index(name: str) -> int | None:
    """The GPU a job map file is of (`3`, or `3.1` for a MIG device of GPU 3), or None."""
    found = _NAME.fullmatch(name)
    return int(found.group(1)) if found else None


def parse_line(line: str) -> Job | None:
    """One job from one line of a job map file, or None if the line names none."""
    words = line.split()
    if not words or not _ID.fullmatch(words[0]):
        return None
    facts: dict[str, str] = {}
    for n, word in enumerate(words[1:]):
        key, equals, value = word.partition("=")
        if equals and key in _SHAPES:
            if _SHAPES[key].fullmatch(value):
                facts.setdefault(key, value)
        elif n == 0 and _UID.fullmatch(word):
            facts.setdefault("uid", word)
    uid = facts.get("uid")
    return Job(
        id=words[0],
        uid=int(uid) if uid is not None else None,
        user=facts.get("user"),
        account=facts.get("account"),
        partition=facts.get("partition"),
        sluid=facts.get("sluid"),
    )


def jobs_in(text: str) -> Jobs:
    """The jobs one file names, each once, in order."""
    found: dict[str, Job] = {}
    for line in text.splitlines():
        job = parse_line(line)
        if job is not None:
            found.setdefault(job.id, job)
    return tuple(found.values())


def merge(entries: dict[str, Jobs]) -> Allocations:
    """The allocations that the files' jobs (by file name) make, by GPU index: each job once,
    in the order of the files' names."""
    jobs: dict[int, dict[str, Job]] = {}
    for name in sorted(entries):
        index = gpu_index(name)
        if index is None:
            continue
        for job in entries[name]:
            jobs.setdefault(index, {}).setdefault(job.id, job)
    return {index: Allocation(tuple(found.values())) for index, found in jobs.items() if found}


def parse_files(files: list[tuple[str, str]]) -> Allocations:
    """The allocations that files (name, text) say, by GPU index: each job once, in order."""
    return merge({name: jobs_in(text) for name, text in files})


def check_map(path: str) -> None:
    """Blocking: Untrusted if the map, or the path to it, is not to be trusted (a map not there
    yet is checked once it is)."""
    check(path, JOB_MAP)


def read_map(path: str, limit: int, user_of: Callable[[int], str | None]) -> Reading:
    """Blocking: what the directory's files say, with users named from uids where the map gives
    a uid only. None there: nothing. Untrusted if it is not to be trusted (then nothing in it is
    read), OSError if it cannot be read."""
    check_path(path, JOB_MAP)
    try:
        directory = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Reading({}, frozenset(), {})
    try:
        check_directory(os.fstat(directory), path, JOB_MAP)
        entries: dict[str, Jobs] = {}
        unread: set[str] = set()
        problems: dict[str, str] = {}
        users: dict[int, str | None] = {}
        for name in os.listdir(directory):
            if name.startswith(".") or gpu_index(name) is None:
                continue
            try:
                text, problem = read_file(directory, name, limit)
            except OSError as exc:
                unread.add(name)
                problems[name] = f"cannot be read: {exc.strerror or exc}"
                continue
            if problem is not None:
                problems[name] = problem
            if text is not None:
                entries[name] = named(jobs_in(text), users, user_of)
        # Still trusted after the reading: nobody else could have written what was read.
        check_directory(os.fstat(directory), path, JOB_MAP)
    finally:
        os.close(directory)
    return Reading(entries, frozenset(unread), problems)


def read_file(directory: int, name: str, limit: int) -> tuple[str | None, str | None]:
    """Blocking: the text of one file of the map (`directory`: the map's descriptor), and why
    it is not read whole, if so. (None, why): not a file of the map (a link, never followed,
    or not a regular file, never read); (None, None): gone meanwhile. OSError if it cannot be
    read."""
    try:
        info = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:  # removed by an epilog since the listing
        return None, None
    if not stat.S_ISREG(info.st_mode):
        return None, kind(info.st_mode)
    try:  # no link followed, no FIFO waited for: one may have been put there since the stat
        fd = os.open(
            name,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
            dir_fd=directory,
        )
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link now
            return None, kind(stat.S_IFLNK)
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, kind(info.st_mode)
        data = read_at_most(fd, limit + 1)
    finally:
        os.close(fd)
    problem = None
    if len(data) > limit:  # only its complete lines within the limit
        data = data[: data.rfind(b"\n", 0, limit) + 1]
        problem = f"over {limit} bytes: the lines past them are not read"
    return data.decode("utf-8", "replace"), problem


def read_at_most(fd: int, size: int) -> bytes:
    """Blocking: up to `size` bytes of a file, from its start."""
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 65536))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def kind(mode: int) -> str:
    """Why an entry that is not a regular file is not read."""
    if stat.S_ISLNK(mode):
        return "a link: not followed"
    if stat.S_ISFIFO(mode):
        return "a FIFO: not read"
    if stat.S_ISDIR(mode):
        return "a directory: not read"
    return "not a regular file: not read"


def named(jobs: Jobs, users: dict[int, str | None], user_of: Callable[[int], str | None]) -> Jobs:
    """The jobs, each whose map gives a uid and no user named by the uid (`users`: the names
    already looked up)."""

    def user(uid: int) -> str | None:
        if uid not in users:
            users[uid] = user_of(uid)
        return users[uid]

    return tuple(
        job
        if job.user is not None or job.uid is None
        else Job(job.id, job.uid, user(job.uid), job.account, job.partition, job.sluid)
        for job in jobs
    )


def account_name(uid: int) -> str | None:
    """Blocking: the host account of `uid`, or None."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def listed(items: Iterable[str]) -> str:
    """The first SHOWN of `items`, and how many more."""
    items = list(items)
    more = f", and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


class JobMapWatch(AllocationWatch):
    """Reads the job map and tells of each device whose allocation changed (see above)."""

    name = "slurm_job_map"
    source = "slurm"

    def __init__(self, inventory: Inventory, signals: Signals, config: Config) -> None:
        assert config.slurm_job_map is not None
        super().__init__(
            inventory, signals, config.job_map_every, f"the Slurm job map {config.slurm_job_map}"
        )
        self.path = config.slurm_job_map
        self.limit = config.job_map_file_limit
        self._unknown: set[int] = set()  # indices named in the map that no device has: told once
        self._entries: dict[str, Jobs] = {}  # the jobs last read of each file
        self._problems: dict[str, str] = {}  # files told of, and why: told again if it changes
        self._distrust: str | None = None  # why the map is not trusted now, as told

    def start(self) -> None:
        if not os.path.isdir(self.path):
            log.info(
                "the Slurm job map %s is not there yet: no GPU is allocated to a job "
                "until the prolog writes it",
                self.path,
            )
        super().start()

    def apply(self, found: Allocations) -> None:
        """Tell of every device whose allocation is not what was last told: indices are
        matched to devices afresh each time, so a renumbered host needs nothing more."""
        by_index = {d.number: d.uuid for d in self.inventory if not d.lost}
        unknown = set(found) - set(by_index)
        if unknown - self._unknown:
            log.warning(
                "the Slurm job map names GPU(s) %s, which this host does not have: "
                "ignored (are Slurm's GRES indices nvidia-smi's?)",
                listed(str(i) for i in sorted(unknown - self._unknown)),
            )
        self._unknown = unknown
        self.tell({by_index[i]: a for i, a in found.items() if i in by_index})

    def report(self, problems: dict[str, str]) -> None:
        """Warn of the files newly ignored, read in part or not read, in one line."""
        new = sorted(
            (name for name, why in problems.items() if self._problems.get(name) != why),
            key=lambda n: (gpu_index(n), n),
        )
        self._problems = problems
        if new:
            log.warning(
                "%s: %d file(s) ignored or not read whole: %s",
                self.what,
                len(new),
                listed(f"{name} ({problems[name]})" for name in new),
            )

    async def read(self) -> None:
        """Read the map now, and tell of what changed."""
        loop = asyncio.get_running_loop()
        try:
            found = await loop.run_in_executor(None, read_map, self.path, self.limit, account_name)
        except Untrusted as exc:
            self.failed(f"not trusted: {exc}", anew=str(exc) != self._distrust)
            self._distrust = str(exc)
            return
        except OSError as exc:
            self._distrust = None
            self.failed(exc.strerror or exc)
            return
        self._distrust = None
        self.read_well()
        self.report(found.problems)
        entries = dict(found.entries)
        for name in found.unread & set(self._entries):  # what could not be read stands
            entries[name] = self._entries[name]
        self._entries = entries
        self.apply(merge(entries))
