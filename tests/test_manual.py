"""The whole command line in one parser (patroller/manual.py): `patroller --help` names every
command, shell completion that real bash, zsh and fish complete with, and a man page that
man(1) reads; each made from the parsers the commands themselves use."""

import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT

from patroller.cli import COMMANDS
from patroller.config import settings_table

shtab = pytest.importorskip("shtab", reason="shtab (a requirement) writes the completion")
DEPENDENCIES = os.path.dirname(os.path.dirname(os.path.abspath(shtab.__file__)))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, DEPENDENCIES])}
EVERY_COMMAND = (*COMMANDS, "doctor", "config", "completion", "manpage")


def patroller(*args):
    return subprocess.run(
        [sys.executable, "-m", "patroller", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_names_every_command_and_every_flag_of_the_daemon():
    # As found: `patroller --help` omitted history, users, queue, report and systemd-unit.
    done = patroller("--help")
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("\ncommands:\n", 1)[1]
    named = re.findall(r"^    (\S+)\s{2,}\S", listed, re.MULTILINE)
    assert named == list(EVERY_COMMAND), listed
    for flag, variable, _ in settings_table():
        assert f"{flag} VALUE" in done.stdout or f"{flag} " in done.stdout, flag
        assert variable in done.stdout.replace("\n", " ").replace("  ", ""), variable
    assert patroller("--port", "8080", "--help").stdout == done.stdout


def completed(shell_script: str, line: str) -> list:
    """What real bash offers after `line`, with the completion script loaded."""
    words = line.split(" ")
    program = (
        f"source {shell_script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\nCOMP_LINE={line!r}\nCOMP_POINT=${{#COMP_LINE}}\n"
        f"_shtab_patroller patroller {words[-1]!r} {words[-2]!r}\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile"],
        input=program,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_commands_their_flags_and_the_daemons(tmp_path):
    done = patroller("completion", "bash")
    assert done.returncode == 0, done.stderr
    script = tmp_path / "patroller.bash"
    script.write_text(done.stdout)
    assert completed(str(script), "patroller re") == ["release", "reserve", "report"]
    assert completed(str(script), "patroller hist") == ["history"]
    assert completed(str(script), "patroller --state") == ["--state-dir"]  # the daemon's
    assert completed(str(script), "patroller doctor --state") == ["--state-dir"]
    assert "--json" in completed(str(script), "patroller doctor --")
    assert completed(str(script), "patroller status --wat") == ["--watch"]
    assert completed(str(script), "patroller completion ") == ["bash", "zsh", "fish"]
    assert completed(str(script), "patroller report --b") == ["--by"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_the_commands(tmp_path):
    done = patroller("completion", "fish")
    assert done.returncode == 0, done.stderr
    script = tmp_path / "patroller.fish"
    script.write_text(done.stdout)
    asked = subprocess.run(
        [
            "fish",
            "--no-config",
            "-c",
            f"source {script}; complete -C 'patroller hist'; "
            f"complete -C 'patroller doctor --state'",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert asked.returncode == 0, asked.stderr
    offered = [line.split("\t")[0] for line in asked.stdout.splitlines()]
    assert "history" in offered and "--state-dir" in offered, asked.stdout


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_loads_the_completion_function(tmp_path):
    done = patroller("completion", "zsh")
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "functions"
    folder.mkdir()
    (folder / "_patroller").write_text(done.stdout)
    # compinit finds it on fpath, as installed under site-functions, and binds it to patroller
    asked = subprocess.run(
        [
            "zsh",
            "-f",
            "-c",
            f"fpath=({folder} $fpath); autoload -Uz compinit; "
            "compinit -u -D; print -r -- $_comps[patroller]; "
            "autoload +X _patroller && print loaded",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.split() == ["_patroller", "loaded"], asked.stdout + asked.stderr
    assert "history" in done.stdout and "--state-dir" in done.stdout


def test_the_man_page_is_every_command_and_flag_and_man_reads_it(tmp_path):
    pytest.importorskip("argparse_manpage", reason="argparse-manpage (a requirement) writes it")
    done = patroller("manpage")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('.TH PATROLLER "1" ')
    page = tmp_path / "patroller.1"
    page.write_text(done.stdout)
    if shutil.which("man") is None:
        pytest.skip("man is not installed to read it")
    shown = subprocess.run(
        ["man", "-l", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MANWIDTH": "100", "MAN_KEEP_FORMATTING": ""},
    )
    assert shown.returncode == 0, shown.stderr
    text = re.sub(r".\x08", "", shown.stdout)
    assert "patroller - who is on which GPU" in text
    for command in EVERY_COMMAND:
        assert re.search(rf"^\s+patroller {re.escape(command)}\b", text, re.MULTILINE), command
    for flag, _, _ in settings_table():
        assert flag in text, flag


def test_the_help_of_completion_and_manpage_say_where_each_goes():
    done = patroller("completion", "--help")
    assert done.returncode == 0
    flat = " ".join(done.stdout.split())
    assert "patroller completion bash > /usr/share/bash-completion/completions/patroller" in flat
    assert patroller("completion", "tcsh").returncode == 2
    assert "patroller manpage > /usr/local/share/man/man1/patroller.1" in " ".join(
        patroller("manpage", "--help").stdout.split()
    )


def test_help_names_every_command_where_only_the_client_is_installed():
    # `pip install --no-deps` in a training image: no Tornado; `patroller --help` worked there
    # before it named every command, and still does (the doctor said to be missing here).
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['tornado'] = None\n"
            "from patroller.main import main; sys.exit(main(['--help']))",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("\ncommands:\n", 1)[1]
    assert re.findall(r"^    (\S+)\s{2,}\S", listed, re.MULTILINE) == list(EVERY_COMMAND)
