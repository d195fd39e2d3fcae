"""The compute-apps cross-check: processes on devices where pmon cannot attribute any.

In MIG mode pmon gives no per-process attribution, and some GPUs and drivers print only `-`
rows while processes run: by pmon alone such a device looks free while people compute on it.
For those devices (the `candidates`, which the daemon works out: MIG-enabled devices, and
devices that dmon shows busy while pmon lists no process) this monitor runs
`nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name` and announces what it
lists as processes, with the same signals as pmon (process_started, process_ended, and
process_sampled with each process's used memory as `fb`).

Why only for candidates, and slowly: a single nvidia-smi query has been measured at 7-15 s on
a large host (shared/NVIDIA-SMI.md, Cost), against a stream that costs nothing per sample. So
the query runs every `interval` seconds (10 by default) and only while some device is a
candidate or a process it announced is still listed; never two at once, never on the event
loop, and a run that takes longer than `timeout` is killed.

The delay it adds: a process on a candidate device is announced, and reported gone, up to
`interval` plus the query's own time after the fact: about 10 s plus well under a second on
a small host, up to `interval + timeout` when the query is slow, and later still while it
fails (each failure costs another interval). A device that only just became a candidate
waits for the next tick as well.

A failing query (non-zero exit, nvidia-smi missing, killed for taking too long) is counted,
logged at most once a minute, and retried at the next tick; what was announced stays
announced until a query that works no longer lists it: a driver hiccup is not every process
ending.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

from patroller.core.devices import Inventory
from patroller.observe.signals import GpuProcess, ProcessSamples, Signals
from patroller.observe.supervisor import parent_death_kill
from patroller.observe.nvsmi.parsers import ComputeApp, parse_compute_apps

log = logging.getLogger(__name__)

QUERY = ("--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
         "--format=csv,noheader,nounits")
LOG_EVERY = 60.0  # seconds between reports of failing queries or unreadable lines
Key = Tuple[str, int]  # (device uuid, pid)


def _one_line(text: str, limit: int = 300) -> str:
    words = " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return words if len(words) <= limit else words[:limit] + "..."


class CrossCheck:
    """Announces the compute processes `--query-compute-apps` lists on candidate devices.

    `candidates()` is asked at every tick for the uuids of the devices pmon cannot attribute
    processes on now; it must be quick (it runs on the event loop).
    """

    def __init__(self, inventory: Inventory, signals: Signals, argv: List[str],
                 env: Mapping[str, str], candidates: Callable[[], Set[str]],
                 interval: float = 10.0, timeout: float = 30.0) -> None:
        self.inventory = inventory  # may be replaced when the devices are read again
        self.signals = signals
        self.argv = [*argv, *QUERY]
        self.env = dict(env)
        self.candidates = candidates
        self.interval = interval
        self.timeout = timeout
        self.runs = 0  # queries started
        self.failures = 0
        self.skipped = 0  # unreadable output lines
        self.announced_total = 0
        self.last_duration: Optional[float] = None  # seconds the last query took
        self._announced: Dict[Key, GpuProcess] = {}
        self._process: Optional[asyncio.subprocess.Process] = None
        self._stopping = False
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional["asyncio.Future[None]"] = None
        self._failing = 0  # failures since the last report or success
        self._failure_logged = -LOG_EVERY
        self._skips_logged = -LOG_EVERY
        self._skips_reported = 0

    def start(self) -> None:
        """Begin ticking on the running loop; the first query comes after one interval."""
        self._wake = asyncio.Event()  # made here: on Python 3.9 an Event binds to a loop
        self._task = asyncio.ensure_future(self._tick())

    async def stop(self, grace: float = 0.5) -> None:
        """Stop ticking; a running query is terminated, and its group killed after `grace` s."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        self._signal(signal.SIGTERM)
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), grace)
            except asyncio.TimeoutError:
                self._signal(signal.SIGKILL)
                await self._task

    def metrics(self) -> Dict[str, object]:
        """Counters for /metrics."""
        return {"runs": self.runs, "failures": self.failures,
                "last_duration": self.last_duration, "processes": len(self._announced),
                "announced": self.announced_total, "skipped_lines": self.skipped,
                "running": self._process is not None and self._process.returncode is None}

    async def _tick(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            if self._stopping:
                break
            try:
                if self._announced or self.candidates():
                    await self._check()
            except Exception:  # a bug (here or in a receiver) must not end the timer
                log.exception("cross-check failed")

    async def _check(self) -> None:
        """One query, then the processes that came and went on the devices it watches."""
        self.runs += 1
        started = time.monotonic()
        output, problem = await self._query()
        self.last_duration = time.monotonic() - started
        if self._stopping:
            return  # stopped mid-query: its output is incomplete
        if output is None:
            self._failed(problem or "no output")
            return
        if self._failing:
            log.info("cross-check: `%s` answers again after %d failure(s)",
                     " ".join(self.argv), self._failing)
            self._failing = 0
        skipped: List[str] = []
        apps = parse_compute_apps(output, skipped)
        self._count_skips(skipped)
        self._settle(apps)

    def _settle(self, apps: List[ComputeApp]) -> None:
        """Announce new processes on candidates; end announced ones no longer listed."""
        wanted = self.candidates()
        listed: Dict[Key, ComputeApp] = {}
        for app in apps:
            key = (app.uuid, app.pid)
            if key in self._announced or (app.uuid in wanted and self.inventory.get(app.uuid)):
                listed[key] = app
        for key in [k for k in self._announced if k not in listed]:
            self.signals.process_ended.send(self, record=self._announced.pop(key))
        for key, app in listed.items():
            if key not in self._announced:
                record = GpuProcess(uuid=app.uuid, pid=app.pid, type="C", command=app.name)
                self._announced[key] = record
                self.announced_total += 1
                self.signals.process_started.send(self, record=record)
        if listed:  # the used memory, under pmon's name for it (MiB)
            values = {key: {"fb": app.used_mib} for key, app in listed.items()}
            self.signals.process_sampled.send(self, record=ProcessSamples(values, time.time()))

    async def _query(self) -> Tuple[Optional[str], Optional[str]]:
        """(stdout, None) of a query that worked, else (None, what went wrong)."""
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self.env,
                start_new_session=True,  # its own group: a timeout kills all of it
                preexec_fn=parent_death_kill())
        except OSError as exc:
            return None, f"cannot start {self.argv[0]}: {exc.strerror or exc}"
        self._process = process
        try:
            out, err = await asyncio.wait_for(process.communicate(), self.timeout)
        except asyncio.TimeoutError:
            self._signal(signal.SIGKILL)  # a hung nvidia-smi need not answer SIGTERM
            await process.wait()
            return None, f"no answer in {self.timeout:g} s: killed"
        finally:
            if process.returncode is None:  # cancelled: never leave it behind
                self._signal(signal.SIGKILL)
        stdout = out.decode("utf-8", "replace")
        if process.returncode != 0:
            said = _one_line(err.decode("utf-8", "replace")) or _one_line(stdout) or "nothing"
            code = process.returncode
            status = f"signal {-code}" if code < 0 else f"status {code}"
            return None, f"{status}: {said}"
        return stdout, None

    def _failed(self, problem: str) -> None:
        self.failures += 1
        self._failing += 1
        now = time.monotonic()
        if now - self._failure_logged >= LOG_EVERY:
            self._failure_logged = now
            log.warning("cross-check: `%s` failed (%d time(s) in a row), %s; "
                        "keeping the %d process(es) it announced, trying again every %g s",
                        " ".join(self.argv), self._failing, problem, len(self._announced),
                        self.interval)

    def _count_skips(self, skipped: List[str]) -> None:
        self.skipped += len(skipped)
        now = time.monotonic()
        if self.skipped > self._skips_reported and now - self._skips_logged >= LOG_EVERY:
            log.warning("cross-check: %d unreadable line(s) skipped, the last: %r",
                        self.skipped - self._skips_reported, skipped[-1][:200] if skipped else "")
            self._skips_reported, self._skips_logged = self.skipped, now

    def _signal(self, signum: int) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
