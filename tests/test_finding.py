"""How the command line finds its daemon with no --server: the daemon's socket, then
PATROLLER_SERVER, then the configuration file's socket and port, then port 8080; one message
naming each place tried when none answers. Against a real daemon on a unix socket in a
temporary directory and on a loopback port; a refused port is one bound and never listened on."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, ServerProcess

import patroller.cli.finding as finding
from patroller import client, hosts
from patroller.cli import main as cli_main
from patroller.config import Config


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("run") / "api.sock")
    server = ServerProcess("--test", "--socket", path).start()
    server.socket = path
    yield server
    assert server.stop() == 0


@pytest.fixture
def refused():
    """A loopback port that refuses connections: bound, never listened on."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


@pytest.fixture
def nowhere(tmp_path, monkeypatch, refused):
    """No daemon anywhere the command line looks: no socket, no PATROLLER_SERVER, no file, and
    the default port refused."""
    monkeypatch.setattr(finding, "SOCKET", str(tmp_path / "no.sock"))
    monkeypatch.setattr(client, "DEFAULT_PORT", refused)
    for name in ("PATROLLER_SOCKET", "PATROLLER_SERVER", "PATROLLER_HOSTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATROLLER_CONFIG", str(tmp_path / "no.toml"))
    return tmp_path


def test_the_daemons_socket_comes_first(daemon, nowhere, monkeypatch, capsys):
    monkeypatch.setattr(finding, "SOCKET", daemon.socket)
    monkeypatch.setenv("PATROLLER_SERVER", daemon.server)  # answers too: the socket still first
    assert finding.find(os.environ) == "unix://" + daemon.socket
    assert cli_main(["status"]) == 0
    assert "A100" in capsys.readouterr().out
    # Only a connection was made to find it: the daemon said nothing of it.
    assert not re.search(r" (WARNING|ERROR) ", daemon.log), daemon.log


def test_then_patroller_server(daemon, nowhere, monkeypatch):
    monkeypatch.setenv("PATROLLER_SERVER", daemon.server)
    assert finding.find(os.environ) == daemon.server


def test_then_the_configuration_files_socket_and_port(daemon, nowhere, monkeypatch, refused):
    path = nowhere / "patroller.toml"
    monkeypatch.setenv("PATROLLER_CONFIG", str(path))
    path.write_text(f'socket = "{daemon.socket}"\nport = {refused}\n')
    assert finding.find(os.environ) == "unix://" + daemon.socket
    port = daemon.server.rsplit(":", 1)[1]
    path.write_text(f'port = {port}\naddress = "127.0.0.1"\n')
    assert finding.find(os.environ) == f"127.0.0.1:{port}"
    path.write_text(f'port = {port}\naddress = "0.0.0.0"\n')  # every interface: this host
    assert finding.find(os.environ) == f"localhost:{port}"


def test_then_the_default_port(daemon, nowhere, monkeypatch):
    monkeypatch.setattr(client, "DEFAULT_PORT", int(daemon.server.rsplit(":", 1)[1]))
    assert finding.find(os.environ) == f"localhost:{client.DEFAULT_PORT}"


def test_when_none_answers_one_message_names_each_place_tried(
    nowhere, monkeypatch, refused, capsys
):
    monkeypatch.setenv("PATROLLER_SERVER", f"127.0.0.1:{refused}")
    assert cli_main(["status"]) == 69
    said = capsys.readouterr().err
    assert said == (
        f"patroller: cannot find the Patroller daemon: tried unix://{nowhere}/no.sock (the "
        f"daemon's socket: no such file or directory); 127.0.0.1:{refused} (PATROLLER_SERVER: "
        f"connection refused); {nowhere}/no.toml (no such file or directory); "
        f"localhost:{refused} (the default port: connection refused). Name it with --server "
        "HOST:PORT (or unix:///path/to/socket) or PATROLLER_SERVER, or give the daemon's port "
        f"or socket in {nowhere}/no.toml\n"
    )
    monkeypatch.delenv("PATROLLER_SERVER")
    (nowhere / "no.toml").write_text("lease = 3\n")
    assert cli_main(["users"]) == 69
    said = capsys.readouterr().err
    assert "; PATROLLER_SERVER (not set); " in said
    assert f"; {nowhere}/no.toml (names no port nor socket); " in said
    (nowhere / "no.toml").write_text("port = \n")
    assert cli_main(["queue"]) == 69
    assert f"{nowhere}/no.toml (not TOML: `patroller config` says why)" in capsys.readouterr().err


def test_an_explicit_server_wins_over_all(daemon, nowhere, monkeypatch, refused, capsys):
    monkeypatch.setattr(finding, "SOCKET", daemon.socket)
    assert cli_main(["status", "--server", f"127.0.0.1:{refused}"]) == 69
    assert "cannot reach the server: Patroller at 127.0.0.1" in capsys.readouterr().err


def test_many_hosts_need_no_server_of_its_own(daemon, nowhere, capsys):
    assert cli_main(["status", "--hosts", daemon.server, "--json"]) == 0
    assert daemon.server in capsys.readouterr().out


def test_patroller_socket_names_the_socket_for_the_command_line(daemon, tmp_path):
    env = {name: value for name, value in os.environ.items() if name != "PATROLLER_SERVER"}
    env.update(PYTHONPATH=ROOT, PATROLLER_SOCKET=daemon.socket, PATROLLER_CONFIG="none")
    done = subprocess.run(
        [sys.executable, "-m", "patroller", "status"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "A100" in done.stdout, done.stderr


def test_one_default_port_everywhere():
    assert Config().port == client.DEFAULT_PORT == hosts.DEFAULT_PORT == 8080
    assert client.parse_server("gpu1")[2] == 8080
    assert hosts.base_url("gpu1") == "http://gpu1:8080"
    assert hosts.base_url("http://gpu1") == "http://gpu1:80"
    unit = Path(os.path.join(ROOT, "patroller", "cli", "patroller.service")).read_text()
    assert "--port" not in unit.split("ExecStart=")[1].split("\n")[0]  # the default: 8080
    assert finding.SOCKET in unit and finding.CONFIG_FILE in unit
    import patroller.config.file as configfile  # its DEFAULT_PATH as written (conftest moves it)

    source = Path(configfile.__file__).read_text(encoding="utf-8")
    assert f'\nDEFAULT_PATH = "{finding.CONFIG_FILE}"' in source
