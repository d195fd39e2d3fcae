"""`patroller doctor` as its entry point runs it, in the test process (main.py calls
`command.main`): a flag or variable the daemon would refuse is a failed check of its own, left
out of what the other checks examine; a command line that cannot be read is a usage error,
a JSON list with --json; each word compared whole. tests/test_doctor.py runs the command as a
program, which a mutation run does not see (docs/development.md, "Mutation testing")."""

import io
import json
import os

import pytest
from helpers import engines_in

from patroller.doctor.command import FAILING, HEALTHY, USAGE, accepted, main, parser
from patroller.doctor.results import failed


@pytest.fixture
def no_variables(monkeypatch):
    """No PATROLLER_* variable of the machine's reaches the doctor."""
    for name in list(os.environ):
        if name.startswith("PATROLLER_"):
            monkeypatch.delenv(name)


def isolated(folder):
    """Flags that keep the doctor to what a test made: every engine's socket and the
    kubelet's in `folder`, loopback, a port the kernel picks, synthetic devices."""
    flags = ["--test", "--port", "0", "--address", "127.0.0.1"]
    for name, value in engines_in(folder, kubelet_socket=f"{folder}/kubelet.sock").items():
        flags += [f"--{name.replace('_', '-')}", value]
    return flags


def test_a_refused_flag_and_variable_are_checks_of_their_own_and_left_out():
    """The flag left out, its variable counts; the `--flag=VALUE` form left out too."""
    config, refused = accepted(
        ["--port", "70000", "--address", "127.0.0.1", "--usage-interval=x"],
        {"PATROLLER_PORT": "8001", "PATROLLER_USAGE_DAYS": "lots"},
    )
    assert config is not None
    assert (config.port, config.address, config.usage_days) == (8001, "127.0.0.1", 400)
    later = "the daemon would refuse to start; the other checks are of it without"
    assert [(r.check, r.status, r.detail, r.fix) for r in refused] == [
        (
            "--port",
            "failed",
            f"'70000' is not a port number (0-65535): {later} --port",
            "give --port a value the daemon takes (`patroller --help`), or leave it out",
        ),
        (
            "--usage-interval",
            "failed",
            "'x' is not a number of seconds or a duration such as 90, 90s, 30m, 2h: "
            f"{later} --usage-interval",
            "give --usage-interval a value the daemon takes (`patroller --help`), or leave it out",
        ),
        (
            "PATROLLER_USAGE_DAYS",
            "failed",
            f"'lots' is not a whole number of 1 or more: {later} PATROLLER_USAGE_DAYS",
            "set PATROLLER_USAGE_DAYS to a value the daemon takes (`patroller --help`), or "
            "unset it",
        ),
    ]


def test_the_examination_follows_the_refused_flag_as_json(tmp_path, no_variables):
    out = io.StringIO()
    assert main(["--json", "--usage-days", "x", *isolated(str(tmp_path))], out) == FAILING
    listed = json.loads(out.getvalue())
    assert listed[0] == {
        "check": "--usage-days",
        "status": "failed",
        "detail": "'x' is not a whole number of 1 or more: the daemon would refuse to start; "
        "the other checks are of it without --usage-days",
        "fix": "give --usage-days a value the daemon takes (`patroller --help`), or leave it out",
    }
    assert {"nvidia-smi", "state directory", "unix socket", "notifications"} <= {
        r["check"] for r in listed
    }
    for result in listed:
        assert sorted(result) == ["check", "detail", "fix", "status"], result


def test_a_command_line_that_cannot_be_read_is_a_usage_error(capsys):
    out = io.StringIO()
    assert main(["--json", "--no-such-flag"], out) == USAGE
    assert json.loads(out.getvalue()) == [
        {
            "check": "command line",
            "status": "failed",
            "detail": "the command line cannot be read: unrecognized arguments: --no-such-flag",
            "fix": "see `patroller doctor --help`",
        }
    ]
    # without --json: argparse's usage and the error, on stderr alone
    out = io.StringIO()
    assert main(["--no-such-flag"], out) == USAGE
    printed = capsys.readouterr()
    assert out.getvalue() == "" and printed.out == ""
    assert printed.err.startswith("usage: patroller doctor ")
    assert printed.err.endswith(
        "\npatroller doctor: error: unrecognized arguments: --no-such-flag\n"
    )


def test_the_help_says_what_is_checked_how_to_aim_it_and_the_exit_statuses():
    """`patroller doctor --help`, as a user reads it (argparse's wrapping undone)."""
    said = " ".join(parser().format_help().split())
    assert said.startswith("usage: patroller doctor ")
    assert (
        "Check what the daemon would meet on this host: nvidia-smi and its commands, /proc and "
        "cgroups, the container engines, the kubelet, the Slurm job map, the state directory, "
        "the usage history, the port and socket, the systemd unit. One line each: ok, degraded "
        "(works, with less) or failed, with how to fix it." in said
    )
    assert said.endswith(
        "Give it the daemon's own flags (below), or their PATROLLER_* variables, to check what "
        "that daemon would meet. A value the daemon would refuse is a failed check. Exit "
        "status: 0 when nothing failed, 78 when a check failed, 2 for a command line that "
        "cannot be read."
    )
    assert (
        '--json print a JSON list of {"check", "status", "detail", "fix"}, always (a command '
        "line that cannot be read too)" in said
    )
    assert "--state-dir" in said  # the daemon's own flags, to aim it


def test_a_refusal_that_cannot_be_left_out_is_the_configuration_failed_once():
    """The refused flag comes from a variable of another name: leaving nothing out of the
    command line cannot mend it, so the doctor says it once and examines nothing."""
    config, refused = accepted([], {"PATROLLER_TEST_PROCESSES": "1"})
    assert config is None
    assert refused == [
        failed(
            "configuration",
            "--test-processes: only with --test: a GPU host's processes are its own",
            "correct it: the daemon would not start",
        )
    ]


def test_the_examination_is_said_in_lines_without_json(tmp_path, no_variables):
    out = io.StringIO()
    assert main(["--usage-days", "x", *isolated(str(tmp_path))], out) == FAILING
    said = out.getvalue().splitlines()
    assert said[0] == (
        "failed    --usage-days: 'x' is not a whole number of 1 or more: the daemon would "
        "refuse to start; the other checks are of it without --usage-days; fix: give "
        "--usage-days a value the daemon takes (`patroller --help`), or leave it out"
    )
    assert said[1] == "ok        nvidia-smi: not used: --test serves synthetic devices"
    assert said[-1].endswith(" failed") and out.getvalue().endswith("\n")


def test_a_switch_refused_on_the_command_line_is_left_out_with_the_whole_reason():
    """The reason has a colon of its own: the flag is what comes before the first."""
    config, refused = accepted(["--test-processes"], {})
    assert config is not None and not config.test_processes
    assert [(r.check, r.detail) for r in refused] == [
        (
            "--test-processes",
            "only with --test: a GPU host's processes are its own: the daemon would refuse to "
            "start; the other checks are of it without --test-processes",
        )
    ]


def test_a_refused_variable_leaves_the_command_line_alone():
    """Even a flag whose value is the variable's name."""
    config, refused = accepted(
        ["--address", "PATROLLER_USAGE_DAYS"], {"PATROLLER_USAGE_DAYS": "lots"}
    )
    assert config is not None and config.address == "PATROLLER_USAGE_DAYS"
    assert [r.check for r in refused] == ["PATROLLER_USAGE_DAYS"]


def test_a_configuration_the_daemon_would_refuse_whole_is_not_examined(no_variables, monkeypatch):
    monkeypatch.setenv("PATROLLER_TEST_PROCESSES", "1")
    out = io.StringIO()
    assert main(["--json"], out) == FAILING
    assert out.getvalue() == (
        "[\n"
        " {\n"
        '  "check": "configuration",\n'
        '  "status": "failed",\n'
        '  "detail": "--test-processes: only with --test: a GPU host\'s processes are its '
        'own",\n'
        '  "fix": "correct it: the daemon would not start"\n'
        " }\n"
        "]\n"
    )


def test_a_host_where_nothing_fails_is_healthy(tmp_path, no_variables):
    out = io.StringIO()
    assert main(["--json", *isolated(str(tmp_path))], out) == HEALTHY
    assert all(r["status"] != "failed" for r in json.loads(out.getvalue()))
