"""The whole command line in one parser, and what is made from it: `patroller --help` (the
daemon's flags and every command), shell completion (`patroller completion bash|zsh|fish`,
written by shtab) and the manual page (`patroller manpage`, written by argparse-manpage).

The daemon's flags (config/flags.py), the client commands (cli/) and the doctor (doctor/) each
keep their own parser; here they are put together, so that what is completed and documented
is what each command takes, and nothing is written twice. shtab and argparse-manpage are
imported only by the command that needs them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from patroller import __version__
from patroller.cli.parser import build_parser
from patroller.config.flags import daemon_parser

SHELLS = ("bash", "zsh", "fish")
COMMANDS = ("completion", "manpage")  # the commands this module runs
DESCRIPTION = (
    "Know which user is on which GPU of a shared NVIDIA host, and hand out free "
    "GPUs fairly. With flags and no command, `patroller` runs the daemon; each "
    "command has its own --help."
)
EPILOG = (
    "Every flag of the daemon falls back to the environment variable named in its help. "
    "Shell completion: patroller completion bash|zsh|fish; the manual page: patroller "
    "manpage (docs/command-line.md says where each goes)."
)
# Where each shell looks for a command's completion, system-wide (docs/command-line.md).
INSTALL = {
    "bash": "/usr/share/bash-completion/completions/patroller",
    "zsh": "/usr/local/share/zsh/site-functions/_patroller",
    "fish": "/usr/share/fish/vendor_completions.d/patroller.fish",
}
MAN_PAGE = "/usr/local/share/man/man1/patroller.1"


def completion_parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="patroller completion",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print the completion of every command and flag of patroller for a shell.",
        epilog="Install it where the shell looks (as root; a new shell then completes):\n"
        + "\n".join(f"  patroller completion {shell} > {path}" for shell, path in INSTALL.items()),
    )
    made.add_argument("shell", choices=SHELLS, help="the shell: " + ", ".join(SHELLS))
    return made


def manpage_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="patroller manpage",
        description="Print the manual page patroller(1), in roff.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Install it (as root), then read it with man patroller:\n"
        f"  patroller manpage > {MAN_PAGE}",
    )


def doctor_parser() -> argparse.ArgumentParser:
    """The doctor's parser; where only the client is installed (no Tornado: `pip install
    --no-deps`), a stand-in that says so, so that --help still names every command."""
    try:
        from patroller.doctor.command import parser
    except ImportError as exc:
        return argparse.ArgumentParser(
            prog="patroller doctor",
            description="Check what the daemon would meet on this "
            f"host. Not here: it needs the daemon's packages ({exc.name or exc} is missing).",
        )
    return parser()


def config_parser() -> argparse.ArgumentParser:
    """`patroller config`'s options and the daemon's flags it takes."""
    from patroller.config.shown import parser

    own = parser()
    return argparse.ArgumentParser(
        prog=own.prog,
        parents=[daemon_parser(), own],
        conflict_handler="resolve",
        description=own.description,
        epilog=own.epilog,
    )


def whole_parser() -> argparse.ArgumentParser:
    """The daemon's flags and every command, the daemon-side ones (doctor, completion,
    manpage) included, each with its own flags."""
    top = daemon_parser()
    top.description, top.epilog = DESCRIPTION, EPILOG
    return build_parser(
        top,
        [
            ("doctor", "check what the daemon would meet on this host", doctor_parser()),
            (
                "config",
                "every setting the daemon would run with, and where it came from",
                config_parser(),
            ),
            ("completion", "print the shell completion (bash, zsh, fish)", completion_parser()),
            ("manpage", "print the manual page patroller(1)", manpage_parser()),
        ],
    )


def full_help() -> str:
    """`patroller --help`: the daemon's flags, then every command."""
    return whole_parser().format_help()


def completion(shell: str) -> str:
    """The completion script for `shell`, from the whole parser."""
    import shtab  # only here: the rest of Patroller does without it

    return str(shtab.complete(whole_parser(), shell=shell))


def manpage() -> str:
    """patroller(1) in roff, from the whole parser."""
    from argparse_manpage.manpage import Manpage  # only here, as shtab

    page = Manpage(whole_parser())
    page.source = f"patroller {__version__}"
    page.manual = "Patroller"
    page.description = "who is on which GPU, and free GPUs handed out fairly"
    return str(page)


def main(argv: Sequence[str]) -> int:
    """`patroller completion SHELL` or `patroller manpage`: the text on stdout; 2 for bad
    usage, 69 (EX_UNAVAILABLE) when the library that writes it is not installed."""
    name, rest = argv[0], list(argv[1:])
    made = completion_parser() if name == "completion" else manpage_parser()
    try:
        options = made.parse_args(rest)
    except SystemExit as exit_:  # --help (0) or a usage error (2)
        return int(exit_.code or 0)
    shell: str | None = getattr(options, "shell", None)
    try:
        text = completion(shell) if shell is not None else manpage()
    except ImportError as exc:
        print(
            f"patroller {name}: {exc.name or exc} is not installed: pip install "
            f"{'shtab' if shell else 'argparse-manpage'} (both come with patroller's "
            "own requirements)",
            file=sys.stderr,
        )
        return 69
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
