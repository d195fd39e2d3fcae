"""A GPU's health: what `nvidia-smi -q -x` and the kernel's Xid lines say is wrong with it, in
words an admin acts on. Pure: the readings and the Xids are given, nothing is read here.

A GPU is healthy, degraded or unhealthy. Unhealthy: a fault that wants a reset or a repair (a
row remap or a page retirement pending, a remap that failed, uncorrectable ECC errors rising
between two readings, the driver asking for a reset or a recovery action, a field that reads
"GPU is lost", an Xid of a hardware or driver fault): the lease rules grant it to nobody, its
holder keeps it. Degraded: its clocks are slowed (thermal, power brake): shown, still granted.

What ends an unhealthy episode (docs/gpu-host.md): a condition of `-q -x` ends when a reading
no longer shows it (after the reset: the remap applied, the volatile ECC count back at zero);
an Xid ends when the GPU is seen reset (it left the inventory and came back), or when the
host's root says so (`patroller release --healthy GPU`), which also excuses the conditions that
a reading shows now until a reading no longer shows them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HEALTHY, DEGRADED, UNHEALTHY = "healthy", "degraded", "unhealthy"
RESET, APPLICATION = "reset", "application"

# NVIDIA's public Xid catalogue, in Patroller's words: the faults of the GPU or the driver that
# want the GPU reset (unhealthy), and those an application caused (told against its process).
XIDS: Mapping[int, tuple[str, str]] = {
    13: (APPLICATION, "graphics engine exception"),
    31: (APPLICATION, "GPU memory page fault"),
    43: (APPLICATION, "GPU stopped processing"),
    45: (APPLICATION, "preemptive cleanup after an earlier error"),
    68: (APPLICATION, "video decoder exception"),
    48: (RESET, "double-bit ECC error"),
    62: (RESET, "internal micro-controller halt"),
    63: (RESET, "page retirement or row remap recorded"),
    64: (RESET, "page retirement or row remap failed to record"),
    74: (RESET, "NVLink error"),
    79: (RESET, "fallen off the bus"),
    92: (RESET, "high single-bit ECC error rate"),
    94: (RESET, "contained ECC error"),
    95: (RESET, "uncontained ECC error"),
    119: (RESET, "GSP RPC timeout"),
    120: (RESET, "GSP error"),
    140: (RESET, "unrecovered ECC error"),
}

# The clocks' event reasons that slow a GPU for its own protection (degraded); the others (idle,
# an application's clocks, the power cap, sync boost, the display) are ordinary.
SLOWDOWNS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
)


def xid_kind(number: int) -> str | None:
    """RESET, APPLICATION, or None for an Xid the catalogue above does not place."""
    known = XIDS.get(number)
    return known[0] if known else None


def xid_words(number: int) -> str:
    known = XIDS.get(number)
    return f"Xid {number}: {known[1]}" if known else f"Xid {number}"


@dataclass(frozen=True)
class Reading:
    """One `-q -x` reading's facts on one GPU's health; None: not printed, or `N/A`."""

    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remapped_uncorrectable: int | None = None  # rows remapped for uncorrectable errors
    retire_pending: bool | None = None
    retired_pages: int | None = None  # single- and double-bit retirements
    ecc_uncorrectable: int | None = None  # volatile (since the last reset), summed
    slowdowns: tuple[str, ...] = ()  # the SLOWDOWNS active now
    reset_required: bool | None = None  # <gpu_reset_status><reset_required>
    recovery_action: str | None = None  # <gpu_recovery_action> other than None
    broken: str | None = None  # "GPU is lost", "GPU requires reset" printed for a value


@dataclass(frozen=True)
class Problem:
    """One thing wrong: `code` for machines (the metric's `reason`), words and what to do."""

    code: str
    words: str
    action: str
    grave: bool  # True: unhealthy, granted to nobody; False: degraded, shown only

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "words": self.words, "action": self.action, "grave": self.grave}


@dataclass(frozen=True)
class Fault:
    """An Xid told against a process (an application's fault), or one the catalogue does not
    place: shown, never held against the GPU."""

    xid: int
    words: str
    pid: int | None
    name: str | None
    at: float  # wall clock

    @property
    def kind(self) -> str:
        """APPLICATION (its process's own fault), or `unknown` (not in the catalogue)."""
        return xid_kind(self.xid) or "unknown"

    def to_json(self) -> dict[str, Any]:
        """Its name is left out: the process named it, and --hide-users may hide its command."""
        return {
            "xid": self.xid,
            "kind": self.kind,
            "words": self.words,
            "pid": self.pid,
            "at": self.at,
        }


@dataclass(frozen=True)
class Health:
    """A GPU's health now: its problems, and the recent faults of processes on it."""

    problems: tuple[Problem, ...] = ()
    faults: tuple[Fault, ...] = ()

    @property
    def state(self) -> str:
        if any(p.grave for p in self.problems):
            return UNHEALTHY
        return DEGRADED if self.problems else HEALTHY

    @property
    def reason(self) -> str | None:
        """Why it is granted to nobody and what to do, or None while it may be granted."""
        grave = [f"{p.words}: {p.action}" for p in self.problems if p.grave]
        return "; ".join(grave) or None

    @property
    def codes(self) -> str:
        """The problems' codes, comma-separated ("" when none): the metric's `reason`."""
        return ",".join(p.code for p in self.problems)

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "problems": [p.to_json() for p in self.problems],
            "faults": [f.to_json() for f in self.faults],
        }


FINE = Health()


def _reset(number: int) -> str:
    return f"reset the GPU (`nvidia-smi -r -i {number}`) when nothing runs on it"


def problems_of(reading: Reading, number: int, ecc_base: int | None) -> tuple[Problem, ...]:
    """What a reading shows wrong with GPU `number`; `ecc_base`: the volatile uncorrectable ECC
    count that is not news (the first one seen since a reset), None if none yet."""
    found = []
    reset = _reset(number)
    if reading.remap_failure:
        found.append(
            Problem(
                "remap_failure",
                "row remap failed",
                "its memory cannot be repaired: have the GPU replaced",
                True,
            )
        )
    if reading.remap_pending:
        found.append(Problem("remap_pending", "row remap pending", reset, True))
    if reading.retire_pending:
        found.append(
            Problem(
                "retire_pending", "page retirement pending", f"{reset} (or reboot the host)", True
            )
        )
    ecc = reading.ecc_uncorrectable
    if ecc is not None and ecc_base is not None and ecc > ecc_base:
        found.append(
            Problem(
                "ecc_rising",
                f"uncorrectable ECC errors rose from {ecc_base} to {ecc}",
                f"{reset}; if they come back, have the GPU checked",
                True,
            )
        )
    if reading.reset_required:
        found.append(Problem("reset_required", "the driver says it needs a reset", reset, True))
    if reading.recovery_action:
        found.append(
            Problem(
                "recovery_action",
                f"the driver asks for a recovery action: {reading.recovery_action}",
                "do as it asks when nothing runs on it",
                True,
            )
        )
    if reading.broken:
        found.append(
            Problem(
                "gpu_lost",
                f"nvidia-smi says: {reading.broken}",
                f"{reset}, or reboot the host",
                True,
            )
        )
    if reading.slowdowns:
        found.append(
            Problem(
                "slowdown",
                "clocks slowed (" + ", ".join(reading.slowdowns) + ")",
                "check its cooling and power",
                False,
            )
        )
    return tuple(found)


def xid_problem(xid: int, number: int, detail: str = "") -> Problem:
    """The problem an Xid of a GPU or driver fault makes (sticky until a reset is seen)."""
    said = f" ({detail})" if detail else ""
    return Problem(
        f"xid_{xid}",
        xid_words(xid) + said,
        f"{_reset(number)}; then `patroller release --healthy {number}`",
        True,
    )


@dataclass
class _Gpu:
    """What the book keeps of one GPU."""

    number: int = 0
    reading: Reading | None = None
    ecc_base: int | None = None
    xids: dict[int, Problem] = field(default_factory=dict)
    excused: set[str] = field(default_factory=set)
    faults: deque[Fault] = field(default_factory=deque)
    health: Health = FINE


class HealthBook:
    """Every GPU's health, from its readings and its Xids; each method returns the GPU's new
    health when it changed, else None."""

    def __init__(self, faults_kept: int = 8) -> None:
        self.faults_kept = faults_kept
        self._gpus: dict[str, _Gpu] = {}

    def get(self, uuid: str) -> Health:
        gpu = self._gpus.get(uuid)
        return gpu.health if gpu is not None else FINE

    def _gpu(self, uuid: str, number: int) -> _Gpu:
        gpu = self._gpus.setdefault(uuid, _Gpu(faults=deque(maxlen=self.faults_kept)))
        gpu.number = number
        return gpu

    def read(self, uuid: str, number: int, reading: Reading) -> Health | None:
        """A `-q -x` reading of the GPU."""
        gpu = self._gpu(uuid, number)
        ecc = reading.ecc_uncorrectable
        if ecc is None or gpu.ecc_base is None or ecc < gpu.ecc_base:
            gpu.ecc_base = ecc  # the first count, or one that fell: a reset cleared it
        gpu.reading = reading
        return self._update(gpu)

    def xid(
        self,
        uuid: str,
        number: int,
        xid: int,
        pid: int | None = None,
        name: str | None = None,
        detail: str = "",
        at: float = 0.0,
    ) -> Health | None:
        """An Xid line of the kernel naming the GPU."""
        gpu = self._gpu(uuid, number)
        if xid_kind(xid) == RESET:
            gpu.xids.setdefault(xid, xid_problem(xid, number, detail))
        else:
            gpu.faults.append(Fault(xid, xid_words(xid), pid, name, at))
        return self._update(gpu)

    def reset(self, uuid: str) -> Health | None:
        """The GPU was seen reset (it left the host's list and came back): its Xids end."""
        gpu = self._gpus.get(uuid)
        if gpu is None:
            return None
        gpu.xids.clear()
        gpu.excused.clear()
        gpu.ecc_base = None if gpu.reading is None else gpu.reading.ecc_uncorrectable
        return self._update(gpu)

    def declare_healthy(self, uuid: str) -> Health | None:
        """The host's root says the GPU is fine: its Xids end, and what the last reading shows
        is excused until a reading no longer shows it."""
        gpu = self._gpus.get(uuid)
        if gpu is None:
            return None
        gpu.xids.clear()
        if gpu.reading is not None:
            gpu.ecc_base = gpu.reading.ecc_uncorrectable
            gpu.excused = {p.code for p in problems_of(gpu.reading, gpu.number, gpu.ecc_base)}
        return self._update(gpu)

    def _update(self, gpu: _Gpu) -> Health | None:
        shown = problems_of(gpu.reading, gpu.number, gpu.ecc_base) if gpu.reading else ()
        codes = {p.code for p in shown}
        gpu.excused &= codes  # a condition gone and back is news again
        problems = tuple(p for p in shown if p.code not in gpu.excused)
        health = Health(problems + tuple(gpu.xids.values()), tuple(gpu.faults))
        if health == gpu.health:
            return None
        gpu.health = health
        return health
