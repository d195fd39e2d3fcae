"""The values of the daemon's flags: each parser takes the text given (a flag's or its
environment variable's) and returns the setting, or raises ValueError saying what is wrong
(flags.py names the flag or variable in front)."""

from __future__ import annotations

import math
import os
import re
import zoneinfo
from collections.abc import Sequence
from datetime import timedelta, timezone, tzinfo

from patroller import durations, hosts
from patroller.config.settings import NOTIFY_KINDS, Weekly

LOG_LEVELS = ("debug", "info", "warning", "error")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*", re.IGNORECASE)  # a URL's scheme (RFC 3986)
SIZE = re.compile(r"([0-9]+)\s*((?:[km](?:i?b)?|b)?)", re.IGNORECASE)
_OFFSET = re.compile(r"([+-])(\d{2}):?(\d{2})?\Z")  # +02:00, -0530, +09
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})\Z")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
SIZE_UNITS = {
    "": 1,
    "b": 1,
    **{unit: 1 << 10 for unit in ("k", "kb", "kib")},
    **{unit: 1 << 20 for unit in ("m", "mb", "mib")},
}


def port(text: str) -> int:
    if not text.strip().isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError("is not a port number (0-65535)")
    return int(text)


def silence(text: str) -> float:
    value = durations.parse(text)
    if value < 3:
        raise ValueError("must be at least 3 seconds: nvidia-smi prints once a second")
    return value


def nonnegative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be zero or more")
    return value


def percent(text: str) -> float:
    value = nonnegative(text)
    if value > 100:
        raise ValueError("must be a percentage from 0 to 100")
    return value


USAGE_STORES = ("sqlite", "none")


def usage(text: str) -> str:
    given = text.strip().lower()
    if given not in USAGE_STORES:
        raise ValueError(f"must be {' or '.join(USAGE_STORES)}")
    return given


def usage_interval(text: str) -> float:
    value = durations.parse(text)
    if value < 0.1:
        raise ValueError("must be at least 0.1 seconds")
    return value


def existing_file(text: str) -> str:
    path = os.path.abspath(os.path.expanduser(text.strip()))
    if not os.path.isfile(path):
        raise ValueError("is not a file")
    return path


def labels(text: str) -> tuple[str, ...]:
    found = tuple(part.strip() for part in text.split(",") if part.strip())
    if any(any(c.isspace() for c in label) for label in found):
        raise ValueError("holds a label with white space")
    return found


def count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError("is not a whole number of 1 or more")
    return int(text)


def user_labels(text: str) -> tuple[str, ...]:
    found = labels(text)
    if not found:
        raise ValueError("must name at least one label")
    return found


def log_level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise ValueError("must be one of " + ", ".join(LOG_LEVELS))
    return text.lower()


def nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


def socket_path(text: str) -> str:
    path = os.path.abspath(text.strip())
    if not text.strip():
        raise ValueError("must not be empty")
    if len(path.encode()) > 107:
        raise ValueError("is longer than a unix socket path may be (107 bytes)")
    if not os.path.isdir(os.path.dirname(path)):
        raise ValueError(f"is in a directory that does not exist ({os.path.dirname(path)})")
    return path


def optional_socket(text: str) -> str | None:
    """A unix socket another program serves, which need not be there (the kubelet's); `none`
    or empty: None."""
    if text.strip().lower() in ("", "none"):
        return None
    path = os.path.abspath(os.path.expanduser(text.strip()))
    if len(path.encode()) > 107:
        raise ValueError("is longer than a unix socket path may be (107 bytes)")
    return path


def optional_path(text: str) -> str | None:
    """A file another program writes, which need not be readable yet (the kernel log);
    `none` or empty: None."""
    if text.strip().lower() in ("", "none"):
        return None
    return os.path.abspath(os.path.expanduser(text.strip()))


def directory(text: str) -> str | None:
    """A directory, which need not be there yet (the lease book's is made at start; the Slurm
    job map's by the prolog at the first job); `none` or empty: None."""
    if text.strip().lower() in ("", "none"):
        return None
    path = os.path.abspath(os.path.expanduser(text.strip()))
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError("is not a directory")
    return path


def fleet(text: str) -> tuple[str, ...]:
    return fleet_hosts(hosts.split(text))


def fleet_file(text: str) -> tuple[str, ...]:
    path = os.path.abspath(os.path.expanduser(text.strip()))
    try:
        found = hosts.read(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    return fleet_hosts(found)


def fleet_hosts(found: list[str]) -> tuple[str, ...]:
    if not found:
        raise ValueError("names no host")
    for host in found:
        try:
            hosts.base_url(host)
        except ValueError as exc:
            raise ValueError(f"names {host!r}, which {exc}") from None
    return tuple(found)


def fleet_interval(text: str) -> float:
    value = durations.parse(text)
    if value < 0.5:
        raise ValueError("must be at least 0.5 seconds: every host is asked that often")
    return value


def size(text: str) -> int:
    """Bytes: a whole number, or one with the unit KiB or MiB (K, M: the same)."""
    found = SIZE.fullmatch(text.strip())
    if found is None:
        raise ValueError("is not a number of bytes (1048576, 512KiB, 4MiB)")
    value = int(found.group(1)) * SIZE_UNITS[found.group(2).lower()]
    if value < 1024:
        raise ValueError("must be at least 1 KiB: a host's answer of one GPU is about that")
    return value


def switch(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError("must be 1, true, yes or on; or 0, false, no, off or empty")


def docker_host(text: str) -> str:
    if not text.strip().startswith(("unix://", "tcp://", "ssh://", "http://", "https://")):
        raise ValueError("must be a unix://, tcp://, ssh:// or http(s):// address")
    return text.strip()


def unix_path_fits(address: str) -> str:
    if address.startswith("unix://") and len(address[len("unix://") :].encode()) > 107:
        raise ValueError("is longer than a unix socket path may be (107 bytes)")
    return address


def engine_address(text: str) -> str | None:
    """An engine's address; None for none (or nothing); a path is a unix socket's."""
    address = text.strip()
    if address.lower() in ("", "none"):
        return None
    return docker_host("unix://" + address if address.startswith("/") else address)


def engine_socket(text: str) -> str | None:
    address = engine_address(text)
    if address is None:
        return None
    if "{" in address or "}" in address:
        raise ValueError("holds braces: only the rootless sockets take {uid}")
    return unix_path_fits(address)


def engine_template(text: str) -> str | None:
    address = engine_address(text)
    if address is None:
        return None
    if "{uid}" not in address:
        raise ValueError("must hold {uid}, which stands for the uid of the engine's user")
    try:
        widest = address.format(uid=4294967294)  # the largest uid there can be
    except (KeyError, IndexError, ValueError):
        raise ValueError("may hold {uid} and nothing else in braces") from None
    unix_path_fits(widest)
    return address


def containerd_socket(text: str) -> str | None:
    """containerd's socket: a path or a unix:// address (it serves no other); none: not asked."""
    address = engine_address(text)
    if address is None:
        return None
    if not address.startswith("unix://") or not address[len("unix://") :].startswith("/"):
        raise ValueError("must be a unix socket: a path, or unix:///path")
    return unix_path_fits(address)


_NAMESPACE = re.compile(r"^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$")  # as containerd checks them


def namespaces(text: str) -> tuple[str, ...]:
    found = tuple(part.strip() for part in text.split(",") if part.strip())
    if not found:
        raise ValueError("must name at least one namespace")
    for name in found:
        if len(name) > 76 or not _NAMESPACE.match(name):
            raise ValueError(f"names {name!r}, which is not a containerd namespace")
    return found


def keys(given: Sequence[str]) -> tuple[str, ...]:
    """Label or annotation keys, from a flag given once or more (each comma-separated)."""
    found = tuple(key for text in given for key in labels(text))
    if not found:
        raise ValueError("must name at least one key")
    return found


def notify_urls(given: Sequence[str]) -> tuple[str, ...]:
    """Apprise URLs, from a flag given once or more (the variable: separated by spaces). Only
    their shape is checked here; Apprise says at start whether it knows each. A message never
    repeats one: they hold passwords and tokens."""
    found = tuple(url for text in given for url in text.split())
    if not found:
        raise ValueError("names no URL")
    for n, url in enumerate(found, 1):
        scheme, sep, rest = url.partition("://")
        if not sep or not scheme or not rest or not _SCHEME.fullmatch(scheme):
            raise ValueError(
                f"URL {n} is not a URL of the form scheme://... (mailtos://, "
                "json://, slack://, ntfy://, ...; Apprise's list of services)"
            )
    return found


def notify_kinds(text: str) -> tuple[str, ...]:
    """Kinds of notice, comma-separated: each one of NOTIFY_KINDS."""
    found = tuple(dict.fromkeys(kind.strip().lower() for kind in text.split(",") if kind.strip()))
    unknown = [kind for kind in found if kind not in NOTIFY_KINDS]
    if unknown or not found:
        raise ValueError(f"must name kinds among {', '.join(NOTIFY_KINDS)}")
    return found


def notify_template(text: str) -> str:
    """A user's destination by default: one Apprise URL with {user} or {email} in it, and no
    other {...}."""
    url = text.strip()
    notify_urls([url])
    fields = re.findall(r"\{([^{}]*)\}", url)
    if not fields or any(name not in ("user", "email") for name in fields):
        raise ValueError("must hold {user} or {email}, and no other {...}")
    return url


def zero_or_duration(text: str) -> float:
    """A duration, or 0."""
    return durations.parse(text, zero=True)


def time_zone(text: str) -> tzinfo:
    """A time zone as the usage reports take one (tz=): UTC, an offset from UTC (+02:00, -0530,
    +09) or the name of a zone the host knows (Europe/Paris)."""
    given = text.strip()
    if given in ("UTC", "Z"):
        return timezone.utc
    offset = _OFFSET.match(given)
    if offset is not None:
        sign, hours, minutes = offset.groups()
        moved = int(hours) * 60 + int(minutes or 0)
        if int(minutes or 0) >= 60 or moved > 14 * 60:
            raise ValueError("is an offset from UTC beyond 14:00")
        return timezone((-1 if sign == "-" else 1) * timedelta(minutes=moved))
    try:  # zoneinfo refuses a path (absolute, or with ..): only the zone database is read
        return zoneinfo.ZoneInfo(given)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        pass
    raise ValueError(
        "is neither UTC, an offset from UTC (+02:00) nor the name of a time zone "
        "this host knows (Europe/Paris)"
    )


def weekly(text: str) -> Weekly | None:
    """A time of the week: a weekday and a time of day, in UTC or in the zone that follows
    (`mon 09:00`, `friday 17:30 Europe/Paris`, `mon 9:00 +02:00`); `off`: never."""
    words = text.split()
    if len(words) == 1 and words[0].lower() in ("off", "none"):
        return None
    if len(words) not in (2, 3):
        raise ValueError(
            "is not a weekday and a time, and a zone if not UTC: 'mon 09:00', "
            "'fri 17:30 Europe/Paris' (or off)"
        )
    day = words[0].lower()
    days = [n for n, name in enumerate(WEEKDAYS) if len(day) >= 3 and name.startswith(day)]
    clock = _CLOCK.match(words[1])
    if len(days) != 1 or clock is None:
        raise ValueError("is not a weekday (mon, tue, ... or monday, ...) and a time (09:00)")
    hour, minute = int(clock.group(1)), int(clock.group(2))
    if hour > 23 or minute > 59:
        raise ValueError("has no such time of day: from 00:00 to 23:59")
    zone = words[2] if len(words) == 3 else "UTC"
    time_zone(zone)
    return days[0], hour, minute, zone
