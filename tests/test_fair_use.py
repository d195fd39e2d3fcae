"""Fair use on the fake clock: per-user limits, the starvation bound, reservations for a
duration, the administrator's release, idle detection, and the audit record."""

import json
import logging
import os
from dataclasses import replace

import pytest
from helpers import lease_manager

from patroller import durations
from patroller.config import Config, load_limits, policy_of
from patroller.config.policy import MAX_LIMITS_BYTES
from patroller.core.devices import Device, Inventory
from patroller.core.errors import Busy, NotYours, OverLimit
from patroller.core.identity import Identity, ProcessRef, named_user
from patroller.core.leases.queue import Waiter, WaitQueue
from patroller.http.views import claims
from patroller.observe.idle import IdleWatch
from patroller.state.audit import AuditLog

LEASE = Config().lease  # the shared factory's
alice, bob, carol = named_user("alice"), named_user("bob"), named_user("carol")
root = Identity(user="root", source="host", account="root", uid=0)


def manager(clock, **policy):
    """The shared factory's manager, under a policy of `policy`."""
    return lease_manager(clock, policy=replace(policy_of(Config()), **policy))


def recorded(leases):
    events = []
    leases.on_event(events.append)
    return events


# -- limits -----------------------------------------------------------------------------------


def test_a_user_cannot_hold_more_than_the_limit_every_way_counted(clock):
    leases = manager(clock, max_per_user=3)
    leases.request(alice, {"gpu": 2})
    leases.process_started(
        leases.inventory.by_number(5).uuid, 4242, alice
    )  # took one by computing
    with pytest.raises(OverLimit) as refused:
        leases.request(alice, {"gpu": 1})
    assert refused.value.data == {"limit": 3, "held": [0, 1, 5], "requested": {"gpu": 1}}
    assert refused.value.message == (
        "alice holds 3 device(s) (0, 1, 5) and asks for 1: the most one user may hold is 3; "
        "release some first (/release?uuid=..., or patroller release NUMBER)"
    )
    leases.request(bob, {"gpu": 3})  # the limit is per user
    leases.release(alice, leases.inventory.by_number(0).uuid)
    assert [d.number for d in leases.request(alice, {"gpu": 1})] == [0]


def test_a_user_who_holds_nothing_is_told_the_limit_without_advice_to_release(clock):
    leases = manager(clock, max_per_user=2)
    with pytest.raises(OverLimit) as refused:
        leases.request(alice, {"gpu": 3})
    assert refused.value.data == {"limit": 2, "held": [], "requested": {"gpu": 3}}
    assert refused.value.message == f"{alice.user} asks for 3: the most one user may hold is 2"


def test_per_user_limits_override_the_default(clock, tmp_path):
    path = tmp_path / "limits.json"
    path.write_text(json.dumps({"alice": 4, "bob": None}))
    leases = manager(clock, max_per_user=1, limits=load_limits(str(path)))
    assert len(leases.request(alice, {"gpu": 4})) == 4
    assert len(leases.request(bob, {"gpu": 3})) == 3  # no limit for bob
    with pytest.raises(OverLimit):
        leases.request(carol, {"gpu": 2})  # the default
    for bad in ("[1, 2]", '{"alice": -1}', '{"alice": "four"}', "{"):
        path.write_text(bad)
        with pytest.raises(ValueError):
            load_limits(str(path))


def test_the_limits_file_is_read_as_the_configuration_file_is(tmp_path):
    """One reader for both (config/regular.py): a missing file, a directory, a FIFO nobody
    writes to (read to its end, it would wait for ever) and a file over the bound are refused
    by name, never waited on."""
    missing = tmp_path / "nope.json"
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"alice": 1, "x": "y" * MAX_LIMITS_BYTES}))
    said = {}
    for path in (missing, tmp_path, fifo, big):
        with pytest.raises(ValueError) as refused:
            load_limits(str(path))
        said[path] = str(refused.value)
    assert said == {
        missing: f"cannot read {missing}: No such file or directory",
        tmp_path: f"{tmp_path} is not a regular file",
        fifo: f"{fifo} is not a regular file",
        big: f"{big} is over {MAX_LIMITS_BYTES} bytes",
    }


def test_a_waiter_over_the_limit_is_refused_and_one_that_grew_over_it_waits_on(clock):
    leases = manager(clock, max_per_user=2, limits={"bob": None})
    leases.request(bob, {"gpu": 8})
    with pytest.raises(OverLimit):
        leases.wait(alice, {"gpu": 3}, lambda d: None)
    got = []
    leases.wait(alice, {"gpu": 2}, got.append)
    leases.wait(carol, {"gpu": 1}, got.append)
    freed = leases.inventory.by_number(7).uuid
    leases.release(bob, freed)  # carol, behind alice, fits and alice does not: carol gets it
    assert [d.number for d in got[0]] == [7]
    six = leases.inventory.by_number(6).uuid
    leases.release(bob, six)
    leases.process_started(six, 4242, alice)  # alice takes the free one by computing on it
    assert leases.held_by("alice") == [leases.inventory.by_number(6)]
    leases.release(bob, leases.inventory.by_number(0).uuid)
    leases.release(bob, leases.inventory.by_number(1).uuid)
    assert len(got) == 1 and len(leases.waiters) == 1  # 2 free, but alice would hold 3
    leases.process_ended(six, 4242)
    clock.advance(LEASE)
    leases.expire()  # her claim's lease runs out: she holds none, and is served
    assert [d.number for d in got[1]] == [0, 1]


# -- the starvation bound ----------------------------------------------------------------------


def run_stream(clock, leases, seconds):
    """Eight GPUs held by small jobs whose leases run out in turn; every second a new small
    job asks to wait for one GPU. A 4-GPU request waits among them. When was it served?"""
    for n in range(8):
        leases.request(named_user(f"small{n}"), {"gpu": 1})
        clock.advance(1.25)
    big = []
    start = clock.now
    leases.wait(alice, {"gpu": 4}, big.append)
    taken_after_bound = 0
    for second in range(seconds):
        clock.advance(1.0)
        late = clock.now - start >= leases.policy.starvation_bound
        granted = []
        leases.wait(named_user(f"job{second}"), {"gpu": 1}, granted.append)
        leases.expire()
        if late and granted and not big:
            taken_after_bound += 1
        if big:
            return clock.now - start, taken_after_bound
    return None, taken_after_bound


def test_a_big_request_among_a_stream_of_small_ones_is_served_within_the_bound(clock):
    leases = manager(clock, starvation_bound=60.0)
    served, overtaken_late = run_stream(clock, leases, 600)
    assert served is not None
    # once the bound passed, freed devices were set aside: served within one more lease
    assert 60.0 <= served <= 60.0 + LEASE + 1
    assert overtaken_late == 0


def test_without_the_bound_the_big_request_starves(clock):
    leases = manager(clock, starvation_bound=float("inf"))
    served, _ = run_stream(clock, leases, 600)
    assert served is None


def test_a_starving_waiter_is_set_aside_exactly_what_it_wants_of_each_group(clock):
    """It wants one GPU and two FPGAs; two GPUs and one FPGA are free: one GPU (not two) is
    held for it, and the other is anyone's."""
    inventory = Inventory(
        [
            Device("G0", 0),
            Device("G1", 1),
            Device("G2", 2),
            Device("F0", 3, group="fpga"),
            Device("F1", 4, group="fpga"),
        ]
    )
    leases = lease_manager(
        clock, inventory, policy=replace(policy_of(Config()), starvation_bound=30.0)
    )
    leases.request(bob, {"gpu": 3, "fpga": 2})
    waiter = leases.wait(alice, {"gpu": 1, "fpga": 2}, lambda d: None)
    clock.advance(30.0)
    leases.release(bob, "G0")
    leases.release(bob, "G1")
    leases.release(bob, "F0")  # alice still lacks an FPGA: she waits, starving
    assert leases.set_aside() == (waiter, {"G0", "F0"})
    [granted] = leases.request(carol, {"gpu": 1})
    assert granted.uuid == "G1"


@pytest.mark.parametrize(
    "waited, starving",
    [(30.0, True), (30.0 - 1e-6, False)],
    ids=["exactly-the-bound", "a-hair-under"],
)
def test_a_request_that_has_waited_exactly_the_bound_is_starving(clock, waited, starving):
    leases = manager(clock, starvation_bound=30.0)
    held = leases.request(bob, {"gpu": 8})
    waiter = leases.wait(alice, {"gpu": 2}, lambda d: None)
    clock.advance(waited)
    leases.release(bob, held[0].uuid)  # one device free: alice wants two and waits on
    assert leases.set_aside() == ((waiter, {held[0].uuid}) if starving else (None, set()))
    assert claims(leases)[held[0].uuid]["set_aside_for"] == ("alice" if starving else None)
    if starving:  # set aside: not free for a newcomer
        with pytest.raises(Busy):
            leases.request(carol, {"gpu": 1})
    else:
        assert leases.request(carol, {"gpu": 1}) == [held[0]]


def test_devices_set_aside_are_not_free_for_a_request_and_say_for_whom(clock):
    leases = manager(clock, starvation_bound=30.0)
    held = leases.request(bob, {"gpu": 8})
    leases.wait(alice, {"gpu": 3}, lambda d: None)
    clock.advance(31)
    leases.release(bob, held[0].uuid)
    with pytest.raises(Busy):
        leases.request(carol, {"gpu": 1})
    assert claims(leases)[held[0].uuid]["set_aside_for"] == "alice"
    assert leases.state(held[0].uuid) == "free"


# -- durations ----------------------------------------------------------------------------------


def test_a_reservation_for_a_duration_outlives_its_processes_and_ends_on_time(clock):
    leases = manager(clock)
    [device] = leases.request(alice, {"gpu": 1}, duration=7200)
    assert leases.hold_of(device.uuid) == {
        "hold": "duration",
        "expires": 7200.0,
        "held_for_pid": None,
    }
    clock.advance(3 * LEASE)
    leases.expire()
    leases.process_started(device.uuid, 4242, alice)
    leases.process_ended(device.uuid, 4242)  # a notebook cell ran and finished: no lease
    clock.advance(7200 - 3 * LEASE - 1)
    leases.expire()
    assert leases.state(device.uuid) == "reserved"
    assert claims(leases)[device.uuid]["expires"] == 1.0
    clock.advance(1)
    assert leases.expire() == [device]


def test_at_its_end_a_duration_gives_way_to_the_usual_rules_and_release_ends_it_early(clock):
    leases = manager(clock)
    [device] = leases.request(alice, {"gpu": 1}, duration=100)
    leases.process_started(device.uuid, 4242, alice)
    clock.advance(100)
    assert leases.expire() == []  # her process still runs: claimed
    assert leases.state(device.uuid) == "claimed"
    leases.process_ended(device.uuid, 4242)
    assert claims(leases)[device.uuid]["expires"] == LEASE
    [other] = leases.request(bob, {"gpu": 1}, duration=3600)
    assert leases.release(bob) == ([other], [])


def test_durations_are_read_in_any_unit():
    assert [durations.parse(t) for t in ("90", "90s", "15m", "2h", "1.5d", " 2H ", "1e3")] == [
        90,
        90,
        900,
        7200,
        129600,
        7200,
        1000,
    ]
    for bad in ("", "2x", "-1h", "0", "h", "inf", "nan", "1_000", "\u0661\u0662", "2 hours"):
        with pytest.raises(ValueError):
            durations.parse(bad)
    assert durations.parse("0", zero=True) == 0
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(ValueError, match="zero or more"):
            durations.parse(bad, zero=True)


def test_durations_are_said_back_one_way_in_every_unit_or_two():
    """durations.describe, the one formatting of a duration in Python: every unit for the
    daemon's messages (nothing lost), two for the command line's tables."""
    seconds = (0, 0.004, 0.21, 0.5, 4.56, 4.99, 8, 12.4, 59.6, 90, 192, 3600, 3661, 7500, 46800)
    seconds += (273600, 604800, -3)
    assert [durations.describe(s) for s in seconds] == [
        "0s",
        "0s",
        "0.2s",  # a probe the doctor timed: to a tenth, as the command line's waits
        "0.5s",
        "4.6s",
        "5s",
        "8s",
        "12s",
        "1m",
        "1m30s",
        "3m12s",
        "1h",
        "1h01m01s",
        "2h05m",
        "13h",
        "3d04h",
        "7d",
        "0s",
    ]
    assert [durations.describe(s, most=2) for s in (3661, 90061, 14399.4)] == [
        "1h01m",
        "1d01h",
        "3h59m",
    ]
    for text in ("30s", "2h", "1d", "45m"):  # said back, a single unit reads as written
        assert durations.parse(durations.describe(durations.parse(text))) == durations.parse(text)


# -- the administrator ---------------------------------------------------------------------------


def test_root_releases_another_users_reservation_with_a_reason(clock):
    leases = manager(clock)
    events = recorded(leases)
    [device] = leases.request(alice, {"gpu": 1})
    with pytest.raises(NotYours):
        leases.release(bob, device.uuid)
    assert leases.release(root, device.uuid, "forgotten since Friday") == ([device], [])
    assert events[-1].kind == "admin_release" and events[-1].user == "alice"
    assert events[-1].details == {"by": "root", "reason": "forgotten since Friday"}
    assert leases.release(root) == ([], [])  # without a uuid: only root's own


# -- idle ---------------------------------------------------------------------------------------


def test_a_held_device_unused_is_idle_after_the_period_and_work_resets_it(clock):
    leases = manager(clock, idle_after=60)
    idle = IdleWatch(leases, clock=clock)
    [device] = leases.request(alice, {"gpu": 1}, duration=3600)
    quiet = {"sm": 0, "fb": 300}
    idle.observe(device.uuid, quiet)
    clock.advance(59)
    idle.observe(device.uuid, quiet)
    assert idle.idle_for(device.uuid) is None
    clock.advance(2)
    idle.observe(device.uuid, quiet)
    assert idle.idle_for(device.uuid) == 61
    idle.observe(device.uuid, {"sm": 40, "fb": 300})
    assert idle.idle_for(device.uuid) is None
    idle.observe(device.uuid, {"sm": 0, "fb": 4000})  # a model loaded: not idle
    clock.advance(100)
    assert idle.idle_for(device.uuid) is None
    idle.observe(device.uuid, {"sm": None, "fb": None})  # not printed: never taken for idle
    clock.advance(100)
    assert idle.idle_for(device.uuid) is None
    free = leases.inventory.by_number(5).uuid
    idle.observe(free, quiet)
    clock.advance(100)
    assert idle.idle_for(free) is None  # free is not idle


def test_an_idle_reservation_without_processes_is_released_when_asked(clock):
    leases = manager(clock, idle_after=60, idle_release=600)
    events = recorded(leases)
    idle = IdleWatch(leases, clock=clock)
    [reserved] = leases.request(alice, {"gpu": 1}, held_for=ProcessRef(4141, 1))
    [claimed] = leases.request(bob, {"gpu": 1}, duration=7200)
    leases.process_started(claimed.uuid, 4242, bob)
    # As found: a hold=2h was released after 45 s idle. A duration is kept to its end.
    [notebook] = leases.request(carol, {"gpu": 1}, duration=7200)
    for _ in range(12):
        for uuid in (reserved.uuid, notebook.uuid):
            idle.observe(uuid, {"sm": 0, "fb": 0})
        idle.observe(claimed.uuid, {"sm": 0, "fb": 100})
        clock.advance(60)
    for uuid in (reserved.uuid, notebook.uuid):
        idle.observe(uuid, {"sm": 0, "fb": 0})
    idle.observe(claimed.uuid, {"sm": 0, "fb": 100})
    assert leases.state(reserved.uuid) == "free"
    assert leases.state(claimed.uuid) == "claimed"  # a process is there: only marked idle
    assert idle.idle_for(claimed.uuid) >= 600
    assert leases.state(notebook.uuid) == "reserved" and idle.idle_for(notebook.uuid) >= 600
    assert [e.kind for e in events if e.kind == "idle_release"] == ["idle_release"]
    assert next(e for e in events if e.kind == "idle_release").user == "alice"


# -- the record ----------------------------------------------------------------------------------


def test_every_change_of_hands_is_recorded(clock, tmp_path):
    leases = manager(clock)
    log = AuditLog(str(tmp_path / "audit.jsonl"), 5, 60.0, clock=lambda: 1000.0 + clock.now)
    log.open()
    leases.on_event(log.record)
    [first] = leases.request(alice, {"gpu": 1})
    leases.process_started(first.uuid, 11, bob)  # bob computes on alice's GPU
    free = leases.inventory.by_number(3).uuid
    leases.process_started(free, 12, carol)  # carol takes a free one by computing
    leases.release(alice)
    clock.advance(LEASE)
    [second] = leases.request(bob, {"gpu": 1})
    clock.advance(LEASE)
    leases.expire()
    log.close()
    lines = [
        json.loads(line)
        for line in (tmp_path / "audit.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert [(e["event"], e["user"]) for e in lines] == [
        ("grant", "alice"),
        ("trespass", "bob"),
        ("claim", "carol"),
        ("release", "alice"),
        ("grant", "bob"),
        ("expire", "bob"),
    ]
    assert lines[0]["devices"] == [{"uuid": first.uuid, "number": first.number}]
    assert lines[0]["hold"] == "lease" and lines[1]["holder"] == "alice"
    assert lines[1]["pid"] == 11 and lines[0]["time"].endswith("+00:00")
    assert len(log.recent) == 5  # bounded
    assert [e["event"] for e in log.since(lines[4]["at"], 1000)] == ["grant", "expire"]
    assert [e["event"] for e in log.since(0, 1)] == ["expire"]


def test_the_record_to_standard_output_is_a_json_line_an_event_left_open(clock, capsys):
    """`--audit-log -`: each event a JSON line on standard output, which closing leaves open."""
    leases = manager(clock)
    log = AuditLog("-", 5, 60.0, clock=lambda: 1000.0)
    log.open()
    leases.on_event(log.record)
    [first] = leases.request(alice, {"gpu": 1})
    log.close()
    [line] = capsys.readouterr().out.splitlines()
    entry = json.loads(line)
    assert (entry["event"], entry["user"], entry["devices"]) == (
        "grant",
        "alice",
        [{"uuid": first.uuid, "number": first.number}],
    )
    print("still open")
    assert capsys.readouterr().out == "still open\n"


def test_a_full_disk_loses_the_file_lines_not_the_record(clock, caplog):
    leases = manager(clock)
    log = AuditLog("/dev/full", 5, 60.0)  # every write fails: no space left on the device
    log.open()
    leases.on_event(log.record)
    with caplog.at_level(logging.WARNING, logger="patroller.state.audit"):
        for _ in range(3):
            leases.request(alice, {"gpu": 1})
    assert log.failures == 3 and [e["event"] for e in log.recent] == ["grant"] * 3
    log.close()  # what is left to flush cannot be written either: counted, not raised
    assert log.failures == 4
    warnings = [r.getMessage() for r in caplog.records if r.name == "patroller.state.audit"]
    assert len(warnings) == 1 and "No space left on device (1 failures)" in warnings[0]


def test_the_starving_waiter_is_the_longest_waiting_of_every_shape_whatever_came_first():
    """The shapes are kept in the order each first had a waiter: the one whose first waiter
    was served keeps its place with a later waiter at its head, and must not be taken for
    the longest waiting (a larger request would be overtaken for ever)."""
    queue = WaitQueue(100, 100)
    first_one, pair, later_one = (
        Waiter(Identity(user=u, source="host"), wants, lambda d: None)
        for u, wants in (("alice", {"gpu": 1}), ("bob", {"gpu": 2}), ("carol", {"gpu": 1}))
    )
    queue.add(first_one, 0.0)
    queue.add(pair, 1.0)
    queue.add(later_one, 2.0)
    queue.remove(first_one)  # granted
    assert queue.starving(now=100.0, bound=30.0) is pair
    assert queue.starving(now=30.9, bound=30.0) is None  # bob waited 29.9 s
