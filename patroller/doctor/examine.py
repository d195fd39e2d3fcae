"""One examination: every probe run (nvidia-smi's children on the event loop through the
supervisor, the blocking ones in the executor, all at once), then every check over what they
found, in the order the daemon meets them at start. `Doctor` runs one examination at a time for
`GET /doctor`: callers who ask while one runs share its results."""
from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any, Callable, List, Mapping, Optional, Sequence

from patroller.config import Config
from patroller.doctor.gpu import probe, timed
from patroller.doctor.gpuchecks import gpu_results
from patroller.doctor.host import (UNIT, UNIT_DIRS, UnitFacts, check_cgroups, check_proc,
                                   check_unit, probe_proc, probe_unit)
from patroller.doctor.listening import check_port, check_socket, probe_port, probe_socket
from patroller.doctor.places import (check_book, check_job_map, check_state, probe_job_map,
                                     probe_state)
from patroller.doctor.results import Result
from patroller.doctor.runtimes import engine_results, probe_engines

SYSTEMD_RUNNING = "/run/systemd/system"  # there when systemd is the init system (sd_booted)


async def examine(config: Config, environ: Optional[Mapping[str, str]] = None,
                  unit_dirs: Sequence[str] = UNIT_DIRS) -> List[Result]:
    """Every check, for the daemon `config` describes."""
    loop = asyncio.get_running_loop()

    def blocking(probe: Callable[..., Any], *args: Any) -> "asyncio.Future[Any]":
        return loop.run_in_executor(None, probe, *args)

    nvidia = None if config.test else asyncio.ensure_future(probe(config, environ))
    proc, engines, state, job_map, port, sock, unit = await asyncio.gather(
        blocking(probe_proc, config.proc_root), blocking(probe_engines, config),
        blocking(probe_state, config.state_dir, config.proc_root),
        blocking(probe_job_map, config.slurm_job_map, config.job_map_file_limit),
        blocking(probe_port, config.port, config.address, config.doctor_timeout),
        blocking(probe_socket, config.socket, config.doctor_timeout),
        blocking(probe_unit, unit_dirs))
    unit = await _activity(unit, config)
    facts = await nvidia if nvidia is not None else None
    return [*gpu_results(facts, config), check_proc(proc), check_cgroups(proc),
            *engine_results(engines, config), check_job_map(job_map),
            check_state(state, config), check_book(state), check_port(port),
            check_socket(sock), check_unit(unit)]


async def _activity(unit: UnitFacts, config: Config) -> UnitFacts:
    """The unit with `systemctl is-active`'s word, where systemd runs and the unit is there."""
    systemctl = shutil.which("systemctl")
    if unit.path is None or systemctl is None or not os.path.isdir(SYSTEMD_RUNNING):
        return unit
    ran = await timed([systemctl, "is-active", UNIT], None, config.doctor_timeout, config)
    word = ran.answer.output.strip().split()
    return UnitFacts(unit.path, unit.executable, unit.runs, unit.unreadable,
                     word[0] if word and ran.answer.error is None else None)


class Doctor:
    """The examinations of a running daemon: one at a time, shared by whoever asks meanwhile
    (nvidia-smi is not asked more often because more callers ask)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.examinations = 0
        self._running: Optional["asyncio.Future[List[Result]]"] = None

    async def results(self) -> List[Result]:
        if self._running is None or self._running.done():
            self.examinations += 1
            self._running = asyncio.ensure_future(examine(self.config))
        # shielded: a caller who leaves does not end the examination the others wait for
        return await asyncio.shield(self._running)
