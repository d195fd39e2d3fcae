"""`patroller reserve`, `patroller wait` and `patroller release`: GPUs taken for a duration or
the lease, the numbers printed for a script to use, and given back (all, or by number or uuid;
--healthy: the host's root says a GPU is well again)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from patroller import client
from patroller.cli.exits import EX_NOPERM, EX_OK, EX_TEMPFAIL, EX_USAGE, Failure, error_text
from patroller.cli.render import (
    amount,
    describe,
    duration,
    healthy_message,
    numbers_of,
    release_message,
)
from patroller.client import RequestRefused
from patroller.safetext import printable


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
