"""The client helper against a real server process."""
import os
import threading

import pytest

from helpers import ServerProcess
from patroller import client
from patroller.client import Busy, Claim, RequestRefused, ServerUnreachable, claim, release, reserve


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
    release(server.server)


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
    assert sorted(d["uuid"] for d in body["released"]) == sorted([devices[0]["uuid"], devices[2]["uuid"]])


def test_claim_context_manager_releases_on_exit(server):
    with Claim(2, server=server.server) as devices:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(str(d["info"]["number"]) for d in devices)
        assert reserve(7, server=server.server) is None  # only 6 left
    assert len(reserve(8, server=server.server)) == 8


def test_claim_context_manager_raises_busy(server):
    reserve(8, server=server.server)
    with pytest.raises(Busy):
        with Claim(1, server=server.server, timeout=0.2):
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
    assert client.parse_server("gpuhost") == ("http", "gpuhost", 80)
    assert client.parse_server("[::1]:8080") == ("http", "::1", 8080)
    with pytest.raises(ValueError):
        client.parse_server("ftp://gpuhost")


def test_unreachable_server_raises():
    with pytest.raises(ServerUnreachable):
        claim(1, server="127.0.0.1:1")


def test_unix_socket_server_addresses():
    assert client.parse_server("unix:///run/patroller/api.sock") == ("unix", "/run/patroller/api.sock", 0)
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
    result = subprocess.run([sys.executable, "-S", "-c", "import client; print(client.claim)"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
