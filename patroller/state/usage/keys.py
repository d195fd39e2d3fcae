"""The names the usage store keeps, bounded: each cut as a pod's name is (253 characters), the
ids of the parties the writer looked up remembered in a bounded map, and at most
Config.usage_new_parties parties made per interval.

The names of a party (user, host account, Slurm job and account, namespace, pod) and of its
containers come, some of them, from what a user chose: a job's account, a container's label.
Unbounded, 20 processes with unique ~100 KB accounts grew the store by 4 MB and the daemon by
2 MB every 3 s. Cut, each party is at most 6 x 253 characters; bounded per interval, a flood of
new names costs a bounded number of rows an interval; and the map that spares a lookup per
party holds the parties used lately, not every party ever seen.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace

from cachetools import LRUCache

from patroller.core.pods import NAME_CHARS
from patroller.core.usage import NOBODY, GpuSample, Party, Present


def cut_party(party: Party) -> Party:
    """`party` with each name cut to NAME_CHARS characters (the same party when none is
    longer: the common case costs six length checks)."""
    fields = (
        party.user,
        party.account,
        party.job,
        party.slurm_account,
        party.namespace,
        party.pod,
    )
    if all(len(name) <= NAME_CHARS for name in fields):
        return party
    return Party(*(name[:NAME_CHARS] for name in fields))


def cut_sample(sample: GpuSample) -> GpuSample:
    """A sample whose every name is cut (cut_party; containers' names too), so that what
    waits in memory for the writer, and what it writes, is bounded."""
    present = tuple(_cut_present(p) for p in sample.present)
    holder = cut_party(sample.holder) if sample.holder is not None else None
    name = sample.name[:NAME_CHARS]
    if present == sample.present and holder is sample.holder and name == sample.name:
        return sample
    return replace(sample, present=present, holder=holder, name=name)


def _cut_present(present: Present) -> Present:
    party = cut_party(present.party)
    containers = tuple(name[:NAME_CHARS] for name in present.containers)
    if party is present.party and containers == present.containers:
        return present
    return replace(present, party=party, containers=containers)


def fallback(party: Party) -> Party:
    """Where a party over the bound is counted: its host account alone (from the password
    database, so as many as the host has accounts), nobody's if it has none."""
    return Party(user=party.account, account=party.account) if party.account else NOBODY


class Keys:
    """The ids of GPUs and parties already in the file, so that each is looked up once.
    Cleared whenever a transaction fails (an id it made may have been rolled back)."""

    def __init__(self, remembered: int = 1024, new_per_interval: int = 128) -> None:
        self.gpus: dict[str, tuple[int, int, str]] = {}  # uuid -> (id, number, name): few
        self.parties: LRUCache[Party, int] = LRUCache(remembered)
        self.new_per_interval = new_per_interval
        self.overflow = 0  # parties counted under their host account: over the bound
        self._made = 0  # parties made in the interval being written
        self._over: set[Party] = set()  # those over the bound in it (each counted once)

    def clear(self) -> None:
        self.gpus.clear()
        self.parties.clear()

    def interval(self) -> None:
        """An interval's writing begins: its own bound of new parties."""
        self._made = 0
        self._over.clear()

    def gpu(self, db: sqlite3.Connection, sample: GpuSample) -> int:
        known = self.gpus.get(sample.uuid)
        if known is not None and known[1:] == (sample.number, sample.name):
            return known[0]
        db.execute(
            "INSERT INTO gpus (uuid, number, name) VALUES (?, ?, ?) ON CONFLICT (uuid) "
            "DO UPDATE SET number = excluded.number, name = excluded.name",
            (sample.uuid, sample.number, sample.name),
        )
        [found] = db.execute("SELECT id FROM gpus WHERE uuid = ?", (sample.uuid,)).fetchone()
        self.gpus[sample.uuid] = (found, sample.number, sample.name)
        return int(found)

    def party(self, db: sqlite3.Connection, party: Party | None) -> int | None:
        if party is None:
            return None
        known = self.parties.get(party)  # a party remembered is cut already: no need to cut
        if known is not None:
            return known
        party = cut_party(party)
        if party == NOBODY:
            return 0  # the row every file has (schema.py)
        known = self.parties.get(party)
        if known is not None:
            return known
        fields = (
            party.user,
            party.account,
            party.job,
            party.slurm_account,
            party.namespace,
            party.pod,
        )
        where = (
            "SELECT id FROM parties WHERE user = ? AND account = ? AND job = ? "
            "AND slurm_account = ? AND namespace = ? AND pod = ?"
        )
        row = db.execute(where, fields).fetchone()
        if row is None:
            backup = fallback(party)
            if self._made >= self.new_per_interval and backup != party:
                if party not in self._over:
                    self._over.add(party)
                    self.overflow += 1
                return self.party(db, backup)
            db.execute(
                "INSERT INTO parties (user, account, job, slurm_account, namespace, "
                "pod) VALUES (?, ?, ?, ?, ?, ?)",
                fields,
            )
            self._made += 1
            row = db.execute(where, fields).fetchone()
        self.parties[party] = int(row[0])
        return int(row[0])
