"""Writing the usage store's tables (schema.py says what each holds): one interval's samples in
one transaction, with its hourly and daily totals, and the removal of old samples and hourly
totals, whose time stays in the daily ones. Run by the store's writer thread alone, on its
connection (autocommit mode: each transaction is explicit)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from patroller.core.usage import GpuSample, classify
from patroller.state.usage.keys import Keys

HOUR = 3600
DAY = 86400
ADD_HOURLY = (
    "INSERT INTO hourly (hour, gpu, category, party, seconds) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (hour, gpu, category, party) "
    "DO UPDATE SET seconds = seconds + excluded.seconds"
)
ADD_DAILY = (
    "INSERT INTO daily (day, gpu, category, party, seconds) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (day, gpu, category, party) "
    "DO UPDATE SET seconds = seconds + excluded.seconds"
)
# one encoder for every interval (json.dumps with separators makes a new one each call)
_PROCESSES = json.JSONEncoder(separators=(",", ":")).encode


def write_interval(
    db: sqlite3.Connection, keys: Keys, at: float, samples: Sequence[GpuSample]
) -> int:
    """One interval's samples, ending at `at` (epoch seconds), and their GPU-seconds by hour,
    category and party, in one transaction: all of them or none. The rows written."""
    keys.interval()
    hourly: list[tuple[int, int, str, int | None, float]] = []
    db.execute("BEGIN IMMEDIATE")
    try:
        for sample in samples:
            gpu = keys.gpu(db, sample)
            processes = [
                {
                    "party": keys.party(db, p.party),
                    "own": p.own,
                    "pids": list(p.pids),
                    "containers": list(p.containers),
                }
                for p in sample.present
            ]
            db.execute(
                "INSERT INTO samples (at, gpu, seconds, state, hold, holder, reserved, "
                "processes, readings, busy, sm_mean, sm_max, mem_mean, mem_max, fb_mean, "
                "fb_max) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    at,
                    gpu,
                    sample.seconds,
                    sample.state,
                    sample.hold,
                    keys.party(db, sample.holder),
                    int(sample.reserved),
                    _PROCESSES(processes),
                    sample.readings,
                    sample.busy,
                    sample.sm_mean,
                    sample.sm_max,
                    sample.mem_mean,
                    sample.mem_max,
                    sample.fb_mean,
                    sample.fb_max,
                ),
            )
            # counted in the hour its interval began
            hour = int((at - sample.seconds) // HOUR * HOUR)
            hourly.extend(
                (hour, gpu, category, keys.party(db, party), seconds)
                for category, party, seconds in classify(sample)
            )
        # the totals in two statements for the whole interval (a row twice adds up, as before)
        db.executemany(ADD_HOURLY, hourly)
        db.executemany(ADD_DAILY, [(hour - hour % DAY, *row) for hour, *row in hourly])
        db.execute("COMMIT")
    except BaseException:
        keys.clear()
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # no transaction left to roll back (SQLite ended it itself)
        raise
    return len(samples)


def cutoff(now: float, days: int) -> int:
    """Where folding stops: the start (UTC) of the day `days` before `now`; rows before it are
    folded, so that only whole days become daily totals."""
    return int((now - days * DAY) // DAY * DAY)


def fold(db: sqlite3.Connection, before: int) -> tuple[int, int]:
    """Remove the hourly totals and the samples before `before` (epoch seconds, a day's
    start), in one transaction: their GPU-seconds stay in the daily totals, written with them.
    (samples removed, hourly totals removed)"""
    db.execute("BEGIN IMMEDIATE")
    try:
        hours = db.execute("DELETE FROM hourly WHERE hour < ?", (before,)).rowcount
        samples = db.execute("DELETE FROM samples WHERE at < ?", (before,)).rowcount
        db.execute("COMMIT")
    except BaseException:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise
    return samples, int(hours)
