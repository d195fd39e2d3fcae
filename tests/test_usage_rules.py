"""The usage categories and reports, as pure rules: each category by hand, the time split between
the parties on a GPU, the report's order and shares, the /usage query's mistakes, and what a
caller sees of the keys under --hide-users."""

import asyncio
import time
from dataclasses import replace as changed

import pytest
from helpers import FakeClock, async_test, lease_manager

from patroller.core.devices import Inventory
from patroller.core.errors import BadRequest
from patroller.core.health import HealthBook, Reading
from patroller.core.identity import Identity
from patroller.core.jobs import Job, billed_to
from patroller.core.usage import (
    CATEGORIES,
    NOBODY,
    GpuSample,
    Party,
    Present,
    classify,
    party_of,
    summarize,
)
from patroller.http import query
from patroller.http.hiding import Viewer
from patroller.http.usage import keys_seen
from patroller.observe.signals import Sample
from patroller.observe.tally import Tally
from patroller.observe.testmode import synthetic_inventory
from patroller.state.pseudonyms import Pseudonyms
from patroller.state.usage.sampler import UsageSampler

ALICE = Party(user="alice", account="alice")
BOB = Party(user="bob", account="bob")
JOB = Party(user="carol", account="carol", job="4242", slurm_account="physics")


def gpu(**fields):
    """A sample of 60 s of GPU 0 (free unless told otherwise)."""
    return GpuSample(**{"uuid": "GPU-0", "number": 0, "seconds": 60.0, "state": "free", **fields})


def shares(sample):
    return {
        (category, party.user): round(seconds, 6) for category, party, seconds in classify(sample)
    }


def test_a_free_gpu_is_free_for_nobody():
    assert classify(gpu()) == [("free", NOBODY, 60.0)]


@pytest.mark.parametrize("state", ["lost", "withheld"])
def test_a_lost_or_withheld_gpu_is_lost_for_its_holder_whatever_runs(state):
    sample = gpu(
        state=state,
        holder=ALICE,
        reserved=True,
        readings=60,
        busy=60,
        present=(Present(ALICE, own=True),),
    )
    assert classify(sample) == [("lost", ALICE, 60.0)]


def test_a_reservation_with_no_process_is_reserved_unused():
    sample = gpu(state="reserved", hold="lease", holder=ALICE, reserved=True, readings=60)
    assert shares(sample) == {("reserved_unused", "alice"): 60.0}


def test_the_holders_process_is_active_while_the_sm_is_busy_and_idle_held_otherwise():
    """45 of 60 readings at or over the threshold: 45 s active, 15 s idle-held."""
    sample = gpu(
        state="claimed",
        hold="lease",
        holder=ALICE,
        reserved=True,
        readings=60,
        busy=45,
        present=(Present(ALICE, own=True, pids=(7,)),),
    )
    assert shares(sample) == {("active", "alice"): 45.0, ("idle_held", "alice"): 15.0}


def test_computing_without_a_reservation_is_unreserved():
    taken = gpu(
        state="claimed",
        hold="lease",
        holder=ALICE,
        reserved=False,
        readings=10,
        busy=10,
        present=(Present(ALICE, own=True),),
    )
    assert shares(taken) == {("unreserved", "alice"): 60.0}
    unheld = gpu(state="free", readings=10, busy=5, present=(Present(BOB, own=True),))
    assert shares(unheld) == {("unreserved", "bob"): 30.0, ("idle_held", "bob"): 30.0}


def test_a_process_that_does_not_compute_holds_the_gpu_idle():
    sample = gpu(
        state="claimed",
        hold="process",
        holder=ALICE,
        reserved=True,
        readings=60,
        busy=0,
        present=(Present(ALICE, own=True),),
    )
    assert shares(sample) == {("idle_held", "alice"): 60.0}


def test_an_intruder_trespasses_and_the_holder_without_a_process_shares_the_rest_unused():
    sample = gpu(
        state="shared",
        hold="lease",
        holder=ALICE,
        reserved=True,
        readings=60,
        busy=60,
        present=(Present(BOB, own=False),),
    )
    assert shares(sample) == {("reserved_unused", "alice"): 30.0, ("trespass", "bob"): 30.0}


def test_the_parties_on_a_gpu_share_its_time_equally():
    """alice's own process computes half the time, bob and a job's process intrude: a third
    each; the holder has a process there, so no share of her own besides."""
    sample = gpu(
        state="shared",
        hold="lease",
        holder=Party(user="alice"),
        reserved=True,
        readings=4,
        busy=2,
        present=(Present(ALICE, own=True), Present(BOB, own=False), Present(JOB, own=False)),
    )
    assert shares(sample) == {
        ("active", "alice"): 10.0,
        ("idle_held", "alice"): 10.0,
        ("trespass", "bob"): 20.0,
        ("trespass", "carol"): 20.0,
    }


def test_with_no_sm_reading_a_process_is_taken_as_computing():
    """A MIG device, or a driver that prints `-`: nobody is called idle on no evidence."""
    sample = gpu(
        state="claimed",
        hold="slurm",
        holder=JOB,
        reserved=True,
        readings=0,
        present=(Present(JOB, own=True),),
    )
    assert shares(sample) == {("active", "carol"): 60.0}


@pytest.mark.parametrize(
    "sample",
    [
        gpu(),
        gpu(
            state="shared",
            holder=ALICE,
            reserved=True,
            readings=7,
            busy=3,
            present=(Present(ALICE, own=True), Present(BOB, own=False)),
        ),
        gpu(
            state="shared",
            holder=ALICE,
            reserved=False,
            readings=3,
            busy=1,
            present=(Present(BOB, own=False), Present(JOB, own=False)),
        ),
        gpu(state="lost", seconds=13.7),
    ],
)
def test_the_shares_add_up_to_the_interval(sample):
    found = classify(sample)
    assert abs(sum(s for _, _, s in found) - sample.seconds) < 1e-9
    assert {category for category, _, _ in found} <= set(CATEGORIES)


def test_a_party_is_the_user_with_the_account_job_and_pod_of_the_process():
    slurm = Identity(
        user="carol",
        source="slurm",
        account="carol",
        uid=1003,
        job=(("id", "4242"), ("step", "0")),
    )
    assert party_of(slurm, "physics") == JOB
    pod = Identity(
        user="dave@example.org", source="pod", pod=(("namespace", "ml"), ("name", "train-0"))
    )
    assert party_of(pod) == Party(user="dave@example.org", namespace="ml", pod="train-0")


def test_a_job_is_billed_to_the_job_maps_account_never_to_the_identitys_own():
    # An identity that carries an account of its own (as an old lease book's may, read from
    # the process's environment) is billed to the map's, or to none where the map lists no
    # such job, or lists it for another uid.
    said = Identity(
        user="carol",
        source="slurm",
        account="carol",
        uid=1003,
        job=(("id", "4242"), ("step", "0"), ("account", "physics")),
    )
    mapped = Job(id="4242", uid=1003, user="carol", account="vision-lab", partition="gpu")
    assert party_of(said) == changed(JOB, slurm_account="")
    assert billed_to(said, [mapped]) == "vision-lab"
    assert billed_to(said, [Job(id="77", account="physics")]) == ""
    assert billed_to(said, [changed(mapped, uid=1004)]) == ""
    assert billed_to(said, [changed(mapped, account=None)]) == ""
    assert billed_to(said, ()) == ""


def test_a_report_orders_keys_by_use_and_gives_shares_of_the_whole():
    report = summarize(
        [
            ("alice", "active", 3600.0),
            ("alice", "idle_held", 3600.0),
            ("bob", "reserved_unused", 7200.0 + 360.0),
            (None, "free", 7200.0),
            ("carol", "trespass", 1800.0),
        ]
    )
    assert [row["key"] for row in report["rows"]] == ["bob", "alice", "carol", None]
    alice = report["rows"][1]
    assert alice["hours"]["active"] == 1.0 and alice["gpu_hours"] == 2.0
    assert alice["share"] == round(7200 / 23760, 4)
    assert report["total"]["gpu_hours"] == 6.6
    assert report["total"]["shares"]["free"] == round(7200 / 23760, 4)
    assert set(report["total"]["hours"]) == set(CATEGORIES)
    days = summarize(
        [("2026-11-02", "free", 1.0), ("2026-11-01", "active", 2.0)], chronological=True
    )
    assert [row["key"] for row in days["rows"]] == ["2026-11-01", "2026-11-02"]
    assert summarize([])["total"]["shares"]["active"] == 0.0


def test_a_report_adds_up_each_key_and_breaks_ties_by_time_held_then_by_name():
    report = summarize(
        [
            ("zed", "future_category", 50.0),  # a category a later version added: skipped
            ("bob", "active", 1.0),
            ("bob", "active", 1.0),  # added up, not replaced
            ("amy", "active", 2.0),
            ("amy", "free", 10.0),  # as used as bob; more time in all
            (None, "active", 2.0),
            ("cal", "active", 2.0),  # as used as bob, unnamed last
            ("dan", "free", 0.25),
        ]
    )
    assert [row["key"] for row in report["rows"]] == ["amy", "bob", "cal", None, "dan"]
    bob = report["rows"][1]
    assert bob["hours"]["active"] == bob["gpu_hours"] == 0.000556  # 2 s, to 6 places
    assert report["total"]["hours"]["active"] == 0.002222
    assert report["total"]["gpu_hours"] == 0.005069  # 18.25 s
    assert report["rows"][-1]["share"] == round(0.25 / 18.25, 4)
    days = summarize(
        [(None, "active", 1.0), ("2026-11-02", "active", 2.0), ("2026-11-01", "active", 0.5)],
        chronological=True,
    )
    assert [row["key"] for row in days["rows"]] == ["2026-11-01", "2026-11-02", None]
    half = summarize([("amy", "active", 0.5)])  # less than a second in all: a share all the same
    assert half["rows"][0]["share"] == 1.0 and half["total"]["shares"]["active"] == 1.0


def test_a_report_compares_use_and_all_gpu_time_to_the_microsecond():
    keys = lambda report: [row["key"] for row in report["rows"]]
    # used: 1.4 s against 1.2, whatever the rest (not a tie at whole seconds)
    assert keys(
        summarize([("ann", "active", 1.2), ("ann", "free", 9.0), ("bob", "active", 1.4)])
    ) == ["bob", "ann"]
    # a use that differs under a microsecond is a tie: all GPU-time decides
    assert keys(
        summarize([("ann", "active", 1.0000001), ("bob", "active", 1.0), ("bob", "free", 4.0)])
    ) == ["bob", "ann"]
    # the same use: all GPU-time, 4.4 s against 4.2 (not a tie at whole seconds); under a
    # microsecond apart, a tie, and the key decides, whichever came first
    assert keys(
        summarize(
            [
                ("bob", "active", 1.0),
                ("bob", "free", 3.4),
                ("cat", "active", 1.0),
                ("cat", "free", 3.2000001),
                ("ann", "active", 1.0),
                ("ann", "free", 3.2),
            ]
        )
    ) == ["bob", "ann", "cat"]


def test_the_tally_sums_the_readings_between_two_takes():
    inventory = synthetic_inventory(2)
    tally = Tally(inventory, busy_sm=1.0)
    uuid = inventory.by_number(0).uuid
    for sm, fb in ((0, 100), (50, 300), (1, 200), (None, 200)):
        tally._on_sample(None, Sample(uuid, {"sm": sm, "mem": 10, "fb": fb}, 0.0))
    tally._on_sample(None, Sample("GPU-not-here", {"sm": 99}, 0.0))
    figures = tally.take(uuid)
    assert (figures.readings, figures.busy) == (3, 2)  # the `-` reading has no SM figure
    assert (figures.sm_mean, figures.sm_max) == (17.0, 50.0)
    assert (figures.fb_mean, figures.fb_max, figures.mem_max) == (200.0, 300.0, 10.0)
    fresh = tally.take(uuid)  # a fresh start: nothing read since, the last reading carried
    assert (fresh.readings, fresh.busy, fresh.sm_mean) == (1, 1, None)


# -- the query ----------------------------------------------------------------------------------

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def args(**given):
    return {name: [value.encode()] for name, value in given.items()}


def test_a_range_is_durations_before_now_or_iso_dates_and_times():
    asked = query.parse_usage(args(since="7d", by="gpu"), NOW)
    assert (asked.since, asked.until, asked.by) == (NOW - 7 * 86400, NOW, "gpu")
    asked = query.parse_usage(args(since="2027-01-01", until="2027-01-02T12:00:00Z"), NOW)
    assert asked.since == 1798761600.0 and asked.until == 1798761600.0 + 36 * 3600
    assert query.parse_usage(args(since="2027-01-15T07:00:00+00:00"), NOW).since == NOW - 3600
    assert query.parse_usage({}, NOW) == query.UsageRange(NOW - 7 * 86400, NOW, "user")


@pytest.mark.parametrize(
    "given,field",
    [
        (dict(since="yesterday"), "since"),
        (dict(until="7 days"), "until"),
        (dict(since="-7d"), "since"),
        (dict(since="2027-01-01T08:00:00"), "since"),  # no zone
        (dict(since="2027-02-01"), "since"),  # in the future
        (dict(since="1d", until="2027-01-16"), "until"),  # in the future
        (dict(since="1d", until="2d"), "since"),  # reversed
        (dict(since="2027-01-10", until="2027-01-10"), "since"),  # empty
        (dict(by="team"), "by"),
        (dict(sincee="7d"), "sincee"),
    ],
)
def test_a_bad_range_is_refused_naming_the_field(given, field):
    with pytest.raises(BadRequest) as refused:
        query.parse_usage(args(**given), NOW)
    assert refused.value.data["field"] == field
    assert field in refused.value.message


# -- --hide-users ------------------------------------------------------------------------------

ROWS = [
    ("alice", "alice", "active", 10.0),
    ("bob", "bob", "trespass", 5.0),
    (None, None, "free", 1.0),
]


@pytest.fixture
def pseudonyms():
    made = Pseudonyms(None, 16)
    made.open()
    return made


def test_a_caller_sees_their_own_name_and_everyone_elses_pseudonym(pseudonyms):
    seen = keys_seen("user", Viewer("alice"), pseudonyms)(ROWS)
    assert seen == [
        ("alice", "active", 10.0),
        (pseudonyms.of("bob"), "trespass", 5.0),
        (None, "free", 1.0),
    ]
    assert keys_seen("user", Viewer("root", everything=True), pseudonyms)(ROWS) == [
        (key, category, seconds) for key, _, category, seconds in ROWS
    ]
    nobody = keys_seen("user", Viewer(), pseudonyms)(ROWS)
    assert "alice" not in str(nobody) and "bob" not in str(nobody)


def test_an_account_or_job_is_hidden_unless_every_user_under_it_may_be_seen(pseudonyms):
    rows = [
        ("root", "alice", "active", 1.0),
        ("root", "bob", "active", 1.0),
        ("alice", "alice", "idle_held", 1.0),
        (None, None, "free", 1.0),
    ]
    seen = keys_seen("account", Viewer("alice"), pseudonyms)(rows)
    assert [key for key, _, _ in seen] == [pseudonyms.of("root")] * 2 + ["alice", None]
    jobs = keys_seen("job", Viewer("bob"), pseudonyms)(
        [("4242", "alice", "active", 1.0), ("4343", "bob", "active", 1.0)]
    )
    hidden = jobs[0][0]
    assert hidden.startswith("job-") and len(hidden) == 16 and "4242" not in hidden
    assert jobs[1][0] == "4343"
    gpus = keys_seen("gpu", Viewer("bob"), pseudonyms)([("GPU-1", "alice", "active", 1.0)])
    assert gpus == [("GPU-1", "active", 1.0)]


# -- the sampler: a hold as a sample ------------------------------------------------------------


class Collected:
    """The usage store's side the sampler sees: what it is handed."""

    def __init__(self):
        self.intervals = []

    def put(self, at, samples):
        self.intervals.append((at, samples))


@async_test
async def test_each_gpu_is_sampled_as_its_hold_stands_with_the_readings_of_the_interval():
    clock = FakeClock()
    devices = synthetic_inventory(5)
    lost = devices.by_number(4).uuid
    inventory = Inventory([changed(d, lost=True) if d.uuid == lost else d for d in devices])
    leases = lease_manager(clock, inventory)
    leases.devices_changed()
    uuid = [d.uuid for d in inventory]
    alice = Identity(user="alice", source="host", account="alice", uid=1001)
    in_container = Identity(
        user="alice",
        source="container",
        account="root",
        uid=0,
        container=("3f2a9c1b7d4e", "train"),
    )
    bob = Identity(user="bob", source="host", account="bob", uid=1002)
    [granted] = leases.request(alice, {"gpu": 1})
    leases.process_started(granted.uuid, 10, alice)
    leases.process_started(granted.uuid, 11, alice)
    leases.process_started(granted.uuid, 12, in_container)
    leases.process_started(granted.uuid, 13, bob)
    taken = next(u for u in uuid if u != granted.uuid)
    leases.process_started(taken, 20, bob)  # bob takes one by computing
    silent = next(u for u in uuid if u not in (granted.uuid, taken, lost))
    leases.withhold(silent, "printed nothing for 2 s")
    sick = next(u for u in uuid if u not in (granted.uuid, taken, lost, silent))
    health = HealthBook().read(sick, 4, Reading(remap_pending=True))
    leases.withhold(sick, health.reason, "health", health)
    tally, store = Tally(inventory, busy_sm=1.0), Collected()
    sampler = UsageSampler(inventory, leases, tally, store, 60.0, clock=clock, wall=lambda: 5e9)
    sampler.start()
    for sm in (0, 30, 60):
        tally._on_sample(None, Sample(granted.uuid, {"sm": sm, "mem": 5, "fb": 1000}, 0.0))
    clock.advance(60)
    sampler.sample()
    [(at, samples)] = store.intervals
    found = {s.uuid: s for s in samples}
    assert at == 5e9 and len(samples) == 5 and all(s.seconds == 60 for s in samples)
    mine = found[granted.uuid]
    assert (mine.state, mine.hold, mine.reserved) == ("shared", "lease", True)
    assert mine.holder == Party(user="alice", account="alice")
    assert [
        (p.party.user, p.party.account, p.own, p.pids, p.containers) for p in mine.present
    ] == [
        ("alice", "alice", True, (10, 11), ()),
        ("alice", "root", True, (12,), ("train",)),
        ("bob", "bob", False, (13,), ()),
    ]
    assert (mine.readings, mine.busy, mine.sm_mean, mine.fb_max) == (3, 2, 30.0, 1000.0)
    assert (found[taken].state, found[taken].reserved) == ("claimed", False)
    assert found[silent].state == "withheld" and found[lost].state == "lost"
    assert classify(found[lost]) == [("lost", NOBODY, 60.0)]
    assert found[sick].state == "unhealthy"  # the reason kept: its health, not a silence
    assert classify(found[sick]) == [("lost", NOBODY, 60.0)]
    sampler.stop()  # the interval so far: none has passed on this clock
    assert len(store.intervals) == 1


@async_test
async def test_the_sampler_counts_each_interval_from_its_start_to_its_stop():
    clock = FakeClock()
    devices = synthetic_inventory(2)
    nameless = devices.by_number(1).uuid
    inventory = Inventory([changed(d, name=None) if d.uuid == nameless else d for d in devices])
    leases = lease_manager(clock, inventory)
    leases.devices_changed()
    named = devices.by_number(0).uuid
    tally, store = Tally(inventory, busy_sm=1.0), Collected()
    sampler = UsageSampler(inventory, leases, tally, store, 60.0, clock=clock, wall=lambda: 5e9)
    tally._on_sample(None, Sample(named, {"sm": 99, "mem": 99, "fb": 9999}, 0.0))  # before
    sampler.start()
    for sm, mem, fb in ((10, 4, 1000), (50, 8, 3000)):
        tally._on_sample(None, Sample(named, {"sm": sm, "mem": mem, "fb": fb}, 0.0))
    clock.advance(0.5)  # an interval shorter than a second counts too
    sampler.sample()
    clock.advance(60)
    sampler.sample()
    clock.advance(10)
    sampler.stop()  # the interval so far
    sampler.stop()  # stopped already: nothing more
    assert sampler.samples == 3
    assert [[s.seconds for s in samples] for _, samples in store.intervals] == [
        [0.5, 0.5],
        [60, 60],
        [10, 10],
    ]
    first = {s.uuid: s for s in store.intervals[0][1]}
    figures = first[named]  # the readings of the interval alone, not those before the start
    assert (
        figures.readings,
        figures.busy,
        figures.sm_mean,
        figures.sm_max,
        figures.mem_mean,
        figures.mem_max,
        figures.fb_mean,
        figures.fb_max,
    ) == (2, 2, 30.0, 50.0, 6.0, 8.0, 2000.0, 3000.0)
    assert (figures.name, first[nameless].name) == ("NVIDIA A100-SXM4-80GB", "")
    assert (first[nameless].state, first[nameless].hold, first[nameless].holder) == (
        "free",
        None,
        None,
    )


@async_test
async def test_the_sampler_samples_every_interval_on_the_event_loop():
    inventory = synthetic_inventory(1)
    leases = lease_manager(FakeClock(), inventory)
    store = Collected()
    sampler = UsageSampler(inventory, leases, Tally(inventory, busy_sm=1.0), store, 0.2)
    sampler.start()
    deadline = time.monotonic() + 20
    while len(store.intervals) < 2:
        assert time.monotonic() < deadline, "no two samples within 20 s"
        await asyncio.sleep(0.01)
    sampler.stop()
    # the timer fires an interval after the start, never sooner (later on a busy machine)
    assert store.intervals[0][1][0].seconds >= 0.2 * 0.95


def test_a_sampler_not_started_samples_nothing_and_stops_quietly():
    inventory = synthetic_inventory(1)
    store = Collected()
    sampler = UsageSampler(
        inventory,
        lease_manager(FakeClock(), inventory),
        Tally(inventory, busy_sm=1.0),
        store,
        60.0,
    )
    sampler.sample()  # no interval has begun
    sampler.stop()
    assert (sampler.samples, store.intervals) == (0, [])


def test_an_interval_with_the_stream_down_carries_the_last_reading():
    # As found: after dmon restarted, 2 intervals had no SM reading on any GPU and were counted
    # as computing, by the rule meant for MIG devices that print no SM figure.
    inventory = synthetic_inventory(3)
    idle, busy, mig = (inventory.by_number(n).uuid for n in range(3))
    tally = Tally(inventory, busy_sm=1.0)
    for sm in (50, 0):  # the last reading idle
        tally._on_sample(None, Sample(idle, {"sm": sm, "fb": 100}, 0.0))
    for sm in (0, 80):  # the last reading busy
        tally._on_sample(None, Sample(busy, {"sm": sm, "fb": 100}, 0.0))
    tally._on_sample(None, Sample(mig, {"sm": None, "fb": 100}, 0.0))  # `-`: no SM figure
    first = {u: tally.take(u) for u in (idle, busy, mig)}
    assert [(first[u].readings, first[u].busy) for u in (idle, busy, mig)] == [
        (2, 1),
        (2, 1),
        (0, 0),
    ]
    # the stream down for a whole interval: no sample at all
    down = {u: tally.take(u) for u in (idle, busy, mig)}
    assert [(down[u].readings, down[u].busy) for u in (idle, busy, mig)] == [
        (1, 0),
        (1, 1),
        (0, 0),
    ]
    assert down[idle].sm_mean is None  # nothing was read: no figure is made up
    holder = Party(user="alice")
    mine = Present(holder, True, (10,))
    shown = {
        u: shares(
            gpu(
                uuid=u,
                state="claimed",
                hold="lease",
                holder=holder,
                reserved=True,
                present=(mine,),
                readings=down[u].readings,
                busy=down[u].busy,
            )
        )
        for u in (idle, busy, mig)
    }
    assert shown[idle] == {("idle_held", "alice"): 60.0}  # as its last reading: not computing
    assert shown[busy] == {("active", "alice"): 60.0}
    assert shown[mig] == {("active", "alice"): 60.0}  # MIG: no SM figure ever, computing
    tally._on_sample(None, Sample(idle, {"sm": 90}, 0.0))  # back: its own readings again
    back = tally.take(idle)
    assert (back.readings, back.busy, back.sm_mean) == (1, 1, 90.0)
