"""Every refusal of a setting's value, word for word as the user reads it (config/values.py
through flags.load: the flag or variable, the text given, what is wrong), and the edges each
check takes. tests/test_config.py holds the rest of the flags' tests."""

import os

import pytest

from patroller.config import ConfigError, load

LONG = "/tmp/" + "x" * 103  # 108 bytes: one more than a unix socket's path may have

REFUSED = [
    (["--max-per-user", "0"], "'0' is not a whole number of 1 or more"),
    (["--usage-days", "1.5"], "'1.5' is not a whole number of 1 or more"),
    (["--usage-interval", "0.09"], "'0.09' must be at least 0.1 seconds"),
    (
        ["--podman-socket", "/run/{x}.sock"],
        "'/run/{x}.sock' holds braces: only the rootless sockets take {uid}",
    ),
    (
        ["--podman-socket", "/run/x}.sock"],
        "'/run/x}.sock' holds braces: only the rootless sockets take {uid}",
    ),
    (
        ["--rootless-docker-socket", "/run/{uid}/{0}.sock"],
        "'/run/{uid}/{0}.sock' may hold {uid} and nothing else in braces",
    ),
    (
        ["--rootless-podman-socket", "/run/podman.sock"],
        "'/run/podman.sock' must hold {uid}, which stands for the uid of the engine's user",
    ),
    (["--fleet-max-bytes", "lots"], "'lots' is not a number of bytes (1048576, 512KiB, 4MiB)"),
    (
        ["--fleet-max-bytes", "1023"],
        "'1023' must be at least 1 KiB: a host's answer of one GPU is about that",
    ),
    (["--socket", " "], "' ' must not be empty"),
    (
        ["--socket", "/no/such/dir/api.sock"],
        "'/no/such/dir/api.sock' is in a directory that does not exist (/no/such/dir)",
    ),
    (["--idle-sm", "x"], "'x' is not a number"),
    (["--idle-sm", "-1"], "'-1' must be zero or more"),
    (["--usage-busy-sm", "101"], "'101' must be a percentage from 0 to 100"),
    (["--log-level", "loud"], "'loud' must be one of debug, info, warning, error"),
    (["--nvidia-smi", " "], "' ' must not be empty"),
    (["--limits-file", "/no/such"], "'/no/such' is not a file"),
    (["--user-labels", " , "], "' , ' must name at least one label"),
    (["--state-dir", "/etc/hostname"], "'/etc/hostname' is not a directory"),
    (
        ["--fleet-file", "/no/such/file"],
        "'/no/such/file' cannot be read: No such file or directory",
    ),
    (["--fleet", " , "], "' , ' names no host"),
    (
        ["--fleet-interval", "0.4"],
        "'0.4' must be at least 0.5 seconds: every host is asked that often",
    ),
    (["--podman-socket", LONG], f"'{LONG}' is longer than a unix socket path may be (107 bytes)"),
    (
        ["--containerd-socket", "tcp://h:1"],
        "'tcp://h:1' must be a unix socket: a path, or unix:///path",
    ),
    (["--containerd-namespaces", " , "], "' , ' must name at least one namespace"),
    (
        ["--containerd-namespaces", "k8s.io,bad name"],
        "'k8s.io,bad name' names 'bad name', which is not a containerd namespace",
    ),
    (["--pod-user-key", " , "], "' , ' must name at least one key"),
    (
        ["--notify-events", "idle,bogus"],
        "'idle,bogus' must name kinds among trespass, unreserved, idle, expiring, granted, lost, "
        "unhealthy, daemon, digest",
    ),
    (
        ["--notify-digest", "mon 09:00 +15:00"],
        "'mon 09:00 +15:00' is an offset from UTC beyond 14:00",
    ),
    (
        ["--notify-digest", "mon 09:00 Mars/Base"],
        "'mon 09:00 Mars/Base' is neither UTC, an offset from UTC (+02:00) nor the name of a "
        "time zone this host knows (Europe/Paris)",
    ),
    (["--notify-digest", "mon 24:00"], "'mon 24:00' has no such time of day: from 00:00 to 23:59"),
    (
        ["--notify-digest", "mo 09:00"],
        "'mo 09:00' is not a weekday (mon, tue, ... or monday, ...) and a time (09:00)",
    ),
]


@pytest.mark.parametrize("argv, message", REFUSED)
def test_each_refusal_is_told_word_for_word(argv, message):
    with pytest.raises(ConfigError) as error:
        load(argv, {})
    assert str(error.value) == f"{argv[0]}: {message}"


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"PATROLLER_MAX_WAITING_PER_USER": "x"}, "'x' is not a whole number of 1 or more"),
        (
            {"DOCKER_HOST": "/var/run/docker.sock"},
            "'/var/run/docker.sock' must be a unix://, tcp://, ssh:// or http(s):// address",
        ),
        ({"PATROLLER_NOTIFY": " "}, "names no URL"),  # the URLs are never repeated
        (
            {"PATROLLER_NOTIFY": "json://a b"},
            "URL 2 is not a URL of the form scheme://... (mailtos://, json://, slack://, "
            "ntfy://, ...; Apprise's list of services)",
        ),
        (
            {"PATROLLER_NOTIFY_USER_DEFAULT": "mailto://h/{uid}"},
            "must hold {user} or {email}, and no other {...}",
        ),
    ],
)
def test_each_refusal_of_a_variable_is_told_word_for_word(environ, message):
    with pytest.raises(ConfigError) as error:
        load([], environ)
    assert str(error.value) == f"{next(iter(environ))}: {message}"


def test_the_edges_of_each_check_are_taken(tmp_path):
    assert load(["--max-per-user", "1"], {}).max_per_user == 1
    assert load(["--usage-interval", "0.1"], {}).usage_interval == 0.1
    assert load(["--fleet-interval", "0.5"], {}).fleet_interval == 0.5
    assert load(["--usage-busy-sm", "100"], {}).usage_busy_sm == 100.0
    assert load(["--idle-sm", "0"], {}).idle_sm == 0.0
    sizes = {"1024": 1024, "1k": 1024, "512 KiB": 512 << 10, "4MiB": 4 << 20, "2mb": 2 << 20}
    for text, size in sizes.items():
        assert load(["--fleet-max-bytes", text], {}).fleet_max_bytes == size, text
    path = str(tmp_path / "api.sock")
    assert load(["--socket", f" {path} "], {}).socket == path
    widest = "/run/{uid}/" + "x" * (107 - len("/run/4294967294/"))  # 107 bytes at the widest uid
    assert load(["--rootless-podman-socket", widest], {}).rootless_podman_socket == (
        "unix://" + widest
    )
    assert load(["--state-dir", str(tmp_path)], {}).state_dir == str(tmp_path)
    assert load(["--state-dir", str(tmp_path / "new")], {}).state_dir == str(tmp_path / "new")
    assert os.path.isdir(tmp_path) and not os.path.exists(tmp_path / "new")  # not made here
