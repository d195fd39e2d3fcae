"""Each form a setting's value may take, and what the daemon then runs with (config/values.py
through flags.load): `none` and empty, the schemes, the cases, the edges of each range; and the
forms just past them, refused. tests/test_config_values.py has every refusal's words."""

import zoneinfo

import pytest

from patroller.config import ConfigError, load

SOCKET_MOST = 107  # bytes of a unix socket's path


def given(flag, text, attribute=None):
    return getattr(load([flag, text], {}), attribute or flag[2:].replace("-", "_"))


def refused(flag, text):
    with pytest.raises(ConfigError) as error:
        load([flag, text], {})
    return str(error.value).removeprefix(f"{flag}: {text!r} ")


@pytest.mark.parametrize(
    "flag", ["--state-dir", "--slurm-job-map", "--kernel-log", "--kubelet-socket"]
)
def test_none_in_any_case_or_nothing_is_no_path(flag):
    for text in ("none", "NONE", "None", "", " "):
        assert given(flag, text) is None, text


def test_a_path_is_made_absolute_and_the_home_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert given("--kernel-log", "~/kmsg") == str(tmp_path / "kmsg")
    assert given("--kubelet-socket", " ~/kubelet.sock ") == str(tmp_path / "kubelet.sock")
    monkeypatch.chdir(tmp_path)
    assert given("--kernel-log", "k.log") == str(tmp_path / "k.log")
    assert given("--state-dir", "state") == str(tmp_path / "state")


def test_the_kubelets_socket_may_be_107_bytes_not_108():
    most = "/" + "k" * (SOCKET_MOST - 1)
    assert given("--kubelet-socket", most) == most
    said = refused("--kubelet-socket", most + "k")
    assert said == "is longer than a unix socket path may be (107 bytes)"


def test_each_engine_address_scheme_is_taken_as_given():
    for address in (
        "unix:///var/run/docker.sock",
        "tcp://gpu1:2375",
        "ssh://admin@gpu1",
        "http://gpu1:2375",
        "https://gpu1:2376",
    ):
        assert load([], {"DOCKER_HOST": address}).docker_host == address
    assert refused("--podman-socket", "/run/{x.sock") == (
        "holds braces: only the rootless sockets take {uid}"
    )
    assert refused("--containerd-socket", "unix://run/containerd.sock") == (
        "must be a unix socket: a path, or unix:///path"
    )


def test_a_fleet_file_that_is_not_text_is_refused_with_the_decoders_words(tmp_path):
    path = tmp_path / "hosts"
    path.write_bytes(b"\xffgpu1:8080\n")
    assert refused("--fleet-file", str(path)) == (
        "cannot be read: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"
    )


def test_a_containerd_namespace_may_have_76_characters_not_77():
    assert given("--containerd-namespaces", "n" * 76) == ("n" * 76,)
    assert refused("--containerd-namespaces", "n" * 77) == (
        f"names {'n' * 77!r}, which is not a containerd namespace"
    )


def test_the_kinds_of_notice_in_any_case_once_each():
    assert given("--notify-events", "IDLE, Lost,idle") == ("idle", "lost")
    assert given("--notify-events", "digest") == ("digest",)
    assert refused("--notify-events", " , ").startswith("must name kinds among trespass, ")
    assert refused("--notify-events", "idle lost").startswith("must name kinds among ")


def test_a_users_default_destination_holds_user_or_email():
    for url in ("mailto://mail.example/{user}", "json://hooks.example/{email}?to={user}"):
        assert given("--notify-user-default", url) == url
    for url in ("json://hooks.example/{USER}", "json://hooks.example/{Email}", "json://x/"):
        with pytest.raises(ConfigError, match=r"must hold \{user\} or \{email\}"):
            load(["--notify-user-default", url], {})


def test_a_notify_url_needs_something_after_its_scheme():
    with pytest.raises(ConfigError) as error:
        load([], {"PATROLLER_NOTIFY": "json://hooks.example json://"})
    assert str(error.value).startswith("PATROLLER_NOTIFY: URL 2 is not a URL of the form")


def test_a_port_from_0_to_65535():
    assert (given("--port", "0"), given("--port", "65535")) == (0, 65535)
    assert refused("--port", "65536") == "is not a port number (0-65535)"


def test_the_stream_silence_from_3_seconds():
    assert given("--stream-silence", "3") == 3.0


@pytest.mark.parametrize(
    "text, value",
    [("1", True), ("true", True), ("TRUE", True), ("yes", True), ("On", True)]
    + [("0", False), ("false", False), ("no", False), ("off", False), ("OFF", False)],
)
def test_a_switch_in_each_of_its_words(text, value):
    assert load([], {"PATROLLER_HIDE_USERS": text}).hide_users is value
    assert load([], {"PATROLLER_NOTIFY_TERMINAL": text}).notify_terminal is value


def test_a_switch_refused_says_each_word_it_takes():
    with pytest.raises(ConfigError) as error:
        load([], {"PATROLLER_NOTIFY_TERMINAL": "maybe"})
    assert str(error.value) == (
        "PATROLLER_NOTIFY_TERMINAL: 'maybe' must be 1, true, yes or on; or 0, false, no, off or "
        "empty"
    )


@pytest.mark.parametrize(
    "text, digest",
    [
        ("off", None),
        ("OFF", None),
        ("none", None),
        ("NONE", None),
        ("mon 09:00", (0, 9, 0, "UTC")),
        ("sun 23:59", (6, 23, 59, "UTC")),
        ("Friday 0:00 Z", (4, 0, 0, "Z")),
        ("tue 10:00 UTC", (1, 10, 0, "UTC")),
        ("wed 12:30 +14:00", (2, 12, 30, "+14:00")),
        ("thu 12:30 -0959", (3, 12, 30, "-0959")),
        ("sat 08:15 Europe/Paris", (5, 8, 15, "Europe/Paris")),
    ],
)
def test_the_digests_weekday_time_and_zone(text, digest):
    assert given("--notify-digest", text) == digest


@pytest.mark.parametrize(
    "text, said",
    [
        ("mon 09:60", "has no such time of day: from 00:00 to 23:59"),
        ("mon 24:00", "has no such time of day: from 00:00 to 23:59"),
        ("mon 10:00 +10:60", "is an offset from UTC beyond 14:00"),
        ("mon 10:00 +14:01", "is an offset from UTC beyond 14:00"),
        ("mon 10:00 utc", "is neither UTC, an offset from UTC (+02:00) nor the name of a time"),
        ("off now", "is not a weekday (mon, tue, ... or monday, ...) and a time (09:00)"),
    ],
)
def test_the_digest_just_past_each_edge_is_refused(text, said):
    assert refused("--notify-digest", text).startswith(said)


def test_an_escalation_of_0_is_none_and_a_duration_is_seconds():
    assert (given("--notify-escalate", "0"), given("--notify-escalate", "30m")) == (0.0, 1800.0)


def test_utc_and_z_need_no_zone_database():
    zoneinfo.reset_tzpath(to=[])
    zoneinfo.ZoneInfo.clear_cache()
    try:
        assert given("--notify-digest", "mon 09:00 UTC") == (0, 9, 0, "UTC")
        assert given("--notify-digest", "mon 09:00 Z") == (0, 9, 0, "Z")
        assert refused("--notify-digest", "mon 09:00 Europe/Paris").startswith("is neither UTC")
    finally:
        zoneinfo.reset_tzpath()
        zoneinfo.ZoneInfo.clear_cache()
    assert given("--notify-digest", "mon 09:00 Europe/Paris") == (0, 9, 0, "Europe/Paris")
