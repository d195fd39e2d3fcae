"""contrib/systemd/patroller.service: systemd itself checks it (`systemd-analyze verify`, with
no warning), it has the hardening the host needs, and its command line is the daemon's."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

UNIT = os.path.join(ROOT, "contrib", "systemd", "patroller.service")


def analyze():
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must check the unit: tests/setup.sh installs systemd")
        pytest.skip("systemd-analyze is missing (Debian's systemd package)")
    return found


def settings():
    """The unit's [Service] settings, name -> value (the last one of a name)."""
    found, section = {}, None
    for line in Path(UNIT).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif line and not line.startswith("#") and section == "[Service]":
            name, _, value = line.partition("=")
            found[name] = value
    return found


def test_systemd_verifies_the_unit_without_a_warning(tmp_path):
    # As docs/gpu-host.md says: the installed `patroller` prints the unit with its own path
    # (this checkout's virtual environment here), which systemd checks exists.
    unit = tmp_path / "patroller.service"
    patroller = os.path.join(os.path.dirname(sys.executable), "patroller")
    printed = subprocess.run(
        [patroller, "systemd-unit"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert printed.returncode == 0, printed.stderr
    assert f"ExecStart={patroller} --socket" in printed.stdout
    unit.write_text(printed.stdout)
    done = subprocess.run(
        [analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", done.stderr
    # And it would say so: an unknown key is a warning.
    unit.write_text(unit.read_text().replace("NoNewPrivileges=", "NoNewPrivilege="))
    done = subprocess.run(
        [analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert "Unknown key" in done.stderr


def test_the_unit_is_hardened_and_restarts_on_failure():
    unit = settings()
    assert unit["NoNewPrivileges"] == "yes" and unit["ProtectSystem"] == "strict"
    assert unit["StateDirectory"] == "patroller" and unit["Restart"] == "on-failure"
    assert int(unit["LimitNOFILE"]) >= 65536
    assert unit["ExecReload"].endswith("kill -HUP $MAINPID")  # --limits-file again
    # What it writes lies in its own directories, the rest being read-only to it.
    command = unit["ExecStart"].split()
    for flag, directory in (
        ("--state-dir", "/var/lib/patroller"),
        ("--socket", "/run/patroller/"),
        ("--audit-log", "/var/log/patroller/"),
    ):
        assert command[command.index(flag) + 1].startswith(directory)


def test_the_units_command_line_is_the_daemons():
    command = settings()["ExecStart"].split()
    assert command[0] == "/usr/local/bin/patroller"
    shown = subprocess.run(
        [sys.executable, "-m", "patroller", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    ).stdout
    for word in command[1:]:
        if word.startswith("--"):
            assert f"{word} VALUE" in shown, word


def test_the_docs_install_the_unit_the_installed_patroller_prints():
    """docs/gpu-host.md writes the unit with `patroller systemd-unit` of the install it made,
    and contrib/systemd's unit is the one that command prints (a link to it)."""
    text = Path(os.path.join(ROOT, "docs", "gpu-host.md")).read_text(encoding="utf-8")
    assert (
        "/opt/patroller/bin/patroller systemd-unit > /etc/systemd/system/patroller.service" in text
    )
    assert os.path.realpath(UNIT) == os.path.join(ROOT, "patroller", "cli", "patroller.service")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "patroller",
            "systemd-unit",
            "--exec",
            "/opt/patroller/bin/patroller",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    shipped = Path(UNIT).read_text(encoding="utf-8").splitlines(keepends=True)
    assert done.returncode == 0 and done.stdout == "".join(
        line.replace("/usr/local/bin/patroller", "/opt/patroller/bin/patroller")
        if line.startswith("ExecStart=")
        else line
        for line in shipped
    )
    # As found: the comment said "...bin/patroller, where a system-wide `pip install` puts it"
    # of the venv's path too. Every comment that names a path says something true of it.
    comments = "".join(
        line for line in done.stdout.splitlines(keepends=True) if line.startswith("#")
    ).replace("\n# ", " ")
    assert "/usr/local/bin/patroller, where a system-wide `pip install`" in comments
    assert "/opt/patroller/bin/patroller, where" not in comments
    assert (
        "ExecStart= names the patroller command whose `patroller systemd-unit` printed" in comments
    )
    assert "\nExecStart=/opt/patroller/bin/patroller --" in done.stdout
    relative = subprocess.run(
        [sys.executable, "-m", "patroller", "systemd-unit", "--exec", "bin/patroller"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert relative.returncode == 2 and "absolute path" in relative.stderr


def test_the_unit_keeps_what_the_daemon_writes_to_root():
    # systemd makes StateDirectory= and LogsDirectory= 0755 unless told a mode, and hands the
    # service a umask of 0022: the usage history and the audit record would be every user's.
    unit = settings()
    assert unit["StateDirectoryMode"] == "0700"
    assert int(unit["LogsDirectoryMode"], 8) & 0o007 == 0  # 0750 or tighter
    assert unit["UMask"] == "0077"
    assert unit["RuntimeDirectoryMode"] == "0755"  # the socket's: every local user may call


def test_the_unit_gives_the_memory_of_reports_back():
    # Python's own allocator keeps the arenas a year-long report used (some 22 MiB after the
    # reports end); the C allocator gives them back (docs/performance.md measures both).
    assert settings()["Environment"] == "PYTHONMALLOC=malloc"
