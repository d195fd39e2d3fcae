"""A state directory on a read-only filesystem (a real read-only bind mount): a real daemon
starts there, gives back the holds in its lease book, serves and hands out GPUs, writes nothing,
and says so at start and in /metrics; the usage store is off (/usage: 503); a second daemon is
still refused, and so is a directory others may write to (config/trust.py)."""

import json
import os
import subprocess
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import ServerProcess, need_root
from prometheus_client.parser import text_string_to_metric_families


@contextmanager
def read_only_view(source, where):
    """`source` bind-mounted read-only at `where` (root only); unmounted after."""
    need_root("it mounts a filesystem")
    os.makedirs(where, exist_ok=True)
    subprocess.run(["mount", "--bind", str(source), str(where)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def get(server, path):
    """(status, body) of a GET: JSON, or the text of /metrics."""
    try:
        with urllib.request.urlopen(server.url + path, timeout=20) as response:
            raw = response.read().decode()
            return response.status, raw if path == "/metrics" else json.loads(raw)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def gauges(server):
    """The /metrics samples, by name and labels."""
    _, text = get(server, "/metrics")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def snapshot(directory):
    """Every entry of the directory: its name, and what it holds or links to."""
    found = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        found[name] = os.readlink(path) if os.path.islink(path) else Path(path).read_bytes()
    return found


@pytest.fixture
def booked(tmp_path):
    """A state directory whose lease book holds GPUs 0 and 1 for alice (and a usage store)."""
    state = tmp_path / "state"
    server = ServerProcess("--test", "--state-dir", str(state), "--lease", "600").start()
    try:
        code, granted = get(server, "/request?gpu=2&user=alice")
        assert code == 200, granted
    finally:
        assert server.stop() == 0
    return state, sorted(d["uuid"] for d in granted)


def held(server):
    _, status = get(server, "/status")
    return {
        uuid: (entry["claim"].get("user") or {}).get("user")
        for uuid, entry in status.items()
        if entry["claim"]["state"] != "free"
    }


def test_a_read_only_state_directory_is_read_served_and_never_written(booked, tmp_path):
    state, alices = booked
    before = snapshot(state)
    with read_only_view(state, tmp_path / "ro") as where:
        server = ServerProcess("--test", "--state-dir", str(where), "--lease", "600").start()
        try:
            assert held(server) == dict.fromkeys(alices, "alice")  # the book's holds are back
            code, granted = get(server, "/request?gpu=1&user=bob")  # and it hands out
            assert code == 200, granted
            found = gauges(server)
            assert found[("patroller_lease_book_read_only", ())] == 1.0
            assert found[("patroller_lease_book_writable", ())] == 0.0
            assert found[("patroller_usage_state", (("state", "read_only"),))] == 1.0
            code, body = get(server, "/metrics.json")
            assert (
                body["lease_book"]["read_only"] is True and body["usage"]["state"] == "read_only"
            )
            code, body = get(server, "/usage")
            assert code == 503 and "read-only filesystem" in body["error"]
            second = ServerProcess("--test", "--state-dir", str(where))
            with pytest.raises(AssertionError, match="another patroller"):
                second.start()  # the lock is held on the read-only file
        finally:
            assert server.stop() == 0
        assert snapshot(where) == before  # nothing written, renamed or removed
    errors = [line for line in server.log.splitlines() if " ERROR " in line]
    assert (
        len(errors) == 1
        and "read-only filesystem: the lease book is read, never written" in errors[0]
    ), server.log
    assert "running without a usage store" in server.log
    assert "2 device(s) held again" in server.log and "Traceback" not in server.log
    after = ServerProcess("--test", "--state-dir", str(state), "--lease", "600").start()
    try:  # bob's GPU was in no file: only alice's come back
        assert held(after) == dict.fromkeys(alices, "alice")
    finally:
        after.stop()


def test_a_missing_state_directory_under_a_read_only_mount_runs_without_one(tmp_path):
    (tmp_path / "empty").mkdir(mode=0o700)
    with read_only_view(tmp_path / "empty", tmp_path / "ro") as where:
        server = ServerProcess(
            "--test", "--state-dir", str(where / "state"), "--hide-users"
        ).start()
        try:
            code, _ = get(server, "/request?gpu=1&user=alice")
            assert code == 200
            assert gauges(server)[("patroller_lease_book_read_only", ())] == 1.0
        finally:
            assert server.stop() == 0
        assert os.listdir(where) == []
    assert "a key for this run alone" in server.log and "Traceback" not in server.log


def test_a_read_only_directory_others_may_write_to_is_still_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with read_only_view(shared, tmp_path / "ro") as where:
        server = ServerProcess("--test", "--state-dir", str(where))
        with pytest.raises(AssertionError, match="server exited at start"):
            server.start()
    assert f"the state directory {where} is writable by others (mode 777" in server.log, server.log
