"""The Slurm job map: which jobs each GPU is allocated to, from the files a prolog writes.

The directory (`--slurm-job-map`) holds one file per allocated GPU, named by its index as
nvidia-smi numbers it (`2`), or `<index>.<GPU instance>` for a MIG device (its GPU counts as
allocated). Each line names one job: its id first, then, where the prolog wrote them,
`key=value` words (`uid=`, `user=`, `account=`, `partition=`, `sluid=`). A bare number after
the id is a uid, as some exporters' prologs write it. A file of bare ids is the format other
GPU exporters read, so one prolog can serve both. Names starting with a dot (a prolog's file
being written) and any other name are ignored; a line that names no job is skipped.

The watch reads the directory every `job_map_every` seconds, off the event loop, and tells of
every device whose allocation changed (`job_allocation`). A directory that is not there holds
no allocation (the prolog makes it at the first job). One that cannot be read keeps the last
allocations known, and the watch is failing until it reads again: a GPU a job holds is never
handed out because a read failed.
"""
from __future__ import annotations

import asyncio
import logging
import os
import pwd
import re
from typing import Callable, Dict, List, Optional, Set, Tuple

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.core.jobs import Allocation, Job
from patroller.observe.allocwatch import AllocationWatch
from patroller.observe.signals import Signals

log = logging.getLogger(__name__)

_NAME = re.compile(r"^([0-9]+)(?:\.([0-9]+))?$")
_ID = re.compile(r"^[0-9A-Za-z_.]{1,64}$")
_WORD = re.compile(r"^(uid|user|account|partition|sluid)=(.{1,128})$")

Allocations = Dict[int, Allocation]  # GPU index -> its jobs


def gpu_index(name: str) -> Optional[int]:
    """The GPU a job map file is of (`3`, or `3.1` for a MIG device of GPU 3), or None."""
    found = _NAME.match(name)
    return int(found.group(1)) if found else None


def parse_line(line: str) -> Optional[Job]:
    """One job from one line of a job map file, or None if the line names none."""
    words = line.split()
    if not words or not _ID.match(words[0]):
        return None
    facts: Dict[str, str] = {}
    for n, word in enumerate(words[1:]):
        found = _WORD.match(word)
        if found:
            facts.setdefault(found.group(1), found.group(2))
        elif n == 0 and word.isdigit():
            facts.setdefault("uid", word)
    uid = facts.get("uid")
    return Job(id=words[0], uid=int(uid) if uid and uid.isdigit() else None,
               user=facts.get("user"), account=facts.get("account"),
               partition=facts.get("partition"), sluid=facts.get("sluid"))


def parse_files(files: List[Tuple[str, str]]) -> Allocations:
    """The allocations that files (name, text) say, by GPU index: each job once, in order."""
    jobs: Dict[int, Dict[str, Job]] = {}
    for name, text in sorted(files):
        index = gpu_index(name)
        if index is None:
            continue
        for line in text.splitlines():
            job = parse_line(line)
            if job is not None:
                jobs.setdefault(index, {}).setdefault(job.id, job)
    return {index: Allocation(tuple(found.values())) for index, found in jobs.items() if found}


def read_map(path: str, limit: int,
             user_of: Callable[[int], Optional[str]]) -> Allocations:
    """Blocking: the allocations in the directory, with users named from uids where the map
    gives a uid only. None there: none. OSError if it cannot be read."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return {}
    files = []
    for name in names:
        if name.startswith(".") or gpu_index(name) is None:
            continue
        try:
            with open(os.path.join(path, name), encoding="utf-8", errors="replace") as f:
                files.append((name, f.read(limit)))
        except FileNotFoundError:  # removed by an epilog since the listing
            continue
        except IsADirectoryError:
            continue
    found = parse_files(files)
    return {index: Allocation(tuple(
        job if job.user is not None or job.uid is None else Job(
            job.id, job.uid, user_of(job.uid), job.account, job.partition, job.sluid)
        for job in allocation.jobs)) for index, allocation in found.items()}


def account_name(uid: int) -> Optional[str]:
    """Blocking: the host account of `uid`, or None."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


class JobMapWatch(AllocationWatch):
    """Reads the job map and tells of each device whose allocation changed (see above)."""

    name = "slurm_job_map"
    source = "slurm"

    def __init__(self, inventory: Inventory, signals: Signals, config: Config) -> None:
        assert config.slurm_job_map is not None
        super().__init__(inventory, signals, config.job_map_every,
                         f"the Slurm job map {config.slurm_job_map}")
        self.path = config.slurm_job_map
        self.limit = config.job_map_file_limit
        self._unknown: Set[int] = set()  # indices named in the map that no device has: told once

    def start(self) -> None:
        if not os.path.isdir(self.path):
            log.info("the Slurm job map %s is not there yet: no GPU is allocated to a job "
                     "until the prolog writes it", self.path)
        super().start()

    def apply(self, found: Allocations) -> None:
        """Tell of every device whose allocation is not what was last told: indices are
        matched to devices afresh each time, so a renumbered host needs nothing more."""
        by_index = {d.number: d.uuid for d in self.inventory if not d.lost}
        for index in sorted(set(found) - set(by_index) - self._unknown):
            log.warning("the Slurm job map names GPU %d, which this host does not have: "
                        "ignored (are Slurm's GRES indices nvidia-smi's?)", index)
        self._unknown = set(found) - set(by_index)
        self.tell({by_index[i]: a for i, a in found.items() if i in by_index})

    async def read(self) -> None:
        """Read the map now, and tell of what changed."""
        loop = asyncio.get_running_loop()
        try:
            found = await loop.run_in_executor(None, read_map, self.path, self.limit,
                                               account_name)
        except OSError as exc:
            self.failed(exc.strerror or exc)
            return
        self.read_well()
        self.apply(found)
