"""contrib/: the Grafana dashboard asks only for what a live exposition has, or the recording
rules record, on the hosts chosen by its `instance` variable, in PromQL that Prometheus runs; the
example scrape configuration and the recording rules pass promtool, their unit tests included."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import ROOT, ScenarioFile, ServerProcess
from prometheus import PATROLLER_NAME, Prometheus, eventually, exposition, get, sample_names, tool

DASHBOARD = os.path.join(ROOT, "contrib", "grafana", "patroller-dashboard.json")
SCRAPE_CONFIG = os.path.join(ROOT, "contrib", "prometheus", "prometheus.yml")
RULES = os.path.join(ROOT, "contrib", "prometheus", "patroller-rules.yml")
RULE_TESTS = os.path.join(ROOT, "contrib", "prometheus", "patroller-rules.test.yml")
# Metric names a query may use: Patroller's, prometheus_client's standard process ones, and
# the series the recording rules record from Patroller's (level:patroller_...:operations).
METRIC = re.compile(
    r"\b((?:[a-z_]+:)?(?:patroller|process|python)_[a-z0-9_]+(?::[a-z0-9_]+)?)"
    r"\b(\{[^}]*\})?"
)
BY_INSTANCE = 'instance=~"$instance"'


def dashboard() -> dict[str, Any]:
    with open(DASHBOARD, encoding="utf-8") as f:
        return json.load(f)


def panels(within: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in within:
        yield panel
        yield from panels(panel.get("panels", []))


def exprs() -> list[str]:
    """The PromQL of every panel target."""
    found = [
        target["expr"]
        for panel in panels(dashboard()["panels"])
        for target in panel.get("targets", [])
    ]
    assert found
    return found


def variable_queries() -> list[str]:
    found = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append(query["query"] if isinstance(query, dict) else query)
    return found


def recorded() -> dict[str, str]:
    """{recorded name: its PromQL} of every recording rule in contrib/prometheus (each written
    as `- record: NAME` and, on the next line, `expr: PROMQL`)."""
    with open(RULES, encoding="utf-8") as f:
        text = f.read()
    found = dict(re.findall(r"^\s*- record: (\S+)\n\s*expr: (.+)$", text, re.MULTILINE))
    assert len(found) == text.count("record:"), text
    return found


def get_json(server: ServerProcess, path: str) -> Any:
    status, _, body = get(server.url + path)
    assert status == 200, (path, status, body)
    return json.loads(body)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A test-mode daemon (alice holds two GPUs, carol waits for eight) and a GPU-host one on
    the simulator (a real `sleep` on a GPU, one GPU reserved), each with a usage store: every
    family has samples."""
    scenario = ScenarioFile(
        str(tmp_path_factory.mktemp("sim") / "scenario.json"), devices=[{}, {}, {}]
    )
    sleeper = subprocess.Popen(["sleep", "600"])
    usage = ("--usage-interval", "0.5")
    test_mode = ServerProcess(
        "--test",
        "--lease",
        "600",
        "--state-dir",
        str(tmp_path_factory.mktemp("test-state")),
        *usage,
    ).start()
    waiter = None
    try:
        gpu_host = ServerProcess(
            "--nvidia-smi",
            scenario.command,
            "--lease",
            "300",
            "--state-dir",
            str(tmp_path_factory.mktemp("gpu-state")),
            *usage,
        ).start()
        try:
            get_json(test_mode, "/request?gpu=2&user=alice@example.org")
            waiter = threading.Thread(
                target=get,
                args=(test_mode.url + "/wait?gpu=8&timeout=300&user=carol",),
                kwargs={"timeout": 400},
                daemon=True,
            )
            waiter.start()
            eventually(lambda: get_json(test_mode, "/queue"), "carol waiting")
            scenario.write(
                processes=[
                    {
                        "pid": sleeper.pid,
                        "gpu": 1,
                        "type": "C",
                        "name": "sleep",
                        "used_mib": 256,
                        "sm": 40,
                    }
                ]
            )
            eventually(
                lambda: any(
                    e["claim"]["processes"] == [sleeper.pid]
                    for e in get_json(gpu_host, "/status").values()
                ),
                "sleep seen on a GPU",
            )
            get_json(gpu_host, "/request?gpu=1")
            # the per-process figures arrive with pmon's next complete interval
            eventually(
                lambda: "patroller_process_gpu_utilization_ratio{" in exposition(gpu_host.url),
                "per-process figures exposed",
            )
            eventually(
                lambda: (
                    'patroller_usage_gpu_seconds_total{category="reserved_unused"'
                    in exposition(test_mode.url)
                ),
                "alice's reserved_unused GPU-seconds",
            )
            yield test_mode, gpu_host
        finally:
            assert gpu_host.stop() == 0, gpu_host.log
    finally:
        assert test_mode.stop() == 0, test_mode.log  # answers carol's /wait
        if waiter is not None:
            waiter.join(30)
        sleeper.kill()
        sleeper.wait()


def test_the_dashboard_has_a_datasource_and_a_multi_host_instance_variable():
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 40
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    instance = variables["instance"]
    assert instance["type"] == "query"
    assert instance["query"]["query"] == "label_values(patroller_build_info, instance)"
    assert instance["multi"] is True and instance["includeAll"] is True
    for panel in panels(board["panels"]):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_the_dashboard_has_the_panels_the_fleet_needs():
    by_title = {panel["title"]: panel for panel in panels(dashboard()["panels"])}
    hours = "instance_user_category:patroller_gpu_hours"  # the recording rules' prefix
    wanted = {
        "GPUs by user": "sum by (user) (patroller_user_gpus_held",
        "GPU utilisation heat map": "patroller_gpu_utilization_ratio",
        "Reserved but idle GPUs": "patroller_user_gpus_reserved_unused",
        "GPUs used without a reservation": "patroller_user_gpus_unreserved",
        "Requests waiting": "patroller_requests_waiting",
        "Longest wait": "patroller_wait_seconds_max",
        "Who holds what": "patroller_gpu_holder_info",
        "GPU memory per process": "patroller_process_gpu_memory_bytes",
        "Monitors up": "patroller_monitor_up",
        "HTTP requests by status": "patroller_http_requests_total",
        "GPU-hours per user and category, per day": f"{hours}:increase1h",
        "GPU-hours per user and category, per hour": f"{hours}:increase1h",
        "GPU-hours in the last 24 hours": f"{hours}:increase1d",
    }
    for title, fragment in wanted.items():
        assert title in by_title, title
        assert any(fragment in t["expr"] for t in by_title[title]["targets"]), (title, fragment)


def test_every_query_filters_by_the_instance_variable():
    for expr in exprs():
        selectors = METRIC.findall(expr)
        assert selectors, expr
        for name, labels in selectors:
            assert BY_INSTANCE in labels, (name, expr)


def test_every_metric_the_dashboard_names_is_exposed(live):
    exposed = set()
    for server in live:
        exposed |= sample_names(exposition(server.url))
    named = {name for query in exprs() + variable_queries() for name, _ in METRIC.findall(query)}
    assert {n for n in named if PATROLLER_NAME.fullmatch(n)}, named
    # a name with colons is a recording rule's; the rules ask for exposed metrics in turn
    rules = recorded()
    asked = {name for expr in rules.values() for name, _ in METRIC.findall(expr)}
    assert "patroller_usage_gpu_seconds_total" in asked, rules
    unrecorded = sorted(n for n in named if ":" in n and n not in rules)
    assert not unrecorded, f"the dashboard asks for series no rule records: {unrecorded}"
    missing = sorted({n for n in named | asked if ":" not in n} - exposed)
    assert not missing, f"the dashboard or the rules ask for metrics no daemon exposes: {missing}"
    assert {n for n in asked if ":" in n} <= set(rules)


def test_every_query_runs_in_prometheus(live):
    """Each panel's PromQL, with the dashboard's variables filled in as Grafana would, is
    accepted by a real Prometheus scraping both daemons; the instance variable's query finds
    both hosts."""
    hosts = [server.server for server in live]
    prometheus = Prometheus({"patroller": hosts}, rules=[RULES]).start()
    try:
        eventually(prometheus.targets_up, "both targets up")
        assert sorted(
            labels["instance"] for labels, _ in prometheus.query("patroller_build_info")
        ) == sorted(hosts)
        # Grafana's value of a multi-valued variable: a regex alternation, escaped for PromQL
        chosen = "|".join(re.escape(host) for host in hosts).replace("\\", "\\\\")
        for expr in exprs():
            filled = expr.replace("$instance", chosen).replace("$__rate_interval", "1m")
            status, _, body = get(
                f"{prometheus.url}/api/v1/query?" + urllib.parse.urlencode({"query": filled})
            )
            answer = json.loads(body)
            assert status == 200 and answer["status"] == "success", (expr, answer)
        # what the GPUs-by-user panel shows, once scraped
        eventually(
            lambda: (
                {
                    labels["user"]
                    for labels, _ in prometheus.query(
                        f'sum by (user) (patroller_user_gpus_held{{instance=~"{chosen}"}})'
                    )
                }
                >= {"alice@example.org"}
            ),
            "alice on the GPUs-by-user panel",
        )
        # and what the hourly GPU-hours panel shows, once the rules have recorded it: alice's
        # held GPUs, with nothing on them (the daily figures need an hour mark to pass: the
        # rules' unit tests check those)
        [expr] = [
            t["expr"]
            for p in panels(dashboard()["panels"])
            if p["title"] == "GPU-hours per user and category, per hour"
            for t in p["targets"]
        ]
        filled = expr.replace("$instance", chosen)
        eventually(
            lambda: (
                [
                    value
                    for labels, value in prometheus.query(filled)
                    if labels.get("user") == "alice@example.org"
                    and labels["category"] == "reserved_unused"
                    and value > 0
                ]
                or None
            ),
            "alice's reserved_unused GPU-hours on the hourly panel",
        )
    finally:
        prometheus.stop()


def test_the_example_scrape_configuration_passes_promtool():
    done = subprocess.run(
        [tool("promtool"), "check", "config", SCRAPE_CONFIG],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_recording_rules_pass_promtool_and_their_unit_tests():
    """`promtool check rules`, and `promtool test rules` on the series written by hand in
    contrib/prometheus/patroller-rules.test.yml (GPU-hours worked out in its comments)."""
    promtool = tool("promtool")
    done = subprocess.run(
        [promtool, "check", "rules", RULES], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(recorded())} rules found" in done.stdout, done.stdout
    done = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "FAILED" not in done.stdout, done.stdout


def test_the_example_configuration_loads_the_rules():
    with open(SCRAPE_CONFIG, encoding="utf-8") as f:
        config = f.read()
    assert re.search(r"^rule_files:\n  - patroller-rules\.yml$", config, re.MULTILINE), config
    done = subprocess.run(
        [tool("promtool"), "check", "config", SCRAPE_CONFIG],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"SUCCESS: {len(recorded())} rules found" in done.stdout, done.stdout
