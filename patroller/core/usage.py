"""GPU-time, split into categories anyone can check by hand, and summed into reports. Pure.

A usage sample is one GPU over one sampling interval (`--usage-interval`): who held it and how,
whose processes ran on it, and how many of the interval's statistics readings (dmon prints one
a second) found its SM busy, at least `--usage-busy-sm` %. Its seconds are split:

  lost             the GPU was gone from the host, silent or unhealthy (withheld): nobody
                   could use it (the sample's state says which);
  free             nobody held it and nothing ran on it;
  reserved_unused  held (a reservation, a Slurm job's or a pod's allocation) with no process of
                   the holder's on it;
  active           a process of the holder's computed on it, under a reservation;
  unreserved       a process computed on it without a reservation: its user took it by
                   computing (or nobody held it);
  idle_held        a process held it (memory, a context) but did not compute;
  trespass         another party's process ran on a held GPU (another user's, or on a Slurm
                   job's or a pod's GPU, a process outside the job or pod).

The parties on a GPU share its time equally: each party with processes there, and the holder
when none of the processes there is the holder's. A party's share that runs by right (the
holder's own, or anyone's on a GPU nobody holds) is computing for the fraction of the readings
that found the SM busy (all of it when no reading says: a device whose driver prints no SM
figure, such as a MIG one; observe/tally.py carries a GPU's last reading into an interval its
stream was down), and idle-held for the rest; an intruder's share is trespass whether
it computes or not. docs/usage.md works an example through.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from patroller.core.identity import Identity

CATEGORIES = ("active", "idle_held", "reserved_unused", "trespass", "unreserved", "free", "lost")
UNUSED = ("free", "lost")  # GPU-time nobody held: left out of a report's order "by use"
# The states of a usage sample: the hold's states, withheld (silent, granted to nobody) and
# unhealthy (granted to nobody for its health: core/health.py).
STATES = ("free", "reserved", "claimed", "shared", "allocated", "lost", "withheld", "unhealthy")
# What a report groups GPU-time by.
BY = ("user", "account", "job", "slurm_account", "namespace", "pod", "gpu", "day")
# ... and, for a report's grouping of its own or under another key, the place of each hour in
# the week: its weekday and its hour of the day (local time, where a report asks for a zone).
CYCLES = ("weekday", "hour")
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# Keys kept in time's order in a report, not ordered by use.
IN_TIME = ("day", "weekday", "hour")


@dataclass(frozen=True)
class Party:
    """Whom GPU-time is counted for: a user, with the host account, Slurm job and account, and
    Kubernetes pod their process ran as or in ("" where it has none)."""

    user: str = ""
    account: str = ""  # host account
    job: str = ""  # Slurm job id
    slurm_account: str = ""
    namespace: str = ""  # Kubernetes namespace
    pod: str = ""  # the pod's name, in its namespace


NOBODY = Party()


def party_of(identity: Identity, slurm_account: str = "") -> Party:
    """The party an identity (a holder, a process's owner) counts as, billed to
    `slurm_account`: the job map's account of its job (core/jobs.py `billed_to`), never one
    the identity carries, which may have come from what its user wrote."""
    job = dict(identity.job or ())
    pod = dict(identity.pod or ())
    return Party(
        user=identity.user,
        account=identity.account or "",
        job=job.get("id", ""),
        slurm_account=slurm_account,
        namespace=pod.get("namespace", ""),
        pod=pod.get("name", ""),
    )


@dataclass(frozen=True)
class Present:
    """One party's processes on a GPU."""

    party: Party
    own: bool  # it runs there by right: the holder's, in the allocation's job or pod, or unheld
    pids: tuple[int, ...] = ()
    containers: tuple[str, ...] = ()  # the containers' names (or short ids) they run in


@dataclass(frozen=True)
class GpuSample:
    """One GPU over one sampling interval: the hold as it stood at the interval's end, and the
    statistics readings of the whole interval."""

    uuid: str
    number: int
    seconds: float  # how long the interval was
    state: str  # one of STATES
    hold: str | None = None  # how it was held: lease, process, duration, slurm, kubernetes
    holder: Party | None = None
    reserved: bool = False  # held by a grant or an allocation, not taken by computing
    present: tuple[Present, ...] = ()
    readings: int = 0  # statistics readings with an SM figure
    busy: int = 0  # of them, those with SM at least the threshold
    sm_mean: float | None = None  # SM utilisation, %
    sm_max: float | None = None
    mem_mean: float | None = None  # memory-controller utilisation, %
    mem_max: float | None = None
    fb_mean: float | None = None  # memory held, MiB
    fb_max: float | None = None
    name: str = ""  # the GPU's model


Share = tuple[str, Party, float]  # (category, party, seconds)


def classify(sample: GpuSample) -> list[Share]:
    """The sample's seconds by category and party (module docstring); they add up to
    `sample.seconds`, in a fixed order, zero ones left out."""
    seconds = sample.seconds
    if sample.state in ("lost", "withheld", "unhealthy"):
        return [("lost", sample.holder or NOBODY, seconds)]
    if sample.holder is None and not sample.present:
        return [("free", NOBODY, seconds)]
    parties: list[tuple[str, Party]] = []  # ("own" | "intruder" | "holder", party)
    if sample.holder is not None and not any(p.own for p in sample.present):
        parties.append(("holder", sample.holder))
    for present in sample.present:
        parties.append(("own" if present.own else "intruder", present.party))
    each = seconds / len(parties)
    busy = sample.busy / sample.readings if sample.readings else 1.0
    computing = "active" if sample.reserved else "unreserved"
    found: dict[tuple[str, Party], float] = {}
    for role, party in parties:
        if role == "holder":
            parts = [("reserved_unused", each)]
        elif role == "intruder":
            parts = [("trespass", each)]
        else:
            parts = [(computing, each * busy), ("idle_held", each * (1.0 - busy))]
        for category, part in parts:
            if part > 0:
                found[(category, party)] = found.get((category, party), 0.0) + part
    return [(category, party, part) for (category, party), part in found.items()]


# -- reports ----------------------------------------------------------------------------------

Total = tuple[str | None, str, float]  # (key, category, seconds)
HOUR = 3600.0
Key = str | None
Grouped = tuple[tuple[Key, ...], str, float]  # (a key per grouping, category, seconds)


class Summary:
    """A report summed a part at a time (`add`), then made (`result`): per key, GPU-hours per
    category, in all, and its share of the whole; the whole, with each category's share. Keys
    in order of use (GPU-hours held or used: all but free and lost; the most first), or by key
    (`chronological`, for days). The daemon feeds it a slice of rows a turn of its loop."""

    def __init__(self, chronological: bool = False) -> None:
        self.chronological = chronological
        self._rows: dict[Any, dict[str, float]] = {}
        self._whole = dict.fromkeys(CATEGORIES, 0.0)
        self._tuples = False  # each key a tuple of keys (GroupedSummary)
        self._ordered: list[tuple[Any, dict[str, float]]] | None = None  # `ordering`'s

    def add(self, totals: Iterable[Total] | Iterable[Grouped]) -> None:
        """GPU-seconds by key and category, added in the order given."""
        self._ordered = None
        rows, whole, tuples = self._rows, self._whole, self._tuples
        key: Any
        for key, category, seconds in totals:
            if category not in whole:
                continue  # a category a later version added: not this report's
            if tuples:
                key = tuple(key)
            row = rows.get(key)
            if row is None:
                row = rows[key] = dict.fromkeys(CATEGORIES, 0.0)
            row[category] += seconds
            whole[category] += seconds

    def ordered(self) -> list[tuple[Any, dict[str, float]]]:
        """The keys added and their GPU-seconds by category, in the report's order (made in
        one piece unless `ordering` made it since the last `add`)."""
        if self._ordered is None:
            for _ in self.ordering(max(len(self._rows), 1)):
                pass
        assert self._ordered is not None
        return self._ordered

    def ordering(self, size: int) -> Iterator[None]:
        """`ordered`, made `size` keys at a time, yielding between two parts (the daemon lets
        its loop run then): each part's keys weighed and sorted, then the parts merged. The
        order is `sorted`'s by the same weights (ties: in the order the keys came)."""
        items = list(self._rows.items())
        yield from self._weighing(items, size)
        weigh = self._weight()
        runs = []
        for start in range(0, len(items), size):
            part = items[start : start + size]
            runs.append(sorted((weigh(key, row), n) for n, (key, row) in enumerate(part, start)))
            yield
        merged = heapq.merge(*runs)
        ordered: list[tuple[Any, dict[str, float]]] = []
        while taken := [items[n] for _, n in itertools.islice(merged, size)]:
            ordered += taken
            yield
        self._ordered = ordered
        while runs:  # let go of the weights a few parts a slice: 7,000 of them at once, 3 ms
            del runs[:8]
            yield

    def letting_go(self, size: int) -> Iterator[None]:
        """What was summed let go, `size` keys a step (its thousands of small objects freed at
        once took 4 ms of the loop for a year by day,user): the summary is empty after."""
        self._ordered = None
        for held in (self._rows, getattr(self, "_sums", {})):
            while held:
                for _ in range(min(size, len(held))):
                    held.popitem()
                yield

    def _weighing(self, items: list[tuple[Any, dict[str, float]]], size: int) -> Iterator[None]:
        """What the weights need, `size` keys at a time (GroupedSummary: each key's sums)."""
        yield from ()

    def _weight(self) -> Callable[[Any, dict[str, float]], tuple[object, ...]]:
        """A key's place in the order: by key (`chronological`) or by use, the most first."""
        if self.chronological:
            return lambda key, row: (key is None, key or "")
        return lambda key, row: (
            -round(_used(row), 6),
            -round(sum(row.values()), 6),
            key is None,
            key or "",
        )

    def entries(self, part: list[tuple[Any, dict[str, float]]]) -> list[dict[str, Any]]:
        """The report's rows of a part of `ordered`, as answered."""
        everything = sum(self._whole.values())
        return [
            {
                "key": self._shown(key),
                "hours": _hours(row),
                "gpu_hours": round(sum(row.values()) / HOUR, 6),
                "share": _share(sum(row.values()), everything),
            }
            for key, row in part
        ]

    def _shown(self, key: Any) -> Any:
        return key

    def total(self) -> dict[str, Any]:
        """The report's whole, as answered."""
        whole = self._whole
        everything = sum(whole.values())
        return {
            "hours": _hours(whole),
            "gpu_hours": round(everything / HOUR, 6),
            "shares": {c: _share(s, everything) for c, s in whole.items()},
        }

    def result(self) -> dict[str, Any]:
        """The report of the rows added, in one piece."""
        return {"rows": self.entries(self.ordered()), "total": self.total()}


def summarize(totals: Iterable[Total], chronological: bool = False) -> dict[str, Any]:
    """A report from GPU-seconds by key and category, in one piece (`Summary`)."""
    summary = Summary(chronological)
    summary.add(totals)
    return summary.result()


def _used(row: dict[str, float]) -> float:
    return sum(s for c, s in row.items() if c not in UNUSED)


def _hours(row: dict[str, float]) -> dict[str, float]:
    return {category: round(row[category] / HOUR, 6) for category in CATEGORIES}


def _share(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole > 0 else 0.0


class GroupedSummary(Summary):
    """`Summary`, grouped by one key or two (`by`): a row per key (per pair of keys, whose
    `key` is then a list of the two). Rows in order of the first key, then of the second
    within it: a key of IN_TIME in time's order, any other by use (the most first), as
    `Summary` orders them; null keys after the others."""

    def __init__(self, by: tuple[str, ...]) -> None:
        super().__init__()
        self.by = by
        self._tuples = True
        self._sums: dict[tuple[Key, ...], tuple[float, float]] = {}

    def _shown(self, key: Any) -> Any:
        return list(key) if len(self.by) > 1 else key[0]

    def _weighing(self, items: list[tuple[Any, dict[str, float]]], size: int) -> Iterator[None]:
        # GPU-seconds (used, then all) of every leading part of a key, for the order by use
        sums: dict[tuple[Key, ...], tuple[float, float]] = {}
        for start in range(0, len(items), size):
            for key, row in items[start : start + size]:
                used = _used(row)
                for n in range(1, len(key) + 1):
                    was = sums.get(key[:n], (0.0, 0.0))
                    sums[key[:n]] = (was[0] + used, was[1] + sum(row.values()))
            yield
        self._sums = sums

    def _weight(self) -> Callable[[Any, dict[str, float]], tuple[object, ...]]:
        by, sums = self.by, self._sums

        def order(key: tuple[Key, ...], row: dict[str, float]) -> tuple[object, ...]:
            parts: list[object] = []
            for n, (name, value) in enumerate(zip(by, key, strict=True)):
                if value is None:
                    parts.append((1, 0.0, 0.0, ""))
                elif name in IN_TIME:
                    place = WEEKDAYS.index(value) if name == "weekday" and value in WEEKDAYS else 0
                    parts.append((0, 0.0, float(place), value))
                else:
                    used, every = sums[key[: n + 1]]
                    parts.append((0, -round(used, 6), -round(every, 6), value))
            return tuple(parts)

        return order


def summarize_grouped(totals: Iterable[Grouped], by: tuple[str, ...]) -> dict[str, Any]:
    """`summarize`, grouped by one key or two (`GroupedSummary`), in one piece."""
    summary = GroupedSummary(by)
    summary.add(totals)
    return summary.result()
