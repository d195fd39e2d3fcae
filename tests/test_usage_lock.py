"""The usage store against a lock it cannot get: another process holds the file's write lock
(`BEGIN EXCLUSIVE` on a connection of its own) for as long as it likes. The writer waits
`usage_busy_timeout` at a time, never for good; the backlog is kept; what is dropped once it is
full is counted in /metrics and /metrics.json and logged once a `repeat_log_every`; and once the
lock is let go, what was kept is written."""

import logging
import subprocess
import sys
import time

import pytest
from helpers import async_test, find, running, scrape, until

FILE = "usage.sqlite3"
LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()  # held until the test lets go
db.execute("COMMIT")
db.close()
"""


@pytest.mark.errors_expected  # the writes that cannot get the lock are logged as an error
@async_test
async def test_a_lock_held_by_another_process_keeps_the_backlog_and_counts_what_is_dropped(
    tmp_path, caplog
):
    state = tmp_path / "state"
    async with running(
        state_dir=str(state),
        usage_interval=0.05,
        usage_retry=0.05,
        usage_backlog=3,
        usage_busy_timeout=0.2,
    ) as h:
        store = h.services.usage
        await until(lambda: store.intervals >= 2)
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(state / FILE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert locker.stdout.readline().strip() == "locked"
            await until(lambda: store.state == "failing", timeout=30)
            assert "locked" in store.why, store.why
            await until(lambda: store.dropped >= 5 and store.failures >= 5, timeout=30)
            began = time.monotonic()
            await h.ok("/status")  # serving goes on meanwhile
            assert time.monotonic() - began < 5
            counters = await h.ok("/metrics.json")
            assert counters["usage"]["state"] == "failing"
            assert counters["usage"]["dropped"] >= 5
            assert counters["usage"]["pending"] <= 3 + 2  # the backlog, and what was just put
            found, _, _ = await scrape(h)
            assert find(found, "patroller_usage_dropped_intervals_total")[0] >= 5
            written = store.intervals
        finally:
            locker.stdin.write("\n")
            locker.stdin.flush()
            assert locker.wait(10) == 0
        await until(lambda: store.state == "writable", timeout=30)
        await until(lambda: store.intervals >= written + 3)  # the backlog kept is written
    dropped = [r for r in caplog.records if "the oldest is dropped" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].levelno == logging.WARNING, dropped
    assert "locked" in dropped[0].getMessage()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "cannot write the usage store" in errors[0].getMessage(), errors
    assert store.dropped == h.services.sampler.samples - store.intervals
