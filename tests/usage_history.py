"""Usage history written straight into a usage store's file, as its writer writes it (one
interval per hour and GPU here, so that weeks of history take a second): a few hand-made hours
whose GPU-hours anyone can add up, and a lab's month (weekday working hours, idle-held evenings,
reservations left unused over the weekend, a trespass, a lost GPU) for the report page's tests
and its screenshot."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterable, Sequence

from patroller.core.usage import GpuSample, Party, Present
from patroller.state.usage import schema, tables

HOUR = 3600
DAY = 86400
Interval = tuple[float, Sequence[GpuSample]]  # (its end, epoch seconds; a sample per GPU)


def party(user: str) -> Party:
    return Party(user=user, account=user.split("@")[0])


def gpu_hour(
    number: int,
    state: str = "free",
    holder: str | None = None,
    reserved: bool = False,
    users: Sequence[tuple[str, bool]] = (),
    busy: int = 0,
    readings: int = 60,
) -> GpuSample:
    """One GPU for one hour: its holder, whether by a reservation, the users with a process on
    it (user, runs there by right) and how many of the readings found its SM busy."""
    present = tuple(
        Present(party(user), own=own, pids=(1000 + n,)) for n, (user, own) in enumerate(users)
    )
    return GpuSample(
        uuid=f"GPU-{number:08x}-0000-0000-0000-000000000000",
        number=number,
        seconds=float(HOUR),
        state=state,
        hold="lease" if holder else None,
        holder=party(holder) if holder else None,
        reserved=reserved,
        present=present,
        readings=readings,
        busy=busy,
        name="NVIDIA H100 80GB HBM3",
    )


def write(path: str, intervals: Iterable[Interval]) -> int:
    """The intervals, into the store's file at `path` (made if need be): the intervals written."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        schema.migrate(db)
        keys = tables.Keys()
        count = 0
        for at, samples in intervals:
            tables.write_interval(db, keys, at, samples)
            count += 1
        return count
    finally:
        db.close()


def lab(now: float, days: int, gpus: int = 8, seed: int = 7) -> list[Interval]:
    """A lab's `days` days of hours up to the hour before `now` (UTC): alice trains by day and
    leaves her processes idle overnight now and then; bob reserves two GPUs and leaves them
    unused over weekends; carol computes without asking; dave's GPU is trespassed on by erin
    one afternoon; frank reserves a GPU some days; the last GPU is lost for a day."""
    rng = random.Random(seed)
    last = int(now // HOUR * HOUR)  # the hour in progress is not over: not written
    first = last - days * DAY
    lost_day = (first // DAY + days // 3) * DAY
    intervals: list[Interval] = []
    for start in range(first, last, HOUR):
        weekday = ((start // DAY) + 3) % 7  # 1970-01-01 was a Thursday: Monday is 0
        hour = (start % DAY) // HOUR
        working = weekday < 5 and 8 <= hour < 19
        samples = []
        for number in range(gpus):
            samples.append(_hour(rng, number, start, working, weekday, hour, lost_day, gpus))
        intervals.append((start + HOUR, samples))
    return intervals


def _hour(
    rng: random.Random,
    number: int,
    start: int,
    working: bool,
    weekday: int,
    hour: int,
    lost_day: int,
    gpus: int,
) -> GpuSample:
    if number == gpus - 1 and lost_day <= start < lost_day + DAY:
        return gpu_hour(number, "lost")
    if number in (0, 1):  # alice: reserved; computing by day, idle-held some nights
        if working:
            return gpu_hour(
                number, "claimed", "alice", True, [("alice", True)], busy=rng.randint(40, 60)
            )
        if rng.random() < 0.35:
            return gpu_hour(number, "claimed", "alice", True, [("alice", True)], busy=0)
        return gpu_hour(number)
    if number in (2, 3):  # bob: reserved all week, used on weekdays, left unused at weekends
        if weekday >= 5:
            return gpu_hour(number, "reserved", "bob", True)
        if working and rng.random() < 0.8:
            return gpu_hour(
                number, "claimed", "bob", True, [("bob", True)], busy=rng.randint(20, 60)
            )
        return gpu_hour(number, "reserved", "bob", True)
    if number == 4:  # carol computes without asking, by day
        if working and rng.random() < 0.7:
            return gpu_hour(
                number, "claimed", "carol", False, [("carol", True)], busy=rng.randint(30, 60)
            )
        return gpu_hour(number)
    if number == 5:  # dave: reserved by day; erin trespasses on Wednesday afternoons
        if working:
            users = [("dave", True)]
            if weekday == 2 and hour >= 14:
                users.append(("erin", False))
            return gpu_hour(
                number,
                "shared" if len(users) > 1 else "claimed",
                "dave",
                True,
                users,
                busy=rng.randint(30, 60),
            )
        return gpu_hour(number)
    if number == 6 and working and (start // DAY) % 3 == 0:  # frank, every third day
        if rng.random() < 0.5:
            return gpu_hour(number, "reserved", "frank", True)
        return gpu_hour(number, "claimed", "frank", True, [("frank", True)], busy=50)
    return gpu_hour(number)
