"""Every `--usage-interval`, a usage sample of every GPU, taken on the event loop and handed to
the usage store's writer: the hold as it stands (state, how, holder, the processes on it and
their owners) and the statistics tally of the interval. Taking one costs a walk over the holds
(some microseconds a GPU); writing is the writer thread's. The sampler also keeps the running
GPU-seconds by user and category that /metrics exposes (`seconds`), split by the same `classify`
the store's hourly totals are, so that Prometheus's figures and the store's agree: some 260 µs
an interval at 64 GPUs with two parties each (a two-core virtual machine)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tornado.ioloop import PeriodicCallback

from patroller.core.devices import Device, Inventory
from patroller.core.identity import Identity
from patroller.core.jobs import Job, billed_to, listed
from patroller.core.leases import Hold, LeaseManager
from patroller.core.usage import GpuSample, Party, Present, classify, party_of
from patroller.observe.tally import Tally
from patroller.state.usage.store import UsageStore


class UsageSampler:
    """Takes the samples; the first interval runs from `start`, the last ends at `stop`."""

    def __init__(
        self,
        inventory: Inventory,
        leases: LeaseManager,
        tally: Tally,
        store: UsageStore,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.inventory = inventory
        self.leases = leases
        self.tally = tally
        self.store = store
        self.interval = interval
        self.clock = clock
        self.wall = wall
        self.samples = 0  # intervals sampled
        # GPU-seconds since the start by (user, category): "" for GPU-time no user had (free;
        # lost with no holder). One entry per user and category seen: bounded by the users.
        self.seconds: dict[tuple[str, str], float] = {}
        self._last: float | None = None  # clock() at the last sample (or the start)
        self._timer: PeriodicCallback | None = None

    def start(self) -> None:
        """Sample every interval from now, on the current IOLoop."""
        self._last = self.clock()
        for device in self.inventory:
            self.tally.take(device.uuid)  # readings from before the start are no interval's
        self._timer = PeriodicCallback(self.sample, self.interval * 1000)
        self._timer.start()

    def stop(self) -> None:
        """Stop, with a sample of the interval so far (a stop loses none of it)."""
        if self._timer is None:
            return
        self._timer.stop()
        self._timer = None
        self.sample()

    def sample(self) -> None:
        """One sample of every GPU, for the interval since the last one."""
        now = self.clock()
        seconds = now - self._last if self._last is not None else 0.0
        self._last = now
        if seconds <= 0:
            return
        self.samples += 1
        # The jobs the map lists now: each party in a job is billed to its account there.
        jobs = listed(hold.allocation for hold in self.leases.holds.values())
        samples = [self.snapshot(device, seconds, jobs) for device in self.inventory]
        self.count(samples)
        self.store.put(self.wall(), samples)

    def count(self, samples: Sequence[GpuSample]) -> None:
        """Add an interval's GPU-seconds to the running totals, by user and category."""
        totals = self.seconds
        for sample in samples:
            for category, party, part in classify(sample):
                key = (party.user, category)
                totals[key] = totals.get(key, 0.0) + part

    def snapshot(self, device: Device, seconds: float, jobs: Sequence[Job] = ()) -> GpuSample:
        """One GPU's sample: its hold now, its statistics over the interval; `jobs`: those the
        job map lists, whose accounts the parties in them are billed to."""
        hold = self.leases.holds[device.uuid]
        figures = self.tally.take(device.uuid)
        state = (
            hold.state
            if hold.lost or not hold.withheld
            else "unhealthy"
            if "health" in hold.withholds
            else "withheld"
        )
        holder = billed_party(hold.holder, jobs) if hold.holder is not None else None
        return GpuSample(
            uuid=device.uuid,
            number=device.number,
            name=device.name or "",
            seconds=seconds,
            state=state,
            hold=hold.how if hold.holder is not None else None,
            holder=holder,
            reserved=hold.holder is not None and (hold.asked or hold.allocation is not None),
            present=present(hold, jobs),
            readings=figures.readings,
            busy=figures.busy,
            sm_mean=figures.sm_mean,
            sm_max=figures.sm_max,
            mem_mean=figures.mem_mean,
            mem_max=figures.mem_max,
            fb_mean=figures.fb_mean,
            fb_max=figures.fb_max,
        )


def billed_party(owner: Identity, jobs: Sequence[Job]) -> Party:
    """The party `owner` counts as, billed to the account the job map gives its job."""
    return party_of(owner, billed_to(owner, jobs))


def present(hold: Hold, jobs: Sequence[Job] = ()) -> tuple[Present, ...]:
    """The parties with processes on a GPU, in the order their first process came: their pids,
    their containers, and whether they run there by right (on a GPU nobody holds, all do)."""
    found: dict[Party, tuple[bool, list[int], list[str]]] = {}
    for pid, owner in hold.processes.items():
        party = billed_party(owner, jobs)
        own = hold.holder is None or hold.belongs(owner)
        was, pids, containers = found.get(party, (True, [], []))
        pids.append(pid)
        name = _container(owner)
        if name and name not in containers:
            containers.append(name)
        found[party] = (was and own, pids, containers)
    return tuple(
        Present(party, own, tuple(pids), tuple(containers))
        for party, (own, pids, containers) in found.items()
    )


def _container(owner: Identity) -> str:
    if owner.container is None:
        return ""
    short, name = owner.container
    return name or short
