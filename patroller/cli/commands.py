"""The command line people type: `patroller run|status|release|wait|reserve|report|...`.

Standard library and `patroller.client` only, so that it works wherever the client is installed
(a container with the socket directory mounted) without Tornado or Docker. `patroller` with
flags (or none) is still the server; patroller/main.py hands these words to `main` here, which
parses them (parser.py), finds the server, runs the command's handler and turns what went wrong
into a message and an exit status (patroller/cli/exits.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from patroller import client
from patroller.cli.arguments import offsets_joined
from patroller.cli.exits import (
    EX_INTERRUPTED,
    EX_PIPE,
    EX_UNAVAILABLE,
    EX_USAGE,
    Failure,
    error_text,
    refused_code,
)
from patroller.cli.finding import find
from patroller.cli.parser import build_parser
from patroller.cli.render import use_colour
from patroller.client import RequestRefused, ServerUnreachable
from patroller.safetext import printable


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; its exit status."""
    args = offsets_joined(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    try:
        options = parser.parse_args(args)
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
        return int(exit_.code or 0)
    try:
        client.parse_server(getattr(options, "server", None))
    except ValueError as exc:
        print(f"patroller: {printable(str(exc))}", file=sys.stderr)
        return EX_USAGE
    if hasattr(options, "colour"):  # on a terminal only, as the user lets it
        options.colour = options.colour and use_colour(sys.stdout)
    try:
        if wants_server(options):  # none named: the daemon's socket, PATROLLER_SERVER, ...
            options.server = find(os.environ)
        code = options.handler(options)
        sys.stdout.flush()  # here, where a reader gone is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:
        return reader_gone()
    except Failure as failure:  # its words may be a daemon's (an error, a holder's name)
        print(f"patroller: {printable(str(failure))}", file=sys.stderr)
        return failure.code
    except ServerUnreachable as exc:
        print(f"patroller: cannot reach the server: {printable(str(exc))}", file=sys.stderr)
        return EX_UNAVAILABLE
    except RequestRefused as refused:
        print(f"patroller: the server refused: {error_text(refused)}", file=sys.stderr)
        return refused_code(refused)
    except KeyboardInterrupt:
        print("patroller: interrupted", file=sys.stderr)
        return EX_INTERRUPTED


def wants_server(options: argparse.Namespace) -> bool:
    """Whether the command asks one server and none was named (--hosts asks others)."""
    return (
        hasattr(options, "server")
        and options.server is None
        and not (
            getattr(options, "hosts", None)
            or getattr(options, "hosts_file", None)
            or ("hosts" in options and os.environ.get("PATROLLER_HOSTS", "").strip())
        )
    )


def reader_gone() -> int:
    """The reader of stdout left (`patroller report --json | head -c 600`): end quietly, as
    a Unix tool that SIGPIPE ends does (the shell says 141), with nothing more written to the
    pipe, not even at the interpreter's exit, where Python would print the error again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EX_PIPE
