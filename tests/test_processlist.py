"""A GPU with thousands of processes in /status (http/processlist.py, http/statusview.py): its
process list is kept a row per process, so that no turn of the event loop builds it whole.
Counted, not timed: the rows serialized, and the work done between two yields. 2,000 processes
stand for the 5,000 of the benchmark (bench/crowded.py): the lease manager's own work for each
of them makes the tests' set-up slow."""

import json
from dataclasses import replace

import pytest
from helpers import FakeClock, lease_manager

from patroller.core.identity import IDENTIFYING, named_user
from patroller.http import processlist
from patroller.http.statusview import StatusView
from patroller.observe.signals import ProcessSamples, Signals
from patroller.observe.stats import StatsStore
from patroller.observe.testmode import synthetic_inventory

MANY = 2000
CAROL = 400  # one of carol's processes every CAROL
FIRST = 100_000  # the first pid


@pytest.fixture
def crowded():
    """One GPU (of two) with MANY processes: bob's, and one of carol's every CAROL."""
    clock = FakeClock()
    inventory = synthetic_inventory(2)
    leases = lease_manager(clock, inventory, lease=10)
    stats = StatsStore(inventory, stale_after=3, history_every=5, history_points=120, clock=clock)
    signals = Signals()
    stats.connect(signals)
    uuid = inventory.devices[0].uuid
    for n in range(MANY):
        owner = named_user("carol" if n % CAROL == CAROL - 1 else "bob")
        leases.process_started(uuid, FIRST + n, owner, "python")
    view = StatusView(inventory, leases, stats, None, max_age=0.1, clock=clock, slice_=0.0)
    return clock, leases, signals, view, uuid


def shown(view, uuid):
    return json.loads(view.body())[uuid]["claim"]["process_detail"]


def figures(signals, uuid, sm):
    interval = {FIRST + n: {"sm": sm, "mem": 1, "fb": 100} for n in range(MANY)}
    signals.process_sampled.send(None, record=ProcessSamples({uuid: interval}, 0.0))


def stepped(view):
    """The daemon's background rebuild, stepped by hand: the rows serialized in each step
    (a slice of 0 s: it lets the loop serve at every chance), and the lists shown between."""
    task = view._refresh_soon()
    rows, lists = [], []
    try:
        while True:
            built = view.rows_built
            task.send(None)
            rows.append(view.rows_built - built)
            lists.append(view.body())
    except StopIteration:
        rows.append(view.rows_built - built)
    return rows, lists


def test_new_figures_for_thousands_of_processes_are_built_a_hundred_rows_a_turn(crowded):
    """A second of figures for every process: the background rebuild serializes at most
    ROWS_A_STEP rows between two turns of the loop, and each body meanwhile shows the whole
    list as it was (the old figures, every process); once done, the new figures, all."""
    clock, leases, signals, view, uuid = crowded
    assert {p["sm"] for p in shown(view, uuid)} == {None}
    figures(signals, uuid, 30)
    rows, lists = stepped(view)
    assert sum(rows) == MANY and max(rows) <= processlist.ROWS_A_STEP <= 100
    assert len(rows) >= 2 * MANY // processlist.ROWS_A_STEP  # the merge's steps, the rows'
    for body in lists[:-1]:
        listed = json.loads(body)[uuid]["claim"]["process_detail"]
        assert len(listed) == MANY and {p["sm"] for p in listed} == {None}
    assert {p["sm"] for p in shown(view, uuid)} == {30}
    assert json.loads(view.body()) == view.data()


def test_the_list_is_put_together_in_a_step_of_its_own_after_the_last_rows(crowded):
    """The join of thousands of rows is a slice of its own, not added to the last rows'."""
    clock, leases, signals, view, uuid = crowded
    leases.process_ended(uuid, FIRST + 10)  # 1,999 rows: the last step of rows is not full
    view.body()
    figures(signals, uuid, 30)
    rows, lists = stepped(view)
    assert rows[-1] == 0 and rows[-2] == (MANY - 1) % processlist.ROWS_A_STEP  # 99
    for body in lists:  # the last rows made: the list is still the old one
        assert {p["sm"] for p in json.loads(body)[uuid]["claim"]["process_detail"]} == {None}
    assert {p["sm"] for p in shown(view, uuid)} == {30}  # put together, alone, at the end


def test_a_process_starting_or_ending_among_thousands_serializes_one_row_and_is_shown_at_once(
    crowded,
):
    clock, leases, signals, view, uuid = crowded
    view.body()
    built = view.rows_built
    leases.process_started(uuid, 7, named_user("bob"), "train")
    listed = shown(view, uuid)
    assert view.rows_built == built + 1
    assert len(listed) == MANY + 1 and listed[-1]["pid"] == 7 and listed[-1]["command"] == "train"
    leases.process_ended(uuid, FIRST + 10)
    leases.process_ended(uuid, 7)
    listed = shown(view, uuid)
    assert view.rows_built == built + 1 and len(listed) == MANY - 1
    assert FIRST + 10 not in {p["pid"] for p in listed}
    assert json.loads(view.body()) == view.data()


def test_a_new_holder_flags_every_process_again_and_serializes_no_row(crowded):
    """bob holds the GPU by computing: carol's five processes trespass. bob's processes end
    and his lease runs out: carol's are left, she holds it and none of them trespasses, with
    no row serialized again; a process of bob's that comes now trespasses."""
    clock, leases, signals, view, uuid = crowded
    listed = shown(view, uuid)
    assert [p["pid"] for p in listed if p["trespass"]] == [
        FIRST + n for n in range(CAROL - 1, MANY, CAROL)
    ]
    built = view.rows_built
    for n in range(MANY):
        if n % CAROL != CAROL - 1:
            leases.process_ended(uuid, FIRST + n)
    clock.advance(10)
    leases.expire()
    listed = shown(view, uuid)
    assert json.loads(view.body())[uuid]["claim"]["user"]["user"] == "carol"
    assert len(listed) == 5 and not any(p["trespass"] for p in listed)
    assert view.rows_built == built
    leases.process_started(uuid, 8, named_user("bob"), "python")
    assert shown(view, uuid)[-1] == {
        "pid": 8,
        "user": "bob",
        "command": "python",
        "trespass": True,
        "sm": None,
        "mem": None,
        "fb": None,
    }


def test_the_list_keeps_the_hold_order_through_a_reused_pid_and_a_new_owner(crowded):
    """A pid that ends and starts again before the next body is shown last, as the hold has
    it, whoever runs it; a process whose owner becomes known is shown with its owner, in its
    place. Only their rows are serialized again."""
    clock, leases, signals, view, uuid = crowded
    leases.process_started(uuid, 9, IDENTIFYING, None)
    leases.process_started(uuid, 10, named_user("dora"), "python")
    view.body()
    built = view.rows_built
    leases.process_ended(uuid, FIRST)
    leases.process_started(uuid, FIRST, named_user("erin"), "bash")
    leases.update_owner(uuid, 9, named_user("bob"))
    listed = shown(view, uuid)
    assert [p["pid"] for p in listed] == list(leases.holds[uuid].processes)
    assert listed[-1]["pid"] == FIRST and listed[-1]["user"] == "erin"
    assert listed[-3] == {**listed[-3], "pid": 9, "user": "bob"}
    assert view.rows_built == built + 2
    leases.process_ended(uuid, FIRST + 1)  # the same user and command again, under its pid
    leases.process_started(uuid, FIRST + 1, named_user("bob"), "python")
    listed = shown(view, uuid)
    assert [p["pid"] for p in listed] == list(leases.holds[uuid].processes)
    assert listed[-1]["pid"] == FIRST + 1
    assert json.loads(view.body()) == view.data()


def test_figures_that_come_while_processes_change_end_up_shown(crowded):
    """Processes start, end and change owner between the background rebuild's steps: the
    list shown is always the hold's, and once the rebuild is done, every process that has
    figures shows them."""
    clock, leases, signals, view, uuid = crowded
    view.body()
    figures(signals, uuid, 40)
    task = view._refresh_soon()
    changes = iter(range(20))
    try:
        while True:
            task.send(None)
            n = next(changes, None)
            if n is not None:
                leases.process_ended(uuid, FIRST + 200 * n)
                leases.process_started(uuid, 50 + n, named_user("bob"), "python")
                leases.update_owner(uuid, FIRST + 200 * n + 1, named_user("frank"))
            listed = shown(view, uuid)
            assert [p["pid"] for p in listed] == list(leases.holds[uuid].processes)
    except StopIteration:
        pass
    listed = shown(view, uuid)
    assert [p["pid"] for p in listed] == list(leases.holds[uuid].processes)
    assert {p["sm"] for p in listed if p["pid"] >= FIRST} == {40}
    assert {p["sm"] for p in listed if p["pid"] < FIRST} == {None}  # none came for them
    assert json.loads(view.body()) == view.data()


def test_a_reused_pid_is_shown_last_among_processes_all_alike(crowded):
    """On a GPU where every process is bob's `python` (a fork bomb), a pid that ends and
    starts again is still shown where the hold has it: last."""
    clock, leases, signals, view, uuid = crowded
    other = next(device for device in leases.holds if device != uuid)
    for pid in (1, 2, 3):
        leases.process_started(other, pid, named_user("bob"), "python")
    assert [p["pid"] for p in shown(view, other)] == [1, 2, 3]
    leases.process_ended(other, 1)
    leases.process_started(other, 1, named_user("bob"), "python")
    assert [p["pid"] for p in shown(view, other)] == [2, 3, 1]


def test_the_users_of_a_crowded_gpu_are_named_by_the_holder_then_their_first_process(crowded):
    """claim.users: the holder as held, then each other user as their first process names
    them (one look-up a process: Hold.users)."""
    clock, leases, signals, view, uuid = crowded
    other = next(device for device in leases.holds if device != uuid)
    leases.request(named_user("bob"), {"gpu": 1})  # the other GPU: the first is taken
    first, later = (replace(named_user("dora"), account=name) for name in ("dora1", "dora2"))
    leases.process_started(other, 1, replace(named_user("bob"), account="bob-in-a-box"), "x")
    leases.process_started(other, 2, first, "python")
    leases.process_started(other, 3, later, "python")
    users = json.loads(view.body())[other]["claim"]["users"]
    assert [(u["user"], u["account"]) for u in users] == [("bob", None), ("dora", "dora1")]
