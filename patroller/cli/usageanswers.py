"""What GET /usage answered, for `patroller report`: checked, and summed over hosts.

Pure. A host may answer anything: `check` holds an answer to the fields the report reads, with
their types (openapi.json's /usage), before it is summed or drawn (usage.py). Sums over many
hosts order their rows as /usage does (patroller/core/usage.py `summarize`): by use, the
GPU-hours held or used (all but free and lost), the most first; by day, by day.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from patroller.answers import BadAnswer, fields, is_kind, kind, quoted

UNUSED = ("free", "lost")  # GPU-time nobody held: not "use" when rows are ordered
IN_TIME = ("day", "weekday", "hour")  # keys ordered in time's order, as /usage orders them
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
ANSWER = {
    "since": ("string",),
    "until": ("string",),
    "by": ("string",),
    "first": ("string", "null"),
    "categories": ("array",),
    "rows": ("array",),
    "total": ("object",),
}
ROW = {
    "key": ("string", "null", "array"),
    "hours": ("object",),
    "gpu_hours": ("number",),
    "share": ("number",),
    "number": ("integer", "null"),
}
TOTAL: dict[str, tuple[str, ...]] = {
    "hours": ("object",),
    "gpu_hours": ("number",),
    "shares": ("object",),
}


def check(answer: Any) -> dict[str, Any]:
    """`answer`, if it is a /usage answer in every field the report reads; else BadAnswer
    saying where and what is wrong."""
    fields(answer, ANSWER, "/usage")
    for name in ("rows", "categories", "total"):
        if name not in answer:
            raise BadAnswer(f"/usage has no {name}")
    if not all(is_kind(c, "string") for c in answer["categories"]):
        raise BadAnswer("/usage.categories holds other than strings")
    width = len(answer["by"].split(","))
    for n, row in enumerate(answer["rows"]):
        fields(row, ROW, f"/usage.rows[{n}]")
        key = row.get("key")
        if (
            isinstance(key, list) != (width > 1)
            or isinstance(key, list)
            and (len(key) != width or not all(is_kind(k, "string") or k is None for k in key))
        ):
            raise BadAnswer(
                f"/usage.rows[{n}].key is {kind(key)}, not a key for by={quoted(answer['by'])}"
            )
        hours(row.get("hours", {}), f"/usage.rows[{n}].hours")
    fields(answer["total"], TOTAL, "/usage.total")
    hours(answer["total"].get("hours", {}), "/usage.total.hours")
    hours(answer["total"].get("shares", {}), "/usage.total.shares")
    return answer


def hours(found: dict[str, Any], where: str) -> None:
    for category, value in found.items():
        if not is_kind(value, "number") or value < 0:
            raise BadAnswer(f"{where}.{quoted(category)} is {kind(value)}, not a number of hours")


def summed(answers: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One answer from the answers of many hosts, (host, checked answer) in the order asked:
    each key's hours added up (by gpu, each host's GPUs apart: a row has its `host`), the
    shares of the sum, ordered as /usage orders."""
    by = answers[0][1]["by"]
    categories: list[str] = []
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for host, answer in answers:
        categories += [c for c in answer["categories"] if c not in categories]
        for row in answer["rows"]:
            key = row.get("key")
            ident = (host, key) if by == "gpu" else tuple(key) if isinstance(key, list) else (key,)
            if by != "gpu" and "gpu" in by.split(","):
                ident = (host, *ident)  # a GPU is a host's: by its number, after the host
            entry = rows.setdefault(ident, {"key": row.get("key"), "hours": {}})
            if "gpu" in by.split(","):
                entry.update(host=host, number=row.get("number"))
            for category, value in row.get("hours", {}).items():
                entry["hours"][category] = entry["hours"].get(category, 0.0) + value
    whole = {c: sum(r["hours"].get(c, 0.0) for r in rows.values()) for c in categories}
    everything = sum(whole.values())
    for entry in rows.values():
        entry["hours"] = {c: round(entry["hours"].get(c, 0.0), 6) for c in categories}
        entry["gpu_hours"] = round(sum(entry["hours"].values()), 6)
        entry["share"] = share(entry["gpu_hours"], everything)
    return {
        "since": answers[0][1]["since"],
        "until": answers[0][1]["until"],
        "by": by,
        "first": earliest(answer.get("first") for _, answer in answers),
        "categories": categories,
        "rows": (
            ordered(list(rows.values()), by == "day")
            if "," not in by
            else in_pairs(list(rows.values()), by.split(","))
        ),
        "total": {
            "hours": {c: round(h, 6) for c, h in whole.items()},
            "gpu_hours": round(everything, 6),
            "shares": {c: share(h, everything) for c, h in whole.items()},
        },
    }


def earliest(times: Iterable[Any]) -> str | None:
    """The earliest of the hosts' first figures (ISO times; null for a host with none)."""
    found = []
    for text in times:
        try:
            found.append((datetime.fromisoformat(text), text))
        except (TypeError, ValueError):
            continue
    return min(found)[1] if found else None


def share(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole > 0 else 0.0


def ordered(rows: list[dict[str, Any]], chronological: bool) -> list[dict[str, Any]]:
    """By use, the most first (then by GPU-hours in all, the null key last, by key); by key
    for days."""

    def order(row: dict[str, Any]) -> tuple[Any, ...]:
        key = row["key"]
        if chronological:
            return (key is None, key or "")
        used = sum(h for c, h in row["hours"].items() if c not in UNUSED)
        return (
            -round(used, 6),
            -round(row["gpu_hours"], 6),
            key is None,
            key or "",
            row.get("host") or "",
        )

    return sorted(rows, key=order)


def in_pairs(rows: list[dict[str, Any]], by: list[str]) -> list[dict[str, Any]]:
    """Rows keyed by two keys, as /usage orders them: by the first key, then by the second
    within it; a key of IN_TIME in time's order, any other by use (the most first); null keys
    last."""
    sums: dict[tuple[Any, ...], tuple[float, float]] = {}
    for row in rows:
        used = sum(h for c, h in row["hours"].items() if c not in UNUSED)
        for n in range(1, len(by) + 1):
            was = sums.get(tuple(row["key"][:n]), (0.0, 0.0))
            sums[tuple(row["key"][:n])] = (was[0] + used, was[1] + row["gpu_hours"])

    def order(row: dict[str, Any]) -> tuple[Any, ...]:
        parts: list[tuple[Any, ...]] = []
        for n, (name, value) in enumerate(zip(by, row["key"], strict=True)):
            if value is None:
                parts.append((1, 0.0, 0.0, ""))
            elif name in IN_TIME:
                place = WEEKDAYS.index(value) if value in WEEKDAYS else 0
                parts.append((0, 0.0, float(place), value))
            else:
                used, every = sums[tuple(row["key"][: n + 1])]
                parts.append((0, -round(used, 6), -round(every, 6), value))
        return tuple(parts)

    return sorted(rows, key=order)
