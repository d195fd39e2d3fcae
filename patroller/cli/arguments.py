"""The types of the command line's options: whole counts, durations, the redraw interval,
`--wait` (a duration or forever) and `--hold` (lease or a duration), each refusing bad text
with argparse's own error (status 2), naming what was wrong."""
from __future__ import annotations

import argparse
from typing import Optional

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
        raise argparse.ArgumentTypeError(f"{text!r} is too often: at least {WATCH_SOONEST} s")
    return value


def wait_arg(text: str) -> Optional[float]:
    """A duration, or None for 'forever'."""
    if text.strip().lower() in ("forever", "inf", "infinity"):
        return None
    return seconds_arg(text)


def hold_arg(text: str) -> str:
    """lease, or a duration; a command line has no process to hold devices for."""
    if text.strip().lower() == "lease":
        return "lease"
    if text.strip().lower() == "process":
        raise argparse.ArgumentTypeError("a reservation made here has no process to last for: "
                                         "use patroller run, which holds them while it runs")
    seconds_arg(text)
    if durations.parse(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive duration")
    return text.strip()
