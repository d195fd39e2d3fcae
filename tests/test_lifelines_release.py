"""A process hold given up while its process lives (patroller/state/lifetimes.py `sync`): its
pidfd is closed and taken off the loop, and the process's end later frees nothing; and where
the interpreter has no pidfds, open_pidfd says so (the watch then polls). In-process: the
mutation suite runs this file (test_hold_process.py has the rest)."""

from __future__ import annotations

import asyncio
import errno
import os

import pytest
from helpers import async_test, lease_manager, until
from test_hold_process import alice, ref_of, sleeping

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
