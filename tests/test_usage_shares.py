"""The usage split at its edges (core/usage.py): a share under a second, two processes of one
party on a GPU, and a summed report let go a few keys a step."""

from patroller.core.usage import GpuSample, GroupedSummary, Party, Present, Summary, classify

ALICE = Party(user="alice", account="alice")
BOB = Party(user="bob", account="bob")


def gpu(**fields):
    return GpuSample(**{"uuid": "GPU-0", "number": 0, "seconds": 60.0, "state": "free", **fields})


def test_a_share_under_a_second_is_kept():
    held = gpu(state="reserved", hold="lease", holder=ALICE, reserved=True, seconds=0.5)
    assert classify(held) == [("reserved_unused", ALICE, 0.5)]
    shared = gpu(
        state="shared",
        holder=ALICE,
        reserved=True,
        seconds=1.5,
        readings=2,
        busy=1,
        present=(Present(ALICE, own=True), Present(BOB, own=False)),
    )
    assert classify(shared) == [
        ("active", ALICE, 0.375),
        ("idle_held", ALICE, 0.375),
        ("trespass", BOB, 0.75),
    ]


def test_two_processes_of_one_party_add_up_to_one_share():
    sample = gpu(
        state="shared",
        holder=ALICE,
        reserved=True,
        readings=4,
        busy=1,
        present=(Present(ALICE, own=True), Present(ALICE, own=True), Present(BOB, own=False)),
    )
    assert classify(sample) == [
        ("active", ALICE, 10.0),
        ("idle_held", ALICE, 30.0),
        ("trespass", BOB, 20.0),
    ]
    intruders = gpu(state="busy", present=(Present(BOB, own=False), Present(BOB, own=False)))
    assert classify(intruders) == [("trespass", BOB, 60.0)]


def totals(*users):
    return [(user, "active", 3600.0 * (n + 1)) for n, user in enumerate(users)]


def test_a_summary_is_let_go_size_keys_a_step_and_is_empty_after():
    summary = Summary()
    summary.add(totals("a", "b", "c"))
    assert [row["key"] for row in summary.result()["rows"]] == ["c", "b", "a"]
    assert sum(1 for _ in summary.letting_go(2)) == 2  # 2 keys, then 1
    assert summary.ordered() == [] and summary.result()["rows"] == []
    summary.add(totals("d"))
    assert [row["key"] for row in summary.result()["rows"]] == ["d"]


def test_a_grouped_summary_lets_go_its_keys_and_their_sums():
    summary = GroupedSummary(("user", "day"))
    summary.add([((user, day), "active", 60.0) for user in "ab" for day in ("d1", "d2")])
    assert [row["key"] for row in summary.result()["rows"]][:2] == [["a", "d1"], ["a", "d2"]]
    # 4 keys two a step; then the sums of 6 leading parts (a, b, and the 4 pairs) two a step
    assert sum(1 for _ in summary.letting_go(2)) == 2 + 3
    assert summary.result()["rows"] == []
