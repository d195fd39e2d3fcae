"""The greedy search of core/topology.py in detail, on small hand-made hosts: which device it
starts from, among how many peers it grows, and a matrix that lacks some links
(tests/test_topology.py has the real captures and the rule checked against every set)."""

from __future__ import annotations

from collections.abc import Mapping

from test_topology import devices, never, numbers

from patroller.core.devices import Device
from patroller.core.topology import Search, Topology, best, usable


def host(words: Mapping[tuple[int, int], str]) -> Topology:
    return Topology({(f"GPU-{a}", f"GPU-{b}"): w for (a, b), w in words.items()})


def test_the_search_starts_from_the_device_whose_second_strongest_link_is_strongest():
    # 0 has the strongest link of all (NV12 to 1) but no second one better than SYS; 2, 3 and 4
    # are NVLinked to one another: for 3 GPUs, a start from 2 promises most, and with one
    # start only, that start is what decides.
    words = {(a, b): "SYS" for a in range(5) for b in range(a + 1, 5)}
    words.update({(0, 1): "NV12", (2, 3): "NV4", (2, 4): "NV4", (3, 4): "NV4"})
    found = devices(5)
    one_start = Search(exact=0, seeds=1)
    assert numbers(best(host(words), found, 3, never, search=one_start)) == [2, 3, 4]
    assert numbers(best(host(words), found, 3, never)) == [2, 3, 4]  # every set weighed
    # For 2 GPUs the strongest link itself is what promises most: the NV12 pair.
    assert numbers(best(host(words), found, 2, never, search=one_start)) == [0, 1]


def test_among_starts_that_promise_alike_the_users_last_then_the_oldest_release_go_first():
    # Two NVLink pairs, SYS between them: the pairs are linked alike; with one start only, the
    # start decides the pair, and it is the one rule 3 of the choice prefers.
    words = {(0, 1): "NV4", (2, 3): "NV4", (0, 2): "SYS", (0, 3): "SYS", (1, 2): "SYS"}
    words[(1, 3)] = "SYS"
    found = devices(4)
    one_start = Search(exact=0, seeds=1)

    def released(at: Mapping[int, float], last: int | None = None):
        def prefer(device: Device) -> tuple[int, float]:
            return (0 if device.number == last else 1), at.get(device.number, float("-inf"))

        return prefer

    older_pair = released({0: 100.0, 2: 50.0})  # the pair 2, 3 rested longer
    assert numbers(best(host(words), found, 2, older_pair, search=one_start)) == [2, 3]
    assert numbers(best(host(words), found, 2, older_pair)) == [2, 3]  # as when all are weighed
    never_held = released({0: 100.0, 1: 90.0, 2: 50.0})  # 3 never held: -inf, the oldest
    assert numbers(best(host(words), found, 2, never_held, search=one_start)) == [2, 3]
    users_last = released({0: 100.0, 2: 50.0}, last=0)  # the user's last GPU wins over rest
    assert numbers(best(host(words), found, 2, users_last, search=one_start)) == [0, 1]


def test_the_search_grows_among_the_near_strongest_linked_peers_only():
    # From 0 (NVLinked to 1 and 2), 3 is a weaker peer (PIX). Growing among its 2 strongest
    # peers, the search adds 1 and then must take 2 (a SYS link to 1); told to look at 3 peers,
    # it finds 3, PIX to both: the better set. The docs say the search may miss the best.
    words = {(0, 1): "NV4", (0, 2): "NV4", (0, 3): "PIX", (1, 2): "SYS"}
    words.update({(1, 3): "PIX", (2, 3): "PIX"})
    found = devices(4)
    assert numbers(best(host(words), found, 3, never, search=Search(0, 1, near=2))) == [0, 1, 2]
    assert numbers(best(host(words), found, 3, never, search=Search(0, 1, near=3))) == [0, 1, 3]
    assert numbers(best(host(words), found, 3, never)) == [0, 1, 3]  # every set weighed


def test_a_matrix_that_lacks_a_link_covers_only_the_devices_it_links():
    partial = host({(0, 1): "NV4", (1, 2): "PIX"})  # no link between 0 and 2
    found = devices(4)
    assert usable(partial, found[:2]) and usable(partial, found[1:3])
    assert not usable(partial, found[:3]) and not usable(partial, [found[0], found[2]])
    assert not usable(partial, [found[1], found[3]])  # 3 is not in the matrix at all
    assert not usable(partial, [found[3], found[1]])  # whichever comes first
    whole = host({(0, 1): "NV4", (0, 2): "PIX", (1, 2): "PIX"})
    assert usable(whole, found[:3]) and not usable(whole, found)
    assert not usable(whole, [found[3], found[0]])  # whichever comes first
    assert not usable(whole, [found[3]])  # a device the whole matrix does not name


def users_last(number: int):
    def prefer(device: Device) -> tuple[int, float]:
        return (0 if device.number == number else 1), float("-inf")

    return prefer


def test_the_link_comes_before_the_preference_and_the_sum_of_links_before_it_too():
    # From 0, 1 is NVLinked and 2 only PIX: the user's last (2) waits for a tie of the links.
    words = {(0, 1): "NV4", (0, 2): "PIX", (1, 2): "PIX"}
    one_start = Search(exact=0, seeds=1)
    assert numbers(best(host(words), devices(3), 2, users_last(2), search=one_start)) == [0, 1]
    # Once 0 and 1 are in, 2 and 3 are both PHB to 1: the same weakest link; 2 is NV4 to 0
    # and 3 PHB: the larger sum (2) wins over the user's last GPU (3).
    words = {(0, 1): "NV8", (0, 2): "NV4", (0, 3): "PHB", (1, 2): "PHB", (1, 3): "PHB"}
    words[(2, 3)] = "SYS"
    chosen = best(host(words), devices(4), 3, users_last(3), search=one_start)
    assert numbers(chosen) == [0, 1, 2]
    words[(0, 3)] = "NV4"  # now a tie of the sums too: the user's last
    chosen = best(host(words), devices(4), 3, users_last(3), search=one_start)
    assert numbers(chosen) == [0, 1, 3]


def test_among_peers_linked_alike_the_users_last_then_the_oldest_release_are_added():
    words = {(a, b): "NV4" for a in range(4) for b in range(a + 1, 4)}
    one_start = Search(exact=0, seeds=1)
    assert numbers(best(host(words), devices(4), 2, users_last(2), search=one_start)) == [0, 2]

    def released(device: Device) -> tuple[int, float]:
        return 1, {1: 30.0, 2: 10.0, 3: 20.0}.get(device.number, float("-inf"))

    assert numbers(best(host(words), devices(4), 3, released, search=one_start)) == [0, 2, 3]


def test_peers_tied_with_the_last_near_one_are_weighed_up_to_twice_near():
    # One kind (every link NV4): from 0, `near` peers and those tied with the last of them,
    # at most twice `near`: the user's last GPU is weighed only when it is among them.
    words = {(a, b): "NV4" for a in range(6) for b in range(a + 1, 6)}
    found = devices(6)
    for near, last, chosen in ((1, 2, [0, 2]), (1, 3, [0, 1]), (2, 4, [0, 4]), (2, 5, [0, 1])):
        search = Search(exact=0, seeds=1, near=near)
        assert numbers(best(host(words), found, 2, users_last(last), search=search)) == chosen


def test_a_set_insisting_on_nvlink_may_have_single_nvlinks():
    words = {(0, 1): "NV1", (0, 2): "NV1", (1, 2): "NV1", (0, 3): "SYS", (1, 3): "SYS"}
    words[(2, 3)] = "SYS"
    greedy = Search(exact=0)
    assert numbers(best(host(words), devices(4), 3, never, "nvlink", greedy)) == [0, 1, 2]
    assert best(host(words), devices(4), 4, never, "nvlink", greedy) is None
    unknown = {(0, 1): "XYZ", (0, 2): "XYZ", (1, 2): "XYZ"}  # a word not known: the weakest
    assert numbers(best(host(unknown), devices(3), 3, never, search=greedy)) == [0, 1, 2]


def test_the_nvlink_groups_each_peer_of_each_in_the_order_given():
    # 0-1-2 chained by NVLink (0 and 2 only through 1), 3-4 by a single NVLink, PCIe between
    # the groups; 5 is in no link of the matrix.
    words = {(0, 1): "NV4", (1, 2): "NV2", (0, 2): "SYS", (3, 4): "NV1", (2, 3): "PIX"}
    words.update({(0, 3): "SYS", (1, 3): "SYS", (0, 4): "SYS", (1, 4): "SYS", (2, 4): "PHB"})
    order = [5, 2, 4, 0, 1, 3]
    uuids = [f"GPU-{n}" for n in order]
    groups = host(words).groups(uuids)
    assert [[int(u[4:]) for u in group] for group in groups] == [[5], [2, 0, 1], [4, 3]]
    partial = host({(0, 1): "NV4", (1, 2): "NV4"})  # 0 and 2 have no link: one group still
    assert partial.groups(["GPU-0", "GPU-2", "GPU-1"]) == [["GPU-0", "GPU-2", "GPU-1"]]
