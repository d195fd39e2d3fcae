"""The client helper against a real server process."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from helpers import ROOT, ServerProcess

from patroller import client
from patroller.client import (
    Busy,
    Claim,
    RequestRefused,
    ServerUnreachable,
    claim,
    release,
    renew,
    reserve,
)


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--test", "--lease", "30").start()
    yield process
    assert process.stop() == 0


@pytest.fixture(autouse=True)
def clean_environment(server, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.delenv("PATROLLER_SERVER", raising=False)
    yield
    client.release_all(server.server)


def test_claim_sets_the_cuda_environment(server):
    assert claim(2, server=server.server) is True
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert claim(1, server=server.server) is True
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"


def test_claim_returns_false_when_busy_or_timed_out(server):
    assert claim(8, server=server.server) is True
    os.environ.pop("CUDA_VISIBLE_DEVICES")
    assert claim(1, server=server.server) is False
    assert claim(1, server=server.server, timeout=0.3) is False
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_claim_with_timeout_waits_for_a_release(server):
    granted = reserve(8, server=server.server)
    sixth = granted[6]["uuid"]
    timer = threading.Timer(0.3, release, kwargs={"server": server.server, "uuid": sixth})
    timer.start()
    try:
        assert claim(1, server=server.server, timeout=10) is True
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    finally:
        timer.join()


def test_release_returns_what_it_released(server):
    devices = reserve(3, server=server.server)
    body = release(server.server, uuid=devices[1]["uuid"])
    assert [d["uuid"] for d in body["released"]] == [devices[1]["uuid"]]
    body = release(server.server)
    assert sorted(d["uuid"] for d in body["released"]) == sorted(
        [devices[0]["uuid"], devices[2]["uuid"]]
    )


def test_claim_context_manager_releases_on_exit(server):
    with Claim(2, server=server.server) as devices:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(
            str(d["info"]["number"]) for d in devices
        )
        assert reserve(7, server=server.server) is None  # only 6 left
    assert len(reserve(8, server=server.server)) == 8


def test_claim_context_manager_raises_busy(server):
    reserve(8, server=server.server)
    with pytest.raises(Busy), Claim(1, server=server.server, timeout=0.2):
        pass


def test_bad_requests_raise_a_clear_error(server):
    with pytest.raises(RequestRefused) as refused:
        claim(9, server=server.server)
    assert refused.value.status == 422 and "only 8 exist" in str(refused.value)
    with pytest.raises(RequestRefused) as refused:
        claim(0, server=server.server)
    assert refused.value.status == 400
    with pytest.raises(RequestRefused) as refused:
        claim(1, server=server.server, resource="tpu")
    assert "no device group" in str(refused.value)


def test_server_addresses_in_every_form(server, monkeypatch):
    port = server.server.rsplit(":", 1)[1]
    for form in (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/"):
        assert claim(1, server=form) is True
    monkeypatch.setenv("PATROLLER_SERVER", server.server)
    assert claim(1) is True
    assert client.parse_server("gpuhost") == ("http", "gpuhost", 8080)  # the daemon's port
    assert client.parse_server("http://gpuhost") == ("http", "gpuhost", 80)  # a URL's
    assert client.parse_server("https://gpuhost") == ("https", "gpuhost", 443)
    assert client.parse_server("[::1]:8080") == ("http", "::1", 8080)
    with pytest.raises(ValueError):
        client.parse_server("ftp://gpuhost")


def test_unreachable_server_raises():
    with pytest.raises(ServerUnreachable):
        claim(1, server="127.0.0.1:1")


def test_unix_socket_server_addresses():
    assert client.parse_server("unix:///run/patroller/api.sock") == (
        "unix",
        "/run/patroller/api.sock",
        0,
    )
    with pytest.raises(ValueError):
        client.parse_server("unix://relative.sock")


def test_claim_over_a_unix_socket(tmp_path):
    path = f"/tmp/ptc{os.getpid()}.sock"
    server = ServerProcess("--test", "--socket", path).start()
    try:
        assert f"unix://{path}" in server.log
        assert oct(os.stat(path).st_mode & 0o777) == "0o666"  # any local user, any container
        assert claim(1, server=f"unix://{path}") is True
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
        assert [d["info"]["number"] for d in release(f"unix://{path}")["released"]] == [0]
    finally:
        assert server.stop() == 0
    assert not os.path.exists(path)  # removed at shutdown
    with pytest.raises(ServerUnreachable):
        claim(1, server=f"unix://{path}")


def test_the_client_is_one_file_on_the_standard_library(tmp_path):
    import shutil
    import subprocess
    import sys

    shutil.copy(client.__file__, tmp_path / "client.py")
    # -S: no site-packages, so anything beyond the standard library fails to import
    result = subprocess.run(
        [sys.executable, "-S", "-c", "import client; print(client.claim)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr


def claim_of(server, uuid):
    return client.status(server.server)[uuid]["claim"]


def test_the_default_hold_is_the_calling_process(server):
    granted = reserve(1, server=server.server)
    assert granted[0]["hold"] == "process" and granted[0]["held_for_pid"] == os.getpid()
    assert granted[0]["expires"] is None
    held = claim_of(server, granted[0]["uuid"])
    assert held["state"] == "reserved" and held["held_for_pid"] == os.getpid()
    assert held["expires"] is None


def test_a_process_hold_ends_with_the_script_that_claimed(server):
    script = (
        "import sys\nfrom patroller.client import claim\n"
        f"assert claim(1, server={server.server!r})\n"
        "print('claimed', flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        assert child.stdout.readline() == "claimed\n"
        held = [
            c["claim"]
            for c in client.status(server.server).values()
            if c["claim"]["held_for_pid"] == child.pid
        ]
        assert len(held) == 1 and held[0]["state"] == "reserved"
    finally:
        child.stdin.close()  # the script ends
        child.wait(30)
    deadline = time.monotonic() + 10
    while any(
        c["claim"]["held_for_pid"] == child.pid for c in client.status(server.server).values()
    ):
        assert time.monotonic() < deadline, "the reservation outlived its process"
        time.sleep(0.05)


def test_hold_lease_keeps_the_lease(server):
    granted = reserve(1, server=server.server, hold="lease")
    assert granted[0]["hold"] == "lease" and granted[0]["held_for_pid"] is None
    held = claim_of(server, granted[0]["uuid"])
    assert held["state"] == "reserved" and held["held_for_pid"] is None
    assert 0 < held["expires"] <= 30


def test_hold_must_be_process_or_lease(server):
    with pytest.raises(ValueError):
        reserve(1, server=server.server, hold="forever")
    with pytest.raises(ValueError):
        Claim(1, server=server.server, hold="")


@pytest.mark.parametrize(
    "before", [None, {"CUDA_VISIBLE_DEVICES": "7", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}]
)
def test_claim_context_manager_puts_the_variables_back(server, before):
    for name, value in (before or {}).items():
        os.environ[name] = value
    with Claim(2, server=server.server) as devices:
        numbers = ",".join(str(d["info"]["number"]) for d in devices)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == numbers
        assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    for name in client.CUDA_VARIABLES:
        assert os.environ.get(name) == (before or {}).get(name)


@pytest.mark.parametrize(
    "before", [None, {"CUDA_VISIBLE_DEVICES": "7", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}]
)
def test_release_puts_back_the_variables_claim_set(server, before):
    """claim() twice, then release() of one device, then of the rest: the variables are as
    they were before the first claim() only once nothing claimed is held."""
    for name, value in (before or {}).items():
        os.environ[name] = value
    assert claim(1, server=server.server) and claim(1, server=server.server)
    second = os.environ["CUDA_VISIBLE_DEVICES"]
    first = client._reserved[client.parse_server(server.server)][0]
    release(server.server, first)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == second  # one claimed device is still held
    release(server.server)
    for name in client.CUDA_VARIABLES:
        assert os.environ.get(name) == (before or {}).get(name)


def test_release_all_gives_back_what_claim_took_and_its_variables(server):
    os.environ["CUDA_VISIBLE_DEVICES"] = "7"
    assert claim(2, server=server.server)
    assert client.release_all(server.server)["released"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7" and "CUDA_DEVICE_ORDER" not in os.environ
    assert not client._reserved[client.parse_server(server.server)]


@pytest.fixture(scope="module")
def short_lease():
    process = ServerProcess("--test", "--lease", "0.5").start()
    yield process
    assert process.stop() == 0


def held_throughout(server, uuid, seconds):
    """Whether the device stays reserved by us for `seconds`, looked at every 50 ms."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if claim_of(server, uuid)["state"] != "reserved":
            return False
        time.sleep(0.05)
    return True


def test_renew_restarts_the_lease_and_says_when_it_is_lost(short_lease):
    server = short_lease.server
    try:
        granted = reserve(2, server=server, hold="lease")
        renewed = renew(server, granted[0]["uuid"])
        assert [r["uuid"] for r in renewed] == [granted[0]["uuid"]]
        assert 0 < renewed[0]["expires"] <= 0.5
        assert sorted(r["uuid"] for r in renew(server)) == sorted(g["uuid"] for g in granted)
        release(server, granted[1]["uuid"])
        with pytest.raises(RequestRefused) as lost:
            renew(server, granted[1]["uuid"])
        assert lost.value.status == 409 and lost.value.body["uuid"] == granted[1]["uuid"]
        with pytest.raises(RequestRefused) as unknown:
            renew(server, "GPU-no-such-device")
        assert unknown.value.status == 422
    finally:
        release(server)


def test_keep_alive_holds_a_lease_past_three_lease_lengths_and_reports_a_lost_one(short_lease):
    server = short_lease.server
    try:
        kept, dropped = reserve(2, server=server, hold="lease")
        keeper = client.keep_alive([kept, dropped], server)
        assert keeper.every == pytest.approx(0.5 / 3, abs=0.05)
        try:
            # 3 lease lengths and then some: without renewals the lease ends after one
            assert held_throughout(short_lease, kept["uuid"], 2.0)
            assert keeper.renewals >= 2 and keeper.lost == {} and keeper.running
            release(server, dropped["uuid"])  # now it cannot be renewed: lost, not retried
            deadline = time.monotonic() + 10
            while dropped["uuid"] not in keeper.lost:
                assert time.monotonic() < deadline, "the lost device was not reported"
                time.sleep(0.05)
            assert set(keeper.lost) == {dropped["uuid"]}
            assert held_throughout(short_lease, kept["uuid"], 0.6)
        finally:
            keeper.stop()
        assert not keeper.running
        # once stopped, nothing renews it: the lease runs out
        deadline = time.monotonic() + 10
        while claim_of(short_lease, kept["uuid"])["state"] != "free":
            assert time.monotonic() < deadline, "the lease was still renewed after stop()"
            time.sleep(0.05)
    finally:
        release(server)


def test_without_keep_alive_the_lease_runs_out(short_lease):
    granted = reserve(1, server=short_lease.server, hold="lease")
    assert not held_throughout(short_lease, granted[0]["uuid"], 3.0)


def test_claim_with_hold_lease_keeps_the_lease_while_the_block_runs(short_lease):
    with Claim(1, server=short_lease.server, hold="lease") as devices:
        assert held_throughout(short_lease, devices[0]["uuid"], 2.0)
    assert claim_of(short_lease, devices[0]["uuid"])["state"] == "free"  # released on exit


def test_release_gives_back_what_this_script_claimed_and_no_other_job_of_the_user(server):
    # As found: a script's release() ("give back early") gave back everything the user held:
    # a 4-hour hold, and the GPU of a live `patroller run` job, which then showed free while
    # the job ran.
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "patroller.cli",
            "run",
            "-q",
            "--server",
            server.server,
            "--",
            "sleep",
            "120",
        ],
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        deadline = time.monotonic() + 30
        while not [
            u
            for u, c in client.status(server.server).items()
            if c["claim"]["held_for_pid"] == job.pid
        ]:
            assert time.monotonic() < deadline, "the job's GPU was not reserved"
            time.sleep(0.05)
        [running] = [
            u
            for u, c in client.status(server.server).items()
            if c["claim"]["held_for_pid"] == job.pid
        ]
        code, [notebook] = client._call(
            server.server, "GET", "/request", {"gpu": 1, "hold": "4h"}, 30
        )
        assert code == 200 and notebook["hold"] == "duration"
        script = (
            "import json\nfrom patroller.client import claim, release\n"
            f"assert claim(1, server={server.server!r})\n"
            f"print(json.dumps(release(server={server.server!r})))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT},
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        released = json.loads(done.stdout)["released"]
        assert len(released) == 1 and released[0]["uuid"] not in (running, notebook["uuid"])
        assert claim_of(server, running)["state"] == "reserved"
        assert claim_of(server, notebook["uuid"])["state"] == "reserved"
        # `patroller release` with no device: every reservation but the running job's, which
        # it names.
        bare = subprocess.run(
            [sys.executable, "-m", "patroller.cli", "release", "--server", server.server],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        assert bare.returncode == 0, bare.stderr
        number = client.devices(server.server)[running]["number"]
        assert f"kept GPU {number}: held while pid {job.pid} runs" in bare.stdout, bare.stdout
        assert claim_of(server, notebook["uuid"])["state"] == "free"
        assert claim_of(server, running)["state"] == "reserved"
    finally:
        job.kill()
        job.wait()
