"""The configuration file: precedence, refusals that name the file, the line and the key,
secrets never repeated, `patroller config`'s origins, the example in docs/gpu-host.md, and
SIGHUP on a running daemon."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import ROOT, ServerProcess

import patroller.config.file as configfile
from patroller.config import Config, ConfigError, live, load

PASSWORD = "hunter2-secret"


def written(tmp_path, text, name="patroller.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refusal(path, environ=None, argv=()):
    with pytest.raises(ConfigError) as caught:
        load(["--config", path, *argv], environ or {})
    return str(caught.value)


def test_each_source_wins_over_the_one_below(tmp_path):
    path = written(tmp_path, "port = 9002\nlease = 7\nhide-users = true\nmax-hold = '2h'\n")
    origins = {}
    config = load(
        ["--config", path, "--port", "9000"],
        {"PATROLLER_PORT": "9001", "PATROLLER_LEASE": "3"},
        origins,
    )
    assert config.port == 9000 and origins["--port"] == "--port"  # flag over all
    assert config.lease == 3 and origins["--lease"] == "PATROLLER_LEASE"  # environment over file
    assert config.max_hold == 7200 and origins["--max-hold"] == f"{path}:4"  # file over default
    assert config.hide_users is True and origins["--hide-users"] == f"{path}:3"
    assert config.idle_after == Config.idle_after and "--idle-after" not in origins  # default
    assert load(["--config", path, "--port", "9000"], {}).port == 9000  # flag over file
    assert load(["--config", path], {"PATROLLER_PORT": "9001"}).port == 9001
    assert load(["--config", path], {"PATROLLER_HIDE_USERS": "no"}).hide_users is False
    assert load(["--config", "none"], {}).port == Config.port == 8080
    # PATROLLER_CONFIG names the file; --config wins over it
    assert load([], {"PATROLLER_CONFIG": path}).port == 9002
    other = written(tmp_path, "port = 9003\n", "other.toml")
    assert load(["--config", other], {"PATROLLER_CONFIG": path}).port == 9003


def test_the_file_takes_lists_switches_and_repeated_keys(tmp_path):
    path = written(
        tmp_path,
        'user-labels = ["owner", "email"]\ncontainerd-namespaces = "a,b"\n'
        'pod-user-key = ["x/user", "y/user"]\nnotify = "json://h/p"\n'
        "test = true\nidle-sm = 2.5\n",
    )
    config = load(["--config", path], {})
    assert config.user_labels == ("owner", "email")
    assert config.containerd_namespaces == ("a", "b")
    assert config.pod_user_keys == ("x/user", "y/user") and config.notify == ("json://h/p",)
    assert config.test is True and config.idle_sm == 2.5
    assert config.state_dir is None  # test mode's default: the file's test = true counts


def test_an_unknown_key_is_named_with_its_line_and_the_closest_name(tmp_path):
    path = written(tmp_path, "# the port\nport = 8080\n\nprot = 9000\n")
    assert refusal(path) == f"{path}:4: unknown key 'prot'; did you mean 'port'?"
    path = written(tmp_path, 'state_dir = "/srv"\n')
    assert refusal(path).endswith(":1: unknown key 'state_dir'; did you mean 'state-dir'?")
    path = written(tmp_path, "port = 1\nconfig = '/etc/x.toml'\n")  # no file names another
    assert refusal(path).startswith(f"{path}:2: unknown key 'config'")
    path = written(tmp_path, "zzzz = 1\n")
    assert refusal(path) == (
        f"{path}:1: unknown key 'zzzz'; the keys are the long flags' names (patroller --help)"
    )
    # a control character in a key is escaped once, as the user would write it
    path = written(tmp_path, '"\\u001b[31mprot" = 1\n')
    said = refusal(path)
    assert "\x1b" not in said and ": unknown key '\\x1b[31mprot'; the keys are" in said


def test_a_wrong_type_is_named_with_its_line_and_what_was_expected(tmp_path):
    cases = [
        ("port = 1\n[lease]\nx = 1\n", ":2: lease: expected a string or a number, not a table"),
        ("lease.seconds = 3\n", ":1: lease: expected a string or a number, not a table"),
        ("port = [8080]\n", ":1: port: expected a string or a number, not a list"),
        ("hide-users = 'yes'\n", ":1: hide-users: expected true or false, not a string"),
        ("\nport = true\n", ":2: port: expected a string or a number, not true or false"),
        (
            "user-labels = [1, 2]\n",
            ":1: user-labels: expected a string or a list of "
            "strings, not a list of other than strings",
        ),
        ("lease = 1979-05-27\n", ":1: lease: expected a string or a number, not a date or time"),
    ]
    for text, said in cases:
        path = written(tmp_path, text)
        assert refusal(path) == path + said, text


def test_a_bad_value_is_refused_as_the_flag_refuses_it_with_the_line(tmp_path):
    path = written(tmp_path, "port = 8080\nlease = -3\n")
    assert refusal(path) == f"{path}:2: lease: '-3' must be a positive duration"
    path = written(tmp_path, "\n\nport = 99999\n")
    assert refusal(path) == f"{path}:3: port: '99999' is not a port number (0-65535)"
    path = written(tmp_path, "log-level = 'loud'\n")
    assert (
        refusal(path) == f"{path}:1: log-level: 'loud' must be one of debug, info, warning, error"
    )


def test_a_syntax_error_names_the_file_and_its_line(tmp_path):
    path = written(tmp_path, "port = 8080\nlease 10\n")
    said = refusal(path)
    assert said.startswith(f"{path}:2: not TOML: ") and "line 2" in said
    path = written(tmp_path, "port = 8080\nport = 8081\n")  # a key twice is not TOML either
    assert refusal(path).startswith(f"{path}:2: not TOML: ")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"port = 1\nlease = '\xff'\n")
    assert refusal(str(binary)) == f"{binary}:2: not TOML: not UTF-8"


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    missing = str(tmp_path / "nope.toml")
    assert refusal(missing) == (
        f"{missing}: cannot read the configuration file: No such file or directory"
    )
    assert refusal(str(tmp_path)).endswith("the configuration file is not a regular file")
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # nobody writes to it: reading it to the end would wait for ever
    assert refusal(str(fifo)).endswith("the configuration file is not a regular file")


def test_a_secret_is_never_repeated_back(tmp_path):
    url = f"mailtos://patroller:{PASSWORD}@smtp.example"
    for text in (
        f'notify = ["{url}", "no url {PASSWORD}"]\n',
        f'notify-user-default = "{url}"\n',  # no {{user}} in it
        f'notify = [["{url}"]]\n',
        f'notify = {{ url = "{url}" }}\n',
    ):
        path = written(tmp_path, text)
        said = refusal(path)
        assert PASSWORD not in said and said.startswith(f"{path}:1: notify"), said
    path = written(tmp_path, f'notify = ["{url}"]\nnotify-user-default = "{url}?to={{user}}"\n')
    shown = patroller_config("--config", path)
    assert shown.returncode == 0 and PASSWORD not in shown.stdout
    assert f'file {path}:1  notify = ["mailtos://********"]' in shown.stdout
    shown = patroller_config("--config", path, "--json")
    assert PASSWORD not in shown.stdout
    rows = {row["key"]: row for row in json.loads(shown.stdout)["settings"]}
    assert rows["notify-user-default"]["value"] == "mailtos://********"


def test_the_default_path_is_read_only_when_it_exists(tmp_path, monkeypatch):
    default = tmp_path / "patroller.toml"
    monkeypatch.setattr(configfile, "DEFAULT_PATH", str(default))
    origins = {}
    assert load([], {}, origins).port == 8080 and "--config" not in origins  # not there
    default.write_text("port = 9100\n")
    assert load([], {}, origins).port == 9100 and origins["--config"] == str(default)
    assert load(["--config", "none"], {}).port == 8080  # none: not even the default
    assert load([], {"PATROLLER_CONFIG": ""}).port == 8080
    default.write_text("port = 'x'\n")
    with pytest.raises(ConfigError, match=re.escape(f"{default}:1: port: 'x'")):
        load([], {})


def patroller_config(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "patroller", "config", *args],
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_patroller_config_names_each_settings_origin(tmp_path):
    path = written(tmp_path, "# settings\nport = 9002\nmax-hold = '2h'\n")
    env = {"PATROLLER_LEASE": "3", "PATROLLER_CONFIG": path}
    done = patroller_config("--idle-after", "60", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"# configuration file: {path}"
    shown = {line.split("  ")[-1].split(" = ")[0].strip(): line for line in lines[1:]}
    assert re.fullmatch(rf"file {re.escape(path)}:2 +port = 9002", shown["port"])
    assert re.fullmatch(rf"file {re.escape(path)}:3 +max-hold = 7200.0", shown["max-hold"])
    assert re.fullmatch(r"variable PATROLLER_LEASE +lease = 3.0", shown["lease"])
    assert re.fullmatch(r"flag --idle-after +idle-after = 60.0", shown["idle-after"])
    assert re.fullmatch(r"default +usage = \"sqlite\"", shown["usage"])
    assert re.fullmatch(r"default +max-per-user = \(none\)", shown["max-per-user"])
    assert len(lines) - 1 == len(configfile_keys())  # every key, once
    done = patroller_config("--json", "--idle-after", "60", env=env)
    answer = json.loads(done.stdout)
    assert answer["file"] == path
    rows = {row["key"]: row for row in answer["settings"]}
    assert rows["port"] == {"key": "port", "value": 9002, "origin": "file", "where": f"{path}:2"}
    assert rows["lease"] == {
        "key": "lease",
        "value": 3.0,
        "origin": "environment",
        "where": "PATROLLER_LEASE",
    }
    assert rows["idle-after"] == {
        "key": "idle-after",
        "value": 60.0,
        "origin": "flag",
        "where": "--idle-after",
    }
    assert rows["user-labels"] == {
        "key": "user-labels",
        "origin": "default",
        "where": None,
        "value": ["user.email", "email", "maintainer"],
    }
    bad = patroller_config("--json", env={"PATROLLER_CONFIG": written(tmp_path, "prot = 1\n")})
    assert bad.returncode == 2 and bad.stdout == ""
    assert "prot.toml" not in bad.stderr and ":1: unknown key 'prot'" in bad.stderr


def test_the_docs_sample_of_patroller_config_is_a_real_run(tmp_path):
    text = Path(os.path.join(ROOT, "docs", "configuration.md")).read_text(encoding="utf-8")
    toml = re.search(r"A TOML file whose keys.*?```toml\n(.*?)```", text, re.S).group(1)
    sample = re.search(
        r"```text\n\$ (PATROLLER_LOG_LEVEL=debug) patroller config (--lease 30)\n"
        r"(.*?)```",
        text,
        re.S,
    )
    path = written(tmp_path, toml)
    variable, flag = sample.group(1).split("="), sample.group(2).split()
    done = patroller_config(*flag, env={variable[0]: variable[1], "PATROLLER_CONFIG": path})
    assert done.returncode == 0, done.stderr

    def normal(line):
        return re.sub(r"\s{2,}", "  ", line.replace(path, "/etc/patroller/patroller.toml"))

    ran = [normal(line) for line in done.stdout.splitlines()]
    shown = [normal(line) for line in sample.group(3).splitlines() if line != "..."]
    assert len(shown) > 10
    assert [line for line in shown if line in ran] == shown
    assert sorted(shown, key=ran.index) == shown  # in the order it prints them


def configfile_keys():
    from patroller.config.flags import file_keys

    return file_keys()


def test_every_key_has_a_value_to_show():
    from patroller.config.shown import value_of

    for key in configfile_keys():
        value_of(Config(), key, {})  # an AttributeError names a key with no Config field


def example_in_the_docs():
    text = Path(os.path.join(ROOT, "docs", "gpu-host.md")).read_text(encoding="utf-8")
    found = re.search(
        r"<!-- generated by `patroller config --example`.*?-->\n```toml\n(.*?)```", text, re.S
    )
    assert found, "docs/gpu-host.md has no generated example"
    return found.group(1)


def test_the_docs_example_is_the_one_patroller_config_prints_and_names_every_key(tmp_path):
    done = patroller_config("--example")
    assert done.returncode == 0
    assert example_in_the_docs() == done.stdout, (
        "docs/gpu-host.md's example is stale: paste `patroller config --example` there"
    )
    keys = re.findall(r"^# ([a-z0-9-]+) =", done.stdout, re.M)
    assert keys == list(configfile_keys())
    # Each key shown with a value, its `#` taken off, is the default itself.
    uncommented = re.sub(r"^# ([a-z0-9-]+ = .+)$", r"\1", done.stdout, flags=re.M)
    assert len(re.findall(r"^[a-z]", uncommented, re.M)) > 30
    path = written(tmp_path, uncommented)
    assert load(["--config", path], {}) == load(["--config", "none"], {})


def test_a_reload_applies_the_live_settings_and_names_the_others():
    running = Config(port=8080, lease=10, max_per_user=1, shutdown_grace=0.5)
    read = Config(port=9000, lease=20, max_per_user=4, log_level="debug", pod_user_keys=("x",))
    now, restart = live.applied(running, read)
    assert now.max_per_user == 4 and now.log_level == "debug"  # live
    assert now.port == 8080 and now.lease == 10 and now.shutdown_grace == 0.5  # as they were
    assert restart == ["port", "lease", "pod-user-key", "shutdown-grace"]
    assert live.applied(running, running) == (running, [])
    assert set(live.LIVE) <= {f.name for f in dataclasses.fields(Config)}


def ask(server, path):
    try:
        with urllib.request.urlopen(server.url + path, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def wait_for(condition, server, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, server.log
        time.sleep(0.05)


def test_sighup_rereads_the_file_on_a_running_daemon(tmp_path):
    path = tmp_path / "patroller.toml"
    path.write_text("max-per-user = 1\nlease = 10\n")
    server = ServerProcess("--test", "--config", str(path)).start()
    try:
        assert ask(server, "/request?gpu=2&user=alice") == 403  # the file's limit
        path.write_text("max-per-user = 3\nlease = 20\nheader-timeout = 5\n")
        server.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: limits read again" in server.log, server)
        assert ask(server, "/request?gpu=2&user=alice") == 200  # live: changed
        changed = [line for line in server.log.splitlines() if "restart to apply" in line]
        assert len(changed) == 1 and changed[0].endswith(
            f"SIGHUP: lease, header-timeout changed in {path}: restart to apply"
        ), server.log
        path.write_text("max-per-user = 1\nlease = 'x'\n")  # unusable: all stays
        server.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "the settings stay as they were" in server.log, server)
        assert f"{path}:2: lease: 'x'" in server.log
        assert ask(server, "/request?gpu=1&user=alice") == 200  # 3 GPUs still allowed
    finally:
        assert server.stop() == 0


def test_the_doctor_reads_the_same_file(tmp_path):
    def doctor(path):
        return subprocess.run(
            [sys.executable, "-m", "patroller", "doctor", "--json"],
            env={**os.environ, "PYTHONPATH": ROOT, "PATROLLER_CONFIG": path},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    good = written(
        tmp_path,
        'nvidia-smi = "/nonexistent/nvidia-smi-of-the-file"\n'
        'state-dir = "none"\nkubelet-socket = "none"\n',
    )
    done = doctor(good)
    checks = {check["check"]: check for check in json.loads(done.stdout)}
    assert any(
        "/nonexistent/nvidia-smi-of-the-file" in check["detail"] for check in checks.values()
    ), done.stdout
    bad = written(tmp_path, "port = 1\nhide-users = 'yes'\n", "bad.toml")
    done = doctor(bad)
    assert done.returncode != 0
    assert (
        f"{bad}:2: hide-users: expected true or false, not a string" in done.stdout + done.stderr
    )
