"""The usage store in real daemons: the categories of a simulated GPU host with real processes
of real users, kill -9 and a stop, a full disk, a corrupt and a newer file, a read-only
filesystem, retention at start, /usage's mistakes, and --hide-users."""

import json
import logging
import os
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from helpers import (
    NOBODY,
    ScenarioFile,
    ServerProcess,
    async_test,
    find,
    gpu_running,
    known_claim,
    need_root,
    running,
    scrape,
    until,
)
from test_hide_users import PSEUDONYM, ask_as
from test_openapi import answer_schema, undocumented
from test_usage_store import fill, interval, tmpfs

from patroller.identify.resolver import host_identity
from patroller.state.usage import schema

FILE = "usage.sqlite3"
DAEMON = 1  # a host account other than root and nobody


def get(server, path):
    """(status, JSON body) of a GET to a server process."""
    try:
        with urllib.request.urlopen(server.url + path, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def hourly(path):
    """GPU-seconds so far by GPU uuid and category, read from the file as it is."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {
            (uuid, category): seconds
            for uuid, category, seconds in db.execute(
                "SELECT g.uuid, h.category, SUM(h.seconds) FROM hourly h JOIN gpus g "
                "ON g.id = h.gpu GROUP BY 1, 2"
            )
        }
    finally:
        db.close()


def grown(before, after):
    """Per GPU, the categories whose GPU-seconds grew from `before` to `after`."""
    found = {}
    for (uuid, category), seconds in after.items():
        if seconds - before.get((uuid, category), 0.0) > 1e-6:
            found.setdefault(uuid, set()).add(category)
    return found


def sleeping(uid):
    return subprocess.Popen(["sleep", "120"], user=uid, group=uid, extra_groups=[])


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=[{} for _ in range(6)])


@async_test
async def test_each_gpu_counts_in_the_category_its_holder_and_processes_make(scenario, tmp_path):
    need_root("processes of other users")
    mine, theirs, idle, intruder = (
        sleeping(0),
        sleeping(NOBODY),
        sleeping(NOBODY),
        sleeping(NOBODY),
    )
    try:
        # nobody computes on GPU 1 and holds GPU 2 without computing, both without asking
        processes = [
            {"pid": theirs.pid, "gpu": 1, "sm": 80, "used_mib": 9000},
            {"pid": idle.pid, "gpu": 2, "sm": 0, "used_mib": 3000},
        ]
        scenario.write(processes=processes)
        state = tmp_path / "state"
        async with gpu_running(scenario, state_dir=str(state), usage_interval=1.0, lease=600) as h:
            uuid = {d.number: d.uuid for d in h.services.inventory}
            leases = h.services.leases
            await until(lambda: all(known_claim(leases, uuid[n]) for n in (1, 2)), timeout=20)
            granted = [d["uuid"] for d in await h.ok("/request?gpu=3")]  # root's
            number = {u: n for n, u in uuid.items()}
            active, shared, unused = sorted(granted, key=number.get)
            # root computes on one, nobody intrudes on another, the third stays unused
            processes += [
                {"pid": mine.pid, "gpu": number[active], "sm": 90},
                {"pid": intruder.pid, "gpu": number[shared], "sm": 50},
            ]
            scenario.write(processes=processes)
            free = (set(uuid.values()) - set(granted) - {uuid[1], uuid[2]}).pop()
            expected = {
                active: "claimed",
                shared: "shared",
                unused: "reserved",
                uuid[1]: "claimed",
                uuid[2]: "claimed",
                free: "free",
            }
            await until(lambda: all(leases.state(u) == s for u, s in expected.items()), timeout=20)
            store = h.services.usage
            settled = store.intervals
            await until(lambda: store.intervals > settled + 1, timeout=20)  # one taken after
            before = hourly(state / FILE)
            await until(lambda: store.intervals > settled + 4, timeout=20)
            after = hourly(state / FILE)
            assert grown(before, after) == {
                active: {"active"},
                uuid[1]: {"unreserved"},
                uuid[2]: {"idle_held"},
                shared: {"reserved_unused", "trespass"},
                unused: {"reserved_unused"},
                free: {"free"},
            }
            halves = [
                after[(shared, c)] - before.get((shared, c), 0.0)
                for c in ("reserved_unused", "trespass")
            ]
            assert abs(halves[0] - halves[1]) < 1e-6  # two parties share the GPU's time
            root, nobody = host_identity(0).user, host_identity(NOBODY).user
            users = {row["key"]: row for row in (await h.ok("/usage?since=1h"))["rows"]}
            assert set(users) == {root, nobody, None}
            assert users[root]["hours"]["active"] > 0
            assert users[root]["hours"]["reserved_unused"] > 0
            assert users[nobody]["hours"]["trespass"] > 0
            assert users[nobody]["hours"]["unreserved"] > 0
            assert users[nobody]["hours"]["idle_held"] > 0
            accounts = [row["key"] for row in (await h.ok("/usage?by=account"))["rows"]]
            assert set(accounts) == {"root", "nobody", None}
            gpus = (await h.ok("/usage?by=gpu&since=2h"))["rows"]
            assert sorted(row["number"] for row in gpus) == list(range(6))
            assert gpus[-1]["key"] == free  # the least used last
    finally:
        for process in (mine, theirs, idle, intruder):
            process.kill()
            process.wait()


def samples(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(
            "SELECT at, seconds FROM samples s JOIN gpus g ON g.id = s.gpu "
            "WHERE g.number = 0 ORDER BY at"
        ).fetchall()
    finally:
        db.close()


def test_kill_9_loses_at_most_the_interval_in_progress_and_a_restart_continues(tmp_path):
    state = str(tmp_path / "state")
    args = ("--test", "--state-dir", state, "--usage-interval", "0.3")
    server = ServerProcess(*args).start()
    try:
        get(server, "/request?gpu=2&user=alice")
        deadline = time.monotonic() + 30
        while get(server, "/metrics.json")[1]["usage"]["intervals"] < 5:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        written = get(server, "/metrics.json")[1]["usage"]["intervals"]
    finally:
        server.stop(signal.SIGKILL)
    before = samples(f"{state}/{FILE}")
    assert len(before) >= written  # every interval said to be written is on disk
    server = ServerProcess(*args).start()
    try:
        deadline = time.monotonic() + 30
        while len(samples(f"{state}/{FILE}")) < len(before) + 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status, report = get(server, "/usage?since=1h")
    finally:
        server.stop()
    after = samples(f"{state}/{FILE}")
    assert after[: len(before)] == before  # the first run's samples stay, and more follow
    (last_at, _), (first_at, first_seconds) = before[-1], after[len(before)]
    assert first_seconds < first_at - last_at  # the downtime is counted in no interval
    assert status == 200 and report["rows"][0]["key"] == "alice"
    assert "Traceback" not in server.log


def test_a_stop_writes_the_interval_in_progress(tmp_path):
    state = str(tmp_path / "state")
    server = ServerProcess("--test", "--state-dir", state, "--usage-interval", "1h").start()
    started = time.time()
    get(server, "/status")
    assert server.stop(signal.SIGTERM) == 0
    [(at, seconds)] = samples(f"{state}/{FILE}")
    assert 0 < seconds <= time.time() - started + 1 and at >= started


@pytest.mark.errors_expected  # the failing writes are logged as an error
@async_test
async def test_a_full_disk_degrades_the_store_serving_goes_on_and_it_catches_up(tmp_path, caplog):
    with tmpfs(tmp_path / "state", "1m") as state:
        async with running(
            state_dir=str(state), usage_interval=0.1, usage_retry=0.1, usage_reserve=0
        ) as h:  # no room kept: the disk fills
            store = h.services.usage
            await until(lambda: store.intervals >= 2)
            filler = fill(state)
            await until(lambda: store.state == "failing", timeout=30)
            assert (await h.ok("/metrics.json"))["usage"]["state"] == "failing"
            found, _, _ = await scrape(h)
            assert find(found, "patroller_usage_writable") == [0.0]
            assert find(found, "patroller_usage_state", state="failing") == [1.0]
            assert find(found, "patroller_usage_failures_total")[0] >= 1
            await h.ok("/status")  # serving goes on
            await until(lambda: store.failures >= 3)
            os.unlink(filler)
            await until(lambda: store.state == "writable", timeout=30)
            found, _, _ = await scrape(h)
            assert find(found, "patroller_usage_writable") == [1.0]
            assert find(found, "patroller_usage_rows_written_total")[0] == store.rows > 0
        # stopped: every interval sampled, those of the full disk too, is on disk
        assert store.intervals == h.services.sampler.samples and store.dropped == 0
        db = sqlite3.connect(state / FILE)
        assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (8 * store.intervals,)
        db.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "cannot write the usage store" in errors[0], errors
    assert "is written again" in caplog.text


@pytest.mark.parametrize("kind", ["corrupt", "newer"])
def test_a_corrupt_or_newer_file_is_set_aside_at_start_and_a_fresh_store_starts(tmp_path, kind):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / FILE
    if kind == "corrupt":
        path.write_bytes(b"\x00garbage" * 4096)
    else:
        db = sqlite3.connect(path, isolation_level=None)
        schema.migrate(db)
        db.execute("UPDATE schema_version SET version = ?", (schema.LATEST + 1,))
        db.close()
    kept = path.read_bytes()
    server = ServerProcess("--test", "--state-dir", str(state), "--usage-interval", "0.2").start()
    try:
        deadline = time.monotonic() + 30
        while get(server, "/metrics.json")[1]["usage"]["rows"] < 8:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert get(server, "/metrics.json")[1]["usage"]["set_aside"] == 1
    finally:
        server.stop()
    [aside] = [
        p
        for p in state.iterdir()
        if p.name.startswith(f"{FILE}.{kind}-") and not p.name.endswith(("-wal", "-shm"))
    ]
    assert aside.read_bytes() == kept
    lines = [line for line in server.log.splitlines() if "set aside as" in line]
    assert len(lines) == 1 and "WARNING" in lines[0] and aside.name in lines[0], server.log
    assert ("newer Patroller" in lines[0]) == (kind == "newer")
    assert "Traceback" not in server.log


@async_test
async def test_a_read_only_filesystem_runs_without_a_store_and_says_so(tmp_path, caplog):
    with tmpfs(tmp_path / "ro", options=",ro") as where, caplog.at_level(logging.INFO):
        async with running(state_dir=str(tmp_path / "state"), usage_dir=str(where)) as h:
            found, _, _ = await scrape(h)
            assert find(found, "patroller_usage_state", state="read_only") == [1.0]
            assert find(found, "patroller_usage_writable") == [0.0]
            code, body = await h.call("/usage")
            assert code == 503 and "read-only filesystem" in body["error"]
            await h.ok("/status")
    assert "read-only filesystem: running without a usage store" in caplog.text
    assert os.listdir(where) == []


def test_samples_past_the_retention_are_folded_at_start_and_still_reported(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    db = sqlite3.connect(state / FILE, isolation_level=None)
    schema.migrate(db)
    from patroller.state.usage import tables

    old = time.time() - 90 * 86400
    for n in range(60):  # an hour of one-minute intervals, 90 days ago
        tables.write_interval(db, tables.Keys(), old + 60 * n, interval())
    db.close()
    since = time.strftime("%Y-%m-%d", time.gmtime(old - 86400))
    server = ServerProcess("--test", "--state-dir", str(state), "--usage-days", "30").start()
    try:
        deadline = time.monotonic() + 30
        while "folded into daily totals" not in server.log:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status, report = get(server, f"/usage?since={since}&by=user")
    finally:
        server.stop()
    assert "120 sample(s) and" in server.log
    alice = next(row for row in report["rows"] if row["key"] == "alice")
    assert status == 200 and alice["hours"]["active"] == 0.5 and alice["gpu_hours"] == 1.0
    left = sqlite3.connect(state / FILE).execute("SELECT MIN(at) FROM samples").fetchone()[0]
    assert left is None or left > time.time() - 31 * 86400


@async_test
async def test_bad_ranges_are_400_naming_the_field_and_no_store_is_404(tmp_path):
    async with running(state_dir=str(tmp_path / "state"), usage_interval=0.2) as h:
        for path, field in (
            ("/usage?since=soon", "since"),
            ("/usage?until=2999-01-01", "until"),
            ("/usage?since=1h&until=2h", "since"),
            ("/usage?by=team", "by"),
            ("/usage?since=2026-13-01", "since"),
            ("/usage?group=x", "group"),
            ("/usage?until=soon", "until"),
            ("/usage?since=2999-01-01", "since"),
            ("/usage?since=-1h", "since"),
            ("/usage?until=2026-11-01T08:00", "until"),
            ("/usage?since=2026-11-02&until=2026-11-01", "since"),
            ("/usage?by=user&by=gpu", "by"),
        ):
            code, body = await h.call(path)
            assert code == 400 and body["field"] == field and field in body["error"], path
            assert list(undocumented(body, answer_schema("/usage", "get", 400))) == []
        await h.ok("/request?gpu=1&user=alice")
        await until(lambda: h.services.usage.intervals >= 1)
        for by in ("user", "gpu", "day"):
            code, body = await h.call(f"/usage?since=30d&by={by}")
            assert code == 200 and body["by"] == by and body["rows"]
            assert list(undocumented(body, answer_schema("/usage", "get", 200))) == [], by
        counters = await h.ok("/metrics.json")
        assert counters["usage"]["state"] == "writable"
        assert list(undocumented(counters, answer_schema("/metrics.json", "get", 200))) == []
    for settings in ({}, {"state_dir": str(tmp_path / "other"), "usage": "none"}):
        async with running(**settings) as h:
            code, body = await h.call("/usage")
            assert code == 404 and "--state-dir" in body["error"]
            assert list(undocumented(body, answer_schema("/usage", "get", 404))) == []
            assert (await h.ok("/metrics.json"))["usage"] is None


@async_test
async def test_each_caller_sees_their_own_name_others_pseudonyms_and_root_every_name(
    scenario, tmp_path
):
    need_root("the callers run as other uids, and root is the host's administrator")
    theirs, others = sleeping(NOBODY), sleeping(DAEMON)
    try:
        scenario.write(
            processes=[
                {"pid": theirs.pid, "gpu": 0, "sm": 70},
                {"pid": others.pid, "gpu": 1, "sm": 70},
            ]
        )
        async with gpu_running(
            scenario, state_dir=str(tmp_path / "state"), hide_users=True, usage_interval=0.3
        ) as h:
            nobody, daemon = host_identity(NOBODY).user, host_identity(DAEMON).user
            store = h.services.usage
            await until(
                lambda: all(
                    known_claim(h.services.leases, d.uuid)
                    for d in h.services.inventory
                    if d.number < 2
                ),
                timeout=20,
            )
            written = store.intervals
            await until(lambda: store.intervals > written + 1)
            [[_, users], [_, accounts]] = await ask_as(
                NOBODY, h, "/usage?since=1h", "/usage?by=account"
            )
            keys = {row["key"] for row in users["rows"]}
            [other] = keys - {nobody, None}
            assert nobody in keys and PSEUDONYM.match(other)
            assert {row["key"] for row in accounts["rows"]} == {"nobody", other, None}
            [[_, seen]] = await ask_as(DAEMON, h, "/usage?since=1h")
            keys = {row["key"] for row in seen["rows"]}
            [them] = keys - {daemon, None}
            assert daemon in keys and PSEUDONYM.match(them) and them != other
            root = {row["key"] for row in (await h.ok("/usage?since=1h"))["rows"]}
            assert root == {nobody, daemon, None}
    finally:
        for process in (theirs, others):
            process.kill()
            process.wait()


NOT_KEPT = "no usage history is kept: --usage sqlite needs a state directory"


@pytest.mark.parametrize(
    "flags,warned,level",
    [
        (("--usage", "sqlite", "--state-dir", "none"), "(--state-dir none)", " WARNING "),
        # test mode's default is no state directory (test daemons run many at once): a debug line
        (
            ("--test", "--usage", "sqlite", "--log-level", "debug"),
            "(test mode's default)",
            " DEBUG ",
        ),
        (("--test", "--usage", "sqlite"), None, None),  # nothing at the default level
        (("--test", "--usage", "none"), None, None),  # said so: nothing to warn of
    ],
    ids=["no state directory", "test mode, debug", "test mode", "usage none"],
)
def test_a_usage_store_with_nowhere_to_live_is_a_warning_at_start(flags, warned, level, tmp_path):
    # As found: --usage sqlite without --state-dir kept nothing and said nothing.
    if "--test" not in flags:
        flags += ("--nvidia-smi", ScenarioFile(str(tmp_path / "s.json"), devices=[{}]).command)
    server = ServerProcess(*flags).start()
    try:
        lines = [line for line in server.log.splitlines() if NOT_KEPT in line]
    finally:
        server.stop()
    if warned is None:
        assert lines == [], server.log
    else:
        assert len(lines) == 1 and level in lines[0] and warned in lines[0], server.log
        assert "give --state-dir DIR to keep one, or --usage none" in lines[0]
