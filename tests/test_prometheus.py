"""/metrics scraped by a real Prometheus server: two daemons (test mode with GPUs reserved by two
users, and GPU host mode on the simulator with real processes), one Prometheus scraping both
every second, and its HTTP API asked what a dashboard would ask."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import ScenarioFile, ServerProcess
from prometheus import (
    OPENMETRICS,
    Prometheus,
    eventually,
    exposition,
    get,
    promtool_check_metrics,
    settles,
    tool,
)

ALICE = "alice@example.org"
BOB = "bob@example.org"
MIB = 1024 * 1024


def ok(server: ServerProcess, path: str):
    status, _, body = get(server.url + path)
    assert status == 200, (path, status, body)
    return json.loads(body)


@pytest.fixture(scope="module")
def tools():
    return tool("prometheus"), tool("promtool")


@pytest.fixture(scope="module")
def fleet(tools, tmp_path_factory):
    """Daemon A (test mode: alice holds 2 GPUs, bob 1), daemon B (GPU host mode on the
    simulator: a real `sleep` on GPU 1, one GPU reserved by this process), and Prometheus
    scraping both every second."""
    scenario = ScenarioFile(
        str(tmp_path_factory.mktemp("sim") / "scenario.json"), devices=[{}, {}, {}, {}]
    )
    sleeper = subprocess.Popen(["sleep", "600"])
    started = []
    prometheus = None
    try:
        a = ServerProcess("--test", "--lease", "600").start()
        started.append(a)
        assert len(ok(a, f"/request?gpu=2&user={ALICE}")) == 2
        assert len(ok(a, f"/request?gpu=1&user={BOB}")) == 1
        b = ServerProcess("--nvidia-smi", scenario.command, "--lease", "300").start()
        started.append(b)
        scenario.write(
            processes=[
                {"pid": sleeper.pid, "gpu": 1, "type": "C", "name": "sleep", "used_mib": 512}
            ]
        )
        eventually(
            lambda: [
                e for e in ok(b, "/status").values() if e["claim"]["processes"] == [sleeper.pid]
            ],
            "sleep seen on GPU 1",
        )
        assert len(ok(b, "/request?gpu=1")) == 1  # this process (root here) reserves one
        prometheus = Prometheus({"patroller-test": [a.server], "patroller-gpuhost": [b.server]})
        prometheus.start()
        eventually(prometheus.targets_up, "both targets up")
        yield a, b, scenario, sleeper, prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        statuses = [(server.stop(), server.log) for server in started]
        sleeper.kill()
        sleeper.wait()
    for status, log in statuses:
        assert status == 0 and "Traceback" not in log, log


def holders(server: ServerProcess):
    """{user: GPUs held} from /status: the devices whose claim names that user."""
    counts = {}
    for entry in ok(server, "/status").values():
        user = (entry["claim"]["user"] or {}).get("user")
        if user is not None:
            counts[user] = counts.get(user, 0) + 1
    return counts


def test_gpus_per_user_summed_across_both_hosts(fleet):
    a, b, _, _, prometheus = fleet
    on_b = holders(b)
    [me] = on_b  # this process's account
    assert on_b[me] == 2  # the GPU it reserved, and the one its `sleep` runs on
    expected = {ALICE: 2, BOB: 1, me: 2}

    expr = "sum by (user) (patroller_user_gpus_held)"
    settles(
        lambda: {labels["user"]: value for labels, value in prometheus.query(expr)}, expected, expr
    )
    # each user is counted on the host where they hold: alice and bob on A, this account on B
    by_host = {
        (labels["user"], labels["job"]): value
        for labels, value in prometheus.query("patroller_user_gpus_held")
    }
    assert by_host == {
        (ALICE, "patroller-test"): 2,
        (BOB, "patroller-test"): 1,
        (me, "patroller-gpuhost"): 2,
    }, by_host
    # on B, the `sleep` runs on a GPU nobody reserved
    unreserved = {
        labels["user"]: value
        for labels, value in prometheus.query("patroller_user_gpus_unreserved > 0")
    }
    assert unreserved == {me: 1}, unreserved


def test_a_process_memory_series_appears_and_goes_with_the_process(fleet):
    _, b, scenario, first, prometheus = fleet
    second = subprocess.Popen(["sleep", "600"])
    expr = f'patroller_process_gpu_memory_bytes{{pid="{second.pid}"}}'
    kept = scenario.scenario["processes"]
    try:
        assert prometheus.query(expr) == []
        # on the GPU the first `sleep` holds already: who holds what does not change
        scenario.write(
            processes=kept
            + [{"pid": second.pid, "gpu": 1, "type": "C", "name": "sleep", "used_mib": 1024}]
        )
        [(labels, value)] = eventually(lambda: prometheus.query(expr) or None, f"{expr} scraped")
        assert value == 1024 * MIB == 1073741824
        assert labels["gpu"] == "1" and labels["command"] == "sleep"
        assert labels["job"] == "patroller-gpuhost"
        assert labels["user"] in holders(b), labels  # this process's account

        scenario.write(processes=kept)
        # Prometheus marks the series stale at the first scrape that lacks it
        settles(lambda: prometheus.query(expr), [], f"{expr} gone")
        # the other process's series stays
        still = f'patroller_process_gpu_memory_bytes{{pid="{first.pid}"}}'
        assert [value for _, value in prometheus.query(still)] == [512 * MIB]
    finally:
        scenario.write(processes=kept)
        second.kill()
        second.wait()


def test_promtool_finds_no_problem_in_either_exposition(fleet):
    a, b, _, _, _ = fleet
    for server in (a, b):
        status, said = promtool_check_metrics(exposition(server.url))
        assert (status, said) == (0, ""), (server.args, said)


def test_openmetrics_when_the_scraper_asks_for_it(fleet):
    a, b, _, _, _ = fleet
    for server in (a, b):
        status, kind, body = get(server.url + "/metrics", accept=OPENMETRICS)
        assert status == 200 and kind.startswith("application/openmetrics-text"), kind
        assert body.decode("utf-8").endswith("# EOF\n")
        status, kind, body = get(server.url + "/metrics")
        assert status == 200 and kind.startswith("text/plain; version=0.0.4"), kind
        assert b"# EOF" not in body
