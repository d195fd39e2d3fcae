"""A process hold given up while its process lives (patroller/state/lifetimes.py `sync`): its
pidfd is closed and taken off the loop, and the process's end later frees nothing; and where
the interpreter has no pidfds, open_pidfd says so (the watch then polls). In-process: the
mutation suite runs this file (test_hold_process.py has the rest)."""

from __future__ import annotations

import asyncio
import errno
import os
from dataclasses import replace

import pytest
from helpers import async_test, lease_manager, until
from test_hold_process import alice, bob, ref_of, sleeping

from patroller.config import Config
from patroller.state.lifetimes import Lifelines, open_pidfd


@async_test
async def test_a_hold_released_while_its_process_lives_stops_its_watch():
    leases = lease_manager()
    lifelines = Lifelines(leases, Config())
    lifelines.start()
    process = sleeping()
    try:
        ref = ref_of(process)
        [device] = leases.request(alice, {"gpu": 1}, held_for=ref)
        await until(lambda: lifelines.metrics()["watched"] == 1)
        leases.request(bob, {"gpu": 1})  # a change: the process is watched, not polled too
        assert lifelines.metrics() == {"watched": 1, "polled": 0, "ended": 0}
        fd = lifelines._fds[ref]
        assert leases.release(alice, device.uuid) == ([device], [])
        assert lifelines.metrics() == {"watched": 0, "polled": 0, "ended": 0}
        assert asyncio.get_running_loop().remove_reader(fd) is False  # off the loop
        with pytest.raises(OSError):
            os.fstat(fd)  # closed
        process.kill()
        process.wait()
        for _ in range(3):
            await asyncio.sleep(0)
        assert lifelines.metrics()["ended"] == 0 and leases.state(device.uuid) == "free"
    finally:
        lifelines.stop()
        process.kill()
        process.wait()


@async_test
async def test_a_hold_released_while_its_process_lives_is_polled_no_more():
    leases = lease_manager()
    lifelines = Lifelines(leases, replace(Config(), lifeline_poll=0.05), pidfds=False)
    lifelines.start()
    process = sleeping()
    try:
        [device] = leases.request(alice, {"gpu": 1}, held_for=ref_of(process))
        await until(lambda: lifelines.metrics()["polled"] == 1)
        assert leases.release(alice, device.uuid) == ([device], [])
        assert lifelines.metrics() == {"watched": 0, "polled": 0, "ended": 0}
    finally:
        lifelines.stop()
        process.kill()
        process.wait()


def test_without_pidfds_open_pidfd_says_so(monkeypatch):
    """What the watch's debug line says before it polls the process."""
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    process = sleeping()
    try:
        with pytest.raises(OSError) as found:
            open_pidfd(ref_of(process))
    finally:
        process.kill()
        process.wait()
    assert found.value.errno == errno.ENOSYS
    assert str(found.value) == f"[Errno {errno.ENOSYS}] os.pidfd_open is not available"


def test_a_pidfd_is_had_on_a_live_process_by_the_hosts_proc_and_none_once_it_ended():
    process = sleeping()
    try:
        ref = ref_of(process)
        fd = open_pidfd(ref)  # the default /proc
        assert fd is not None
        os.close(fd)
    finally:
        process.kill()
        process.wait()
    assert open_pidfd(ref) is None


def test_a_pid_the_proc_root_does_not_show_alive_gets_no_pidfd(tmp_path):
    """Another proc root (a container's view), where the pid is not there: no descriptor, and
    the one opened is closed; a zombie, which has ended, likewise."""
    process = sleeping()
    try:
        assert open_pidfd(ref_of(process), str(tmp_path)) is None
        ref = ref_of(process)
        process.kill()
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped
        assert open_pidfd(ref) is None
    finally:
        process.kill()
        process.wait()


@async_test
async def test_a_change_while_a_watch_is_opened_opens_no_second_one():
    """The lease manager's change notices come at every change: one that comes while a pidfd
    is being opened (in a thread) starts no second watch, and the process's end is seen once."""
    leases = lease_manager()
    lifelines = Lifelines(leases, Config())
    lifelines.start()
    process = sleeping()
    try:
        [device] = leases.request(alice, {"gpu": 1}, held_for=ref_of(process))
        leases.request(bob, {"gpu": 1})  # a change before the watch is open
        await until(lambda: lifelines.metrics()["watched"] == 1)
        process.kill()
        process.wait()
        await until(lambda: leases.state(device.uuid) == "free", timeout=5)
        for _ in range(3):
            await asyncio.sleep(0)
        assert lifelines.metrics() == {"watched": 0, "polled": 0, "ended": 1}
    finally:
        lifelines.stop()
        process.kill()
        process.wait()
