"""/metrics in Prometheus's format, read from live daemons and parsed with prometheus_client."""

import asyncio
import os

import pytest
from helpers import ScenarioFile, async_test, find, gpu_running, running, scrape, until

from patroller.core.errors import Unidentified
from patroller.identify.resolver import host_identity
from patroller.observe.crosscheck import CrossCheck
from patroller.observe.inventory import InventoryWatch
from patroller.observe.silence import SilenceWatch


@async_test
async def test_who_holds_what_by_gpu_and_by_user():
    async with running(lease=60) as h:
        await h.ok("/request?gpu=2&user=alice@example.org")
        await h.ok("/request?gpu=1&user=bob@example.org")
        samples, content_type, text = await scrape(h)
        assert content_type.startswith("text/plain; version=0.0.4")
        assert text.count("# HELP patroller_") == text.count("# TYPE patroller_")
        assert find(samples, "patroller_user_gpus_held", user="alice@example.org") == [2]
        assert find(samples, "patroller_user_gpus_held", user="bob@example.org") == [1]
        assert find(samples, "patroller_user_gpus_reserved_unused", user="alice@example.org") == [
            2
        ]
        holders = find(samples, "patroller_gpu_holder_info", state="reserved")
        assert len(holders) == 3
        assert find(
            samples,
            "patroller_gpu_holder_info",
            gpu="0",
            user="alice@example.org",
            state="reserved",
            model="NVIDIA A100-SXM4-80GB",
        ) == [1]
        assert len(find(samples, "patroller_gpu_holder_info", state="free", user="")) == 5
        assert len(find(samples, "patroller_gpu_lease_expiry_seconds")) == 3
        assert all(0 < v <= 60 for v in find(samples, "patroller_gpu_lease_expiry_seconds"))
        assert find(samples, "patroller_build_info", mode="test") == [1]
        assert find(samples, "patroller_devices") == [8]


@async_test
async def test_every_gpu_has_its_figures_in_base_units():
    async with running() as h:
        await until(lambda: h.services.stats.view(h.uuids()[0])["updated"] is not None)
        samples, _, _ = await scrape(h)
        view = h.services.stats.view(h.uuids()[0])
        labels = dict(gpu="0", uuid=h.uuids()[0])
        assert find(samples, "patroller_gpu_memory_total_bytes", **labels) == [81920 * 2**20]
        [ratio] = find(samples, "patroller_gpu_utilization_ratio", **labels)
        assert 0 <= ratio <= 1
        [celsius] = find(samples, "patroller_gpu_temperature_celsius", sensor="gpu", **labels)
        assert celsius == view["gtemp"]
        [hertz] = find(samples, "patroller_gpu_clock_hertz", clock="memory", **labels)
        assert hertz == view["mclk"] * 1e6
        assert find(samples, "patroller_gpu_stale", data="statistics", **labels) == [0]


@async_test
async def test_a_waiting_request_shows_per_user_and_in_all():
    async with running() as h:
        await h.ok("/request?gpu=8&user=bob")
        waiting = asyncio.ensure_future(h.call("/wait?gpu=1&user=carol"))
        await until(lambda: len(h.services.leases.waiters) == 1)
        await asyncio.sleep(0.2)
        samples, _, _ = await scrape(h)
        assert find(samples, "patroller_user_requests_waiting", user="carol") == [1]
        [longest] = find(samples, "patroller_user_wait_seconds_max", user="carol")
        assert longest >= 0.2
        assert find(samples, "patroller_requests_waiting") == [1]
        await h.ok("/release?user=bob")
        assert (await waiting)[0] == 200
        samples, _, _ = await scrape(h)
        assert find(samples, "patroller_user_requests_waiting") == []
        assert find(samples, "patroller_requests_waiting") == [0]


@async_test
async def test_requests_are_counted_by_endpoint_and_status_fast_lane_included():
    async with running() as h:
        for _ in range(3):
            await h.ok("/status")
        await h.call("/request?gpu=99")
        await h.call("/nowhere")
        samples, _, _ = await scrape(h)
        assert find(
            samples, "patroller_http_requests_total", endpoint="/status", status="200"
        ) == [3]
        assert find(
            samples, "patroller_http_requests_total", endpoint="/request", status="422"
        ) == [1]
        assert find(samples, "patroller_http_requests_total", endpoint="other", status="404") == [
            1
        ]


@async_test
async def test_gpu_seconds_by_user_and_category_add_up_to_the_gpus_time(tmp_path):
    """The usage sampler's running totals: every GPU's time in one category, for its holder;
    without a usage store the family is there with no samples."""
    async with running(lease=600) as h:  # test mode: no state directory, no store
        samples, _, text = await scrape(h)
        assert "# TYPE patroller_usage_gpu_seconds_total counter" in text
        assert not find(samples, "patroller_usage_gpu_seconds_total")
    async with running(lease=600, state_dir=str(tmp_path), usage_interval=3600.0) as h:
        await h.ok("/request?gpu=2&user=alice@example.org")
        h.services.sampler.sample()  # the interval since the start (the timer's is an hour)
        samples, _, _ = await scrape(h)
        seconds = {
            (dict(labels)["user"], dict(labels)["category"]): value
            for (name, labels), value in samples.items()
            if name == "patroller_usage_gpu_seconds_total"
        }
        assert set(seconds) == {("alice@example.org", "reserved_unused"), ("", "free")}
        each = seconds[("", "free")] / 6  # the interval: six GPUs free all of it
        assert each > 0
        assert seconds[("alice@example.org", "reserved_unused")] == pytest.approx(2 * each)
        assert sum(seconds.values()) == pytest.approx(8 * each)


@async_test
async def test_openmetrics_when_the_scraper_asks_for_it():
    async with running() as h:
        _, content_type, text = await scrape(h, "application/openmetrics-text; version=1.0.0")
        assert content_type.startswith("application/openmetrics-text")
        assert text.endswith("# EOF\n")


@async_test
async def test_a_process_has_series_only_while_it_is_on_a_gpu(tmp_path, sleeper):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    me = host_identity(os.getuid()).user
    async with gpu_running(scenario) as h:
        await h.ok("/request?gpu=1")  # gpu 0: reserved, nothing on it
        scenario.write(
            processes=[
                {"pid": sleeper.pid, "gpu": 1, "name": "python", "used_mib": 1024, "sm": 50}
            ]
        )

        async def memory():
            samples, _, _ = await scrape(h)
            return find(samples, "patroller_process_gpu_memory_bytes", pid=str(sleeper.pid))

        found = []
        for _ in range(200):
            found = await memory()
            if found:
                break
            await asyncio.sleep(0.05)
        assert found == [1024 * 2**20]
        samples, _, _ = await scrape(h)
        assert find(
            samples,
            "patroller_process_gpu_utilization_ratio",
            pid=str(sleeper.pid),
            user=me,
            command="python",
            gpu="1",
        ) == [0.5]
        # gpu 1 was taken by computing on it, without a request: used unreserved
        assert find(samples, "patroller_user_gpus_unreserved", user=me) == [1]
        assert find(samples, "patroller_user_gpus_held", user=me) == [2]
        assert find(samples, "patroller_user_gpus_reserved_unused", user=me) == [1]
        assert find(samples, "patroller_monitor_up", monitor="pmon") == [1]
        scenario.write(processes=[])
        for _ in range(200):
            if not await memory():
                break
            await asyncio.sleep(0.05)
        assert await memory() == []


@async_test
async def test_callers_refused_for_want_of_an_identity_are_counted():
    async with running() as h:
        original = h.services.callers.identify

        async def nobody(request, claimed):
            if claimed == "ghost":
                raise Unidentified("the calling process cannot be identified")
            return await original(request, claimed)

        h.services.callers.identify = nobody  # the handlers share this object
        assert (await h.call("/request?gpu=1&user=ghost"))[0] == 403
        assert (await h.call("/request?gpu=1&user=alice"))[0] == 200
        samples, _, _ = await scrape(h)
        assert find(samples, "patroller_identity_failures_total") == [1]
        assert find(
            samples, "patroller_http_requests_total", endpoint="/request", status="403"
        ) == [1]


@async_test
async def test_memory_is_in_bytes_where_nvidia_smi_prints_mib(tmp_path, sleeper):
    scenario = ScenarioFile(
        str(tmp_path / "scenario.json"),
        devices=[{"memory_mib": 24576, "stats": {"fb": 3000}}],
        processes=[{"pid": sleeper.pid, "gpu": 0, "used_mib": 1536}],
    )
    async with gpu_running(scenario) as h:
        uuid = h.uuids()[0]
        await until(
            lambda: (
                h.services.stats.view(uuid)["fb"] == 3000
                and h.services.stats.process_view(uuid, sleeper.pid)["fb"] == 1536
            )
        )
        samples, _, _ = await scrape(h)
        labels = dict(gpu="0", uuid=uuid)
        assert find(samples, "patroller_gpu_memory_used_bytes", **labels) == [3000 * 2**20]
        assert find(samples, "patroller_gpu_memory_total_bytes", **labels) == [24576 * 2**20]
        assert find(
            samples, "patroller_process_gpu_memory_bytes", pid=str(sleeper.pid), **labels
        ) == [1536 * 2**20]


def state_of(samples, monitor):
    """The state a monitor's patroller_monitor_state series set to 1."""
    on = [
        dict(labels)["state"]
        for (name, labels), value in samples.items()
        if name == "patroller_monitor_state"
        and dict(labels)["monitor"] == monitor
        and value == 1.0
    ]
    assert len(on) == 1, (monitor, on)
    return on[0]


@async_test
async def test_every_monitor_is_up_or_idle_by_design_in_normal_operation_and_failing_says_so(
    tmp_path,
):
    # As found: patroller_monitor_up{monitor="cross_check"} was 0 in normal operation (its
    # child runs only while it queries), so a plain alert fired all the time, and the
    # inventory watch had no series at all.
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {"mig": "Enabled"}])
    (tmp_path / "kmsg").write_text("")  # the kernel log: a file of its own, readable
    async with gpu_running(
        scenario, cross_check_every=0.2, kernel_log=str(tmp_path / "kmsg")
    ) as h:
        names = {m.name for m in h.services.monitors}
        assert names == {
            "dmon",
            "pmon",
            "cross_check",
            "inventory",
            "silence",
            "topology",
            "kernel_log",
        }

        async def states():
            samples = (await scrape(h))[0]
            return {name: state_of(samples, name) for name in names}, samples

        await until(lambda: all(m.metrics().state != "failing" for m in h.services.monitors))
        now, samples = await states()
        cross_check = now.pop("cross_check")  # it queries the MIG GPU every 0.2 s
        assert cross_check in ("idle", "up")
        assert now.pop("topology") in ("idle", "up")  # read at start, and after a change
        assert now == {
            "dmon": "up",
            "pmon": "up",
            "inventory": "idle",
            "silence": "up",
            "kernel_log": "up",
        }
        assert all(find(samples, "patroller_monitor_up", monitor=name) == [1.0] for name in names)
        # The drivers fail: dmon exits and waits to restart, a query fails.
        scenario.write(
            faults={"dmon": {"fail": "no_driver"}, "--query-compute-apps": {"fail": "no_driver"}}
        )
        checker = [m for m in h.services.monitors if m.name == "cross_check"][0]
        await until(
            lambda: (
                h.services.monitors[0].metrics().state == "failing"
                and checker.metrics().state == "failing"
            ),
            timeout=20,
        )
        now, samples = await states()
        assert now["dmon"] == "failing" and now["cross_check"] == "failing"
        assert find(samples, "patroller_monitor_up", monitor="dmon") == [0.0]
        # Back to normal: it recovers by itself, and says so.
        scenario.write(faults={})
        await until(
            lambda: (
                checker.metrics().state != "failing"
                and h.services.monitors[0].metrics().state == "up"
            ),
            timeout=30,
        )


@async_test
async def test_a_renamed_monitor_keeps_its_series(tmp_path, monkeypatch):
    # As found: /metrics read the cross-check's, the inventory's and the silence watch's figures
    # under the monitors' names; a monitor renamed turned its series into zeros, silently.
    renamed = {
        CrossCheck: "compute_apps",
        InventoryWatch: "devices_read",
        SilenceWatch: "quiet_gpus",
    }
    for kind, name in renamed.items():
        monkeypatch.setattr(kind, "name", name)
    scenario = ScenarioFile(
        str(tmp_path / "scenario.json"), devices=[{}, {"mig": "Enabled"}, {}, {}]
    )
    async with gpu_running(scenario, cross_check_every=0.2, inventory_every=3600) as h:
        by_kind = {type(m): m for m in h.services.monitors}
        check, watch, quiet = (by_kind[kind] for kind in renamed)
        assert {m.name for m in h.services.monitors} >= set(renamed.values())
        await until(lambda: all(not h.services.stats.view(u)["stale"] for u in h.uuids()))
        scenario.write(devices=[{}, {"mig": "Enabled"}, {"silent": True}, {}])
        # The silent GPU makes the inventory be read; the MIG GPU, the cross-check query.
        await until(lambda: quiet.silences == 1 and watch.readings >= 1 and check.runs >= 1)
        samples, _, _ = await scrape(h)
        assert find(samples, "patroller_devices_silent") == [1]
        assert find(samples, "patroller_silences_total") == [1]
        [readings] = find(samples, "patroller_inventory_readings_total")
        assert 1 <= readings <= watch.readings
        [runs] = find(samples, "patroller_cross_check_runs_total")
        assert 1 <= runs <= check.runs
        for name in renamed.values():
            assert find(samples, "patroller_monitor_up", monitor=name) == [1.0]
        metrics = (await h.ok("/metrics.json"))["monitors"]
        assert metrics["quiet_gpus"] == {"silent": 1, "silences": 1, "state": "up"}
        assert metrics["compute_apps"]["runs"] >= 1
