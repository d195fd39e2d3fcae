"""`patroller systemd-unit`: the systemd unit that runs this installation's daemon.

The unit (patroller.service, beside this file, and contrib/systemd/patroller.service, a link to
it) names the daemon as /usr/local/bin/patroller; this prints it with the path of the
`patroller` that runs the command in ExecStart= instead (a virtual environment under /opt, pipx,
...), since
systemd needs the absolute path of what it starts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from patroller.cli.exits import EX_OK, EX_USAGE

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "patroller.service")
NAMED = "/usr/local/bin/patroller"  # the path the unit file names


def installed_patroller() -> str | None:
    """The absolute path of this installation's `patroller` command, or None."""
    called = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(called) == "patroller" and os.access(called, os.X_OK):
        return called
    beside = os.path.join(os.path.dirname(sys.executable), "patroller")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("patroller")
    return os.path.abspath(found) if found else None


def unit_text(executable: str) -> str:
    """The unit, starting `executable`: its ExecStart= lines name it, and the comments stay as
    they are (they say what the source's copy names, which stays true)."""
    with open(TEMPLATE, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    return "".join(
        line.replace(NAMED, executable) if line.startswith("ExecStart=") else line
        for line in lines
    )


def unit_command(options: argparse.Namespace) -> int:
    """Print the unit for this installation (or for --exec PATH)."""
    executable = options.exec or installed_patroller()
    if executable is None:
        print(
            "patroller: cannot tell where the `patroller` command is installed; name it "
            "with --exec PATH",
            file=sys.stderr,
        )
        return EX_USAGE
    if not os.path.isabs(executable):
        print(f"patroller: --exec must be an absolute path, not {executable!r}", file=sys.stderr)
        return EX_USAGE
    sys.stdout.write(unit_text(executable))
    return EX_OK
