"""`patroller config [--json] [daemon flags]`: every setting the daemon these flags (with the
PATROLLER_* variables and the configuration file) describe would run with, and where each
came from: its default, the file and line, a variable, or a flag. The values of the secret
flags (the notify URLs hold passwords) are shown starred."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, TextIO

from patroller.config.flags import file_keys, load, settings_table
from patroller.config.options import SECRET
from patroller.config.settings import Config, ConfigError
from patroller.core.text import printable

# Keys whose Config attribute is not named after them.
ATTRIBUTES = {"pod-user-key": "pod_user_keys", "fleet-file": "fleet"}
STARS = "********"
# The origins' kinds, as --json names them.
DEFAULT, FILE, VARIABLE, FLAG = "default", "file", "environment", "flag"


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="patroller config",
        description="Show every setting the daemon would run with, and where each came from: "
        "its default, the configuration file and line, an environment variable, or a flag "
        "(in that order of precedence, each over the one before). Secrets are starred.",
        epilog="Give it the daemon's own flags (--config PATH, --port, ...; see `patroller "
        "--help`) to see what that daemon would run with. Exit status: 0, or 2 when a setting "
        "could not be used (the file, line and key named).",
    )
    made.add_argument(
        "--json",
        action="store_true",
        help='print {"file", "settings": [{"key", "value", "origin", "where"}]}',
    )
    made.add_argument(
        "--example",
        action="store_true",
        help="print a configuration file with every key, each commented out at "
        "its default, and what it means: patroller config --example > "
        "/etc/patroller/patroller.toml",
    )
    return made


def main(argv: Sequence[str], out: TextIO = sys.stdout) -> int:
    """Print the settings and their origins; 0, or 2 for a setting that cannot be used."""
    options, rest = parser().parse_known_args(list(argv))
    if options.example:
        out.write(example())
        return 0
    origins: dict[str, str] = {}
    try:
        config = load(rest, origins=origins)
    except ConfigError as exc:
        print(f"patroller config: error: {printable(str(exc), 1000)}", file=sys.stderr)
        return 2
    rows = settings(config, origins)
    path = origins.get("--config")
    if options.json:
        out.write(json.dumps({"file": path, "settings": rows}, indent=1) + "\n")
        return 0
    out.write(printable(f"# configuration file: {path or 'none'}", 1000) + "\n")
    shown = [(origin_text(row), f"{row['key']} = {literal(row['value'])}") for row in rows]
    width = max(len(origin) for origin, _ in shown)
    out.write(
        "".join(
            printable(f"{origin:<{width}}  {setting}", 1000) + "\n" for origin, setting in shown
        )
    )
    return 0


def settings(config: Config, origins: dict[str, str]) -> list[dict[str, Any]]:
    """One row a key of the file: its key, value (secrets starred), origin and where."""
    env_of = {flag: env for flag, env, _ in settings_table()}
    rows = []
    for key in file_keys():
        flag = "--" + key
        where: str | None = origins.get(flag)
        origin = (
            DEFAULT
            if where is None
            else FLAG
            if where == flag
            else VARIABLE
            if where == env_of[flag]
            else FILE
        )
        value = value_of(config, key, origins)
        if flag in SECRET and value is not None:
            value = [starred(v) for v in value] if isinstance(value, list) else starred(value)
        rows.append({"key": key, "value": value, "origin": origin, "where": where})
    return rows


def value_of(config: Config, key: str, origins: dict[str, str]) -> Any:
    """The setting's value in the Config, as JSON has it (a tuple as a list)."""
    if (
        key == "fleet-file"
        and "--fleet-file" not in origins
        or key == "fleet"
        and ("--fleet-file" in origins)
    ):
        return None  # the hosts were named the other way, or not at all
    value = getattr(config, ATTRIBUTES.get(key, key.replace("-", "_")))
    return list(value) if isinstance(value, tuple) else value


def starred(secret: str) -> str:
    """A secret URL with all but its scheme starred."""
    scheme, sep, _ = secret.partition("://")
    return f"{scheme}://{STARS}" if sep else STARS


def origin_text(row: dict[str, Any]) -> str:
    """Where a setting came from, in words: `default`, `file PATH:LINE`, `variable NAME` or
    `flag --NAME`."""
    words = {FILE: "file", VARIABLE: "variable", FLAG: "flag"}
    return DEFAULT if row["origin"] == DEFAULT else f"{words[row['origin']]} {row['where']}"


def literal(value: Any) -> str:
    """A value as TOML writes it (strings quoted, lists in brackets); `(none)` for no value."""
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def example() -> str:
    """A configuration file with every key commented out at its default (none where the default
    depends on the mode or the user: the help says it), under what it means."""
    defaults = Config()
    parts = [
        "# Patroller's configuration (patroller --config; read from "
        "/etc/patroller/patroller.toml\n# when that exists). Each key is a long flag's "
        "name; a flag or its PATROLLER_* variable\n# wins over the file. `patroller config` "
        "shows each setting and where it came from.\n"
    ]
    for flag, env, text in settings_table():
        key = flag[2:]
        if key not in file_keys():
            continue
        value = value_of(defaults, key, {})
        shown = "" if value in (None, []) or key == "fleet-file" else " " + literal(value)
        parts.append(
            "\n"
            + "\n".join(
                textwrap.wrap(f"{text} [{env}]", 96, initial_indent="# ", subsequent_indent="# ")
            )
            + f"\n# {key} ={shown}\n"
        )
    return "".join(parts)
