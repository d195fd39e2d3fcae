"""One examination: every probe run (nvidia-smi's children on the event loop through the
supervisor, the blocking ones each in a thread of its own, all at once), then every check over
what they found, in the order the daemon meets them at start. The whole examination ends within
`Config.doctor_deadline`: a probe still out then is given up on, and its checks are degraded
with what it waited for. `Doctor` runs one examination at a time for
`GET /doctor`: callers who ask while one runs share its results."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from patroller.config import Config
from patroller.doctor.gpu import probe, timed
from patroller.doctor.gpuchecks import gpu_results
from patroller.doctor.host import (
    UNIT,
    UNIT_DIRS,
    UnitFacts,
    check_cgroups,
    check_kernel_log,
    check_proc,
    check_unit,
    probe_kernel_log,
    probe_proc,
    probe_unit,
)
from patroller.doctor.listening import check_port, check_socket, probe_port, probe_socket
from patroller.doctor.notifications import check_notifications, probe_notifications
from patroller.doctor.places import (
    check_book,
    check_job_map,
    check_state,
    check_usage,
    probe_job_map,
    probe_state,
)
from patroller.doctor.privacy import check_privacy, probe_privacy
from patroller.doctor.results import Result, degraded
from patroller.doctor.runtimes import EngineProbes, engine_results
from patroller.durations import describe

SYSTEMD_RUNNING = "/run/systemd/system"  # there when systemd is the init system (sd_booted)


async def examine(
    config: Config, environ: Mapping[str, str] | None = None, unit_dirs: Sequence[str] = UNIT_DIRS
) -> list[Result]:
    """Every check, for the daemon `config` describes, within `config.doctor_deadline`: a
    probe still out then is left behind, and its checks are degraded with what it waited for."""
    loop = asyncio.get_running_loop()
    bound = config.doctor_deadline

    def blocking(probe: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        return _in_thread(loop, probe, *args)

    async def unit_probe() -> UnitFacts:
        return await _activity(await blocking(probe_unit, unit_dirs), config)

    engines = EngineProbes(config)
    out: dict[str, tuple[asyncio.Future[Any], str]] = {  # probe: (its run, what it waits for)
        "proc": (blocking(probe_proc, config.proc_root), f"{config.proc_root}'s processes"),
        "state": (
            blocking(probe_state, config.state_dir, config.proc_root),
            f"the state directory {config.state_dir}",
        ),
        "job map": (
            blocking(probe_job_map, config.slurm_job_map, config.job_map_file_limit),
            f"the job map {config.slurm_job_map}",
        ),
        "port": (
            blocking(probe_port, config.port, config.address, config.doctor_timeout),
            f"port {config.port}: to bind it, or what holds it to answer",
        ),
        "socket": (
            blocking(probe_socket, config.socket, config.doctor_timeout),
            f"the socket path {config.socket}",
        ),
        "unit": (asyncio.ensure_future(unit_probe()), "the systemd unit's files and systemctl"),
        "privacy": (
            blocking(probe_privacy, config.state_dir, config.audit_log),
            "the modes of the state directory's files and the audit record",
        ),
        "notify": (
            blocking(probe_notifications, config),
            "Apprise, to load its services"
            + (f", and the login records {config.notify_utmp}" if config.notify_terminal else ""),
        ),
    }
    if not config.test:
        out["kernel log"] = (
            blocking(probe_kernel_log, config.kernel_log),
            f"the kernel log {config.kernel_log}",
        )
        out["gpu"] = (
            asyncio.ensure_future(probe(config, environ)),
            f"{config.nvidia_smi}: -q -x, then one sample of dmon and pmon, and "
            "--query-compute-apps",
        )
    knocks = [blocking(knock) for knock in engines.probes()]
    runs = [*knocks, *(run for run, _ in out.values())]
    _, pending = await asyncio.wait(runs, timeout=bound)
    for run in pending:
        run.cancel()  # a thread is left to end by itself, unwaited for
    children = [run for run in pending if isinstance(run, asyncio.Task)]
    if children:  # nvidia-smi's children are killed as their task ends: let it end
        await asyncio.wait(children, timeout=config.shutdown_grace)
    for knock in knocks:
        if knock not in pending:
            knock.result()  # a probe's own error is raised, as it always was

    def facts(name: str) -> Any:
        run = out[name][0]
        return None if run in pending else run.result()

    def late(name: str, *checks: str) -> list[Result] | None:
        """The checks of a probe still out at the bound, degraded; None when it answered."""
        if name not in out or out[name][0] not in pending:
            return None
        said = f"no answer within the doctor's {describe(bound)}: waited for {out[name][1]}"
        return [
            degraded(check, said, "find what is slow there: the daemon would wait on it too")
            for check in checks
        ]

    nvidia = None if config.test else facts("gpu")
    proc, state = facts("proc"), facts("state")
    return [
        *(late("gpu", "nvidia-smi") or gpu_results(nvidia, config)),
        *(
            []
            if config.test
            else late("kernel log", "kernel log")
            or [check_kernel_log(config.kernel_log, facts("kernel log"))]
        ),
        *(late("proc", "/proc", "cgroups") or [check_proc(proc), check_cgroups(proc)]),
        *engine_results(engines.facts(), config),
        *(late("job map", "Slurm job map") or [check_job_map(facts("job map"))]),
        *(
            late("state", "state directory", "lease book")
            or [check_state(state, config), check_book(state)]
        ),
        check_usage(config),
        *(late("privacy", "private files") or [check_privacy(facts("privacy"))]),
        *(late("port", "address and port") or [check_port(facts("port"))]),
        *(late("socket", "unix socket") or [check_socket(facts("socket"))]),
        *(late("unit", "systemd unit") or [check_unit(facts("unit"))]),
        *(late("notify", "notifications") or [check_notifications(facts("notify"), config)]),
    ]


def _in_thread(
    loop: asyncio.AbstractEventLoop, probe: Callable[..., Any], *args: Any
) -> asyncio.Future[Any]:
    """`probe(*args)` in a daemon thread of its own, its outcome on the loop. Not the
    executor: asyncio.run's end and the interpreter's exit both wait for the executor's
    threads, so one hung probe would hold the doctor past its bound."""
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return  # given up on at the bound
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def run() -> None:
        try:
            value, error = probe(*args), None
        except BaseException as exc:  # handed to whoever awaits it, as the executor would
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:
            pass  # the loop is closed: the doctor finished without it

    threading.Thread(
        target=run, name=f"doctor-{getattr(probe, '__name__', 'probe')}", daemon=True
    ).start()
    return future


async def _activity(unit: UnitFacts, config: Config) -> UnitFacts:
    """The unit with `systemctl is-active`'s word, where systemd runs and the unit is there."""
    systemctl = shutil.which("systemctl")
    if unit.path is None or systemctl is None or not os.path.isdir(SYSTEMD_RUNNING):
        return unit
    ran = await timed([systemctl, "is-active", UNIT], None, config.doctor_timeout, config)
    word = ran.answer.output.strip().split()
    return UnitFacts(
        unit.path,
        unit.executable,
        unit.runs,
        unit.unreadable,
        word[0] if word and ran.answer.error is None else None,
    )


class Doctor:
    """The examinations of a running daemon: one at a time, shared by whoever asks meanwhile
    (nvidia-smi is not asked more often because more callers ask)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.examinations = 0
        self._running: asyncio.Future[list[Result]] | None = None

    async def results(self) -> list[Result]:
        if self._running is None or self._running.done():
            self.examinations += 1
            self._running = asyncio.ensure_future(examine(self.config))
        # shielded: a caller who leaves does not end the examination the others wait for
        return await asyncio.shield(self._running)
