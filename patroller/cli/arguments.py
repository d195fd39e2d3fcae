"""The command line's words read as values: a count, a duration, a redraw interval, a wait, a
hold, and a time zone's offset written after its option (argparse would take `-10:00` for one).
Standard library only (and durations.py), as the whole command line."""

from __future__ import annotations

import argparse
import re

from patroller import durations


def count_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {value}")
    return value


def seconds_arg(text: str) -> float:
    """A duration (90, 90s, 2m, 1h); zero is allowed."""
    try:
        return durations.parse(text, zero=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} {exc}") from None


WATCH_SOONEST = 0.5  # seconds between redraws at the least: /status changes at most every 0.1 s


def watch_arg(text: str) -> float:
    """A redraw interval: a duration of at least WATCH_SOONEST."""
    value = seconds_arg(text)
    if value < WATCH_SOONEST:
        raise argparse.ArgumentTypeError(
            f"{text!r} is too often: at least {durations.describe(WATCH_SOONEST)}"
        )
    return value


def wait_arg(text: str) -> float | None:
    """A duration, or None for 'forever'."""
    if text.strip().lower() in ("forever", "inf", "infinity"):
        return None
    return seconds_arg(text)


def hold_arg(text: str) -> str:
    """lease, or a duration; a command line has no process to hold devices for."""
    if text.strip().lower() == "lease":
        return "lease"
    if text.strip().lower() == "process":
        raise argparse.ArgumentTypeError(
            "a reservation made here has no process to last for: "
            "use patroller run, which holds them while it runs"
        )
    seconds_arg(text)
    if durations.parse(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive duration")
    return text.strip()


# A time zone's offset, such as -10:00 or +0530: argparse takes one that begins with "-" for an
# option ("expected one argument"), so `--tz -10:00` is handed to it as `--tz=-10:00`.
OFFSET = re.compile(r"[+-]\d{1,2}(:?\d{2})?")
TAKES_OFFSET = ("--tz",)


def offsets_joined(args: list[str]) -> list[str]:
    """`args` with each option of TAKES_OFFSET followed by an offset (`--tz -10:00`) written
    as one word (`--tz=-10:00`); what follows `--` is left as it is (a command of `run`)."""
    out: list[str] = []
    n = 0
    while n < len(args):
        word = args[n]
        if word == "--":
            return out + args[n:]
        if word in TAKES_OFFSET and n + 1 < len(args) and OFFSET.fullmatch(args[n + 1]):
            out.append(f"{word}={args[n + 1]}")
            n += 2
            continue
        out.append(word)
        n += 1
    return out
