"""The probe of nvidia-smi: every command the daemon would run, run once through the one
supervisor (observe/supervisor.py: its own process group, the parent-death signal, killed at
its timeout), each timed, with what it printed. `-q -x` first; then, over the GPUs it lists,
one sample of `dmon` and of `pmon` (`-c 1`, with the column groups the monitors ask for, fewer
where refused, as they do), `--query-compute-apps`, `topo -m` and, where a GPU has MIG on,
`-L`, together. The checks over these facts are gpuchecks.py's."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from patroller.config import Config
from patroller.core.devices import Device
from patroller.durations import describe
from patroller.observe.crosscheck import QUERY
from patroller.observe.inventory import command
from patroller.observe.monitors import DMON_SELECTS, PMON_SELECTS, REFUSED, stream_env
from patroller.observe.nvsmi.discovery import Discovery, DiscoveryError, parse_inventory
from patroller.observe.nvsmi.parsers import DmonParser, PmonParser, PmonRow
from patroller.observe.supervisor import Answer, OneShotChild

_DTD = re.compile(r"nvsmi_device_v(\d+)\.dtd")


@dataclass(frozen=True)
class Ran:
    """One run of one nvidia-smi command: what it was, how long it took, how it ended."""

    shown: str  # the command line
    seconds: float
    answer: Answer
    timeout: float

    @property
    def worked(self) -> bool:
        answer = self.answer
        return (
            answer.error is None
            and not answer.timed_out
            and not answer.stopped
            and answer.status == 0
        )

    @property
    def text(self) -> str:
        """Everything it printed, stdout then stderr (nvidia-smi prints errors on stdout)."""
        return "\n".join(part for part in (self.answer.output, self.answer.said) if part)

    def trouble(self) -> str:
        """Why it gave no answer, in a few words."""
        answer = self.answer
        if answer.error is not None:
            return f"cannot be started: {answer.error.strerror or answer.error}"
        if answer.timed_out:
            return f"no answer in {describe(self.timeout)}: killed"
        if answer.stopped:
            return "stopped before it answered"
        status = (
            f"signal {-(answer.status or 0)}"
            if (answer.status or 0) < 0
            else f"status {answer.status}"
        )
        return f"failed with {status}: {answer.account()}"


@dataclass(frozen=True)
class Stream:
    """One sample of dmon or pmon: each column group tried (refused ones first), the rows of
    the run that answered."""

    runs: tuple[Ran, ...]
    select: str | None  # the column groups that worked ("" the default); None: none did
    gpus: tuple[int, ...] = ()  # the GPU indices that printed a row
    processes: tuple[PmonRow, ...] = ()  # pmon: the rows that name a process
    skipped: int = 0  # lines that could not be read


@dataclass(frozen=True)
class GpuFacts:
    """What nvidia-smi answered, command by command (None: not run, as an earlier one gave no
    GPU to ask about)."""

    argv: tuple[str, ...]
    found: str | None  # where argv[0] is on the PATH, or None
    inventory: Ran | None = None  # -q -x
    discovery: Discovery | None = None  # -q -x read, when it answered
    unreadable: str | None = None  # why its answer could not be read
    dtd: str | None = None  # the document's DOCTYPE version: "12"
    dmon: Stream | None = None
    pmon: Stream | None = None
    apps: Ran | None = None  # --query-compute-apps
    listing: Ran | None = None  # -L, only when a GPU has MIG on
    topology: Ran | None = None  # topo -m
    devices: tuple[Device, ...] = field(default=())


async def timed(
    argv: Sequence[str], env: Mapping[str, str] | None, timeout: float, config: Config
) -> Ran:
    """One run of `argv` through the supervisor, to its end or its timeout."""
    query = OneShotChild(list(argv), env, timeout, config)
    began = time.monotonic()
    answer = await query.run()
    return Ran(" ".join(argv), time.monotonic() - began, answer, timeout)


async def sample(
    argv: Sequence[str],
    kind: str,
    selects: Sequence[str],
    devices: Sequence[Device],
    env: Mapping[str, str],
    config: Config,
) -> Stream:
    """One interval of dmon or pmon over `devices`, asking for fewer column groups while a
    group is refused (as the monitors do)."""
    indices = ",".join(str(d.number) for d in devices)
    runs: list[Ran] = []
    timeout = config.stream_startup + 2 * config.sample_interval
    for select in selects:
        ran = await timed(
            [*argv, kind, *(["-s", select] if select else []), "-i", indices, "-c", "1"],
            env,
            timeout,
            config,
        )
        runs.append(ran)
        parser = DmonParser() if kind == "dmon" else PmonParser()
        rows = [row for row in map(parser.feed, ran.answer.output.splitlines()) if row is not None]
        refused = not rows and ran.answer.status and REFUSED.search(ran.text)
        if refused:
            continue
        if not ran.worked and not rows:
            return Stream(tuple(runs), None)
        return Stream(
            tuple(runs),
            select,
            tuple(sorted({row.gpu for row in rows})),
            tuple(r for r in rows if isinstance(r, PmonRow) and r.pid is not None),
            parser.skipped,
        )
    return Stream(tuple(runs), None)


async def probe(config: Config, environ: Mapping[str, str] | None = None) -> GpuFacts:
    """Run what the daemon would run, once each; never raises for what nvidia-smi does."""
    environ = os.environ if environ is None else environ
    argv = tuple(command(config.nvidia_smi))
    found = shutil.which(argv[0], path=environ.get("PATH")) if argv else None
    inventory = await timed([*argv, "-q", "-x"], None, config.discovery_timeout, config)
    facts = GpuFacts(argv, found, inventory)
    if not inventory.worked:
        return facts
    try:
        discovery = parse_inventory(inventory.answer.output)
    except DiscoveryError as exc:
        return GpuFacts(argv, found, inventory, unreadable=str(exc))
    dtd = _DTD.search(inventory.answer.output[:2000])
    devices = tuple(discovery.devices)
    base = GpuFacts(
        argv, found, inventory, discovery, dtd=dtd.group(1) if dtd else None, devices=devices
    )
    if not devices:
        return base
    env = stream_env(environ)
    mig = any(d.mig for d in devices)
    dmon, pmon, apps, listing, topology = await asyncio.gather(
        sample(argv, "dmon", DMON_SELECTS, devices, env, config),
        sample(argv, "pmon", PMON_SELECTS, devices, env, config),
        timed([*argv, *QUERY], env, config.cross_check_timeout, config),
        timed([*argv, "-L"], None, config.mig_list_timeout, config) if mig else _none(),
        timed([*argv, "topo", "-m"], None, config.topology_timeout, config),
    )
    return GpuFacts(
        argv,
        found,
        inventory,
        discovery,
        dtd=base.dtd,
        dmon=dmon,
        pmon=pmon,
        apps=apps,
        listing=listing,
        topology=topology,
        devices=devices,
    )


async def _none() -> None:
    return None
