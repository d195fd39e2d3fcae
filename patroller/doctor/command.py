"""`patroller doctor [--json] [daemon flags]`: the checks of what the daemon these flags
describe would meet on this host, one line each (or a JSON list). The entry point (main.py)
turns the outcome into an exit status: nothing failed, something failed, or a bad flag.

A flag value (or PATROLLER_* variable) the daemon would refuse is a failed check of its own,
with its fix, and the other checks examine the daemon without it: the doctor is there for
such a host. A command line that cannot be read at all (an unknown flag, a flag without its
value) is a usage error; with --json that too is a JSON list, never text alone."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn, TextIO

from patroller.config import Config, ConfigError, load
from patroller.config.flags import daemon_parser
from patroller.config.options import SWITCHES
from patroller.doctor.examine import examine
from patroller.doctor.results import Result, any_failed, failed, lines
from patroller.safetext import json_text, printable

HEALTHY, FAILING, USAGE = "healthy", "failing", "usage"  # the outcomes


class UsageProblem(Exception):
    """The command line cannot be read (argparse's words)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageProblem(message)


def parser() -> argparse.ArgumentParser:
    made = _Parser(
        prog="patroller doctor",
        parents=[daemon_parser()],
        conflict_handler="resolve",
        description="Check what the daemon would meet on this host: nvidia-smi and its "
        "commands, /proc and cgroups, the container engines, the kubelet, the Slurm job map, "
        "the state directory, the usage history, the port and socket, the systemd unit. One "
        "line each: ok, degraded (works, with less) or failed, with how to fix it.",
        epilog="Give it the daemon's own flags (below), or their PATROLLER_* variables, to "
        "check what that daemon would meet. A value the daemon would refuse is a failed check. "
        "Exit status: 0 when nothing failed, 78 when a check failed, 2 for a command line that "
        "cannot be read.",
    )
    made.add_argument(
        "--json",
        action="store_true",
        help='print a JSON list of {"check", "status", "detail", "fix"}, always '
        "(a command line that cannot be read too)",
    )
    return made


def main(argv: Sequence[str], out: TextIO = sys.stdout) -> str:
    """Run every check and print the results; the outcome (HEALTHY, FAILING or USAGE)."""
    made = parser()
    try:
        options = made.parse_args(list(argv))  # --help prints and exits here
    except UsageProblem as exc:
        said = f"the command line cannot be read: {exc}"
        if "--json" in argv:
            show([failed("command line", said, "see `patroller doctor --help`")], True, out)
        else:
            made.print_usage(sys.stderr)
            print(f"patroller doctor: error: {printable(str(exc))}", file=sys.stderr)
        return USAGE
    rest = [word for word in argv if word != "--json"]
    config, refused = accepted(rest, os.environ)
    results = refused + (asyncio.run(examine(config)) if config is not None else [])
    show(results, options.json, out)
    return FAILING if any_failed(results) else HEALTHY


def show(results: list[Result], as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(json_text([r.json() for r in results], indent=1) + "\n")
    else:
        out.write("\n".join(lines(results)) + "\n")


def accepted(argv: list[str], environ: Mapping[str, str]) -> tuple[Config | None, list[Result]]:
    """The configuration the daemon would run with, less each value it would refuse, and a
    failed check for each of those (None, and the checks, when what is wrong cannot be left
    out)."""
    argv, environ = list(argv), dict(environ)
    refused: list[Result] = []
    for _ in range(len(argv) + len(environ) + 1):
        try:
            return load(argv, environ), refused
        except ConfigError as exc:
            source = str(exc).partition(":")[0].strip()
            left = without(argv, source) if source.startswith("--") else None
            if left is not None:
                argv = left
            elif source in environ:
                del environ[source]
            else:
                return None, refused + [
                    failed(
                        "configuration",
                        printable(str(exc)),
                        "correct it: the daemon would not start",
                    )
                ]
            said = str(exc).partition(":")[2].strip()
            refused.append(
                failed(
                    source,
                    printable(
                        f"{said}: the daemon would refuse to start; "
                        "the other checks are of it without "
                        f"{source}"
                    ),
                    fix_for(source),
                )
            )
    return None, refused


def without(argv: list[str], flag: str) -> list[str] | None:
    """`argv` with every `flag VALUE` and `flag=VALUE` left out; None if it has none."""
    kept, found, skip = [], False, False
    for word in argv:
        if skip:
            skip = False
        elif word == flag:
            found, skip = True, flag not in SWITCHES
        elif word.startswith(flag + "="):
            found = True
        else:
            kept.append(word)
    return kept if found else None


FIXES: dict[str, str] = {
    "--state-dir": "give --state-dir a directory (made at start if missing) or none",
    "--slurm-job-map": "give --slurm-job-map a directory (the prolog makes it) or leave it out",
    "--limits-file": "give --limits-file a readable file, or leave it out",
}


def fix_for(source: str) -> str:
    """How to make a refused flag or variable right."""
    if source in FIXES:
        return FIXES[source]
    if source.startswith("--"):
        return f"give {source} a value the daemon takes (`patroller --help`), or leave it out"
    return f"set {source} to a value the daemon takes (`patroller --help`), or unset it"
