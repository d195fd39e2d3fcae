"""`patroller status`: this host's table, or many hosts' (--hosts, --hosts-file,
PATROLLER_HOSTS), once or redrawn (--watch), as JSON, or the hosts with N free GPUs (--free).
The tables are status.py's and fleet.py's; this only asks and prints."""

from __future__ import annotations

import argparse
import sys
import time

import patroller.cli.fleet as fleet
from patroller import client
from patroller.cli.exits import EX_OK, EX_USAGE, Failure
from patroller.cli.run import optional_queue, optional_users
from patroller.cli.status import format_status
from patroller.cli.table import width_of
from patroller.client import PatrollerError
from patroller.safetext import json_text, printable


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
