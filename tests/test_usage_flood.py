"""A user floods the usage store with distinct long names (as 20 job processes with unique
~100 KB accounts did): on a small real tmpfs the names are cut, new parties are bounded per
interval, the writer's map of parties stays bounded, and the store stops writing while the room
left is the lease book's, so that /request goes on succeeding and the book is written; the
doctor and /metrics say so."""

import json
import os
import sqlite3
import threading
import time
from dataclasses import replace

import pytest
from helpers import async_test, find, running, scrape, until
from test_usage_store import tmpfs

from patroller.config import Config
from patroller.core.pods import NAME_CHARS
from patroller.core.usage import GpuSample, Party, Present
from patroller.doctor.places import check_state, probe_state
from patroller.state.bookfiles import FILE as BOOK
from patroller.state.usage import schema, tables
from patroller.state.usage.keys import Keys
from patroller.state.usage.store import UsageStore

FILE = "usage.sqlite3"
PROCESSES = 20  # job processes a GPU each, each with an account of its own


def flood(n, size=100_000):
    """One interval of the attack: PROCESSES job processes, each with a new ~100 KB account."""
    samples = []
    for p in range(PROCESSES):
        name = f"{n:06d}-{p:02d}-" + "x" * size
        party = Party(
            user="mallory", account="mallory", job=f"{n * PROCESSES + p}", slurm_account=name
        )
        samples.append(
            GpuSample(
                uuid=f"GPU-flood-{p:02d}",
                number=p,
                seconds=1.0,
                state="claimed",
                hold="slurm",
                holder=party,
                reserved=True,
                present=(Present(party, True, (1000 + p,), (name,)),),
                name="A100",
            )
        )
    return samples


def leave(directory, room):
    """Take the free space of `directory`'s filesystem but `room` bytes."""
    found = os.statvfs(directory)
    with open(os.path.join(directory, "filler"), "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(0, found.f_bavail * found.f_frsize - room))


@pytest.mark.errors_expected  # the store's failing writes are logged as an error
@async_test
async def test_a_flood_of_distinct_long_names_never_stops_a_reservation(tmp_path):
    with tmpfs(tmp_path / "state", "8m") as state:
        async with running(
            state_dir=str(state),
            usage_interval=3600,
            usage_retry=0.05,
            usage_reserve=2 << 20,
            usage_new_parties=8,
            usage_parties_remembered=32,
        ) as h:
            store = h.services.usage
            n = 0
            while not store.saving_room and store.state != "failing":
                store.put(time.time(), flood(n))
                n += 1
                await until(
                    lambda: store.metrics()["pending"] == 0 or store.state == "failing", timeout=30
                )
                assert n < 5000, store.metrics()
            # everyone can still reserve, and the grant is in the book
            code, body = await h.call("/request?gpu=1&user=alice")
            assert code == 200, (code, body, store.why)
            assert '"alice"' in (state / BOOK).read_text()
            assert store.saving_room and "kept for the lease book" in store.why, store.why
            # the store gives back its write-ahead log's room as it closes and tries again:
            # the rest of the filesystem is taken, as a flood would go on taking it, but for
            # 1 MiB (under the reserve, more than the book needs)
            leave(state, 1 << 20)
            await until(lambda: store.saving_room and store.failures >= 2)
            code, body = await h.call("/request?gpu=1&user=bob")  # and once it is all taken
            assert code == 200, (code, body)
            book = (state / BOOK).read_text()
            assert '"alice"' in book and '"bob"' in book
            # the store and the doctor say why the history waits
            counters = await h.ok("/metrics.json")
            assert counters["usage"]["saving_room"] is True
            assert counters["usage"]["free"] < 2 << 20
            assert counters["usage"]["parties_overflow"] > 0
            found, _, _ = await scrape(h)
            assert find(found, "patroller_usage_saving_room") == [1.0]
            assert find(found, "patroller_usage_parties_overflow_total")[0] > 0
            checked = check_state(probe_state(str(state)), h.services.config)
            assert checked.status == "degraded" and "usage store" in checked.detail, checked
            # memory: the writer's map of parties holds the ones used lately, no more
            assert len(store.writer.keys.parties) <= 32
        # every name written is cut; a bounded number of parties came in each interval
        db = sqlite3.connect(f"file:{state / FILE}?mode=ro", uri=True)
        try:
            longest = db.execute(
                "SELECT MAX(MAX(LENGTH(user), LENGTH(account), LENGTH(job), "
                "LENGTH(slurm_account), LENGTH(namespace), LENGTH(pod))) "
                "FROM parties"
            ).fetchone()[0]
            parties = db.execute("SELECT COUNT(*) FROM parties").fetchone()[0]
            containers = [
                c
                for (text,) in db.execute("SELECT processes FROM samples")
                for p in json.loads(text)
                for c in p["containers"]
            ]
        finally:
            db.close()
        assert longest == NAME_CHARS
        assert all(len(c) <= NAME_CHARS for c in containers) and containers
        assert parties <= 2 + 8 * store.intervals  # nobody, mallory's account, 8 an interval


def test_parties_over_the_bound_are_counted_under_their_host_account(tmp_path):
    db = sqlite3.connect(tmp_path / FILE, isolation_level=None)
    schema.migrate(db)
    keys = Keys(remembered=4, new_per_interval=3)
    tables.write_interval(db, keys, 1000.0, flood(0, size=10))
    assert keys.overflow == PROCESSES - 3  # each counted once, though named three times
    assert len(keys.parties) <= 4
    rows = db.execute(
        "SELECT user, account, job, slurm_account FROM parties WHERE id > 0 ORDER BY id"
    ).fetchall()
    assert len(rows) == 3 + 1 and rows[-1] == ("mallory", "mallory", "", "")
    # the GPU-time is all there, the overflow's under mallory's account
    total = db.execute("SELECT SUM(seconds) FROM hourly").fetchone()[0]
    assert total == PROCESSES * 1.0
    db.close()


def test_names_are_cut_before_they_wait_in_memory():
    store = UsageStore("/nonexistent", replace(Config(), usage_retry=0.05))
    store.writer.thread = threading.Thread()  # as if open: put queues
    store.put(0.0, flood(0))
    _, samples = store.writer.queue.get_nowait()
    for sample in samples:
        assert len(sample.holder.slurm_account) == NAME_CHARS
        assert all(len(c) <= NAME_CHARS for p in sample.present for c in p.containers)
