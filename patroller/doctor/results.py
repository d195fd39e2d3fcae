"""What the doctor says: one result a check, each `ok`, `degraded` or `failed`, with what was
found and how to make it right; and the results as lines for people or as JSON for programs.
Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from patroller.safetext import printable

OK, DEGRADED, FAILED = "ok", "degraded", "failed"
STATUSES = (OK, DEGRADED, FAILED)  # in order of gravity


@dataclass(frozen=True)
class Result:
    """One check's outcome: `detail` says what was found, `fix` what to do (empty when ok)."""

    check: str  # what was checked, a few words: "nvidia-smi pmon", "state directory"
    status: str  # ok, degraded (works, with less), failed (the daemon would not work)
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is none of {STATUSES}")

    def json(self) -> dict[str, str]:
        return {"check": self.check, "status": self.status, "detail": self.detail, "fix": self.fix}


def ok(check: str, detail: str) -> Result:
    return Result(check, OK, detail)


def degraded(check: str, detail: str, fix: str) -> Result:
    return Result(check, DEGRADED, detail, fix)


def failed(check: str, detail: str, fix: str) -> Result:
    return Result(check, FAILED, detail, fix)


def any_failed(results: Iterable[Result]) -> bool:
    return any(r.status == FAILED for r in results)


def lines(results: Sequence[Result]) -> list[str]:
    """One line a result (`degraded  Docker Engine: ...; fix: ...`), then a count of each. Each
    printable: a detail may quote what a user's engine socket, the job map or a file said."""
    shown = [
        printable(f"{r.status:<8}  {r.check}: {r.detail}" + (f"; fix: {r.fix}" if r.fix else ""))
        for r in results
    ]
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    return shown + [", ".join(f"{counts[s]} {s}" for s in STATUSES)]
