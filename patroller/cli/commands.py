"""The command line people type: `patroller run|status|release|wait|reserve|report|...`.

Standard library and `patroller.client` only, so that it works wherever the client is installed
(a container with the socket directory mounted) without Tornado or Docker. `patroller` with
flags (or none) is still the server; patroller/main.py hands these words to `main` here.
Exit statuses: patroller/cli/exits.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import patroller.cli.fleet as fleet
from patroller import client
from patroller.cli.arguments import (
    count_arg,
    hold_arg,
    offsets_joined,
    seconds_arg,
    wait_arg,
    watch_arg,
)
from patroller.cli.exits import (
    EX_INTERRUPTED,
    EX_NOPERM,
    EX_OK,
    EX_PIPE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
    Failure,
    error_text,
    refused_code,
)
from patroller.cli.finding import find
from patroller.cli.notify import add_parser as add_notify
from patroller.cli.records import history_command, queue_command, users_command
from patroller.cli.render import (
    amount,
    describe,
    duration,
    healthy_message,
    numbers_of,
    release_message,
    use_colour,
)
from patroller.cli.report import add_parser as add_report
from patroller.cli.run import optional_queue, optional_users, run_command
from patroller.cli.status import format_status
from patroller.cli.table import width_of
from patroller.cli.unit import unit_command
from patroller.client import PatrollerError, RequestRefused, ServerUnreachable
from patroller.safetext import json_text, printable

COMMANDS = (
    "run",
    "status",
    "release",
    "wait",
    "reserve",
    "history",
    "users",
    "queue",
    "report",
    "notify",
    "systemd-unit",
)


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


Other = tuple[str, str, argparse.ArgumentParser]  # a daemon-side command: name, help, parser


def build_parser(
    parser: argparse.ArgumentParser | None = None, others: Sequence[Other] = ()
) -> argparse.ArgumentParser:
    """The client commands' parser; or, given `parser` (the daemon's flags) and the daemon-side
    commands, the whole command line in one parser, for --help, completion and the man page
    (patroller/manual.py)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        help="host[:port] (port 8080 by default), http://host:port "
        "or unix:///path (default: the first that answers of the daemon's "
        "socket /run/patroller/api.sock, $PATROLLER_SERVER, the socket or port "
        "in /etc/patroller/patroller.toml, localhost:8080)",
    )
    whole = parser is not None
    if parser is None:
        parser = argparse.ArgumentParser(
            prog="patroller",
            description="Reserve and watch the GPUs of a Patroller host. "
            "`patroller` with flags and no command runs the server (patroller --help).",
        )
    names = COMMANDS + tuple(name for name, _, _ in others)
    if whole:
        commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    else:
        commands = parser.add_subparsers(dest="command", metavar="{" + ",".join(names) + "}")
    commands.required = not whole  # the whole command line: none runs the daemon

    run = commands.add_parser(
        "run",
        parents=[common],
        help="run a command on reserved GPUs",
        description="Reserve GPUs for as long as the command runs, "
        "then run it in place with CUDA_VISIBLE_DEVICES set.",
    )
    run.add_argument("-n", "--count", type=count_arg, default=1, help="how many (default 1)")
    run.add_argument(
        "--wait",
        type=wait_arg,
        default=False,
        metavar="SECONDS|forever",
        help="wait in the queue up to this long (default: do not wait)",
    )
    run.add_argument("--resource", default="gpu", help="device group (default gpu)")
    run.add_argument(
        "--link",
        choices=("nvlink", "numa"),
        help="insist on GPUs linked by NVLink to each other, or all in one NUMA "
        "node (default: the best-connected free GPUs, whatever they are)",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no message before the command")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- command [args...]")
    run.set_defaults(handler=run_command)

    status = commands.add_parser(
        "status",
        parents=[common],
        help="who holds which GPU",
        description="One row per GPU, then the waiting requests.",
    )
    status.add_argument("--json", action="store_true", help="print the raw /status body")
    status.add_argument(
        "--watch",
        nargs="?",
        type=watch_arg,
        const=2.0,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2, at least 0.5) until Ctrl-C",
    )
    status.add_argument(
        "--no-color",
        "--no-colour",
        dest="colour",
        action="store_false",
        help="no colours even on a terminal (so does NO_COLOR)",
    )
    status.add_argument(
        "--hosts",
        metavar="HOST[:PORT],...",
        help="many hosts in one table, asked at once (default: $PATROLLER_HOSTS)",
    )
    status.add_argument("--hosts-file", metavar="FILE", help="the hosts, one a line")
    status.add_argument(
        "--host-timeout",
        type=seconds_arg,
        default=fleet.FLEET_TIMEOUT,
        metavar="SECONDS",
        help="how long a host may take to answer (default 5)",
    )
    status.add_argument(
        "--deadline",
        type=seconds_arg,
        metavar="SECONDS",
        help="with --hosts: draw the table after this long in all, a host not "
        "answered by then shown as 'no answer yet' (default "
        f"${fleet.DEADLINE_VARIABLE}, else {fleet.DEADLINE:g})",
    )
    status.add_argument(
        "--free",
        type=count_arg,
        metavar="N",
        help="list the hosts (or this host) with N free GPUs now",
    )
    status.add_argument(
        "--mine",
        action="store_true",
        help="only the GPUs you hold or use, "
        "you being whom the server takes you for (GET /whoami)",
    )
    status.set_defaults(handler=status_command)

    release = commands.add_parser(
        "release",
        parents=[common],
        help="give reserved GPUs back",
        description="Release all your reservations, or the named.",
    )
    release.add_argument("devices", nargs="*", metavar="UUID|NUMBER")
    release.add_argument(
        "--reason",
        help="why, for the audit record; the host's root may "
        "release another user's device, named, with a reason",
    )
    release.add_argument(
        "--healthy",
        action="store_true",
        help="the host's root: the named "
        "GPUs are healthy again (after a reset); their holders keep them",
    )
    release.set_defaults(handler=release_command)

    wait = commands.add_parser(
        "wait",
        parents=[common],
        help="wait for GPUs, print numbers",
        description="Wait for free GPUs, reserve them for the usual "
        "lease and print their numbers: "
        "CUDA_VISIBLE_DEVICES=$(patroller wait -n 2) python train.py",
    )
    wait.add_argument("-n", "--count", type=count_arg, default=1, help="how many (default 1)")
    wait.add_argument(
        "--timeout",
        type=seconds_arg,
        metavar="SECONDS",
        help="give up after this long (default: wait for ever)",
    )
    wait.add_argument("--resource", default="gpu", help="device group (default gpu)")
    wait.add_argument(
        "--link",
        choices=("nvlink", "numa"),
        help="insist on GPUs linked by NVLink to each other, or all in one NUMA "
        "node (default: the best-connected free GPUs, whatever they are)",
    )
    wait.set_defaults(handler=wait_command)

    reserve = commands.add_parser(
        "reserve",
        parents=[common],
        help="hold GPUs for a while",
        description="Reserve GPUs for a duration, whatever runs on "
        "them (a notebook, jobs one after the other), and print "
        "their numbers: patroller reserve -n 2 --hold 4h",
    )
    reserve.add_argument("-n", "--count", type=count_arg, default=1, help="how many (default 1)")
    reserve.add_argument(
        "--hold",
        type=hold_arg,
        default="lease",
        metavar="DURATION|lease",
        help="how long: 90m, 4h (at most the server's --max-hold), or lease "
        "(the short lease, until your process shows up; the default)",
    )
    reserve.add_argument(
        "--wait",
        type=wait_arg,
        default=0.0,
        metavar="SECONDS|forever",
        help="wait in the queue up to this long (default: do not wait)",
    )
    reserve.add_argument("--resource", default="gpu", help="device group (default gpu)")
    reserve.add_argument(
        "--link",
        choices=("nvlink", "numa"),
        help="insist on GPUs linked by NVLink to each other, or all in one NUMA "
        "node (default: the best-connected free GPUs, whatever they are)",
    )
    reserve.set_defaults(handler=reserve_command)
    table = argparse.ArgumentParser(add_help=False, parents=[common])
    table.add_argument("--json", action="store_true", help="print the server's JSON")
    table.add_argument(
        "--no-color",
        "--no-colour",
        dest="colour",
        action="store_false",
        help="no colours even on a terminal (so does NO_COLOR)",
    )
    history = commands.add_parser(
        "history",
        parents=[table],
        help="the audit record",
        description="The audit record's recent events, oldest first.",
    )
    history.add_argument(
        "--since", metavar="DURATION|TIME", help="from this long ago (2h, 7d) or this ISO time on"
    )
    history.add_argument("--user", help="only the events of this user (as user, holder or by)")
    history.add_argument(
        "--limit",
        type=count_arg,
        default=1000,
        help="at most the last N events (default and most 1000)",
    )
    history.set_defaults(handler=history_command)
    users = commands.add_parser(
        "users",
        parents=[table],
        help="who holds, uses, waits",
        description="Per user: GPUs held, held unused, used without "
        "asking, idle, waiting, trespassing, the limit.",
    )
    users.set_defaults(handler=users_command)
    queue = commands.add_parser(
        "queue",
        parents=[table],
        help="the waiting requests",
        description="The waiting requests, in arrival order.",
    )
    queue.set_defaults(handler=queue_command)
    add_report(commands, common, seconds_arg)
    add_notify(commands, common)
    unit = commands.add_parser(
        "systemd-unit",
        help="print the systemd unit for this install",
        description="Print the systemd unit that runs this "
        "installation's daemon: patroller systemd-unit > "
        "/etc/systemd/system/patroller.service",
    )
    unit.add_argument(
        "--exec",
        metavar="PATH",
        help="the daemon's absolute path (default: this `patroller` command's)",
    )
    unit.set_defaults(handler=unit_command)
    for name, said, other in others:
        commands.add_parser(
            name,
            parents=[other],
            add_help=False,
            help=said,
            description=other.description,
            epilog=other.epilog,
        )
    return parser


def reserve_command(options: argparse.Namespace) -> int:
    """Reserve for a duration (or the lease) and print the numbers on stdout."""
    granted = client.reserve(
        options.count, options.server, options.wait, options.resource, options.hold, options.link
    )
    if granted is None:
        within = "now" if options.wait == 0 else f"within {duration(options.wait or 0)}"
        raise Failure(f"{amount(options.count, options.resource)} not free {within}", EX_TEMPFAIL)
    numbers = numbers_of(granted, options.resource)
    left = min((g["expires"] for g in granted if g.get("expires") is not None), default=None)
    how = (
        f"for {duration(left)}, whatever runs on them"
        if options.hold != "lease" and left
        else f"for the lease: start the job within {duration(left or 0)}"
    )
    them = "them" if len(granted) > 1 else "it"
    print(
        printable(
            f"patroller: {describe(granted)} reserved {how}; `patroller release "
            f"{' '.join(numbers)}` gives {them} back"
        ),
        file=sys.stderr,
    )
    print(printable(",".join(numbers)))
    return EX_OK


def wait_command(options: argparse.Namespace) -> int:
    """Reserve for the usual lease (hold=lease) and print the numbers on stdout."""
    granted = client.reserve(
        options.count, options.server, options.timeout, options.resource, "lease", options.link
    )
    if granted is None:
        within = "now" if options.timeout == 0 else f"within {duration(options.timeout or 0)}"
        raise Failure(f"{amount(options.count, options.resource)} not free {within}", EX_TEMPFAIL)
    numbers = numbers_of(granted, options.resource)
    leases = [g["expires"] for g in granted if g.get("expires") is not None]
    lease = (
        f"start the job within {duration(min(leases))}, or the reservation lapses"
        if leases
        else "start the job soon, or the reservation lapses"
    )
    print(
        printable(
            f"patroller: {describe(granted)} reserved; {lease} (it then lasts while "
            "your processes run on them)"
        ),
        file=sys.stderr,
    )
    print(printable(",".join(numbers)))
    return EX_OK


def release_command(options: argparse.Namespace) -> int:
    """Release everything (but what a running job's process holds), or the devices named by
    uuid or number."""
    if not options.devices and options.healthy:
        raise Failure(
            "release --healthy names the GPUs: patroller release --healthy NUMBER", EX_USAGE
        )
    if not options.devices:
        body = client.release_all(options.server, options.reason)
        print(release_message(body))
        return EX_OK
    inventory = client.devices(options.server)
    failed = False
    for name in options.devices:
        try:
            uuid = uuid_of(name, inventory)
            label = f"GPU {name}" if name.isdigit() else name
            if options.healthy:
                body = client.get_json(
                    options.server, "/release", post={"uuid": uuid, "healthy": "1"}
                )
                print(healthy_message(body, label))
                continue
            print(release_message(client.release(options.server, uuid, options.reason), label))
        except RequestRefused as refused:
            print(
                f"patroller: cannot release {printable(name)}: {error_text(refused)}",
                file=sys.stderr,
            )
            failed = True
        except Failure as failure:
            print(f"patroller: {printable(str(failure))}", file=sys.stderr)
            failed = True
    return EX_NOPERM if failed else EX_OK


def uuid_of(name: str, inventory: dict[str, Any]) -> str:
    """A device's uuid from its uuid or its number (a GPU's, as nvidia-smi numbers them)."""
    if not name.isdigit():
        return name
    for uuid, info in inventory.items():
        if info.get("group", "gpu") == "gpu" and str(info.get("number")) == name:
            return uuid
    raise Failure(f"cannot release {name}: no GPU number {name} on this host", EX_NOPERM)


def status_command(options: argparse.Namespace) -> int:
    colour = options.colour
    if options.watch is None:
        print(render_status(options, colour), end="")
        return EX_OK
    terminal = sys.stdout.isatty()
    try:
        while True:
            try:
                text = render_status(options, colour)
            except PatrollerError as exc:
                text = f"patroller: {printable(str(exc))}\n"
            if terminal:
                sys.stdout.write("\033[H\033[J" + text)
            else:
                sys.stdout.write(text + "\n")
            sys.stdout.flush()
            time.sleep(options.watch)
    except KeyboardInterrupt:
        return EX_OK


def fleet_of(options: argparse.Namespace) -> list[str]:
    """The hosts `status` shows, if more than the one server: --hosts, --hosts-file or
    PATROLLER_HOSTS."""
    try:
        return fleet.hosts_from(options.hosts, options.hosts_file)
    except OSError as exc:
        raise Failure(f"--hosts-file: {exc.strerror or exc}", EX_USAGE) from None


def render_fleet(options: argparse.Namespace, hosts: list[str], colour: bool) -> str:
    # One table: its deadline counts from the command's start; with --watch, each redraw's.
    answers = fleet.ask_all(
        hosts,
        options.host_timeout,
        options.mine,
        fleet.deadline_from(options.deadline),
        0.0 if options.watch else fleet.age(),
    )
    if options.json:
        return json_text(fleet.fleet_json(answers)) + "\n"
    if options.free is not None:
        return fleet.free_lines(answers, options.free)
    return fleet.fleet_table(answers, colour, width_of(sys.stdout), options.mine)


def render_status(options: argparse.Namespace, colour: bool) -> str:
    hosts = fleet_of(options)
    if hosts:
        return render_fleet(options, hosts, colour)
    claims = client.status(options.server)
    if options.json:
        return json_text(claims) + "\n"
    if options.free is not None:  # this host: its own errors (unreachable: 69) as they are
        here = fleet.HostAnswer(
            fleet.server_name(options.server), claims, client.devices(options.server)
        )
        return fleet.free_lines([here], options.free)
    mine = fleet.whoami(options.server) if options.mine else None
    return format_status(
        claims,
        client.devices(options.server),
        optional_queue(options.server),
        colour,
        optional_users(options.server),
        width_of(sys.stdout),
        mine,
    )
