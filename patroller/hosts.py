"""Lists of Patroller hosts as people write them: `gpu1:8080,gpu2:8080` (commas or white
space), or a file with one or more a line and `#` comments.

One reader for every such list: the command line's `--hosts` and `--hosts-file`, and the
daemon's `--fleet` and `--fleet-file`. Standard library only: the client side uses it too.
"""

from __future__ import annotations

import urllib.parse

DEFAULT_PORT = 8080  # the daemon's (patroller/config/settings.py), and the client's


def split(text: str) -> list[str]:
    """The hosts `text` names, separated by commas or white space: each once, in the order
    given."""
    words = [w.strip() for part in text.split(",") for w in part.split()]
    return list(dict.fromkeys(w for w in words if w))


def read(path: str) -> list[str]:
    """The hosts a file names (what follows a `#` on a line is a comment). OSError if it cannot
    be read."""
    with open(path, encoding="utf-8") as f:
        return split(",".join(line.split("#", 1)[0] for line in f))


def base_url(host: str) -> str:
    """The URL a host's API is under: `http://gpu1:8080` for `gpu1:8080` or `gpu1` (the
    daemon's default port, DEFAULT_PORT); `http://` and `https://` addresses as given, port 80
    (443) when none is given. ValueError when `host` is not the address of a host: its message
    says why, without naming it (the caller does)."""
    text = host if "://" in host else "http://" + host
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError("is not host:port, nor an http:// or https:// address")
    if (
        not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise ValueError("is not host:port")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or (port is None and parts.netloc.endswith(":")):
        raise ValueError("has a port that is not a number from 1 to 65535")
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = DEFAULT_PORT if "://" not in host else 443 if parts.scheme == "https" else 80
    return f"{parts.scheme}://{name}:{port or default}"
