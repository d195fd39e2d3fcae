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
    whole = host({(0, 1): "NV4", (0, 2): "PIX", (1, 2): "PIX"})
    assert usable(whole, found[:3]) and not usable(whole, found)
    assert not usable(whole, [found[3], found[0]])  # whichever comes first
    assert not usable(whole, [found[3]])  # a device the whole matrix does not name
