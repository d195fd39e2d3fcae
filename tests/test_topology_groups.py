"""The NVLink groups of a host's devices (core/topology.py `Topology.groups`, which the doctor
shows): each device with every device linked to it by NVLink, directly or through a peer, in
the order asked; a device with no NVLink, or none known, alone."""

from patroller.core.topology import Topology


def test_devices_linked_through_a_peer_are_one_group_in_the_order_asked():
    topology = Topology(
        {
            ("A", "B"): "NV2",
            ("B", "C"): "NV1",
            ("A", "C"): "PHB",
            ("A", "D"): "SYS",
            ("B", "D"): "SYS",
            ("C", "D"): "SYS",
        }
    )
    assert topology.groups(["A", "C", "B", "D"]) == [["A", "C", "B"], ["D"]]
    assert topology.groups(["D", "C", "B", "A"]) == [["D"], ["C", "B", "A"]]
    assert topology.groups(["GPU-z", "A"]) == [["GPU-z"], ["A"]]  # none known: alone


def test_only_an_nvlink_joins_a_group_and_only_among_the_devices_asked():
    topology = Topology({("x", "y"): "NV0", ("y", "z"): "PIX", ("z", "w"): "NV4"})
    assert topology.groups(["x", "y", "z", "w"]) == [["x"], ["y"], ["z", "w"]]
    assert topology.groups(["w", "x"]) == [["w"], ["x"]]  # z, their link, not asked
    assert topology.groups([]) == []
