"""The usage store at start (patroller/state/usage/store.py): which store the configuration
asks for and what is said when there is none, what a store that has written nothing shows in
/metrics, what it says when it opens, and intervals dropped before any write failed.
In-process and fast: the mutation suite runs this file."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import replace

import pytest
from test_read_only_state import read_only_view

from patroller.config import Config
from patroller.core.usage import GpuSample, Party
from patroller.state.usage.files import FILE
from patroller.state.usage.store import UsageStore, store_for

STORE = "patroller.state.usage.store"


def said(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == STORE and r.levelno == level]


def test_the_store_is_in_the_usage_directory_else_the_state_directory(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=STORE)
    store = store_for(replace(Config(), state_dir=str(tmp_path / "state")))
    assert store is not None and store.path == str(tmp_path / "state" / FILE)
    store = store_for(
        replace(Config(), state_dir=str(tmp_path / "state"), usage_dir=str(tmp_path / "use"))
    )
    assert store is not None and store.directory == str(tmp_path / "use")
    assert store.path == str(tmp_path / "use" / FILE)
    store = store_for(replace(Config(), state_dir=None, usage_dir=str(tmp_path / "use")))
    assert store is not None and store.config.usage_dir == str(tmp_path / "use")
    assert store_for(replace(Config(), state_dir=str(tmp_path), usage="none")) is None
    assert caplog.records == []  # none of these is worth a word


def test_no_state_directory_keeps_no_history_and_says_how_to_keep_one(caplog):
    caplog.set_level(logging.DEBUG, logger=STORE)
    assert store_for(replace(Config(), state_dir=None)) is None
    assert said(caplog, logging.WARNING) == [
        "no usage history is kept: --usage sqlite needs a state directory, and there is none "
        "(--state-dir none); give --state-dir DIR to keep one, or --usage none"
    ]
    caplog.clear()
    assert store_for(replace(Config(), state_dir=None, test=True)) is None
    assert said(caplog, logging.WARNING) == []  # test mode's default: a debug line
    assert said(caplog, logging.DEBUG) == [
        "no usage history is kept: --usage sqlite needs a state directory, and there is none "
        "(test mode's default); give --state-dir DIR to keep one, or --usage none"
    ]


def test_a_store_that_has_done_nothing_yet_shows_nothing_done(tmp_path):
    store = UsageStore(str(tmp_path), Config())
    assert store.why == ""
    assert store.metrics() == {
        "path": str(tmp_path / FILE),
        "state": "starting",
        "rows": 0,
        "intervals": 0,
        "failures": 0,
        "set_aside": 0,
        "pending": 0,
        "dropped": 0,
        "answered_again": 0,
        "free": None,
        "saving_room": False,
        "parties_overflow": 0,
        "reports_running": 0,
        "reports_waiting": 0,
        "reports_busy": 0,
        "reports_too_large": 0,
    }


def test_opening_makes_its_directory_private_and_says_what_it_keeps(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=STORE)
    where = tmp_path / "a" / "b"
    store = UsageStore(str(where), replace(Config(), usage_interval=90.0, usage_days=30))
    store.open()
    try:
        assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
        assert store.writer.thread is not None and store.writer.thread.is_alive()
    finally:
        store.close(10)
    assert said(caplog, logging.INFO)[0] == (
        f"usage store {where / FILE}: a sample of every GPU every 1m30s, kept 30 days, "
        "then daily totals"
    )
    assert store.state == "stopped"
    again = UsageStore(str(where), Config())  # its directory there already: opened all the same
    again.open()
    try:
        assert again.writer.thread is not None
    finally:
        again.close(10)
    assert os.path.exists(where / FILE)


@pytest.mark.parametrize("there", [True, False], ids=["its-directory-there", "none"])
def test_on_a_read_only_filesystem_there_is_no_store_and_it_says_so(tmp_path, caplog, there):
    """Whether or not its directory is there already (none can be made there)."""
    caplog.set_level(logging.INFO, logger=STORE)
    (tmp_path / "source").mkdir()
    with read_only_view(tmp_path / "source", tmp_path / "ro") as where:
        directory = where if there else where / "usage"
        store = UsageStore(str(directory), Config())
        store.open()
        assert store.state == "read_only" and store.writer.thread is None
        store.close(10)
        assert store.state == "read_only"
    assert said(caplog, logging.WARNING) == [
        f"the usage store's directory {directory} is on a read-only filesystem: running "
        "without a usage store (no usage history is kept)"
    ]
    assert said(caplog, logging.INFO) == []


def test_intervals_past_the_backlog_before_any_failure_are_dropped_with_one_line(tmp_path, caplog):
    """A wall clock the test holds back holds the writer in its first write (its folding asks
    the time): what is put meanwhile waits, past a backlog of one."""
    caplog.set_level(logging.INFO, logger=STORE)
    let_go = threading.Event()

    def wall():
        let_go.wait(20)
        return time.time()

    store = UsageStore(str(tmp_path), replace(Config(), usage_backlog=1), wall=wall)
    store.open()
    try:
        now = time.time()
        for n in range(3):
            store.put(
                now + 60 * n, [GpuSample(uuid="GPU-a", number=0, seconds=60.0, state="free")]
            )
    finally:
        let_go.set()
        store.close(10)
    assert store.dropped == 2 and store.intervals == 1 and store.failures == 0
    assert said(caplog, logging.WARNING) == [
        f"usage store {tmp_path / FILE}: 1 interval(s) wait in memory, the most kept "
        "(usage_backlog): the oldest is dropped (1 dropped so far): the store cannot be written"
    ]


def test_the_store_keeps_to_the_new_parties_an_interval_it_is_given(tmp_path):
    store = UsageStore(str(tmp_path), replace(Config(), usage_new_parties=1))
    store.open()
    try:
        store.put(
            time.time(),
            [
                GpuSample(uuid=f"GPU-{n}", number=n, seconds=60.0, state="claimed", holder=party)
                for n, party in enumerate(
                    [Party(user="alice", account="alice"), Party(user="bob@lab", account="bob")]
                )
            ],
        )
    finally:
        store.close(10)
    assert store.intervals == 1 and store.metrics()["parties_overflow"] == 1
