"""`patroller doctor [--json] [daemon flags]`: the checks of what the daemon these flags
describe would meet on this host, one line each (or a JSON list). The entry point (main.py)
turns the outcome into an exit status: nothing failed, something failed, or a bad flag."""
from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Sequence, TextIO

from patroller.config import ConfigError, load
from patroller.doctor.examine import examine
from patroller.doctor.results import any_failed, lines
from patroller.safetext import json_text, printable

HEALTHY, FAILING, USAGE = "healthy", "failing", "usage"  # the outcomes


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="patroller doctor",
        description="Check what the daemon would meet on this host: nvidia-smi and its "
        "commands, /proc and cgroups, the container engines, the kubelet, the Slurm job map, "
        "the state directory, the port and socket, the systemd unit. One line each: ok, "
        "degraded (works, with less) or failed, with how to fix it.",
        epilog="Give it the daemon's own flags (--nvidia-smi, --state-dir, --port, --address, "
        "--socket, the engines' sockets, --slurm-job-map, --kubelet-socket, ...; see "
        "`patroller --help`), or their PATROLLER_* variables, to check what that daemon would "
        "meet. Exit status: 0 when nothing failed, 78 when a check failed, 2 for a bad flag.")
    made.add_argument("--json", action="store_true",
                      help='print a JSON list of {"check", "status", "detail", "fix"}')
    return made


def main(argv: Sequence[str], out: TextIO = sys.stdout) -> str:
    """Run every check and print the results; the outcome (HEALTHY, FAILING or USAGE)."""
    options, rest = parser().parse_known_args(list(argv))
    try:
        config = load(rest)
    except ConfigError as exc:
        print(f"patroller doctor: error: {printable(str(exc))}", file=sys.stderr)
        return USAGE
    results = asyncio.run(examine(config))
    if options.json:
        out.write(json_text([r.json() for r in results], indent=1) + "\n")
    else:
        out.write("\n".join(lines(results)) + "\n")
    return FAILING if any_failed(results) else HEALTHY
