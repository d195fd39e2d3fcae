"""The benchmark never loses work: a step whose dependency is missing is skipped with why, one
that fails is recorded as failed (and the run exits 1), and the results are written after
every step, so that what ran before a failure is kept. The steps here are stand-ins; the real
ones run in CI (`python -m bench --quick`)."""

import json
import os
import threading
import time

import pytest

import bench.__main__ as bench
from bench import measures


@pytest.fixture
def steps(monkeypatch, tmp_path):
    """footprint measures, parsers fails, page finds selenium missing; nothing is started."""
    out = tmp_path / "results.json"
    seen_by_page = {}
    monkeypatch.setattr(measures.Context, "start", lambda self, processes=500: None)
    monkeypatch.setattr(
        measures, "footprint", lambda ctx: {"idle": {"cpu_percent": 0.5, "rss_mib": 40}}
    )

    def parsers(ctx):
        raise RuntimeError("the simulator is gone")

    def page(ctx):
        seen_by_page.update(json.loads(out.read_text())["results"])  # saved before this step
        raise ImportError("No module named 'selenium'", name="selenium")

    monkeypatch.setattr(measures, "parsers", parsers)
    monkeypatch.setattr(measures, "page", page)
    return out, seen_by_page


def test_a_failed_and_a_skipped_step_lose_no_other_steps_rows(steps, capsys):
    out, seen_by_page = steps
    code = bench.main(["--quick", "--only", "footprint,parsers,page", "--out", str(out)])
    assert code == 1  # a step failed
    saved = json.loads(out.read_text())
    results = saved["results"]
    assert results["footprint"] == {"idle": {"cpu_percent": 0.5, "rss_mib": 40}}
    assert results["parsers"] == {"failed": "RuntimeError: the simulator is gone"}
    assert results["page"] == {"skipped": "selenium is not installed"}
    assert set(seen_by_page) == {"footprint", "parsers"}  # written as each step ended
    printed = capsys.readouterr().out
    assert "| idle RSS MiB | 40 | < 60 | yes |" in printed
    assert "| step page | skipped: selenium is not installed |" in printed
    assert "| step parsers | failed: RuntimeError: the simulator is gone |" in printed
    checks = {c["what"]: c for c in saved["checks"]}
    assert checks["dmon parser lines/s"]["met"] is None  # not measured, not a crash


def test_only_skipped_steps_exit_zero(steps):
    out, _ = steps
    assert bench.main(["--quick", "--only", "footprint,page", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["results"]["page"] == {
        "skipped": "selenium is not installed"
    }


def test_a_step_over_its_budget_is_said_and_its_figures_stand(steps, capsys, monkeypatch):
    """Quick mode: each step's time and budget are kept in the report; one over its budget
    (here a budget no step can meet) is named in the table's first line and the log, and its
    figures are in the table all the same. A step with no budget of its own has the default;
    the full mode has none."""
    out, _ = steps
    budgets = {name: 10_000 for name in bench.QUICK_BUDGET_S}
    budgets["footprint"] = -1
    del budgets["page"]
    monkeypatch.setattr(bench, "QUICK_BUDGET_S", budgets)
    assert bench.main(["--quick", "--only", "footprint,page", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert list(saved["steps"]) == ["footprint", "page"]
    assert saved["steps"]["footprint"]["budget_s"] == -1
    assert saved["steps"]["page"]["budget_s"] == bench.DEFAULT_BUDGET_S
    first = capsys.readouterr().out.splitlines()[0]
    assert "over their budgets: footprint" in first and "page" not in first
    assert "| idle RSS MiB | 40 | < 60 | yes |" in bench.table(saved)
    budgets["footprint"] = 10_000
    assert bench.main(["--quick", "--only", "footprint", "--out", str(out)]) == 0
    assert "each within its budget" in capsys.readouterr().out.splitlines()[0]
    assert bench.main(["--only", "footprint", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["steps"]["footprint"]["budget_s"] is None
    assert "budget" not in bench.table(saved).splitlines()[0]


def test_the_fleet_steps_table_for_docs_many_hosts():
    from bench import fleet

    machine = {"date": "2026-12-04", "cpu": "a CPU", "cores": 2, "memory_gib": 24}
    result = {
        "hosts": 1010,
        "test_mode_daemons": 300,
        "replicas": 700,
        "refusing": 5,
        "silent": 5,
        "fleet_json_bytes": 2118462,
        "poller_core_fraction": 0.05,
        "fleet_json": {"p99_ms": 20.5, "requests_per_s": 300},
        "fleet_json_one_client": {"p99_ms": 9.1, "requests_per_s": 200},
        "fleet_json_plain": {"p99_ms": 70.2, "requests_per_s": 250},
        "fleet_json_gzip_bytes": 151000,
        "status_poller": {"p99_ms": 12.0},
        "status_plain": {"p99_ms": 11.0},
        "status_p99_ratio": 1.09,
        "status_hosts": {"hosts": "100 live, 5 refusing, 5 silent", "median_s": 1.7, "max_s": 1.8},
    }
    text = fleet.table({"machine": machine, "mode": "full", "results": {"fleet": result}})
    assert (
        "| `/fleet.json` p99 (wrk, 4 connections, gzip accepted as by the page), 1010 hosts"
        " | 20.5 ms (300/s, 151000 bytes)"
    ) in text
    assert "4 connections without gzip | 70.2 ms (250/s, 2118462 bytes)" in text
    assert "(1.09x) | unaffected |" in text and "median 1.7 s, max 1.8 s | under 2 s |" in text
    report = {
        "machine": machine,
        "mode": "full",
        "docker": False,
        "results": {"fleet": {**result, "scaled_down": "200 test-mode daemons, not 300"}},
    }
    assert "; 200 test-mode daemons, not 300." in fleet.table(report)
    checks = {c["what"]: c for c in bench.checks(report)}
    assert checks["/fleet.json p99 ms, 1010 hosts"]["met"] is True
    skipped = {
        "machine": machine,
        "mode": "quick",
        "results": {"fleet": {"skipped": "wrk is not installed"}},
    }
    assert "did not run" in fleet.table(skipped)


def test_the_streams_beside_the_ceiling_are_the_daemons_dmon_and_pmon_run_on_after_it():
    # The ceiling is measured again beside the GPU's tools as the daemon ran them: the same
    # command lines (one dmon, one pmon) on a copy of its scenario, running after it stopped,
    # and gone once the measurement ends.
    from bench.harness import Daemon, Streams

    daemon = Daemon(2).start()
    try:
        daemon.wait_for(lambda status: all(d["updated"] for d in status.values()), timeout=30)
        ran = daemon.streams()
        streams = Streams(daemon)
    finally:
        daemon.stop()
    assert sorted(argv[argv.index("--scenario") + 2] for argv in ran) == ["dmon", "pmon"]
    with streams:
        running = list(streams.processes)
        assert [p.poll() for p in running] == [None, None]
        for process, argv in zip(running, ran, strict=True):
            now = _command_line(process.pid)
            at = argv.index("--scenario") + 1
            assert now[:at] + now[at + 1 :] == argv[:at] + argv[at + 1 :]
            assert now[at].startswith(streams.dir) and os.path.isfile(now[at])
    assert all(p.poll() is not None for p in running) and not os.path.exists(streams.dir)


def _command_line(pid):
    """A child's command line, once it has one: read between its fork and its exec, the
    kernel shows it empty for a moment (seen once in a whole run on a busy machine)."""
    deadline = time.monotonic() + 10
    while True:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            found = [arg.decode() for arg in f.read().split(b"\0")[:-1]]
        if found and "--scenario" in found or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def test_a_fleet_run_at_load_that_answered_no_request_is_a_goal_missed():
    """A run that answered no request (a machine too loaded) has no p99: harness.wrk gives None
    where wrk ended none, and wrk's 0 ms where its requests all timed out (2026-12-07, a run
    queue of 27). Neither is a latency met: the row says so, and the goal is missed."""
    from bench import fleetload

    found = {
        "fleet_json_burning": {"p99_ms": None, "requests_per_s": 0, "runnable_mean": 9.0},
        "fleet_json_quiet": {"p99_ms": 4.0, "requests_per_s": 900},
        "status_hosts_burning": {"max_s": 9.0},
    }
    row = fleetload.checks(found)[0]
    assert row[1] == fleetload.NO_ANSWER and not row[3](row[1])
    found["fleet_json_burning"] |= {"p99_ms": 0.0}
    row = fleetload.checks(found)[0]
    assert row[1] == fleetload.NO_ANSWER and not row[3](row[1])
    found["fleet_json_burning"] |= {"p99_ms": 31.5, "requests_per_s": 40}
    row = fleetload.checks(found)[0]
    assert row[1] == 31.5 and row[3](row[1])
    found["fleet_json_burning"] |= {"p99_ms": 1760.0, "requests_per_s": 1}
    row = fleetload.checks(found)[0]
    assert row[1] == 1760.0 and not row[3](row[1])


def test_wrk_gives_no_latency_for_a_run_that_answered_nothing():
    """A server that accepts and never answers: wrk prints a p99 of 0, which is no p99."""
    import socket

    from bench.harness import wrk

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    try:
        found = wrk(f"http://127.0.0.1:{silent.getsockname()[1]}/status", 1, connections=2)
    finally:
        silent.close()
    assert found["requests_per_s"] == 0
    assert found["p50_ms"] is None and found["p99_ms"] is None


def test_the_storms_heap_reading_counts_what_is_held_and_not_what_was_given_back(tmp_path):
    """The notify step's memory row reads the daemon's heap (bench/notify.py, _sample_heap):
    20 MiB held shows as 20 MiB more, and shows no longer once let go."""
    from bench import notify

    path = str(tmp_path / "heap")
    stop = threading.Event()
    sampler = threading.Thread(target=notify._sample_heap, args=(path, 0.05, stop))
    sampler.start()

    def latest():  # the first reading taken after now
        now = time.monotonic()
        deadline = now + 30
        while not (found := notify._heap_read(path, now, float("inf"))):
            assert time.monotonic() < deadline, "the sampler wrote no reading"
            time.sleep(0.01)
        return found[0]

    try:
        before = latest()
        held = bytearray(20 * 2**20)
        during = latest()
        del held
        after = latest()
    finally:
        stop.set()
        sampler.join(10)
    assert not sampler.is_alive()
    assert 19.5 < during - before < 21, (before, during)
    assert abs(after - before) < 0.5, (before, after)
    assert notify._heap_read(path, 0, 1) == []  # readings outside the times asked: none
    assert notify._heap_read(str(tmp_path / "none"), 0, time.monotonic()) == []
