"""What the benchmark's steps share in a run: the usage store written once (the usage and
reports steps), and the fleet step's test-mode daemons taken over by fleet_at_load, stopped
by it, or by the run's end where it does not run."""

import os
import sqlite3

from bench import fleet, measures, usage
from bench.harness import ROOT


def context(steps: list[str]) -> measures.Context:
    ctx = measures.Context(True, lambda text: None)
    ctx.steps = steps
    return ctx


def samples(directory) -> int:
    with sqlite3.connect(os.path.join(directory, usage.FILE)) as db:
        return db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]


def test_a_store_is_written_once_and_copied_for_the_next_step(tmp_path):
    ctx = context(["usage", "reports"])
    first, second = tmp_path / "usage", tmp_path / "reports"
    first.mkdir()
    second.mkdir()
    try:
        written = usage.store(ctx, str(first), 2, 1)
        copied = usage.store(ctx, str(second), 2, 1)
        template = ctx.stores[(2, 1)][0]
        assert "copied" not in written and copied["copied"] is True
        assert copied["samples"] == written["samples"] == samples(second) == 2 * 1440
        (second / usage.FILE).unlink()  # each step's store its own: the first one is intact
        assert samples(first) == 2 * 1440
    finally:
        ctx.stop()
    assert not os.path.exists(template)


def test_the_fleet_steps_share_their_daemons_and_the_last_stops_them():
    ctx = context(["fleet", "fleet_at_load"])
    ctx.step = "fleet"
    daemons, keep = fleet.shared_daemons(ctx, ROOT, 1, lambda text: None)
    try:
        assert keep and ctx.shared
        ctx.step = "fleet_at_load"
        again, keep_again = fleet.shared_daemons(ctx, ROOT, 1, lambda text: None)
        assert again == daemons and not keep_again and not ctx.shared
    finally:
        fleet.stop_all(daemons)
    ctx.stop()


def test_the_fleet_step_keeps_no_daemon_for_a_step_that_does_not_run():
    ctx = context(["fleet", "notify"])
    ctx.step = "fleet"
    daemons, keep = fleet.shared_daemons(ctx, ROOT, 1, lambda text: None)
    fleet.stop_all(daemons)
    assert not keep and not ctx.shared


def test_the_run_stops_daemons_left_to_a_step_that_did_not_follow():
    ctx = context(["fleet", "fleet_at_load"])
    ctx.step = "fleet"
    daemons, _ = fleet.shared_daemons(ctx, ROOT, 1, lambda text: None)
    ctx.stop()
    assert all(d.process.poll() is not None for d in daemons)
