"""The configuration file: TOML whose keys are the long flags' names (`port = 8080`,
`state-dir = "/var/lib/patroller"`, `notify = ["mailtos://..."]`, `hide-users = true`).

Each key's value is checked for its type here and handed on as the text a flag would have
been given (flags.py then checks the value with the flag's own parser), with the line it is on,
so that every refusal names the file, the line and the key. A value is never repeated back in
a message: some hold passwords (the notify URLs).
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from patroller.config.regular import read_regular
from patroller.config.settings import ConfigError
from patroller.core.text import printable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_PATH = "/etc/patroller/patroller.toml"  # read when it exists and no other is named
MAX_BYTES = 1024 * 1024  # a bigger file is not a configuration file
# What each kind of key takes, as the refusal says it.
SWITCH, REPEATED, LIST, VALUE = "switch", "repeated", "list", "value"
EXPECTED = {
    SWITCH: "true or false",
    REPEATED: "a string or a list of strings",
    LIST: "a string or a list of strings",
    VALUE: "a string or a number",
}
_AT = re.compile(r"at line (\d+)")  # where tomllib's message says the error is
_KEY = re.compile(r"""\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*[=.]""")
_TABLE = re.compile(r"""\s*\[\[?\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*[.\]]""")

# flags whose value is a comma-separated list: the file may give a list of strings instead
LISTS = (
    "--user-labels",
    "--user-info-labels",
    "--containerd-namespaces",
    "--notify-events",
    "--fleet",
)
NOT_IN_FILE = ("--config",)  # flags that are no key of the file
Given = str | bool | list[str]  # a flag's text, a switch's value, a repeated flag's texts


class Setting(NamedTuple):
    """One key of the file: its value as a flag's text, and where it is."""

    value: Given
    path: str
    line: int

    @property
    def where(self) -> str:
        """`file:line`, as a refusal and `patroller config` name it."""
        return f"{self.path}:{self.line}" if self.line else self.path


def kinds(
    flags: Sequence[str], switches: Sequence[str], repeated: Sequence[str]
) -> dict[str, str]:
    """The file's keys (the long flags' names but NOT_IN_FILE) and the kind of value each takes."""
    return {
        flag[2:]: (
            SWITCH
            if flag in switches
            else REPEATED
            if flag in repeated
            else LIST
            if flag in LISTS
            else VALUE
        )
        for flag in flags
        if flag not in NOT_IN_FILE
    }


def named(
    given: str | None, environ: Mapping[str, str], keys: Mapping[str, str]
) -> tuple[str | None, dict[str, Setting]]:
    """Blocking: the path of the file --config (`given`), PATROLLER_CONFIG or DEFAULT_PATH
    names (None: no file), and its settings by key."""
    found = chosen(given, environ, DEFAULT_PATH)
    if found is None:
        return None, {}
    return found[0], read(found[0], keys)


def read(path: str, keys: Mapping[str, str]) -> dict[str, Setting]:
    """Blocking: the settings of the file at `path`, by key. `keys` maps each known key (a long
    flag's name without its dashes) to SWITCH, REPEATED, LIST or VALUE. ConfigError names the
    file (and the line, and the key) when the file cannot be read, is not TOML, names a key
    that is no flag's, or gives a key a value of the wrong type."""
    text = _text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _AT.search(str(exc))
        where = f"{path}:{found.group(1)}" if found else path
        raise ConfigError(f"{where}: not TOML: {exc}") from None
    lines = key_lines(text)
    settings = {}
    for key, value in data.items():
        where = f"{path}:{lines[key]}" if key in lines else path
        if key not in keys:
            raise ConfigError(f"{where}: {unknown(key, keys)}")
        settings[key] = Setting(_given(where, key, value, keys[key]), path, lines.get(key, 0))
    return settings


def unknown(key: str, keys: Mapping[str, str]) -> str:
    """The refusal of a key that is no flag's, with the closest name when one is close."""
    close = difflib.get_close_matches(key.replace("_", "-").lower(), list(keys), n=1)
    hint = (
        f"did you mean {close[0]!r}?"
        if close
        else "the keys are the long flags' names (patroller --help)"
    )
    return f"unknown key '{printable(key)}'; {hint}"  # escaped once (repr would again)


def _text(path: str) -> str:
    """The file's text: a regular file only (a FIFO would block), MAX_BYTES of it at most."""
    try:
        raw = read_regular(path, MAX_BYTES, "the configuration file")
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not TOML: not UTF-8") from None


def _given(where: str, key: str, value: Any, kind: str) -> Given:
    """The value as the flag's text (a switch's: a bool; a repeated flag's: a list of texts);
    ConfigError when its type is not what the key takes."""
    if kind == SWITCH and isinstance(value, bool):
        return value
    if (
        kind in (REPEATED, LIST)
        and isinstance(value, list)
        and all(isinstance(v, str) for v in value)
    ):
        return list(value) if kind == REPEATED else ",".join(value)
    if kind != SWITCH and isinstance(value, str):
        return [value] if kind == REPEATED else value
    if kind == VALUE and isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    raise ConfigError(f"{where}: {key}: expected {EXPECTED[kind]}, not {type_name(value, kind)}")


def type_name(value: Any, kind: str = VALUE) -> str:
    """What a TOML value is, in words (a list, as the kind of key refuses it)."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list" if kind not in (REPEATED, LIST) else "a list of other than strings"
    if isinstance(value, (datetime.date, datetime.time)):
        return "a date or time"
    return "a number" if isinstance(value, (int, float)) else "a string"


def key_lines(text: str) -> dict[str, int]:
    """The line each top-level key is first given on: `key = ...`, `key.sub = ...` before any
    table, or a table's header `[key]`, `[key.sub]`, `[[key]]`. tomllib says no line; a line
    inside a multi-line string is skipped."""
    found: dict[str, int] = {}
    in_table = in_string = False
    for number, line in enumerate(text.splitlines(), 1):
        quotes = line.count('"""') + line.count("'''")
        if in_string:
            in_string = quotes % 2 == 0
            continue
        header = _TABLE.match(line)
        if header:
            in_table = True
            name = next(g for g in header.groups() if g is not None)
            found.setdefault(name, number)
        elif not in_table:
            match = _KEY.match(line)
            if match:
                found.setdefault(next(g for g in match.groups() if g is not None), number)
        in_string = quotes % 2 == 1
    return found


def chosen(given: str | None, environ: Mapping[str, str], default: str) -> tuple[str, str] | None:
    """Which file is read, and who named it: --config's, else PATROLLER_CONFIG's, else
    `default` when it exists; None for no file (`none` or empty, or none at the default
    path)."""
    text, named_by = (
        (given, "--config")
        if given is not None
        else (environ.get("PATROLLER_CONFIG"), "PATROLLER_CONFIG")
    )
    if text is None:
        return (default, "the default path") if os.path.exists(default) else None
    if text.strip().lower() in ("", "none"):
        return None
    return os.path.abspath(os.path.expanduser(text.strip())), named_by
