"""A hung nvidia-smi, stale ownership, and children that must not outlive the daemon."""

import logging
import re
import signal
import subprocess
import time

import pytest
from helpers import (
    ScenarioFile,
    ServerProcess,
    alive,
    async_test,
    gpu_running,
    known_claim,
    streams_of,
    until,
)

from patroller.app import build
from patroller.config import Config, ConfigError, load

SIX = [{"minor": n} for n in range(6)]


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=SIX)


@async_test
async def test_a_hung_pmon_is_killed_and_restarted_and_the_dead_claim_cleared(
    scenario, sleeper, caplog
):
    scenario.write(processes=[{"pid": sleeper.pid, "gpu": 1}])
    async with gpu_running(scenario, stream_silence=1.0) as h:
        pmon = h.services.monitors[1].child
        target = h.uuids()[1]
        listed, ended = [], []
        h.services.signals.processes_listed.connect(lambda s, record: listed.append(1), weak=False)
        h.services.signals.process_ended.connect(
            lambda s, record: ended.append(pmon.starts), weak=False
        )
        await until(lambda: known_claim(h.services.leases, target) and len(listed) >= 3)
        # In one write: pmon, past its 12th row (3 intervals of 6), stops printing but stays
        # alive, and the process ends; a fresh pmon prints two intervals, then hangs again.
        scenario.write(processes=[], faults={"pmon": {"stall_after_lines": 12}})
        sleeper.kill()
        sleeper.wait()
        await until(lambda: pmon.hangs >= 1 and pmon.starts >= 2)
        await until(lambda: h.services.leases.state(target) != "claimed")
        assert ended == [2]  # learnt from the restarted pmon, not from the hung one
        claim = (await h.ok("/status"))[target]["claim"]
        assert claim["processes"] == [] and claim["processes_stale"] is False
        hung = [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and "hung" in r.getMessage()
        ]
        said = re.fullmatch(
            r"pmon: printed nothing more for ([0-9.]+)s: hung, killing it", hung[0]
        )
        assert said and float(said.group(1)) >= 1.0
        assert not [
            r
            for r in caplog.records
            if r.name.endswith("supervisor")
            and "dmon" in r.getMessage()
            and "hung" in r.getMessage()
        ]  # dmon ran on


@async_test
async def test_processes_are_stale_while_pmon_is_silent_and_fresh_again_after(scenario, sleeper):
    scenario.write(processes=[{"pid": sleeper.pid, "gpu": 2}])
    async with gpu_running(scenario, stream_silence=600.0) as h:  # never killed here
        target = h.uuids()[2]
        await until(
            lambda: (
                known_claim(h.services.leases, target)
                and not h.services.stats.processes_stale(target)
                and not h.services.stats.stale(target)
            )
        )  # a pmon interval completed, and dmon's first sample came (either may be first)
        entry = (await h.ok("/status"))[target]
        assert entry["claim"]["processes_stale"] is False and entry["stale"] is False
        scenario.write(faults={"pmon": {"stall_after_lines": 0}})
        await until(lambda: h.services.stats.processes_stale(target), timeout=10)
        entry = (await h.ok("/status"))[target]
        assert entry["claim"]["processes_stale"] is True
        assert entry["claim"]["processes"] == [sleeper.pid]  # the last known list, marked
        assert entry["stale"] is False  # dmon still speaks: only ownership is in doubt
        scenario.write(faults={})
        await until(lambda: not h.services.stats.processes_stale(target), timeout=10)


@async_test
async def test_stop_kills_children_that_ignore_sigterm_before_it_returns(scenario):
    scenario.write(faults={"ignore_sigterm": True})
    config = Config(port=0, address="127.0.0.1", nvidia_smi=scenario.command)
    daemon = await build(config)
    daemon.start()
    children = [m.child for m in daemon.services.monitors if m.name in ("dmon", "pmon")]
    await until(lambda: all(c.heard is not None for c in children))  # SIGTERM ignored by now
    pids = [c.child.pid for c in children]
    await daemon.stop(grace=2.0)
    assert [pid for pid in pids if alive(pid)] == []  # checked as stop returns: no waiting


def test_kill_9_of_the_daemon_leaves_no_nvidia_smi_running(scenario):
    # Silent streams: a child that writes dies of SIGPIPE anyway; a hung one never writes.
    scenario.write(faults={"stall_after_lines": 0})
    server = ServerProcess("--nvidia-smi", scenario.command).start()
    deadline = time.monotonic() + 10
    while len(streams_of(server.process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    children = streams_of(server.process.pid)
    try:
        assert len(children) == 2, server.log
        server.stop(signal.SIGKILL)
        deadline = time.monotonic() + 10  # a bound, not a speed: the kernel acts at the death
        while [pid for pid in children if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in children if alive(pid)] == []
    finally:
        for pid in children:
            if alive(pid):
                subprocess.run(["kill", "-9", str(pid)], check=False)


def test_stream_silence_is_a_setting_with_a_floor():
    assert Config().stream_silence == 5.0
    assert load(["--stream-silence", "12"], {}).stream_silence == 12.0
    assert load([], {"PATROLLER_STREAM_SILENCE": "3"}).stream_silence == 3.0
    with pytest.raises(ConfigError, match="--stream-silence.*at least 3 seconds"):
        load(["--stream-silence", "1"], {})
    with pytest.raises(ConfigError, match="PATROLLER_STREAM_SILENCE"):
        load([], {"PATROLLER_STREAM_SILENCE": "soon"})
