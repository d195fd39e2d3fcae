"""`patroller config` in the test process (config/shown.py): each setting's line and its
origin, column by column; the JSON; the secrets starred; a refusal on stderr; the example file;
the values as TOML writes them. tests/test_config_file.py runs the command as a child too."""

import io
import json
import os

import pytest
from test_config_file import example_in_the_docs, written

import patroller.config.file as configfile
from patroller.config import shown
from patroller.config.flags import file_keys

PASSWORD = "pw-of-the-shown-file"
FILE = f'port = 9002\nnotify = ["mailto://u:{PASSWORD}@mail.example", "json://hooks.example"]\n'
DEFAULT_TO = "mailto://x:" + PASSWORD + "@mail.example/{user}"
FLAGS = ["--idle-after", "60", "--notify-user-default", DEFAULT_TO]


@pytest.fixture
def environ(monkeypatch, tmp_path):
    """The test process's environment with no PATROLLER_* variable but those a test sets, and
    no file at the default path: `patroller config` reads os.environ, as the daemon does."""
    for name in list(os.environ):
        if name.startswith("PATROLLER_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(configfile, "DEFAULT_PATH", str(tmp_path / "no-default.toml"))
    return monkeypatch


def run(argv):
    out = io.StringIO()
    status = shown.main(argv, out)
    return status, out.getvalue()


def test_each_line_names_its_origin_in_a_column_of_its_own(tmp_path, environ):
    path = written(tmp_path, FILE)
    environ.setenv("PATROLLER_LEASE", "3")
    environ.setenv("PATROLLER_CONFIG", path)
    status, text = run(FLAGS)
    assert status == 0
    lines = text.splitlines()
    assert lines[0] == f"# configuration file: {path}"
    assert len(lines) - 1 == len(file_keys())  # every key, once, in the file's order
    assert [line.split("  ")[-1].split(" = ")[0].strip() for line in lines[1:]] == list(
        file_keys()
    )
    width = max(len(f"file {path}:2"), len("flag --notify-user-default"))

    def line(origin, setting):
        return f"{origin:<{width}}  {setting}"

    for expected in (
        line("default", "test = false"),
        line(f"file {path}:1", "port = 9002"),
        line("variable PATROLLER_LEASE", "lease = 3.0"),
        line("flag --idle-after", "idle-after = 60.0"),
        line("default", "max-per-user = (none)"),
        line("default", 'usage = "sqlite"'),
        line("default", 'user-labels = ["user.email", "email", "maintainer"]'),
        line("default", "fleet = []"),
        line("default", "fleet-max-bytes = 1048576"),
        line(f"file {path}:2", 'notify = ["mailto://********", "json://********"]'),
        line("flag --notify-user-default", 'notify-user-default = "mailto://********"'),
    ):
        assert expected in lines, (expected, text)
    assert PASSWORD not in text


def test_no_file_is_said_and_every_setting_is_its_default(environ):
    status, text = run([])
    assert status == 0
    lines = text.splitlines()
    assert lines[0] == "# configuration file: none"
    assert all(line.startswith("default  ") for line in lines[1:]), text
    assert "default  notify = []" in lines and "default  socket = (none)" in lines


def test_the_json_names_each_settings_value_origin_and_where(tmp_path, environ):
    path = written(tmp_path, FILE)
    environ.setenv("PATROLLER_LEASE", "3")
    status, text = run(["--json", "--config", path, *FLAGS])
    assert status == 0
    answer = json.loads(text)
    assert set(answer) == {"file", "settings"} and answer["file"] == path
    assert [row["key"] for row in answer["settings"]] == list(file_keys())
    rows = {row["key"]: row for row in answer["settings"]}
    assert rows["port"] == {"key": "port", "value": 9002, "origin": "file", "where": f"{path}:1"}
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
    assert rows["notify"]["value"] == ["mailto://********", "json://********"]
    assert rows["notify-user-default"] == {
        "key": "notify-user-default",
        "value": "mailto://********",
        "origin": "flag",
        "where": "--notify-user-default",
    }
    assert rows["socket"] == {"key": "socket", "value": None, "origin": "default", "where": None}
    assert PASSWORD not in text


def test_a_secret_not_given_is_none_and_a_secret_without_a_scheme_all_stars(environ):
    rows = {row["key"]: row for row in json.loads(run(["--json"])[1])["settings"]}
    assert rows["notify-user-default"]["value"] is None and rows["notify"]["value"] == []
    assert shown.starred("no-scheme-" + PASSWORD) == "********"
    assert shown.starred(f"tgram://{PASSWORD}/chat") == "tgram://********"
    # the scheme is what comes before the first "://": a URL in the query is starred too
    assert shown.starred(f"json://u:{PASSWORD}@h/?to=https://x") == "json://********"


def test_the_fleet_is_shown_under_the_key_it_was_named_by(tmp_path, environ):
    hosts = written(tmp_path, "# the hosts\ngpu1:8080\ngpu2:8080\n", "hosts.txt")
    by_file = {
        row["key"]: row
        for row in json.loads(run(["--json", "--fleet-file", hosts])[1])["settings"]
    }
    assert by_file["fleet-file"]["value"] == ["gpu1:8080", "gpu2:8080"]
    assert by_file["fleet-file"]["origin"] == "flag" and by_file["fleet"]["value"] is None
    named = {
        row["key"]: row
        for row in json.loads(run(["--json", "--fleet", "gpu3:8080"])[1])["settings"]
    }
    assert named["fleet"]["value"] == ["gpu3:8080"] and named["fleet-file"]["value"] is None


def test_a_setting_that_cannot_be_used_is_refused_on_stderr_made_printable(
    tmp_path, environ, capsys
):
    path = written(tmp_path, "prot = 1\n", "a\x1b[31mb.toml")
    status, text = run(["--config", path])
    assert status == 2 and text == ""
    said, escaped = capsys.readouterr().err, path.replace("\x1b", "\\x1b")
    assert said == (
        f"patroller config: error: {escaped}:1: unknown key 'prot'; did you mean 'port'?\n"
    )


def test_a_files_name_is_shown_printable(tmp_path, environ):
    path = written(tmp_path, "port = 9003\n", "a\x1b[31mb.toml")
    status, text = run(["--config", path])
    shown_path = path.replace("\x1b", "\\x1b")
    assert status == 0 and "\x1b" not in text
    assert text.splitlines()[0] == f"# configuration file: {shown_path}"
    assert f"file {shown_path}:1  port = 9003" in text.splitlines()


def test_the_example_is_the_docs_file_every_key_at_its_default(environ):
    status, text = run(["--example"])
    assert status == 0 and text == shown.example() == example_in_the_docs()
    assert "# port = 8080\n" in text and "# socket =\n" in text and "# fleet-file =\n" in text
    lines = [line for line in text.splitlines() if line]
    assert all(line.startswith("# ") for line in lines), text
    meanings = [line for line in lines if " =" not in line]  # wrapped at 96, each line a "# "
    assert max(len(line) for line in meanings) <= 96, text


def test_values_are_written_as_toml_writes_them():
    assert shown.literal(None) == "(none)"
    assert shown.literal(True) == "true" and shown.literal(False) == "false"
    assert shown.literal(["a", 1, 2.5]) == '["a", 1, 2.5]'
    assert shown.literal('é "q"') == '"é \\"q\\""'  # quoted, not escaped to ASCII
    assert shown.literal(0) == "0" and shown.literal([]) == "[]"


def test_the_help_says_what_is_shown_in_what_order_and_the_exit_status(capsys):
    with pytest.raises(SystemExit) as stopped:
        shown.main(["--help"], io.StringIO())
    said = " ".join(capsys.readouterr().out.split())  # the words, however argparse wraps them
    assert stopped.value.code == 0
    assert said.startswith("usage: patroller config [-h] [--json] [--example] "), said
    for words in (
        "Show every setting the daemon would run with, and where each came from: its default, "
        "the configuration file and line, an environment variable, or a flag (in that order of "
        "precedence, each over the one before). Secrets are starred.",
        '--json print {"file", "settings": [{"key", "value", "origin", "where"}]}',
        "--example print a configuration file with every key, each commented out at its "
        "default, and what it means: patroller config --example > /etc/patroller/patroller.toml",
        "Give it the daemon's own flags (--config PATH, --port, ...; see `patroller --help`) to "
        "see what that daemon would run with. Exit status: 0, or 2 when a setting could not be "
        "used (the file, line and key named).",
    ):
        assert words in said, (words, said)


def test_the_json_is_indented_by_one(environ):
    status, text = run(["--json"])
    assert status == 0 and text == json.dumps(json.loads(text), indent=1) + "\n"


def file_of_length(tmp_path, length):
    """A configuration file whose path is `length` characters long (folders of 200)."""
    folder = str(tmp_path)
    while length - len(folder) - 1 > 250:
        folder = os.path.join(folder, "d" * 200)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "f" * (length - len(folder) - 1))
    with open(path, "w", encoding="utf-8") as file:
        file.write("port = 9004\n")
    return path


def test_a_line_is_shown_whole_up_to_1000_characters_then_cut(tmp_path, environ, capsys):
    header = "# configuration file: "
    whole, cut = (file_of_length(tmp_path / str(n), 1000 - len(header) + n) for n in (0, 1))
    assert run(["--config", whole])[1].splitlines()[0] == header + whole
    assert run(["--config", cut])[1].splitlines()[0] == (header + cut)[:1000] + "..."
    setting = 'flag --nvidia-smi  nvidia-smi = "'  # the widest origin: the flag's
    for extra, shown_line in ((0, lambda line: line), (1, lambda line: line[:1000] + "...")):
        smi = "/" + "s" * (1000 - len(setting) - 2 + extra)
        line = f'{setting}{smi}"'
        assert len(line) == 1000 + extra
        assert shown_line(line) in run(["--nvidia-smi", smi])[1].splitlines()
    prefix = "patroller config: error: "
    for extra in (0, 1):
        port = "x" * (1000 - len("--port: '' is not a port number (0-65535)") + extra)
        assert run(["--port", port]) == (2, "")
        said = capsys.readouterr().err
        message = f"--port: '{port}' is not a port number (0-65535)"
        assert said == prefix + (message if extra == 0 else message[:1000] + "...") + "\n"
