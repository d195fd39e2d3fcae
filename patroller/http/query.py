"""Parsing of the API's query strings into typed requests. Pure: every mistake is a BadRequest."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo

from patroller import durations
from patroller.config.values import time_zone
from patroller.core.errors import BadRequest
from patroller.core.topology import LINKS
from patroller.core.usage import BY as USAGE_BY
from patroller.core.usage import CYCLES

MAX_QUERY = 2048  # bytes of query string
MAX_GROUPS = 16
MAX_COUNT = 9999
MAX_TIMEOUT = 7 * 24 * 3600.0
HOLDS = ("lease", "process")  # how a grant is held: the short lease, or the caller's process
_GROUP = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}\Z")
_USER = re.compile(r"[^\s\x00-\x1f\x7f]{1,128}\Z")
_UUID = re.compile(r"[A-Za-z0-9-]{1,128}\Z")

Args = Mapping[str, Sequence[bytes]]


@dataclass(frozen=True)
class Ask:
    """A /request or /wait: how many devices of each group, and for whom."""

    wants: dict[str, int]
    user: str | None = None  # test mode only
    timeout: float | None = None  # /wait only; None waits for ever
    hold: str = "lease"  # or "process": held while the calling process lives; or "duration"
    duration: float | None = None  # seconds, for hold=<duration> (hold=2h)
    link: str | None = None  # "nvlink" or "numa": how the devices must be linked


@dataclass(frozen=True)
class Release:
    """A /release or /renew: one device or all of them."""

    uuid: str | None = None
    user: str | None = None
    reason: str | None = None  # /release: recorded in the audit record
    healthy: bool = False  # /release?healthy=1: the host's root says the GPU is healthy


def check_length(query: str) -> None:
    """Refuse an absurdly long query before looking at it."""
    if len(query) > MAX_QUERY:
        raise BadRequest(f"the query is too long ({len(query)} bytes, at most {MAX_QUERY})")


def parse_ask(args: Args, *, wait: bool) -> Ask:
    """The groups and counts of a /request (wait=False) or /wait (wait=True)."""
    user = _single(args, "user")
    timeout_text = _single(args, "timeout")
    if timeout_text is not None and not wait:
        raise BadRequest("timeout= belongs to /wait; /request answers at once")
    hold = _single(args, "hold")
    link = _single(args, "link")
    if link is not None and link not in LINKS:
        raise BadRequest(
            f"link={link[:16]!r}: must be nvlink (every two of the devices linked "
            "by NVLink) or numa (all in one NUMA node)",
            links=list(LINKS),
        )
    duration = None
    if hold is not None and hold not in HOLDS:
        try:
            duration = durations.parse(hold)
        except ValueError:
            raise BadRequest(
                f"hold={hold[:16]!r}: must be lease (the short lease, the default), "
                "process (held while the calling process lives) or a duration "
                "(90m, 2h)",
                holds=[*HOLDS, "<duration>"],
            ) from None
        hold = "duration"
    wants: dict[str, int] = {}
    for name, values in args.items():
        if name in ("user", "timeout", "hold", "link"):
            continue
        if not _GROUP.match(name):
            raise BadRequest(f"{name[:64]!r} is not a device group name")
        if len(values) > 1:
            raise BadRequest(
                f"{name} is given {len(values)} times; give each group once", group=name
            )
        wants[name] = _count(name, _text(name, values[0]))
        if len(wants) > MAX_GROUPS:
            raise BadRequest(f"too many groups (at most {MAX_GROUPS})")
    if not wants:
        raise BadRequest("nothing requested: ask for devices as ?gpu=<count>")
    if sum(wants.values()) == 0:
        raise BadRequest("nothing requested: every count is zero", requested=wants)
    return Ask(
        wants=wants,
        user=_user(user),
        timeout=_timeout(timeout_text),
        hold=hold or "lease",
        duration=duration,
        link=link,
    )


def parse_release(args: Args, endpoint: str = "/release") -> Release:
    """The optional uuid (and, for /release, reason) of a /release or a /renew."""
    names = ("uuid", "user", "reason", "healthy") if endpoint == "/release" else ("uuid", "user")
    for name in args:
        if name not in names:
            takes = "uuid=, reason= and healthy=" if endpoint == "/release" else "uuid="
            raise BadRequest(
                f"{endpoint} takes {takes} (and user= in test mode), not {name[:64]}="
            )
    uuid = _single(args, "uuid")
    if uuid is not None and not _UUID.match(uuid):
        raise BadRequest(f"{uuid[:64]!r} is not a device uuid")
    reason = _single(args, "reason")
    if reason is not None and (len(reason) > 500 or not reason.isprintable()):
        raise BadRequest("reason= must be at most 500 printable characters")
    healthy = _single(args, "healthy")
    if healthy not in (None, "0", "1", "true", "false"):
        raise BadRequest("healthy= is 1 (or true) or 0 (or false)")
    if healthy in ("1", "true") and uuid is None:
        raise BadRequest("healthy= names one device: uuid=")
    return Release(
        uuid=uuid,
        user=_user(_single(args, "user")),
        reason=reason,
        healthy=healthy in ("1", "true"),
    )


def parse_user(args: Args) -> str | None:
    """The user= of a read-only endpoint: in test mode, who asks (whose names --hide-users
    shows them); its other arguments are its own."""
    return _user(_single(args, "user"))


def _text(name: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{name}= is not valid UTF-8") from None


def _single(args: Args, name: str) -> str | None:
    values = args.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"{name}= is given {len(values)} times; give it once")
    return _text(name, values[0])


def _count(group: str, text: str) -> int:
    shown = text[:16]
    if text.startswith("-") and text[1:].isdigit():
        raise BadRequest(f"{group}={shown}: a count cannot be negative", group=group)
    if not (text.isascii() and text.isdigit()):
        raise BadRequest(f"{group}={shown!r}: the count must be a whole number", group=group)
    if len(text) > len(str(MAX_COUNT)) or int(text) > MAX_COUNT:
        raise BadRequest(
            f"{group}={shown}: the count is absurdly large (at most {MAX_COUNT})", group=group
        )
    return int(text)


def _user(text: str | None) -> str | None:
    if text is not None and not _USER.match(text):
        raise BadRequest("user= must be 1 to 128 printable characters without spaces")
    return text


def _timeout(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = durations.parse(text, zero=True)
    except ValueError as exc:
        raise BadRequest(f"timeout={text[:16]!r} {exc}") from None
    if value > MAX_TIMEOUT:
        raise BadRequest(
            f"timeout={text[:16]}: at most {durations.describe(MAX_TIMEOUT)}; "
            "leave it out to wait for ever"
        )
    return value


MAX_HISTORY = 1000


@dataclass(frozen=True)
class History:
    """A /history: events since a time (epoch seconds), at most `limit`."""

    since: float = 0.0
    limit: int = MAX_HISTORY


def parse_history(args: Args) -> History:
    """since= (epoch seconds, or an ISO 8601 time with its offset) and limit= (user= is
    `parse_user`'s)."""
    for name in args:
        if name not in ("since", "limit", "user"):
            raise BadRequest(
                f"/history takes since= and limit= (and user= in test mode), not {name[:64]}="
            )
    since_text, limit_text = _single(args, "since"), _single(args, "limit")
    since = 0.0
    if since_text is not None:
        try:
            since = float(since_text)
        except ValueError:
            try:
                # a "+" typed into a URL arrives as a space
                moment = datetime.fromisoformat(
                    since_text.replace("Z", "+00:00").replace(" ", "+")
                )
            except ValueError:
                raise BadRequest(
                    f"since={since_text[:40]!r} is neither epoch seconds nor an ISO 8601 time"
                ) from None
            if moment.tzinfo is None:
                raise BadRequest("since= needs a time zone (2026-12-03T08:00:00Z)") from None
            since = moment.timestamp()
        if not math.isfinite(since):
            raise BadRequest("since= must be a finite time")
    limit = MAX_HISTORY
    if limit_text is not None:
        if (
            not (limit_text.isascii() and limit_text.isdigit())
            or len(limit_text) > 6
            or not 1 <= int(limit_text) <= MAX_HISTORY
        ):
            raise BadRequest(f"limit= must be a whole number from 1 to {MAX_HISTORY}")
        limit = int(limit_text)
    return History(since=since, limit=limit)


USAGE_SINCE = 7 * 86400.0  # the default range: the last week
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")
USAGE_KEYS = (*USAGE_BY, *CYCLES)  # what by= may name, alone or two of them


@dataclass(frozen=True)
class UsageRange:
    """A /usage: GPU-time over [since, until) (epoch seconds), grouped by `by` (one key, or two
    joined by a comma), the time of day and the days read in `tz`."""

    since: float
    until: float
    by: str = "user"
    tz: str = "UTC"  # as given: UTC, an offset (+02:00) or a zone's name (Europe/Paris)
    zone: tzinfo = timezone.utc

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.by.split(","))


def parse_usage(args: Args, now: float) -> UsageRange:
    """since= and until= (a duration before `now`, 7d, or an ISO date or time; default the last
    7 days up to now), by= (a key, or two: day,user) and tz= (user= is `parse_user`'s). A range
    that is malformed, in the future or reversed is a BadRequest naming its `field`, as is a
    by= or tz= that is not one."""
    for name in args:
        if name not in ("since", "until", "by", "tz", "user"):
            raise BadRequest(
                f"/usage takes since=, until=, by= and tz= (and user= in test "
                f"mode), not {name[:64]}=",
                field=name[:64],
            )
        if len(args[name]) > 1:
            raise BadRequest(f"{name}= is given {len(args[name])} times; give it once", field=name)
    by = _single(args, "by") or "user"
    keys = by.split(",")
    if by not in USAGE_BY and (
        len(keys) > 2 or len(set(keys)) < len(keys) or not set(keys) <= set(USAGE_KEYS)
    ):
        raise BadRequest(
            f"by={by[:32]!r}: must be one of {', '.join(USAGE_KEYS)}, or two of "
            "them joined by a comma (day,user)",
            field="by",
            by=list(USAGE_KEYS),
        )
    tz, zone = _zone(_single(args, "tz"))
    since = _moment(args, "since", now, now - USAGE_SINCE, zone)
    until = _moment(args, "until", now, now, zone)
    for name, moment in (("since", since), ("until", until)):
        if moment > now:
            raise BadRequest(
                f"{name}= is in the future: a report covers what has happened", field=name
            )
    if since >= until:
        raise BadRequest(
            "since= is not before until=: the range is reversed or empty", field="since"
        )
    return UsageRange(since=since, until=until, by=by, tz=tz, zone=zone)


def _zone(text: str | None) -> tuple[str, tzinfo]:
    """tz=: UTC (the default), an offset from UTC (+02:00, -0530, +09) or the name of a zone
    the host knows (Europe/Paris; config/values.py's `time_zone`, the one rule); as given, and
    as a tzinfo."""
    if text is None or text in ("UTC", "Z"):
        return "UTC", timezone.utc
    given = text.strip().replace(" ", "+", 1) if text.startswith(" ") else text.strip()
    try:
        return given, time_zone(given)
    except ValueError as exc:
        raise BadRequest(f"tz={given[:40]!r} {exc}", field="tz") from None


def _moment(
    args: Args, name: str, now: float, default: float, zone: tzinfo = timezone.utc
) -> float:
    """A time given as a duration before `now` or as an ISO date (midnight in `zone`) or time."""
    text = _single(args, name)
    if text is None:
        return default
    try:
        before = durations.parse(text, zero=True)
    except ValueError:
        pass
    else:
        return _in_calendar(name, text, now - before, zone)
    try:
        # a "+" typed into a URL arrives as a space
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace(" ", "+"))
    except ValueError:
        raise BadRequest(
            f"{name}={text[:40]!r} is neither a duration before now (7d, 12h, 90m) "
            "nor an ISO date or time (2026-11-01, 2026-11-01T08:00:00Z)",
            field=name,
        ) from None
    if moment.tzinfo is None:
        if not _DATE.match(text.strip()):
            raise BadRequest(
                f"{name}= needs a time zone (2026-11-01T08:00:00Z), or give a "
                "date alone (midnight UTC, or in tz=)",
                field=name,
            )
        moment = moment.replace(tzinfo=zone)
    return _in_calendar(name, text, moment.timestamp(), zone)


def _in_calendar(name: str, text: str, moment: float, zone: tzinfo) -> float:
    """`moment`, if it has a date in UTC and in `zone` (the answer and the grouping write it
    so): 1000000d before now, or the first hours of the year 1 west of UTC, have none."""
    try:
        datetime.fromtimestamp(moment, timezone.utc)
        datetime.fromtimestamp(moment, zone)
    except (ValueError, OverflowError, OSError):
        raise BadRequest(
            f"{name}={text[:40]!r} is past the calendar (before the year 1 or "
            "after 9999): give a range within it",
            field=name,
        ) from None
    return moment
