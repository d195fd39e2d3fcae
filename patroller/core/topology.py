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
the lowest numbers. Every set is weighed when there are at most `exact` of them; beyond, a
greedy search from every kind of device (grown by its strongest weakest link) weighs a few
sets only, and may miss the best (documented as such).

Pure: no I/O.
"""
from __future__ import annotations

import itertools
import math
import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from patroller.core.devices import Device

PCIE = {"PIX": 5, "PXB": 4, "PHB": 3, "NODE": 2, "SYS": 1, "SOC": 1}
NVLINK = 100  # NV<n> is NVLINK + n: above every PCIe path
_NV = re.compile(r"NV(\d+)$")
LINKS = ("nvlink", "numa")  # what a request may insist on

# A device's preference among equals, lower first: (not the user's last, released at).
Prefer = Callable[[Device], Tuple[int, float]]


def strength(word: str) -> int:
    """How good a link is (0: a word Patroller does not know, the worst)."""
    found = _NV.match(word)
    if found:
        return NVLINK + int(found.group(1))
    return PCIE.get(word, 0)


class Topology:
    """The link between every two devices (by uuid) and each device's NUMA node. Empty:
    unknown (no `topo -m`, or one that did not match the devices)."""

    def __init__(self, links: Mapping[Tuple[str, str], str] = {},  # noqa: B006 (read only)
                 numa: Mapping[str, Optional[str]] = {}, cpus: Mapping[str, Optional[str]] = {},
                 why: Optional[str] = None) -> None:
        self.links: Dict[str, Dict[str, str]] = {}
        for (a, b), word in links.items():
            self.links.setdefault(a, {})[b] = word
            self.links.setdefault(b, {})[a] = word
        self._strength = {a: {b: strength(w) for b, w in row.items()}
                          for a, row in self.links.items()}
        self.numa = dict(numa)  # uuid -> its NUMA node ("0"), None where not said
        self.cpus = dict(cpus)  # uuid -> its CPU affinity ("0-23,48-71")
        self.why = why  # why it is unknown, when it is
        self._kinds: Dict[str, int] = {}  # uuid -> a number shared by devices linked alike

    def __bool__(self) -> bool:
        return bool(self.links)

    def covers(self, uuids: Sequence[str]) -> bool:
        """Whether every two of these devices have a link known."""
        return all(b in self.links.get(a, {}) for a, b in itertools.combinations(uuids, 2))

    def link(self, a: str, b: str) -> Optional[str]:
        """The word of the matrix between two devices, or None."""
        return self.links.get(a, {}).get(b)

    def node(self, uuid: str) -> Optional[str]:
        """Where the device sits: its NUMA node, else its CPU affinity, else None."""
        numa = self.numa.get(uuid)
        if numa is not None:
            return numa
        cpus = self.cpus.get(uuid)
        return None if cpus is None else f"cpus {cpus}"

    def groups(self, uuids: Sequence[str]) -> List[List[str]]:
        """The devices in groups linked by NVLink to one another (each peer of each), in order."""
        seen: Dict[str, int] = {}
        groups: List[List[str]] = []
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

    def kind(self, uuid: str) -> int:
        """Devices of one kind are linked alike to every other (twins): a search from one of
        them is a search from all (a DGX's eight GPUs are of one kind)."""
        if not self._kinds:
            self._kinds = self._twins()
        return self._kinds.get(uuid, -1)

    def _twins(self) -> Dict[str, int]:
        """Each device's kind: those whose links to every third device are the same share one.
        Only devices with the same links in some order can be twins: compared within those."""
        alike: Dict[Tuple[int, ...], List[str]] = {}
        for a, row in self._strength.items():
            alike.setdefault(tuple(sorted(row.values())), []).append(a)
        kinds: Dict[str, int] = {}
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

    def fits(self, devices: Sequence[Device], link: Optional[str]) -> bool:
        """Whether these devices together are what `link` insists on."""
        uuids = [d.uuid for d in devices]
        if link == "nvlink":
            return all(self._strength.get(a, {}).get(b, 0) > NVLINK
                       for a, b in itertools.combinations(uuids, 2))
        if link == "numa":
            return len({self.node(u) for u in uuids}) == 1 and self.node(uuids[0]) is not None
        return True

    def score(self, devices: Sequence[Device]) -> Tuple[int, ...]:
        """The set's links from weakest to strongest, negated: lower is better connected."""
        links = sorted(self._strength[a.uuid].get(b.uuid, 0)
                       for a, b in itertools.combinations(devices, 2))
        return tuple(-s for s in links)


def usable(topology: Topology, devices: Sequence[Device]) -> bool:
    """Whether the topology can choose among these devices: known for each, none in MIG mode
    (a MIG instance is a slice of one GPU; the matrix links whole GPUs)."""
    return bool(topology) and not any(d.mig for d in devices) and \
        topology.covers([d.uuid for d in devices])


def best(topology: Topology, free: Sequence[Device], count: int, prefer: Prefer,
         link: Optional[str] = None, exact: int = 500) -> Optional[List[Device]]:
    """The best-connected `count` of `free` (in device order) by the rule above, meeting
    `link`; None if no such set is free. Needs `usable(topology, free)`."""
    if count <= 0:
        return []
    pools: List[Sequence[Device]] = [free]
    if link == "numa":
        nodes: Dict[Optional[str], List[Device]] = {}
        for device in free:
            nodes.setdefault(topology.node(device.uuid), []).append(device)
        pools = [pool for node, pool in nodes.items() if node is not None]
    floor = NVLINK + 1 if link == "nvlink" else 0
    found = [chosen for pool in pools if len(pool) >= count
             for chosen in [_search(topology, pool, count, prefer, floor, exact)] if chosen]
    if not found:
        return None
    return sorted(min(found, key=lambda s: _key(topology, s, prefer)), key=lambda d: d.number)


def _key(topology: Topology, devices: Sequence[Device], prefer: Prefer) -> Tuple[object, ...]:
    """How a set ranks, lower first: its links, then the tie-breaks."""
    prefs = [prefer(d) for d in devices]
    return (topology.score(devices), sum(p[0] for p in prefs), max(p[1] for p in prefs),
            sorted(d.number for d in devices))


def _search(topology: Topology, pool: Sequence[Device], count: int, prefer: Prefer,
            floor: int, exact: int) -> Optional[List[Device]]:
    """The best set of `pool` with no link below `floor`: every set when they are few, else
    the greedy search."""
    if math.comb(len(pool), count) <= exact:
        sets = (list(s) for s in itertools.combinations(pool, count))
        fitting = [s for s in sets if floor == 0 or count < 2 or -topology.score(s)[0] >= floor]
        return min(fitting, key=lambda s: _key(topology, s, prefer)) if fitting else None
    grown = [_grow(topology, pool, seed, count, prefer, floor) for seed in _seeds(topology, pool)]
    sets = [s for s in grown if s is not None]
    return min(sets, key=lambda s: _key(topology, s, prefer)) if sets else None


def _seeds(topology: Topology, pool: Sequence[Device]) -> List[Device]:
    """One device of each kind in the pool, the preferred first: where the searches start."""
    kinds: Dict[int, Device] = {}
    for device in pool:
        kinds.setdefault(topology.kind(device.uuid), device)
    return list(kinds.values())


def _grow(topology: Topology, pool: Sequence[Device], seed: Device, count: int,
          prefer: Prefer, floor: int) -> Optional[List[Device]]:
    """From `seed`, add the device whose weakest link to those chosen is strongest (then
    whose links sum highest, then the preferred) until `count`; None below `floor`."""
    chosen = [seed]
    rest = [d for d in pool if d is not seed]
    row = topology._strength[seed.uuid]
    weakest = [row.get(d.uuid, 0) for d in rest]
    total = list(weakest)
    rank = [prefer(d) for d in rest]
    while len(chosen) < count:
        if not rest:
            return None
        at = max(range(len(rest)), key=lambda i: (weakest[i], total[i], -rank[i][0], -rank[i][1]))
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
