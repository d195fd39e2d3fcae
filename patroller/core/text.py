"""Text that others chose (a kubelet's device ids and pod names, a container's labels, a gRPC
server's error details), made safe for one log line: a newline in it must not start a line of
its own, nor an escape sequence drive a terminal."""

from __future__ import annotations

SHOWN = 200  # characters of such a text in a log line at most


def printable(text: str, limit: int = SHOWN) -> str:
    """`text` with each character that is not printable escaped as Python escapes it (a
    newline as `\\n`), cut to `limit` characters (then `...`). Printable text is left as it is."""
    cut = text[:limit]
    if not cut.isprintable():
        cut = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return cut + "..." if len(text) > limit else cut
