"""How the GPUs are linked to each other (what `nvidia-smi topo -m` says), and the choice of the
best-connected set of free devices for a request.

A link is a word of the matrix: `NV<n>` (n bonded NVLinks), else a PCIe path, from best to
worst: PIX (at most one PCIe bridge), PXB (several bridges), PHB (a host bridge), NODE (host
bridges within a NUMA node), SYS (across NUMA nodes; `SOC` on old drivers). Each has a
strength: NVLink above every PCIe path, more links above fewer.

The rule (docs/fair-use.md, "Which GPUs you get"): of the free sets of the size asked for, the
one whose links, weakest first, are strongest wins (the weakest link decides; then fewer links
that weak; then the next weakest, and so on). Ties go to the set with more devices the user
held last, then to the set whose most recent release is oldest (to spread the wear), then to
the lowest numbers. Every set is weighed when there are at most `Search.exact` of them;
beyond, a greedy search from a few devices (one of each kind, the most promising first), grown
among each one's strongest-linked free peers by the strongest weakest link, weighs a few sets
only, and may miss the best (docs/fair-use.md says so).

Pure: no I/O.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence

from patroller.core.devices import Device

PCIE = {"PIX": 5, "PXB": 4, "PHB": 3, "NODE": 2, "SYS": 1, "SOC": 1}
NVLINK = 100  # NV<n> is NVLINK + n: above every PCIe path
_NV = re.compile(r"NV(\d+)$")
LINKS = ("nvlink", "numa")  # what a request may insist on

# A device's preference among equals, lower first: (not the user's last, released at).
Prefer = Callable[[Device], tuple[int, float]]


def strength(word: str) -> int:
    """How good a link is (0: a word Patroller does not know, the worst)."""
    found = _NV.match(word)
    if found:
        return NVLINK + int(found.group(1))
    return PCIE.get(word, 0)


class Topology:
    """The link between every two devices (by uuid) and each device's NUMA node. Empty:
    unknown (no `topo -m`, or one that did not match the devices)."""

    def __init__(
        self,
        links: Mapping[tuple[str, str], str] = {},
        numa: Mapping[str, str | None] = {},
        cpus: Mapping[str, str | None] = {},
        why: str | None = None,
    ) -> None:
        self.links: dict[str, dict[str, str]] = {}
        for (a, b), word in links.items():
            self.links.setdefault(a, {})[b] = word
            self.links.setdefault(b, {})[a] = word
        self._strength = {
            a: {b: strength(w) for b, w in row.items()} for a, row in self.links.items()
        }
        self.numa = dict(numa)  # uuid -> its NUMA node ("0"), None where not said
        self.cpus = dict(cpus)  # uuid -> its CPU affinity ("0-23,48-71")
        self.why = why  # why it is unknown, when it is
        self._kinds: dict[str, int] = {}  # uuid -> a number shared by devices linked alike
        self._order: dict[str, list[tuple[int, str]]] = {}  # uuid -> peers, strongest first
        # Whether every two devices of the matrix have a link (as `topo -m` gives): then a
        # device's row says it is covered, without looking at every pair (2,016 at 64 GPUs).
        self._whole = all(len(row) == len(self.links) - 1 for row in self.links.values())

    def __bool__(self) -> bool:
        return bool(self.links)

    def covers(self, uuids: Sequence[str]) -> bool:
        """Whether every two of these devices have a link known."""
        if self._whole:
            return all(u in self.links for u in uuids)
        return all(b in self.links.get(a, {}) for a, b in itertools.combinations(uuids, 2))

    def link(self, a: str, b: str) -> str | None:
        """The word of the matrix between two devices, or None."""
        return self.links.get(a, {}).get(b)

    def node(self, uuid: str) -> str | None:
        """Where the device sits: its NUMA node, else its CPU affinity, else None."""
        numa = self.numa.get(uuid)
        if numa is not None:
            return numa
        cpus = self.cpus.get(uuid)
        return None if cpus is None else f"cpus {cpus}"

    def groups(self, uuids: Sequence[str]) -> list[list[str]]:
        """The devices in groups linked by NVLink to one another (each peer of each), in order."""
        seen: dict[str, int] = {}
        groups: list[list[str]] = []
        for uuid in uuids:
            if uuid in seen:
                continue
            group, todo = [], [uuid]
            seen[uuid] = len(groups)
            while todo:
                here = todo.pop()
                group.append(here)
                for peer in uuids:
                    if peer not in seen and self._strength.get(here, {}).get(peer, 0) > NVLINK:
                        seen[peer] = len(groups)
                        todo.append(peer)
            groups.append(sorted(group, key=uuids.index))
        return groups

    def prepare(self) -> None:
        """Work out now what the choice would otherwise work out at its first call (the kinds,
        each device's peers in order): the reader does it off the event loop."""
        for uuid in self.links:
            self.kind(uuid)
            self.order(uuid)

    def order(self, uuid: str) -> list[tuple[int, str]]:
        """The device's peers with the strength of the link to each, strongest first."""
        found = self._order.get(uuid)
        if found is None:
            found = self._order[uuid] = sorted(
                ((s, peer) for peer, s in self._strength.get(uuid, {}).items()),
                key=lambda sp: -sp[0],
            )
        return found

    def kind(self, uuid: str) -> int:
        """Devices of one kind are linked alike to every other (twins): a search from one of
        them is a search from all (a DGX's eight GPUs are of one kind)."""
        if not self._kinds:
            self._kinds = self._twins()
        return self._kinds.get(uuid, -1)

    def _twins(self) -> dict[str, int]:
        """Each device's kind: those whose links to every third device are the same share one.
        Only devices with the same links in some order can be twins: compared within those."""
        alike: dict[tuple[int, ...], list[str]] = {}
        for a, row in self._strength.items():
            alike.setdefault(tuple(sorted(row.values())), []).append(a)
        kinds: dict[str, int] = {}
        for group in alike.values():
            for a in group:
                if a in kinds:
                    continue
                kinds[a] = len(kinds)
                ra = self._strength[a]
                for b in group:
                    rb = self._strength[b]
                    if b not in kinds and all(ra.get(c) == rb.get(c) for c in ra if c != b):
                        kinds[b] = kinds[a]
        return kinds

    def fits(self, devices: Sequence[Device], link: str | None) -> bool:
        """Whether these devices together are what `link` insists on."""
        uuids = [d.uuid for d in devices]
        if link == "nvlink":
            return all(
                self._strength.get(a, {}).get(b, 0) > NVLINK
                for a, b in itertools.combinations(uuids, 2)
            )
        if link == "numa":
            return len({self.node(u) for u in uuids}) == 1 and self.node(uuids[0]) is not None
        return True

    def score(self, devices: Sequence[Device]) -> tuple[int, ...]:
        """The set's links from weakest to strongest, negated: lower is better connected."""
        links = sorted(
            self._strength[a.uuid].get(b.uuid, 0) for a, b in itertools.combinations(devices, 2)
        )
        return tuple(-s for s in links)


def usable(topology: Topology, devices: Sequence[Device]) -> bool:
    """Whether the topology can choose among these devices: known for each, none in MIG mode
    (a MIG instance is a slice of one GPU; the matrix links whole GPUs)."""
    return (
        bool(topology)
        and not any(d.mig for d in devices)
        and topology.covers([d.uuid for d in devices])
    )


class Search:
    """How hard to look: every set while there are at most `exact`; beyond, the greedy search
    from at most `seeds` devices, each grown among its `near` strongest-linked free peers (and
    those linked as strongly as the last of them). Config's topology_* values."""

    def __init__(self, exact: int = 500, seeds: int = 8, near: int = 8) -> None:
        self.exact, self.seeds, self.near = exact, seeds, near


def best(
    topology: Topology,
    free: Sequence[Device],
    count: int,
    prefer: Prefer,
    link: str | None = None,
    search: Search | None = None,
) -> list[Device] | None:
    """The best-connected `count` of `free` (in device order) by the rule above, meeting
    `link`; None if no such set is free. Needs `usable(topology, free)`. `search`: how hard to
    look (Config's topology_* values; Search's defaults when None)."""
    if count <= 0:
        return []
    search = search or Search()
    pools: list[Sequence[Device]] = [free]
    if link == "numa":
        nodes: dict[str | None, list[Device]] = {}
        for device in free:
            nodes.setdefault(topology.node(device.uuid), []).append(device)
        pools = [pool for node, pool in nodes.items() if node is not None]
    floor = NVLINK + 1 if link == "nvlink" else 0
    prefs = {d.uuid: prefer(d) for d in free}
    found = [
        chosen
        for pool in pools
        if len(pool) >= count
        for chosen in [_search(topology, pool, count, prefs, floor, search)]
        if chosen
    ]
    if not found:
        return None
    return sorted(min(found, key=lambda s: _key(topology, list(s), prefs)), key=lambda d: d.number)


def _key(
    topology: Topology, devices: Sequence[Device], prefs: Mapping[str, tuple[int, float]]
) -> tuple[object, ...]:
    """How a set ranks, lower first: its links, then the tie-breaks."""
    mine = [prefs[d.uuid] for d in devices]
    return (
        topology.score(devices),
        sum(p[0] for p in mine),
        max(p[1] for p in mine),
        sorted(d.number for d in devices),
    )


def _search(
    topology: Topology,
    pool: Sequence[Device],
    count: int,
    prefs: Mapping[str, tuple[int, float]],
    floor: int,
    search: Search,
) -> list[Device] | None:
    """The best set of `pool` with no link below `floor`: every set when they are few, else
    the greedy search."""
    if math.comb(len(pool), count) <= search.exact:
        rows = topology._strength
        scored = []
        for chosen in itertools.combinations(pool, count):
            links = sorted(rows[a.uuid][b.uuid] for a, b in itertools.combinations(chosen, 2))
            if floor and count > 1 and links[0] < floor:
                continue
            scored.append((tuple(-s for s in links), chosen))
        if not scored:
            return None
        top = min(score for score, _ in scored)
        return list(
            min(
                (c for score, c in scored if score == top),
                key=lambda c: _key(topology, list(c), prefs),
            )
        )
    by_uuid = {d.uuid: d for d in pool}
    grown = [
        _grow(topology, seed, near, count, prefs, floor)
        for seed, near in _seeds(topology, by_uuid, count, prefs, search)
    ]
    sets = [s for s in grown if s is not None]
    return min(sets, key=lambda s: _key(topology, s, prefs)) if sets else None


def _seeds(
    topology: Topology,
    pool: Mapping[str, Device],
    count: int,
    prefs: Mapping[str, tuple[int, float]],
    search: Search,
) -> list[tuple[Device, list[Device]]]:
    """Where the greedy searches start, each with the free peers it grows among: one device
    of each kind (twins search alike), those whose `count - 1`-th strongest free link is
    strongest first (no set holding a device is linked better than that), then as the choice's
    ties go (the user's last, then the longest released), at most `seeds`."""
    kinds: dict[int, tuple[tuple[object, ...], Device]] = {}
    for uuid, device in pool.items():
        kind = topology.kind(uuid)
        if kind in kinds:
            continue
        bound, seen = 0, 0
        for strength_, peer in topology.order(uuid):
            if peer in pool:
                seen += 1
                if seen == count - 1:
                    bound = strength_
                    break
        kinds[kind] = ((-bound, prefs[uuid][0], prefs[uuid][1], device.number), device)
    ranked = sorted(kinds.values(), key=lambda k: k[0])[: search.seeds]
    return [
        (device, _near(topology, device.uuid, pool, max(search.near, count - 1)))
        for _, device in ranked
    ]


def _near(topology: Topology, uuid: str, pool: Mapping[str, Device], most: int) -> list[Device]:
    """The device's `most` strongest-linked free peers, and those linked as strongly as the
    last of them (up to twice as many: ties are told apart by the preference)."""
    near: list[Device] = []
    last = None
    for strength_, peer in topology.order(uuid):
        if peer not in pool:
            continue
        if len(near) >= most and (strength_ != last or len(near) >= 2 * most):
            break
        near.append(pool[peer])
        last = strength_
    return near


def _grow(
    topology: Topology,
    seed: Device,
    near: list[Device],
    count: int,
    prefs: Mapping[str, tuple[int, float]],
    floor: int,
) -> list[Device] | None:
    """From `seed`, add the peer whose weakest link to those chosen is strongest (then whose
    links sum highest, then the preferred) until `count`; None below `floor`."""
    chosen = [seed]
    rest = list(near)
    row = topology._strength[seed.uuid]
    weakest = [row.get(d.uuid, 0) for d in rest]
    total = list(weakest)
    rank = [(-prefs[d.uuid][0], -prefs[d.uuid][1]) for d in rest]
    while len(chosen) < count:
        if not rest:
            return None
        at = max(range(len(rest)), key=lambda i: (weakest[i], total[i], rank[i]))
        if weakest[at] < floor:
            return None
        added = rest.pop(at)
        weakest.pop(at), total.pop(at), rank.pop(at)
        chosen.append(added)
        row = topology._strength[added.uuid]
        for i, device in enumerate(rest):
            s = row.get(device.uuid, 0)
            total[i] += s
            if s < weakest[i]:
                weakest[i] = s
    return chosen
