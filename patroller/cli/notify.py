"""`patroller notify add URL | list | test | remove N | mute KIND | unmute KIND`: your own
notification destinations on the host's daemon (GET /notify, POST /notify/...). The daemon
knows who you are as it knows for /request, so these reach your destinations alone. A URL is
sent in the request's body and never printed back whole: `list` shows its secrets starred."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from patroller import client
from patroller.cli.exits import EX_OK
from patroller.cli.table import format_table
from patroller.safetext import printable

KINDS = (
    "trespass",
    "unreserved",
    "idle",
    "expiring",
    "granted",
    "lost",
    "unhealthy",
    "daemon",
    "digest",
    "test",
    "terminal",
)  # terminal: every notice written on your terminals


def add_parser(commands: Any, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `notify` command's words, on the command line's subparsers."""
    notify = commands.add_parser(
        "notify",
        parents=[common],
        help="your own notification destinations",
        description="Where the daemon tells you of what concerns you: a trespass on your GPU "
        "or by your process, your wait granted, your GPU lost. Each destination is an Apprise "
        "URL: mailtos://..., ntfys://host/topic, slack://..., json://host/path.",
    )
    actions = notify.add_subparsers(dest="action", metavar="{add,list,test,remove,mute,unmute}")
    actions.required = True
    add = actions.add_parser("add", parents=[common], help="add a destination (an Apprise URL)")
    add.add_argument("url", help="where to tell you: mailtos://..., ntfys://host/topic, ...")
    actions.add_parser("list", parents=[common], help="your destinations, secrets starred")
    actions.add_parser("test", parents=[common], help="send yourself a test notice")
    remove = actions.add_parser("remove", parents=[common], help="remove destination N")
    remove.add_argument("n", type=int, metavar="N", help="its number, as `list` shows it")
    for name, words in (("mute", "stop being told of"), ("unmute", "be told again of")):
        muted = actions.add_parser(name, parents=[common], help=f"{words} a kind of notice")
        muted.add_argument("kind", choices=KINDS, metavar="KIND", help=", ".join(KINDS))
    for parser in (notify, *actions.choices.values()):
        parser.add_argument("--json", action="store_true", help="print the server's JSON")
    notify.set_defaults(handler=notify_command)
    return notify


def notify_command(options: argparse.Namespace) -> int:
    action = options.action
    if action == "list":
        body = client.get_json(options.server, "/notify")
    else:
        form = {
            "add": lambda: {"url": options.url},
            "remove": lambda: {"n": options.n},
            "mute": lambda: {"kind": options.kind},
            "unmute": lambda: {"kind": options.kind},
            "test": lambda: {},
        }[action]()
        body = client.get_json(options.server, f"/notify/{action}", post=form)
    if options.json:
        print(json.dumps(body, indent=2))
        return EX_OK
    said = {
        "add": lambda: f"added as number {body.get('added')}",
        "remove": lambda: f"destination {options.n} removed",
        "mute": lambda: f"{options.kind} muted",
        "unmute": lambda: f"{options.kind} unmuted",
        "test": lambda: (
            f"a test notice is on its way to {body.get('sent_to')} "
            "destination(s); `patroller notify list` shows how it went"
        ),
        "list": lambda: "",
    }[action]()
    if said:
        print(said)
    sys.stdout.write(listing(body))
    return EX_OK


def listing(body: dict[str, Any]) -> str:
    """The caller's destinations as a table, then what is muted and the default."""
    rows = [
        [str(d.get("n")), printable(str(d.get("url"))), str(d.get("last") or "-")]
        for d in body.get("destinations") or []
    ]
    lines = [
        f"notifications for {printable(str(body.get('user')))}"
        + (
            ""
            if body.get("state") == "on"
            else " (off on this host: Apprise is not installed there)"
        )
    ]
    if rows:
        lines.append(format_table(["N", "DESTINATION", "LAST"], rows).rstrip("\n"))
    elif body.get("default"):
        lines.append("no destination of your own: the host's default reaches you")
    else:
        lines.append("no destination: patroller notify add URL")
    if body.get("muted"):
        lines.append("muted: " + ", ".join(printable(str(k)) for k in body["muted"]))
    terminal = body.get("terminal")
    if isinstance(terminal, dict):  # the host writes trespasses and ending holds on terminals
        last = f" (last: {printable(str(terminal['last']))})" if terminal.get("last") else ""
        lines.append(
            "terminal: on" + last
            if terminal.get("on")
            else "terminal: off (muted: patroller notify unmute terminal)"
        )
    return "\n".join(lines) + "\n"
