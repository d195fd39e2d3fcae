"""The compute-apps cross-check against the real simulator as nvidia-smi, with real processes."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import ScenarioFile, alive, async_test, children_of, gpu_running, known_claim, until

from patroller.config import Config
from patroller.core.devices import Device, Inventory
from patroller.observe.crosscheck import CrossCheck
from patroller.observe.signals import GpuProcess, Signals

MIG = "GPU-0000aaaa-5a1e-4e57-8000-00000000aaaa"
PLAIN = "GPU-0000bbbb-5a1e-4e57-8000-00000000bbbb"
INVENTORY = Inventory([Device(MIG, 0, mig_mode="Enabled"), Device(PLAIN, 1)])
TICK = 0.2


class Heard:
    """What a daemon would hear: every signal the cross-check sends, in order."""

    def __init__(self, signals: Signals) -> None:
        self.events: list[tuple[str, Any]] = []
        for name in ("process_started", "process_ended", "process_sampled"):
            getattr(signals, name).connect(self._receiver(name), weak=False)

    def _receiver(self, name: str) -> Any:
        def receive(sender: object, record: Any) -> None:
            self.events.append((name, record))

        return receive

    def of(self, name: str) -> list[Any]:
        return [record for kind, record in self.events if kind == name]


class Candidates:
    """The daemon's candidate set, changed by the test; counts how often it is asked."""

    def __init__(self, *uuids: str) -> None:
        self.uuids: set[str] = set(uuids)
        self.asked = 0

    def __call__(self) -> set[str]:
        self.asked += 1
        return set(self.uuids)


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen]]:
    """Two real processes whose pids the scenario lists as computing."""
    processes = [subprocess.Popen(["sleep", "120"]) for _ in range(2)]
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def scenario(tmp_path: Path, sleepers: list[subprocess.Popen], **extra: Any) -> ScenarioFile:
    first, second = (p.pid for p in sleepers)
    return ScenarioFile(
        str(tmp_path / "scenario.json"),
        devices=[{"uuid": MIG, "mig": "Enabled"}, {"uuid": PLAIN}],
        processes=[
            {"pid": first, "gpu": 0, "name": "python train.py, rank 0", "used_mib": 4096},
            {"pid": second, "gpu": 1, "name": "python", "used_mib": 100},
        ],
        **extra,
    )


def cross_check(
    command: str, candidates: Candidates, signals: Signals, **settings: Any
) -> CrossCheck:
    config = replace(Config(), **{"cross_check_every": TICK, **settings})
    checker = CrossCheck(
        INVENTORY, signals, shlex.split(command), dict(os.environ), candidates, config
    )
    checker.start()
    return checker


@async_test
async def test_a_process_on_a_candidate_device_is_announced_with_its_name(tmp_path, sleepers):
    sim = scenario(tmp_path, sleepers)
    signals = Signals()
    heard = Heard(signals)
    checker = cross_check(sim.command, Candidates(MIG), signals)
    try:
        await until(lambda: heard.of("process_started"))
        runs = checker.runs
        await until(lambda: checker.runs >= runs + 2)  # later runs add nothing
    finally:
        await checker.stop(0.5)
    mine = GpuProcess(MIG, sleepers[0].pid, "C", "python train.py, rank 0")
    # the process on the device that is no candidate is not the cross-check's to announce
    assert heard.of("process_started") == [mine]
    assert heard.of("process_ended") == []
    # its memory, as pmon's `fb` would give it
    assert heard.of("process_sampled")[0].values == {MIG: {sleepers[0].pid: {"fb": 4096}}}
    assert checker.metrics().processes == 1 and checker.metrics().announced == 1
    assert checker.metrics().failures == 0


@async_test
async def test_a_process_gone_from_the_listing_is_ended(tmp_path, sleepers):
    sim = scenario(tmp_path, sleepers)
    signals = Signals()
    heard = Heard(signals)
    checker = cross_check(sim.command, Candidates(MIG, PLAIN), signals)
    try:
        await until(lambda: len(heard.of("process_started")) == 2)
        sim.write(processes=sim.scenario["processes"][1:])
        await until(lambda: heard.of("process_ended"))
    finally:
        await checker.stop(0.5)
    assert heard.of("process_ended") == [
        GpuProcess(MIG, sleepers[0].pid, "C", "python train.py, rank 0")
    ]
    assert checker.metrics().processes == 1


@async_test
async def test_nothing_runs_without_a_candidate_or_an_announced_process(tmp_path, sleepers):
    sim = scenario(tmp_path, sleepers)
    signals = Signals()
    heard = Heard(signals)
    candidates = Candidates()
    checker = cross_check(sim.command, candidates, signals)
    try:
        await until(lambda: candidates.asked >= 4)
        assert checker.runs == 0
        candidates.uuids = {MIG}
        await until(lambda: heard.of("process_started"))
        # No candidate any more, but what it announced is still listed: it keeps looking.
        candidates.uuids = set()
        runs = checker.runs
        await until(lambda: checker.runs >= runs + 2)
        assert heard.of("process_ended") == []
        sim.write(processes=[])
        await until(lambda: heard.of("process_ended"))
        runs, asked = checker.runs, candidates.asked
        await until(lambda: candidates.asked >= asked + 4)
        assert checker.runs == runs
    finally:
        await checker.stop(0.5)


@async_test
async def test_a_failing_query_keeps_what_was_announced_and_recovers(tmp_path, sleepers, caplog):
    sim = scenario(tmp_path, sleepers)
    signals = Signals()
    heard = Heard(signals)
    checker = cross_check(sim.command, Candidates(MIG), signals)
    try:
        await until(lambda: heard.of("process_started"))
        sim.write(faults={"--query-compute-apps": {"fail": "no_driver"}})
        await until(lambda: checker.failures >= 3)
        assert heard.of("process_ended") == []
        assert checker.metrics().processes == 1
        sim.write(faults={}, processes=[])
        await until(lambda: heard.of("process_ended"))
    finally:
        await checker.stop(0.5)
    assert [r.pid for r in heard.of("process_ended")] == [sleepers[0].pid]
    failed = [
        r.getMessage()
        for r in caplog.records
        if r.name == "patroller.observe.crosscheck" and "failed" in r.getMessage()
    ]
    assert len(failed) == 1, failed  # once a minute, not once a run
    assert "couldn't communicate with the NVIDIA driver" in failed[0]
    assert "status 9" in failed[0] and "keeping the 1 process" in failed[0]


@async_test
async def test_a_missing_nvidia_smi_is_a_failure_not_a_crash(tmp_path):
    signals = Signals()
    checker = cross_check(str(tmp_path / "no-such-nvidia-smi"), Candidates(MIG), signals)
    try:
        await until(lambda: checker.failures >= 2)
    finally:
        await checker.stop(0.5)
    assert checker.runs == checker.failures


def hanging(tmp_path: Path, ignore_term: bool = False) -> tuple[str, Path]:
    """A command that hangs like a stuck nvidia-smi and writes its pid to a file."""
    pids = tmp_path / "pids"
    trap = "trap '' TERM; " if ignore_term else ""
    script = f'echo $$ >> "$0"; {trap}exec sleep 60'
    return f"sh -c {shlex.quote(script)} {shlex.quote(str(pids))}", pids


def started_pids(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.exists() else []


@async_test
async def test_a_query_that_takes_too_long_is_killed_and_counted(tmp_path):
    command, pids = hanging(tmp_path)
    checker = cross_check(command, Candidates(MIG), Signals(), cross_check_timeout=0.5)
    try:
        await until(lambda: checker.failures >= 2)
        killed = started_pids(pids)[:2]
        assert len(killed) == 2 and not any(map(alive, killed))
    finally:
        await checker.stop(0.5)


@async_test
async def test_stop_leaves_no_child_running(tmp_path):
    command, pids = hanging(tmp_path, ignore_term=True)  # only SIGKILL ends it
    before = set(children_of(os.getpid()))
    checker = cross_check(command, Candidates(MIG), Signals(), cross_check_timeout=60)
    await until(lambda: started_pids(pids))
    (pid,) = started_pids(pids)
    assert alive(pid)
    # Bounded, with room to spare: a stop that waited for the query would take its 60 s.
    await asyncio.wait_for(checker.stop(grace=0.3), 10)
    assert not alive(pid)
    assert set(children_of(os.getpid())) <= before
    assert checker.failures == 0  # being stopped is not a failing query


@async_test
async def test_never_two_queries_at_once(tmp_path):
    log = tmp_path / "log"
    # Each run takes longer than the interval; one that starts while another runs says so.
    script = (
        'if [ -e "$0.busy" ]; then echo overlap >> "$0"; fi; touch "$0.busy"; '
        'sleep 0.5; rm "$0.busy"; echo done >> "$0"'
    )
    command = f"sh -c {shlex.quote(script)} {shlex.quote(str(log))}"
    checker = cross_check(command, Candidates(MIG), Signals(), cross_check_every=0.05)
    try:
        await until(lambda: log.exists() and log.read_text().count("done") >= 3)
    finally:
        await checker.stop(0.5)
    assert "overlap" not in log.read_text()


@async_test
async def test_a_stop_at_any_moment_of_a_query_ends_the_cross_check():
    # Stops that land before, during and as a query ends (it ends on its own after 20 ms, and
    # at once when terminated). A stop that lost its way (as a cancellation does when it comes
    # as the awaited query finishes, before Python 3.12) would leave the tick running for ever.
    for attempt in range(150):
        checker = cross_check("sleep 0.02", Candidates(MIG), Signals(), cross_check_every=0.005)
        await asyncio.sleep(0.005 + (attempt % 12) * 0.003)
        await asyncio.wait_for(checker.stop(0.5), 10)  # fails here: TimeoutError
        assert not checker.query.running


@async_test
async def test_a_mig_gpu_whose_pmon_rows_carry_no_figures_gets_its_memory(tmp_path, sleepers):
    # As found on 590-series drivers with MIG enabled (real H100 and H200 captures): pmon lists
    # every process with `-` in every figure, so the device was no candidate and in 13.5 s the
    # cross-check ran 0 times: the processes' memory stayed unknown.
    first = sleepers[0].pid
    sim = ScenarioFile(
        str(tmp_path / "scenario.json"),
        devices=[{"uuid": MIG, "mig": "Enabled", "pmon_no_figures": True}, {"uuid": PLAIN}],
        processes=[{"pid": first, "gpu": 0, "name": "python", "used_mib": 4096, "sm": 80}],
    )
    async with gpu_running(sim, cross_check_every=TICK) as h:
        await until(lambda: known_claim(h.services.leases, MIG))

        async def memory():
            detail = (await h.ok("/status"))[MIG]["claim"]["process_detail"]
            return [(p["pid"], p["fb"]) for p in detail]

        for _ in range(100):
            if await memory() == [(first, 4096)]:
                break
            await asyncio.sleep(0.1)
        assert await memory() == [(first, 4096)]
        check = [m for m in h.services.monitors if m.name == "cross_check"][0]
        assert check.metrics().runs >= 1
        assert check.metrics().announced == 0  # pmon announces them; the query measures
        assert h.services.leases.holds[MIG].processes.keys() == {first}
