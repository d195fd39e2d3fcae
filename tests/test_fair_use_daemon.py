"""Fair use on live daemons: the 4xx answers, /users, /history, the audit file, SIGHUP, the
administrator's release, idle GPUs and the journal's format."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import (
    ROOT,
    ScenarioFile,
    ServerProcess,
    async_test,
    gpu_running,
    known_claim,
    running,
    until,
)

from patroller.identify.resolver import host_identity
from patroller.main import JournalFormatter, under_journal


@async_test
async def test_over_the_limit_is_a_403_that_says_the_limit_and_what_is_held():
    async with running(max_per_user=2) as h:
        await h.ok("/request?gpu=1&user=alice")
        status, body = await h.call("/request?gpu=2&user=alice")
        assert status == 403
        assert body["limit"] == 2 and body["held"] == [0] and body["requested"] == {"gpu": 2}
        assert "the most one user may hold is 2" in body["error"]
        status, body = await h.call("/wait?gpu=2&user=alice&timeout=1")
        assert status == 403
        users = await h.ok("/users")
        assert users["alice"]["held"] == 1 and users["alice"]["limit"] == 2
        assert users["alice"]["devices"] == [0]


@async_test
async def test_a_reservation_for_two_hours_shows_its_end():
    async with running(max_hold=4 * 3600) as h:
        [grant] = await h.ok("/request?gpu=1&hold=2h&user=alice")
        assert grant["hold"] == "duration" and 7190 < grant["expires"] <= 7200
        claim = (await h.ok("/status"))[grant["uuid"]]["claim"]
        assert claim["hold"] == "duration" and claim["state"] == "reserved"
        ends = claim["ends_at"]
        assert ends.endswith("+00:00")
        from datetime import datetime

        assert 7190 < datetime.fromisoformat(ends).timestamp() - time.time() <= 7200
        status, body = await h.call("/request?gpu=1&hold=5h&user=alice")
        assert status == 400 and body["max_hold"] == 4 * 3600
        assert body["error"].startswith("hold: 5h is longer than the 4h one may ask for")
        status, body = await h.call("/request?gpu=1&hold=soon&user=alice")
        assert status == 400


@async_test
async def test_the_audit_record_goes_to_its_file_and_to_history(tmp_path):
    path = tmp_path / "audit.jsonl"
    async with running(audit_log=str(path), lease=60) as h:
        began = time.time()
        [grant] = await h.ok("/request?gpu=1&user=alice")
        await h.ok("/release?user=alice&reason=done%20early")
        history = await h.ok(f"/history?since={began - 1}")
        assert [(e["event"], e["user"]) for e in history] == [
            ("grant", "alice"),
            ("release", "alice"),
        ]
        assert history[1]["reason"] == "done early"
        assert history[0]["devices"] == [{"uuid": grant["uuid"], "number": 0}]
        assert await h.ok(f"/history?since={time.time() + 60}") == []
        iso = history[1]["time"]
        assert [e["event"] for e in await h.ok(f"/history?since={iso}")] == ["release"]
        assert [e["event"] for e in await h.ok("/history?limit=1")] == ["release"]
        for bad in (
            "since=yesterday",
            "since=2026-12-03T08:00:00",
            "limit=0",
            "limit=x",
            "until=1",
        ):
            status, body = await h.call(f"/history?{bad}")
            assert status == 400, bad
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["grant", "release"]


def test_sighup_reads_the_limits_file_again(tmp_path):
    limits = tmp_path / "limits.json"
    limits.write_text(json.dumps({"alice": 1}))
    server = ServerProcess("--test", "--limits-file", str(limits)).start()
    try:

        def ask(path):
            try:
                with urllib.request.urlopen(server.url + path, timeout=10) as answer:
                    return answer.status
            except urllib.error.HTTPError as error:
                return error.code

        assert ask("/request?gpu=2&user=alice") == 403
        assert ask("/request?gpu=2&user=bob") == 200  # no default limit
        limits.write_text("{broken")
        server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "limits stay as they were" not in server.log:
            assert time.monotonic() < deadline, server.log
            time.sleep(0.05)
        assert ask("/request?gpu=2&user=alice") == 403
        limits.write_text(json.dumps({"alice": 3}))
        server.process.send_signal(signal.SIGHUP)
        while ask("/request?gpu=2&user=alice") != 200:
            assert time.monotonic() < deadline + 10, server.log
            time.sleep(0.05)
        assert "1 per-user limit(s)" in server.log
    finally:
        assert server.stop() == 0


NOBODY = 65534
ASK = """
import http.client, json, sys, time
connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=20)
connection.request("GET", sys.argv[2])
answer = connection.getresponse()
print(json.dumps([answer.status, json.loads(answer.read())]), flush=True)
"""


@async_test
async def test_root_releases_another_users_reservation_and_the_record_says_why(tmp_path):
    if os.getuid() != 0:
        pytest.skip("the administrator is the host's root: run as root")
    from test_trust_callers import python_for

    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    async with gpu_running(scenario, lease=300) as h:
        python = python_for(NOBODY)
        loop = asyncio.get_running_loop()  # the daemon runs on this loop: never block it
        result = await loop.run_in_executor(
            None,
            lambda: subprocess.run(
                [python, "-c", ASK, str(h.port), "/request?gpu=1"],
                capture_output=True,
                text=True,
                timeout=60,
                user=NOBODY,
                group=NOBODY,
                extra_groups=[],
            ),
        )
        assert result.returncode == 0, result.stderr
        status, [grant] = json.loads(result.stdout)
        assert status == 200
        nobody = host_identity(NOBODY).user
        assert h.services.leases.holder(grant["uuid"]).user == nobody
        released = await h.ok(f"/release?uuid={grant['uuid']}&reason=left%20over")
        assert [d["uuid"] for d in released["released"]] == [grant["uuid"]]
        [event] = [e for e in await h.ok("/history") if e["event"] == "admin_release"]
        assert event["user"] == nobody and event["by"] == host_identity(0).user
        assert event["reason"] == "left over"


@async_test
async def test_an_idle_reservation_shows_idle_and_is_released_when_configured(tmp_path, sleeper):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}])
    async with gpu_running(scenario, lease=300, idle_after=1.0, idle_release=3.0) as h:
        [reserved] = await h.ok("/request?gpu=1")
        # gpu 1: someone computes on it unasked, with little memory and no SM: idle too
        scenario.write(
            processes=[{"pid": sleeper.pid, "gpu": 1, "name": "python", "used_mib": 100, "sm": 0}]
        )
        busy = h.uuids()[1]
        await until(lambda: known_claim(h.services.leases, busy))
        await until(
            lambda: (h.api.status.data()[reserved["uuid"]]["claim"]["idle_for"] or 0) >= 1,
            timeout=10,
        )
        users = await h.ok("/users")
        me = host_identity(os.getuid()).user
        assert users[me]["unreserved"] == 1 and users[me]["reserved_unused"] == 1
        await until(lambda: h.services.leases.state(reserved["uuid"]) == "free", timeout=15)
        events = [e["event"] for e in await h.ok("/history")]
        assert "idle_release" in events
        assert known_claim(h.services.leases, busy)  # a process is on it: only marked
        claim = (await h.ok("/status"))[busy]["claim"]
        assert claim["idle_for"] >= 1 and claim["asked"] is False


def test_log_lines_for_the_journal_carry_their_priority(tmp_path):
    import logging

    record = logging.LogRecord("patroller.leases", logging.WARNING, "", 0, "lost GPU", (), None)
    assert JournalFormatter().format(record) == "<4>patroller.leases: lost GPU"
    os.environ.pop("JOURNAL_STREAM", None)
    assert under_journal() is False
    # a daemon whose stderr is the stream JOURNAL_STREAM names writes priorities, no times
    log = tmp_path / "journal"
    with open(log, "w") as stream:
        info = os.fstat(stream.fileno())
        env = {
            **os.environ,
            "JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}",
            "PATROLLER_STATE_DIR": "",
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "patroller", "--test", "--port", "0", "--address", "127.0.0.1"],
            stderr=stream,
            env=env,
        )
        try:
            deadline = time.monotonic() + 20
            while "serving" not in log.read_text():
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(10)
    first = log.read_text().splitlines()[0]
    assert first.startswith("<6>patroller") and not first[3].isdigit()


def test_a_limits_file_nested_too_deeply_stops_the_start_with_one_line(tmp_path):
    limits = tmp_path / "limits.json"
    limits.write_text("[" * 100000)
    done = subprocess.run(
        [sys.executable, "-m", "patroller", "--test", "--port", "0", "--limits-file", str(limits)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"patroller: --limits-file: {limits} is nested too "
        "deeply: it holds one object of user: limit"
    ]


def test_sighup_with_a_fifo_for_limits_file_keeps_serving(tmp_path):
    limits = tmp_path / "limits.json"
    limits.write_text(json.dumps({"alice": 1}))
    server = ServerProcess("--test", "--limits-file", str(limits)).start()
    try:
        limits.unlink()
        os.mkfifo(limits)  # nobody writes to it: opening it to read would wait for ever
        server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        # The settings read again refuse it (--limits-file is not a file) before the limits
        # file's reader would (not a regular file): either way it is never opened.
        while "is not a file; the settings stay as they were" not in server.log:
            assert time.monotonic() < deadline, server.log
            time.sleep(0.05)
        with urllib.request.urlopen(server.url + "/status", timeout=5) as answer:
            assert answer.status == 200  # the loop was never blocked
    finally:
        assert server.stop() == 0
