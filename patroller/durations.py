"""Durations as people write them: `90` (seconds), `90s`, `1.5m`, `2h`, `1d`.

One parser for every duration Patroller reads: the daemon's flags, the API's `timeout=` and
`hold=`, and the command line's `--wait`, `--timeout` and `--watch`; and `describe`, which says
a number of seconds back in those units (`13h`, not 46800 s), for the daemon's messages and the
command line's tables alike: the one place a duration is formatted in Python (the web pages
have theirs in patroller/http/web/common.js). Standard library
only: the client side uses it too. Its messages name no flag; the caller says which value it was.
"""

from __future__ import annotations

import math

UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
EXAMPLES = "90, 90s, 30m, 2h"


def parse(text: str, *, zero: bool = False) -> float:
    """The seconds `text` says: a number, with an optional unit s, m, h or d.

    Raises ValueError when it is not a duration, is negative or not finite, or is zero and
    `zero` is false.
    """
    given = text.strip().lower()
    unit = given[-1:] if given[-1:] in UNITS else ""
    number = given[: len(given) - len(unit)].strip()
    try:
        if not number.isascii() or "_" in number:
            raise ValueError
        seconds = float(number) * UNITS[unit]
    except ValueError:
        raise ValueError(f"is not a number of seconds or a duration such as {EXAMPLES}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError("must be zero or more seconds" if zero else "must be a positive duration")
    if seconds == 0 and not zero:
        raise ValueError("must be a positive duration")
    return seconds


def describe(seconds: float, most: int = 4) -> str:
    """`seconds` as people read it, largest unit first, in at most `most` units, each after the
    first in two digits, zero ones at the end left out: `13h`, `1h30m`, `2h05m`, `3d04h`, `7d`,
    `45s`, `0.5s` (under ten seconds to a tenth, else whole seconds). The one formatting of a
    duration in Python: the daemon's messages (every unit, so nothing is lost) and the command
    line's tables (two, `most=2`: `3m12s`, `2h05m`) both say it so."""
    if round(seconds, 1) < 10:
        return f"{round(max(seconds, 0.0), 1):g}s"
    left = int(round(seconds))
    parts: list[tuple[int, str]] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if parts or left >= size:
            parts.append((left // size, unit))
            left %= size
    parts = parts[:most]
    while len(parts) > 1 and parts[-1][0] == 0:
        parts.pop()
    return "".join(
        f"{n}{unit}" if i == 0 else f"{n:02d}{unit}" for i, (n, unit) in enumerate(parts)
    )
