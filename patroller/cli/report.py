"""`patroller report`: GPU-hours per category over a range (GET /usage), by user, host account,
Slurm job or account, namespace, pod, GPU or day, as a table, JSON or CSV; with `--hosts`, summed
over many hosts asked at once.

The range and the grouping go to the daemon as given: it checks them, and a 400 naming the field
(malformed, reversed, in the future) is said as its words under the option's name, status 2.
With many hosts, each is asked at once, each for at most `--host-timeout` seconds and all within
one deadline; a host that refuses, says nothing in time, answers other than /usage does or has
no usage store (404) is a line of its own, `host  not answering: why`, and the others are summed
(cli/usageanswers.py). No host answering: status 69 (77 when every one refused); every host
refusing the range (400): status 2, as with one.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from dataclasses import dataclass
from typing import Any

import patroller.cli.fleet as fleet
import patroller.cli.usage as usage
import patroller.cli.usageanswers as usageanswers
from patroller import client
from patroller.answers import BadAnswer
from patroller.cli.exits import EX_NOPERM, EX_OK, EX_UNAVAILABLE, EX_USAGE, Failure
from patroller.cli.table import width_of
from patroller.client import PatrollerError, RequestRefused
from patroller.durations import describe
from patroller.safetext import json_text, printable

REPORT_TIMEOUT = 10.0  # seconds a host may take to answer (--host-timeout): a year's report
# of a big host takes a few
REPORT_MAX_BYTES = 16 << 20  # bytes of a host's answer read at most: thousands of pods
OPTIONS = {
    "since": "--since",
    "until": "--until",
    "by": "--by",
    "tz": "--tz",
}  # what the daemon's `field`
# names, as the command line says it


@dataclass
class HostUsage:
    """What one host answered to /usage, or why there is nothing."""

    host: str
    answer: dict[str, Any] | None = None
    error: str | None = None
    refused: RequestRefused | None = None  # the host's refusal (4xx, 5xx), if it was one


def add_parser(
    commands: Any, common: argparse.ArgumentParser, seconds: Any
) -> argparse.ArgumentParser:
    """The `report` command's words, on the command line's subparsers."""
    report = commands.add_parser(
        "report",
        parents=[common],
        help="GPU-hours per category, by user, job, GPU, day...",
        description="GPU-hours per category (active, idle-held, reserved-unused, trespass, "
        "unreserved, free, lost) over a range, from the daemon's usage store (GET /usage), "
        "sorted by use, with each one's share of the whole.",
    )
    report.add_argument(
        "--since",
        metavar="DURATION|DATE|TIME",
        help="from this long ago (7d, 12h) or this ISO date or time on (default 7d)",
    )
    report.add_argument(
        "--until",
        metavar="DURATION|DATE|TIME",
        help="up to this long ago or this ISO date or time (default now)",
    )
    report.add_argument(
        "--by",
        default="user",
        metavar="user|account|job|slurm_account|namespace|pod|gpu|day|weekday|hour",
        help="what to sum by (default user), or two of them: day,user",
    )
    report.add_argument(
        "--tz",
        metavar="ZONE",
        help="days, weekdays and hours in this time "
        "zone: UTC (the default), +02:00 or Europe/Paris",
    )
    output = report.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the JSON answer")
    output.add_argument("--csv", action="store_true", help="one line per key, with a header")
    report.add_argument(
        "--no-color",
        "--no-colour",
        dest="colour",
        action="store_false",
        help="no colours even on a terminal (so does NO_COLOR)",
    )
    report.add_argument(
        "--hosts",
        metavar="HOST[:PORT],...",
        help="sum over many hosts, asked at once (default: $PATROLLER_HOSTS)",
    )
    report.add_argument("--hosts-file", metavar="FILE", help="the hosts, one a line")
    report.add_argument(
        "--host-timeout",
        type=seconds,
        default=REPORT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long a host may take to answer (default {REPORT_TIMEOUT:g})",
    )
    report.set_defaults(handler=report_command)
    return report


def path_of(options: argparse.Namespace) -> str:
    params = {
        name: getattr(options, name)
        for name in ("since", "until", "by", "tz")
        if getattr(options, name) is not None
    }
    return "/usage?" + urllib.parse.urlencode(params)


def range_error(refused: RequestRefused) -> str:
    """A 400's words, under the option its `field` names: '--since: since= is in the future'."""
    body = refused.body if isinstance(refused.body, dict) else {}
    said = printable(str(body.get("error", refused.body)))
    option = OPTIONS.get(str(body.get("field")))
    return f"{option}: {said}" if option else said


def report_command(options: argparse.Namespace) -> int:
    try:
        hosts = fleet.hosts_from(options.hosts, options.hosts_file)
    except OSError as exc:
        raise Failure(f"--hosts-file: {exc.strerror or exc}", EX_USAGE) from None
    if hosts:
        return many(options, hosts)
    try:
        answer = usageanswers.check(client.get_json(options.server, path_of(options)))
    except RequestRefused as refused:
        if refused.status == 400:
            raise Failure(range_error(refused), EX_USAGE) from None
        raise  # the command line's: 77 for a refusal (404: no store), 69 for a 5xx
    except BadAnswer as exc:
        raise Failure(
            f"{fleet.server_name(options.server)}: bad answer: {exc}", EX_UNAVAILABLE
        ) from None
    show(options, answer, answer)
    return EX_OK


def show(options: argparse.Namespace, answer: dict[str, Any], whole: dict[str, Any]) -> None:
    """Print the report: `whole` as JSON, else `answer` as CSV or a table."""
    if options.json:
        print(json_text(whole, indent=2))
    elif options.csv:
        print(usage.csv_text(answer, hosts="hosts" in whole), end="")
    else:
        print(usage.table(answer, options.colour, width_of(sys.stdout)), end="")


def ask(host: str, path: str, timeout: float) -> HostUsage:
    try:
        return HostUsage(
            host, usageanswers.check(client.get_json(host, path, timeout, REPORT_MAX_BYTES))
        )
    except BadAnswer as exc:
        return HostUsage(host, error=fleet.said(f"bad answer: {exc}"))
    except RequestRefused as refused:
        return HostUsage(host, error=fleet.said(str(refused)), refused=refused)
    except (PatrollerError, ValueError) as exc:  # ValueError: not a server's address
        return HostUsage(host, error=fleet.said(str(exc) or type(exc).__name__))


def many(options: argparse.Namespace, hosts: list[str]) -> int:
    """Ask every host at once, sum those that answered, say the others."""
    path, timeout = path_of(options), options.host_timeout
    found = fleet.at_once(
        hosts,
        lambda host: ask(host, path, timeout),
        timeout + 1,
        lambda host: HostUsage(host, error=f"no answer within {describe(timeout)}"),
    )
    answered = [(h.host, h.answer) for h in found if h.answer is not None]
    lines = [
        f"{printable(h.host)}  not answering: {printable(h.error or '?')}"
        for h in found
        if h.answer is None
    ]
    out = sys.stderr if options.json or options.csv or not answered else sys.stdout
    if not answered:
        refusals = [h.refused for h in found if h.refused is not None]
        ranges = [r for r in refusals if r.status == 400]
        if ranges:
            raise Failure(range_error(ranges[0]), EX_USAGE)
        print("".join(line + "\n" for line in lines), end="", file=out)
        every = len(refusals) == len(found) and all(r.status < 500 for r in refusals)
        raise Failure(
            f"no host answered ({len(found)} asked)", EX_NOPERM if every else EX_UNAVAILABLE
        )
    answer = usageanswers.summed(answered)
    whole = {**answer, "hosts": [{"host": h.host, "error": h.error} for h in found]}
    show(options, answer, whole)
    down = len(found) - len(answered)
    print(
        "".join(line + "\n" for line in lines)
        + f"{len(found)} host{'s' if len(found) != 1 else ''} asked"
        + (f", {down} not answering" if down else "")
        + "\n",
        end="",
        file=out,
    )
    return EX_OK
