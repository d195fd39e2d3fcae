"""GPU-hours per user and category in a real Prometheus: contrib/prometheus/patroller-rules.yml
loaded, daemons with a usage store scraped every second and sampling every second, and what
Prometheus holds compared with what each daemon's usage store says (GET /usage).

The daemon's counter, patroller_usage_gpu_seconds_total, must equal the store's GPU-seconds to
within the scrape and the usage interval that separate the two readings; the recorded hourly
GPU-hours must be the counter's growth since Prometheus first saw it, to within the
extrapolation of increase(), the evaluation interval and the usage interval (a scrape interval
and a usage interval of each GPU: 2-3 GPU-seconds a GPU here)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from helpers import NOBODY, ROOT, ScenarioFile, ServerProcess, need_root
from prometheus import Prometheus, eventually, get
from test_hide_users import PSEUDONYM

from patroller.identify.resolver import host_identity

RULES = os.path.join(ROOT, "contrib", "prometheus", "patroller-rules.yml")
SCRAPE = 1.0  # seconds between scrapes and between evaluations of the rules
GROWN = 15.0  # seconds of each GPU Prometheus sees grow before the figures are compared
HOURLY = "instance_user_category:patroller_gpu_hours:increase1h"
FLEET = "user_category:patroller_gpu_hours:increase1h"
Key = tuple[str, str]  # (user, category); "" for GPU-time no user had


def ok(server: ServerProcess, path: str):
    status, _, body = get(server.url + path)
    assert status == 200, (path, status, body)
    return json.loads(body)


def stored(server: ServerProcess) -> dict[Key, float]:
    """The usage store's GPU-seconds so far by user and category (GET /usage, as a caller
    naming nobody sees it: with --hide-users, others' pseudonyms, as /metrics shows them)."""
    found: dict[Key, float] = {}
    for row in ok(server, "/usage?since=1d&by=user")["rows"]:
        for category, hours in row["hours"].items():
            if hours > 0:
                found[(row["key"] or "", category)] = hours * 3600
    return found


def by_key(samples: list[tuple[dict[str, str], float]]) -> dict[Key, float]:
    return {(labels.get("user", ""), labels["category"]): value for labels, value in samples}


def compare(
    prometheus: Prometheus, server: ServerProcess, usage: float, gpus: dict[Key, float]
) -> None:
    """Prometheus's figures for one daemon (sampling every `usage` seconds) against its
    store's; `gpus`: how many GPUs each user and category has now (how fast its GPU-seconds
    grow), every one that grows (others may have some GPU-seconds from before, not growing)."""
    instance = f'instance="{server.server}"'
    growth = (
        f"patroller_usage_gpu_seconds_total{{{instance}}} - min_over_time("
        f"patroller_usage_gpu_seconds_total{{{instance}}}[1h])"
    )

    def grown() -> bool:
        seen = by_key(prometheus.query(growth))
        return all(seen.get(key, 0.0) >= GROWN * rate for key, rate in gpus.items())

    eventually(grown, f"{GROWN:g} s of each GPU's time seen by Prometheus", timeout=120)
    before = stored(server)
    at = time.time()
    counter = by_key(prometheus.query(f"patroller_usage_gpu_seconds_total{{{instance}}}", at))
    first = by_key(
        prometheus.query(f"min_over_time(patroller_usage_gpu_seconds_total{{{instance}}}[1h])", at)
    )
    hourly = by_key(prometheus.query(f"{HOURLY}{{{instance}}}", at))
    after = stored(server)

    assert set(gpus) <= set(before), (gpus, before)
    assert set(before) == set(counter) == set(hourly), (before, counter, hourly)
    for key in before:
        rate = gpus.get(key, 0.0)
        # the scrape Prometheus has may be a scrape interval older than `before`, and the
        # store may have written an interval more or one less than the sampler counted
        low = before[key] - (SCRAPE + usage) * rate - 0.01
        high = after[key] + usage * rate + 0.01
        assert low <= counter[key] <= high, (key, before[key], counter[key], after[key])
        # increase() over the hour: the growth since the first scrape, extrapolated to the
        # window's ends (half a scrape interval back, up to 1.1 forward) and evaluated up to an
        # evaluation interval before `at`, of a counter that grows a usage interval at a time
        seen = counter[key] - first[key]
        assert abs(hourly[key] * 3600 - seen) <= (SCRAPE + usage) * rate + 0.01, (
            key,
            hourly[key] * 3600,
            seen,
        )


@pytest.fixture
def started(tmp_path) -> Iterator[list[ServerProcess]]:
    """Daemons started and stopped (each must exit cleanly, with no traceback)."""
    servers: list[ServerProcess] = []
    yield servers
    stopped = [(server.stop(), server.log) for server in servers]
    for status, log in stopped:
        assert status == 0 and "Traceback" not in log, log


def usage_daemon(tmp_path, name: str, usage: float, *args: str) -> ServerProcess:
    return ServerProcess(
        *args, "--state-dir", str(tmp_path / name), "--usage-interval", str(usage)
    ).start()


def test_test_mode_hosts_hours_per_user_and_category_match_their_stores(tmp_path, started):
    """Two test-mode daemons, one with --hide-users: alice holds two GPUs and bob one on the
    first, carol one on the second; nothing runs on them (reserved_unused), the rest are free."""
    plain = usage_daemon(tmp_path, "plain", 1.0, "--test", "--lease", "600")
    started.append(plain)
    hidden = usage_daemon(tmp_path, "hidden", 1.0, "--test", "--lease", "600", "--hide-users")
    started.append(hidden)
    prometheus = Prometheus(
        {"patroller": [plain.server, hidden.server]}, interval=f"{SCRAPE:g}s", rules=[RULES]
    ).start()
    try:
        eventually(prometheus.targets_up, "both targets up")
        assert len(ok(plain, "/request?gpu=2&user=alice@example.org")) == 2
        assert len(ok(plain, "/request?gpu=1&user=bob@example.org")) == 1
        assert len(ok(hidden, "/request?gpu=1&user=carol@example.org")) == 1
        compare(
            prometheus,
            plain,
            1.0,
            {
                ("alice@example.org", "reserved_unused"): 2,
                ("bob@example.org", "reserved_unused"): 1,
                ("", "free"): 5,
            },
        )
        # --hide-users: carol is her pseudonym, the one her GPU's holder series shows
        [(labels, _)] = prometheus.query(
            f'patroller_gpu_holder_info{{instance="{hidden.server}",state="reserved"}}'
        )
        carol = labels["user"]
        assert PSEUDONYM.match(carol), carol
        compare(prometheus, hidden, 1.0, {(carol, "reserved_unused"): 1, ("", "free"): 7})
        names = {
            value
            for labels, _ in prometheus.query(f'{{instance="{hidden.server}",user!=""}}')
            for value in labels.values()
        }
        assert not [n for n in names if "carol" in n or "@" in n], names
        # the fleet's figures: each user's across hosts, at one evaluation
        at = time.time()
        fleet = by_key(prometheus.query(FLEET, at))
        hosts = prometheus.query(HOURLY, at)
        assert set(fleet) == {
            ("alice@example.org", "reserved_unused"),
            ("bob@example.org", "reserved_unused"),
            (carol, "reserved_unused"),
            ("", "free"),
        }, fleet
        summed: dict[Key, float] = {}
        for labels, value in hosts:
            key = (labels.get("user", ""), labels["category"])
            summed[key] = summed.get(key, 0.0) + value
        assert fleet == pytest.approx(summed), (fleet, summed)
    finally:
        prometheus.stop()


def test_a_gpu_hosts_every_category_matches_its_store(tmp_path, started):
    """A GPU host on the simulator with real processes of root and of nobody: root computes on
    a GPU it reserved (active), reserves one it leaves unused (reserved_unused) and one where
    nobody's process runs (reserved_unused and trespass, half each); nobody computes on a GPU
    without asking (unreserved) and holds another's memory without computing (idle_held); the
    last is free."""
    need_root("processes of another user")
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{} for _ in range(6)])
    sleepers = []

    def sleeping(uid: int) -> subprocess.Popen:
        process = subprocess.Popen(["sleep", "300"], user=uid, group=uid, extra_groups=[])
        sleepers.append(process)
        return process

    prometheus = None
    try:
        theirs, idle = sleeping(NOBODY), sleeping(NOBODY)
        processes = [
            {"pid": theirs.pid, "gpu": 1, "sm": 80, "used_mib": 9000},
            {"pid": idle.pid, "gpu": 2, "sm": 0, "used_mib": 3000},
        ]
        scenario.write(processes=processes)
        # a sample every 2 s: dmon's readings come every second, so that no interval has
        # none (an interval with no SM reading counts as computing: nobody idle on no evidence)
        host = usage_daemon(
            tmp_path, "state", 2.0, "--nvidia-smi", scenario.command, "--lease", "600"
        )
        started.append(host)
        eventually(
            lambda: (
                [e["claim"]["state"] for e in ok(host, "/status").values()].count("claimed") == 2
                or None
            ),
            "nobody's processes claim GPUs 1 and 2",
        )
        granted = ok(host, "/request?gpu=3")  # this process's: root's
        active, shared, _ = sorted(d["info"]["number"] for d in granted)
        processes += [
            {"pid": sleeping(0).pid, "gpu": active, "sm": 90},
            {"pid": sleeping(NOBODY).pid, "gpu": shared, "sm": 50},
        ]
        scenario.write(processes=processes)
        eventually(
            lambda: (
                sorted(e["claim"]["state"] for e in ok(host, "/status").values())
                == ["claimed", "claimed", "claimed", "free", "reserved", "shared"]
                or None
            ),
            "every GPU in its state",
        )
        prometheus = Prometheus(
            {"patroller": [host.server]}, interval=f"{SCRAPE:g}s", rules=[RULES]
        ).start()
        eventually(prometheus.targets_up, "the target up")
        root, nobody = host_identity(0).user, host_identity(NOBODY).user
        compare(
            prometheus,
            host,
            2.0,
            {
                (root, "active"): 1,
                (root, "reserved_unused"): 1.5,
                (nobody, "trespass"): 0.5,
                (nobody, "unreserved"): 1,
                (nobody, "idle_held"): 1,
                ("", "free"): 1,
            },
        )
    finally:
        if prometheus is not None:
            prometheus.stop()
        for process in sleepers:
            process.kill()
            process.wait()
