"""The client commands' parser: every command, its flags and their help, each command's
handler set as its default; with the daemon's flags and commands (patroller/manual.py), the
whole command line in one parser, for --help, completion and the man page."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import patroller.cli.fleet as fleet
from patroller.cli.arguments import count_arg, hold_arg, seconds_arg, wait_arg, watch_arg
from patroller.cli.notify import add_parser as add_notify
from patroller.cli.overview import status_command
from patroller.cli.records import history_command, queue_command, users_command
from patroller.cli.report import add_parser as add_report
from patroller.cli.reserving import release_command, reserve_command, wait_command
from patroller.cli.run import run_command
from patroller.cli.unit import unit_command

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
