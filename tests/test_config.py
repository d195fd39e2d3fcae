"""Configuration: flags, environment fallbacks, and values refused at start."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from helpers import ROOT, ServerProcess

from patroller.config import Config, ConfigError, default_state_dir, load, settings_table


def test_defaults():
    assert load([], {}) == Config(
        state_dir=default_state_dir(False, {}, os.getuid()),
        kubelet_socket="/var/lib/kubelet/pod-resources/kubelet.sock",
        kernel_log="/dev/kmsg",
    )
    assert Config().port == 8080 and Config().lease == 10
    assert Config().user_labels == ("user.email", "email", "maintainer")


def test_environment_fallbacks():
    config = load(
        [],
        {
            "PATROLLER_TEST": "1",
            "PATROLLER_PORT": "8080",
            "PATROLLER_ADDRESS": "127.0.0.1",
            "PATROLLER_LEASE": "2.5",
            "PATROLLER_USER_LABELS": "owner, email",
            "PATROLLER_USER_INFO_LABELS": "team,project",
            "PATROLLER_NVIDIA_SMI": "/opt/nvidia-smi",
            "PATROLLER_LOG_LEVEL": "DEBUG",
        },
    )
    assert config == Config(
        test=True,
        port=8080,
        address="127.0.0.1",
        lease=2.5,
        user_labels=("owner", "email"),
        user_info_labels=("team", "project"),
        nvidia_smi="/opt/nvidia-smi",
        log_level="debug",
    )


def test_the_usage_store_settings():
    defaults = load([], {})
    assert (
        defaults.usage,
        defaults.usage_interval,
        defaults.usage_days,
        defaults.usage_busy_sm,
    ) == ("sqlite", 60.0, 400, 1.0)
    config = load(
        ["--usage-interval", "2m", "--usage-days", "30"],
        {"PATROLLER_USAGE": "None", "PATROLLER_USAGE_BUSY_SM": "5", "PATROLLER_USAGE_DAYS": "x"},
    )
    assert (config.usage, config.usage_interval, config.usage_days, config.usage_busy_sm) == (
        "none",
        120.0,
        30,
        5.0,
    )
    for args, named in (
        (["--usage", "postgres"], "--usage"),
        (["--usage-interval", "0.01"], "--usage-interval"),
        (["--usage-days", "0"], "--usage-days"),
        (["--usage-busy-sm", "101"], "--usage-busy-sm"),
    ):
        with pytest.raises(ConfigError, match=re.escape(named)):
            load(args, {})


def test_socket_and_docker_host(tmp_path):
    config = load(["--socket", str(tmp_path / "api.sock")], {"DOCKER_HOST": "unix:///tmp/d.sock"})
    assert config.socket == str(tmp_path / "api.sock")
    assert config.docker_host == "unix:///tmp/d.sock"
    assert load([], {}).socket is None and load([], {}).docker_host is None


def test_the_other_container_engines():
    defaults = load([], {})
    assert defaults.podman_socket == "unix:///run/podman/podman.sock"
    assert defaults.rootless_docker_socket == "unix:///run/user/{uid}/docker.sock"
    assert defaults.rootless_podman_socket == "unix:///run/user/{uid}/podman/podman.sock"
    assert defaults.shifted_uids_from == 100000
    config = load(
        [
            "--podman-socket",
            "/srv/podman.sock",
            "--rootless-docker-socket",
            "unix:///srv/{uid}/d.sock",
            "--shifted-uids-from",
            "2000000",
        ],
        {
            "PATROLLER_ROOTLESS_PODMAN_SOCKET": "/srv/p/{uid}.sock",
            "PATROLLER_SHIFTED_UIDS_FROM": "x",
        },
    )
    assert config.podman_socket == "unix:///srv/podman.sock"  # a path is a unix socket
    assert config.rootless_docker_socket == "unix:///srv/{uid}/d.sock"
    assert config.rootless_podman_socket == "unix:///srv/p/{uid}.sock"
    assert config.shifted_uids_from == 2000000
    off = load(
        ["--podman-socket", "none", "--rootless-docker-socket", ""],
        {"PATROLLER_ROOTLESS_PODMAN_SOCKET": "None"},
    )
    assert off.podman_socket is off.rootless_docker_socket is off.rootless_podman_socket is None


def test_flags_win_over_the_environment():
    config = load(
        ["--port", "9000", "--lease", "3", "--test"],
        {"PATROLLER_PORT": "8080", "PATROLLER_LEASE": "x"},
    )
    assert (config.port, config.lease, config.test) == (9000, 3.0, True)


def test_empty_test_variable_is_off():
    assert load([], {"PATROLLER_TEST": ""}).test is False


def test_hide_users_is_a_switch_with_a_checked_variable():
    assert load([], {}).hide_users is False
    assert load(["--hide-users"], {"PATROLLER_HIDE_USERS": "no"}).hide_users is True
    for text, value in (
        ("1", True),
        ("Yes", True),
        ("on", True),
        ("0", False),
        ("", False),
        ("false", False),
    ):
        assert load([], {"PATROLLER_HIDE_USERS": text}).hide_users is value, text


@pytest.mark.parametrize(
    "argv,environ,named",
    [
        (["--port", "http"], {}, "--port"),
        (["--port", "70000"], {}, "--port"),
        ([], {"PATROLLER_PORT": "-1"}, "PATROLLER_PORT"),
        (["--lease", "ten"], {}, "--lease"),
        (["--lease", "-1"], {}, "--lease"),
        (["--lease", "0"], {}, "--lease"),
        ([], {"PATROLLER_LEASE": "inf"}, "PATROLLER_LEASE"),
        (["--user-labels", " , "], {}, "--user-labels"),
        ([], {"PATROLLER_USER_INFO_LABELS": "a b"}, "PATROLLER_USER_INFO_LABELS"),
        (["--nvidia-smi", " "], {}, "--nvidia-smi"),
        (["--log-level", "loud"], {}, "--log-level"),
        (["--socket", "/no/such/dir/api.sock"], {}, "--socket"),
        ([], {"PATROLLER_SOCKET": "/tmp/" + "x" * 120}, "PATROLLER_SOCKET"),
        ([], {"DOCKER_HOST": "/var/run/docker.sock"}, "DOCKER_HOST"),
        (["--body-timeout", "0"], {}, "--body-timeout"),
        ([], {"PATROLLER_HIDE_USERS": "maybe"}, "PATROLLER_HIDE_USERS"),
        (["--podman-socket", "podman.sock"], {}, "--podman-socket"),
        (
            [],
            {"PATROLLER_PODMAN_SOCKET": "/run/user/{uid}/podman.sock"},
            "PATROLLER_PODMAN_SOCKET",
        ),
        (["--podman-socket", "/tmp/" + "x" * 120], {}, "--podman-socket"),
        (
            ["--rootless-docker-socket", "/run/user/1000/docker.sock"],
            {},
            "--rootless-docker-socket",
        ),
        (
            ["--rootless-docker-socket", "/run/user/{user}/{uid}.sock"],
            {},
            "--rootless-docker-socket",
        ),
        (["--rootless-docker-socket", "/run/{uid}/{0}.sock"], {}, "--rootless-docker-socket"),
        (["--rootless-podman-socket", "run/{uid}/podman.sock"], {}, "--rootless-podman-socket"),
        (
            [],
            {"PATROLLER_ROOTLESS_PODMAN_SOCKET": "/run/{uid}/" + "x" * 95},
            "PATROLLER_ROOTLESS_PODMAN_SOCKET",
        ),  # too long for the widest uid
        (["--shifted-uids-from", "0"], {}, "--shifted-uids-from"),
        ([], {"PATROLLER_SHIFTED_UIDS_FROM": "many"}, "PATROLLER_SHIFTED_UIDS_FROM"),
        ([], {"PATROLLER_BODY_TIMEOUT": "soon"}, "PATROLLER_BODY_TIMEOUT"),
        (["--fleet", "gpu1:8080,gpu2:80x"], {}, "--fleet"),
        (["--fleet", "gpu1:0"], {}, "--fleet"),
        (["--fleet", "unix:///run/patroller.sock"], {}, "--fleet"),
        (["--fleet", " , "], {}, "--fleet"),
        ([], {"PATROLLER_FLEET": "gpu1:8080/status"}, "PATROLLER_FLEET"),
        (["--fleet-file", "/no/such/file"], {}, "--fleet-file"),
        (["--fleet", "gpu1:8080", "--fleet-file", "/etc/hostname"], {}, "--fleet-file"),
        (["--fleet-interval", "0.1"], {}, "--fleet-interval"),
        (["--fleet-interval", "never"], {}, "--fleet-interval"),
        (["--fleet-timeout", "0"], {}, "--fleet-timeout"),
        ([], {"PATROLLER_FLEET_TIMEOUT": "-2"}, "PATROLLER_FLEET_TIMEOUT"),
        (["--fleet-max-bytes", "lots"], {}, "--fleet-max-bytes"),
        (["--fleet-max-bytes", "1.5MiB"], {}, "--fleet-max-bytes"),
        (["--fleet-max-bytes", "100"], {}, "--fleet-max-bytes"),
        ([], {"PATROLLER_FLEET_MAX_BYTES": "-1"}, "PATROLLER_FLEET_MAX_BYTES"),
        (["--idle-sm", "-1"], {}, "--idle-sm"),  # finite, below zero
        ([], {"PATROLLER_IDLE_MEMORY": "inf"}, "PATROLLER_IDLE_MEMORY"),  # above zero, not finite
    ],
)
def test_bad_values_name_the_flag_or_variable(argv, environ, named):
    with pytest.raises(ConfigError) as error:
        load(argv, environ)
    assert str(error.value).startswith(named + ":")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--port", "http"], "'http' is not a port number (0-65535)"),
        (["--user-labels", "a b,c"], "'a b,c' holds a label with white space"),
        (["--usage", "csv"], "'csv' must be sqlite or none"),
        (
            ["--stream-silence", "1"],
            "'1' must be at least 3 seconds: nvidia-smi prints once a second",
        ),
        (
            ["--notify-digest", "someday"],
            "'someday' is not a weekday and a time, and a zone if not "
            "UTC: 'mon 09:00', 'fri 17:30 Europe/Paris' (or off)",
        ),
        (
            ["--socket", "/tmp/" + "x" * 103],
            f"'/tmp/{'x' * 103}' is longer than a unix socket path may be (107 bytes)",
        ),
    ],
)
def test_a_bad_value_is_told_word_for_word(argv, message):
    with pytest.raises(ConfigError) as error:
        load(argv, {})
    assert str(error.value) == f"{argv[0]}: {message}"


def test_the_edges_of_a_value_are_taken():
    assert load(["--socket", "/tmp/" + "x" * 102], {}).socket == "/tmp/" + "x" * 102  # 107 bytes
    # a URL whose query holds another URL: its scheme is what comes before the first ://
    assert load(["--notify", "json://h/x?next=http://y"], {}).notify == (
        "json://h/x?next=http://y",
    )
    from patroller.config import values

    assert values.time_zone("+09").utcoffset(None) == timedelta(hours=9)
    assert values.time_zone("-0530").utcoffset(None) == -timedelta(hours=5, minutes=30)


def test_the_stream_silence_and_inventory_period_are_read_from_their_variables():
    found = load([], {"PATROLLER_STREAM_SILENCE": "7", "PATROLLER_INVENTORY_EVERY": "90"})
    assert (found.stream_silence, found.inventory_every) == (7.0, 90.0)


def test_the_fleet_from_a_list_or_a_file(tmp_path):
    config = load(
        [
            "--fleet",
            "gpu1:8080, gpu2:8080 gpu1:8080",
            "--fleet-interval",
            "2s",
            "--fleet-timeout",
            "1.5",
        ],
        {},
    )
    assert config.fleet == ("gpu1:8080", "gpu2:8080")
    assert (config.fleet_interval, config.fleet_timeout) == (2.0, 1.5)
    listing = tmp_path / "fleet"
    listing.write_text("# the lab\ngpu1:8080  # the old one\n\nhttp://[::1]:8080\n")
    assert load([], {"PATROLLER_FLEET_FILE": str(listing)}).fleet == (
        "gpu1:8080",
        "http://[::1]:8080",
    )
    assert load([], {}).fleet == () and Config().fleet_interval > Config().fleet_timeout
    listing.write_text("# nobody yet\n")
    with pytest.raises(ConfigError, match="^--fleet-file: .* names no host$"):
        load(["--fleet-file", str(listing)], {})


def test_the_largest_answer_taken_from_a_fleet_host():
    assert load([], {}).fleet_max_bytes == 1 << 20
    assert load(["--fleet-max-bytes", "65536"], {}).fleet_max_bytes == 65536
    assert load(["--fleet-max-bytes", "512KiB"], {}).fleet_max_bytes == 512 << 10
    assert load([], {"PATROLLER_FLEET_MAX_BYTES": "4m"}).fleet_max_bytes == 4 << 20
    assert (
        load(["--fleet-max-bytes", "2MiB"], {"PATROLLER_FLEET_MAX_BYTES": "4m"}).fleet_max_bytes
        == 2 << 20
    )  # the flag wins
    with pytest.raises(ConfigError) as error:
        load(["--fleet-max-bytes", "100"], {})
    assert str(error.value) == (
        "--fleet-max-bytes: '100' must be at least 1 KiB: a host's answer of one GPU is about that"
    )


def test_a_bad_fleet_host_is_named():
    with pytest.raises(ConfigError) as error:
        load(["--fleet", "gpu1:8080,gpu2:80x"], {})
    assert str(error.value) == (
        "--fleet: 'gpu1:8080,gpu2:80x' names 'gpu2:80x', which has a "
        "port that is not a number from 1 to 65535"
    )


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "patroller", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
    )


@pytest.mark.parametrize(
    "args,env,named",
    [
        (["--test", "--port", "abc"], {}, "--port"),
        (["--test"], {"PATROLLER_LEASE": "-3"}, "PATROLLER_LEASE"),
        (["--test", "--fleet", "gpu1:8080", "--fleet-timeout", "soon"], {}, "--fleet-timeout"),
    ],
)
def test_a_bad_value_stops_the_program_with_one_line_and_status_2(args, env, named):
    result = run(*args, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0]


def test_the_docs_document_every_setting():
    page = Path(os.path.join(ROOT, "docs", "configuration.md")).read_text(encoding="utf-8")
    for flag, env, _ in settings_table():
        assert re.search(rf"`{flag}`.*`{env}`", page), flag


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_the_server_promptly_and_cleanly(signum):
    server = ServerProcess("--test").start()
    started = time.monotonic()
    assert server.stop(signum) == 0
    assert time.monotonic() - started < 5  # generous: the stop path is bounded to ~2 s
    assert "stopped" in server.log and "Traceback" not in server.log


def test_a_port_in_use_is_one_clear_line_and_status_1():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("--test", "--address", "127.0.0.1", "--port", str(port))
    assert result.returncode == 1
    assert "cannot listen on 127.0.0.1 port" in result.stderr and "Traceback" not in result.stderr
