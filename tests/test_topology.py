"""GPU topology: `topo -m` read from real captures, the best-connected choice (core/topology.py),
and its place in the lease rules: it decides which devices, never whether or when."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import (
    FakeClock,
    ScenarioFile,
    async_test,
    gpu_running,
    host_user,
    lease_manager,
    until,
)

from patroller.core.devices import Device, Inventory
from patroller.core.errors import Busy, Unsatisfiable
from patroller.core.topology import Search, Topology, best, strength, usable
from patroller.observe.nvsmi.topo import TopoError, parse_topology
from patroller.observe.topology import bind

REAL = Path(__file__).parent / "fixtures" / "nvsmi" / "real"
WORDS = ["SYS", "NODE", "PHB", "PXB", "PIX", "NV1", "NV2", "NV4", "NV12"]


def devices(n: int) -> list[Device]:
    return [Device(uuid=f"GPU-{i}", number=i) for i in range(n)]


def from_capture(name: str) -> tuple[list[Device], Topology]:
    matrix = parse_topology((REAL / name).read_text(encoding="utf-8"))
    found = devices(len(matrix.gpus))
    return found, bind(matrix, Inventory(found))


def numbers(chosen: Sequence[Device] | None) -> list[int] | None:
    return None if chosen is None else [d.number for d in chosen]


def never(device: Device) -> tuple[int, float]:
    return 1, float("-inf")


def choose(
    name: str,
    free: Sequence[int],
    count: int,
    link: str | None = None,
    search: Search | None = None,
) -> list[int] | None:
    found, topology = from_capture(name)
    return numbers(best(topology, [found[i] for i in free], count, never, link, search))


# -- the parser on each real capture -------------------------------------------------------


def test_the_dgx1_capture_is_read_whatever_its_whitespace():
    found, topology = from_capture("dlperf-dgx1-v100-topo-r470.txt")
    link = lambda a, b: topology.link(f"GPU-{a}", f"GPU-{b}")
    assert (link(0, 1), link(0, 2), link(0, 4), link(4, 3), link(7, 0)) == (
        "NV1",
        "NV2",
        "SYS",
        "NV1",
        "NV2",
    )
    assert [topology.numa[d.uuid] for d in found] == ["0"] * 4 + ["1"] * 4
    assert topology.cpus["GPU-5"] == "24-47,72-95"


def test_without_a_numa_column_the_cpu_affinity_places_a_device():
    found, topology = from_capture("dlperf-dgx1-v100-topo-r440.txt")
    assert topology.numa["GPU-0"] is None
    assert topology.node("GPU-0") == topology.node("GPU-3") != topology.node("GPU-4")


def test_gpu_numa_id_and_nic_legend_are_read_past():
    matrix = parse_topology((REAL / "nccl-tests-8x-rtx4090-topo-pix.txt").read_text())
    assert matrix.gpus == tuple(range(8)) and matrix.nics == ("NIC0",)
    assert matrix.numa == {i: "0" if i < 4 else "1" for i in range(8)}
    assert matrix.links[(1, 2)] == "PIX" and matrix.links[(3, 4)] == "SYS"


@pytest.mark.parametrize("name", sorted(p.name for p in REAL.iterdir() if "topo" in p.name))
def test_every_real_capture_gives_a_symmetric_matrix_of_known_links(name):
    text = (REAL / name).read_text(encoding="utf-8")
    matrix = parse_topology(text)
    rows = [
        line.split()[0]
        for line in text.splitlines()
        if line.split()[:1] and line.split()[0].startswith("GPU") and "X" in line.split()
    ]
    assert [f"GPU{g}" for g in matrix.gpus] == rows
    n = len(matrix.gpus)
    assert len(matrix.links) == n * (n - 1)
    for (a, b), word in matrix.links.items():
        assert matrix.links[(b, a)] == word and strength(word) > 0
    assert all(v is not None for v in matrix.cpus.values())
    if "NUMA Affinity" in text:  # a number, or N/A (one GPU of a capture says so)
        assert any(v is not None for v in matrix.numa.values())
    else:
        assert all(v is None for v in matrix.numa.values())


@pytest.mark.parametrize(
    "text",
    [
        "",
        "No devices were found\n",
        "\tGPU0\tGPU1\nGPU0\t X \tNV1\n",
        "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV1\tNV1\n",
    ],
)
def test_what_is_no_matrix_is_said_to_be_none(text):
    with pytest.raises(TopoError):
        parse_topology(text)


def test_a_matrix_of_other_gpus_than_the_inventory_is_not_known():
    matrix = parse_topology((REAL / "k8s-test-infra-gb200-topo-nv18.txt").read_text())
    topology = bind(matrix, Inventory(devices(8)))
    assert not topology and "GPUs [0, 1, 2, 3]" in (topology.why or "")


# -- the choice -------------------------------------------------------------------------------


def test_the_best_connected_pairs_and_groups_on_real_hosts():
    dgx1 = "dlperf-dgx1-v100-topo-r470.txt"
    assert choose(dgx1, range(8), 2) == [0, 2]  # NV2 beats NV1; lowest numbers among NV2 pairs
    assert choose(dgx1, [1, 3, 4, 5], 2) == [1, 3]  # NV2
    assert choose(dgx1, [0, 1, 5, 6], 2) == [1, 6]  # NV2 across the sockets beats NV1
    rtx = "nccl-tests-8x-rtx4090-topo-pix.txt"
    assert choose(rtx, range(8), 4) == [0, 1, 2, 3]
    assert choose(rtx, [1, 2, 3, 4, 5, 6, 7], 4) == [4, 5, 6, 7]  # one switch, not the lowest
    quda = "quda-8gpu-topo-pix-pxb.txt"
    assert choose(quda, [0, 2, 4, 5], 2) == [4, 5]  # the PIX pair
    assert choose(quda, [0, 2, 3, 4, 6], 3) == [0, 2, 3]  # PXB and a PIX, not SYS
    assert choose("club3090-2gpu-topo-sys-numa-na.txt", [0, 1], 2, "numa") is None
    five = "club3090-5gpu-topo-phb.txt"
    assert choose(five, [0, 1, 3, 4], 2) == [3, 4]


def test_a_link_insisted_on():
    dgx1 = "dlperf-dgx1-v100-topo-r470.txt"
    assert choose(dgx1, [0, 5, 6], 2, "nvlink") == [5, 6]
    assert choose(dgx1, [0, 4, 5], 2, "nvlink") == [4, 5]
    assert choose(dgx1, [0, 5], 2, "nvlink") is None
    assert choose(dgx1, [0, 1, 2, 3], 4, "nvlink") == [0, 1, 2, 3]  # NV everywhere in a quad
    assert choose(dgx1, [0, 2, 4, 6, 7], 3, "numa") == [4, 6, 7]
    assert choose(dgx1, [0, 2, 4, 6], 3, "numa") is None


def test_ties_go_to_the_users_last_devices_then_the_oldest_release():
    found, topology = from_capture("nccl-tests-8x-rtx4090-topo-pix.txt")
    last = {2: (0, 5.0), 3: (0, 9.0), 5: (1, 1.0), 6: (1, 2.0), 7: (1, 3.0)}
    prefer = lambda d: last.get(d.number, (1, float("-inf")))
    assert numbers(best(topology, found, 2, prefer)) == [2, 3]  # the user's own, PIX
    assert numbers(best(topology, found[4:], 2, prefer)) == [4, 5]  # 4 never, then 5 oldest
    assert numbers(best(topology, found[5:], 2, prefer)) == [5, 6]


def test_mig_or_an_unknown_topology_is_not_usable():
    found, topology = from_capture("nccl-4x-h100-topo-nv6.txt")
    assert usable(topology, found) and not usable(Topology(), found)
    mig = [Device(uuid=d.uuid, number=d.number, mig_mode="Enabled") for d in found]
    assert not usable(topology, mig)


def random_hosts(seed: int, cases: int):
    """Small random hosts: up to seven GPUs, random links and NUMA nodes, a random free set,
    count and link (hypothesis is not a test dependency of its own: a seeded enumeration)."""
    rng = random.Random(seed)
    for _ in range(cases):
        n = rng.randint(2, 7)
        words = {pair: rng.choice(WORDS) for pair in itertools.combinations(range(n), 2)}
        free = {i for i in range(n) if rng.random() < 0.7} or {rng.randrange(n)}
        yield (
            n,
            words,
            free,
            rng.randint(1, n),
            rng.choice([None, "nvlink", "numa"]),
            [rng.randint(0, 1) for _ in range(n)],
        )


@pytest.mark.parametrize("seed", range(8))
def test_the_chosen_set_is_never_worse_connected_than_another_free_set(seed):
    for n, words, free_numbers, count, link, nodes in random_hosts(seed, 100):
        check_the_choice(n, words, free_numbers, count, link, nodes)


def check_the_choice(n, words, free_numbers, count, link, nodes):
    found = devices(n)
    topology = Topology(
        {(f"GPU-{a}", f"GPU-{b}"): w for (a, b), w in words.items()},
        {f"GPU-{i}": str(nodes[i]) for i in range(n)},
    )
    free = [d for d in found if d.number in free_numbers]
    chosen = best(topology, free, count, never, link)
    fitting = [list(s) for s in itertools.combinations(free, count) if topology.fits(s, link)]
    if not fitting:
        assert chosen is None
        return
    assert chosen is not None and topology.fits(chosen, link) and set(chosen) <= set(free)

    def weakest_first(s: Sequence[Device]) -> list[int]:  # the rule, written out again here
        return sorted(
            strength(words[(a.number, b.number)]) for a, b in itertools.combinations(s, 2)
        )

    assert weakest_first(chosen) == max(weakest_first(s) for s in fitting), (words, free, link)


def test_beyond_the_exact_bound_the_greedy_search_finds_the_structure():
    rng = random.Random(7)
    for _ in range(20):
        found, topology = from_capture("nccl-tests-8x-rtx4090-topo-pix.txt")
        free = sorted(rng.sample(found, 6), key=lambda d: d.number)
        exact = best(topology, free, 3, never)
        greedy = best(topology, free, 3, never, search=Search(exact=0))
        assert exact is not None and greedy is not None
        assert topology.score(greedy) == topology.score(exact)
        assert sorted(
            strength(topology.link(a.uuid, b.uuid) or "")
            for a, b in itertools.combinations(greedy, 2)
        )[0] == strength("PIX")


def test_the_greedy_search_grows_by_the_strongest_weakest_link():
    # From GPU 0 (the most promising start): 1 and 2 are NVLinked to it; once 1 is in, 2 would
    # bring a SYS link (a sum of 105) and 3 two PHB links (6): 3 it is, as the rule says.
    words = {
        (0, 1): "NV4",
        (0, 2): "NV4",
        (0, 3): "PHB",
        (1, 2): "SYS",
        (1, 3): "PHB",
        (2, 3): "SYS",
    }
    topology = Topology({(f"GPU-{a}", f"GPU-{b}"): w for (a, b), w in words.items()})
    found = devices(4)
    assert numbers(best(topology, found, 3, never, search=Search(exact=0, seeds=1))) == [0, 1, 3]
    # From every start (from 2 the search ends at 0, 1, 2): the best of the sets grown wins.
    assert numbers(best(topology, found, 3, never, search=Search(exact=0))) == [0, 1, 3]


# -- in the lease rules -------------------------------------------------------------------------

ALICE, BOB, CAROL = host_user("alice", 1001), host_user("bob", 1002), host_user("carol", 1003)


def pairs_host(clock: FakeClock, **policy):
    """Four GPUs, NVLink between 0-2 and 1-3 (the simulator's nvlink-pairs)."""
    found = devices(4)
    leases = lease_manager(clock, Inventory(found), **policy)
    words = {
        (0, 2): "NV4",
        (1, 3): "NV4",
        (0, 1): "PHB",
        (2, 3): "PHB",
        (0, 3): "SYS",
        (1, 2): "SYS",
    }
    leases.topology = Topology(
        {(f"GPU-{a}", f"GPU-{b}"): w for (a, b), w in words.items()},
        {f"GPU-{i}": "0" if i < 2 else "1" for i in range(4)},
    )
    return leases


def test_a_request_gets_the_nvlink_pair_and_a_link_refused_says_why():
    leases = pairs_host(FakeClock())
    assert numbers(leases.request(ALICE, {"gpu": 2})) == [0, 2]
    with pytest.raises(Busy) as busy:
        leases.request(BOB, {"gpu": 2}, link="numa")
    assert "NUMA" in str(busy.value) and busy.value.data["link"] == "numa"
    assert numbers(leases.request(BOB, {"gpu": 2}, link="nvlink")) == [1, 3]
    with pytest.raises(Unsatisfiable) as never_linked:
        leases.request(CAROL, {"gpu": 3}, link="nvlink")
    assert "no 3 gpu of this host are all linked" in str(never_linked.value)
    leases.topology = Topology(why="`nvidia-smi topo -m` failed")
    with pytest.raises(Unsatisfiable) as unknown:
        leases.request(CAROL, {"gpu": 1}, link="numa")
    assert "not known (`nvidia-smi topo -m` failed)" in str(unknown.value)


def test_without_a_topology_the_lowest_numbers_as_before():
    leases = lease_manager(FakeClock(), Inventory(devices(4)))
    assert numbers(leases.request(ALICE, {"gpu": 2})) == [0, 1]


def test_a_topology_preference_never_lets_a_user_overtake_the_queue():
    clock = FakeClock()
    leases = pairs_host(clock)
    mine = leases.request(BOB, {"gpu": 2})  # 0 and 2: bob's last devices, once released
    leases.request(CAROL, {"gpu": 2})  # 1 and 3
    granted: dict[str, list[int]] = {}
    leases.wait(ALICE, {"gpu": 2}, lambda ds: granted.setdefault("alice", numbers(ds)))
    clock.advance(1)
    leases.wait(BOB, {"gpu": 2}, lambda ds: granted.setdefault("bob", numbers(ds)))
    leases.release(BOB)  # bob's own NVLink pair comes free: the first in the queue gets it
    assert granted == {"alice": numbers(mine)}
    leases.release(CAROL)
    assert granted == {"alice": [0, 2], "bob": [1, 3]}


def test_the_devices_set_aside_for_a_starving_waiter_are_those_it_would_get():
    clock = FakeClock()
    leases = pairs_host(clock)
    leases.request(BOB, {"gpu": 1})  # 0
    leases.request(CAROL, {"gpu": 2}, link="nvlink")  # 1 and 3
    leases.wait(ALICE, {"gpu": 2}, lambda ds: None, link="nvlink")
    clock.advance(leases.policy.starvation_bound + 1)
    waiter, aside = leases.set_aside()
    assert waiter is not None and aside == {"GPU-2"}  # the largest NVLink set free: one
    with pytest.raises(Busy):
        leases.request(CAROL, {"gpu": 1})
    # were all four free, its NVLink pair would be held for it, not the lowest numbers
    waiter, aside = leases.set_aside({"gpu": leases.inventory.present()})
    assert aside == {"GPU-0", "GPU-2"}


# -- the daemon, on the simulator ---------------------------------------------------------------


@pytest.fixture
def pairs(tmp_path):
    return ScenarioFile(
        str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}], topology="nvlink-pairs"
    )


@async_test
async def test_the_daemon_grants_the_nvlink_pair_and_shows_the_links(pairs):
    async with gpu_running(pairs) as h:
        await until(lambda: bool(h.services.leases.topology))
        status, grant = await h.call("/request?gpu=2")
        assert status == 200 and [g["info"]["number"] for g in grant] == [0, 2]
        shown = (await h.ok("/status"))[grant[0]["uuid"]]["topology"]
        assert shown == {
            "numa": "0",
            "cpus": "0-15",
            "links": {"1": "PHB", "2": "NV4", "3": "SYS"},
            "nvlink": [2],
        }
        assert (await h.ok("/devices"))[grant[1]["uuid"]]["topology"]["nvlink"] == [0]
        status, busy = await h.call("/request?gpu=2&link=numa")
        assert status == 409 and busy["link"] == "numa", busy
        status, never = await h.call("/request?gpu=3&link=nvlink")
        assert status == 422 and "no 3 gpu of this host" in never["error"], never
        status, bad = await h.call("/request?gpu=2&link=nvswitch")
        assert status == 400 and bad["links"] == ["nvlink", "numa"], bad
        status, grant = await h.call("/wait?gpu=2&link=nvlink&timeout=5")
        assert status == 200 and [g["info"]["number"] for g in grant] == [1, 3]


@async_test
async def test_the_links_are_read_again_when_the_inventory_changes(pairs):
    async with gpu_running(pairs, inventory_every=0.2) as h:
        await until(lambda: bool(h.services.leases.topology))
        uuid = next(d.uuid for d in h.services.inventory if d.number == 0)
        assert (await h.ok("/status"))[uuid]["topology"]["nvlink"] == [2]
        pairs.write(devices=[{}, {}, {}], topology="pcie")  # GPU 3 is gone; PCIe only
        await until(lambda: len(h.services.leases.topology.links) == 3, timeout=20)
        assert (await h.ok("/status"))[uuid]["topology"]["links"] == {"1": "PHB", "2": "PHB"}
        assert (await h.ok("/devices"))[uuid]["topology"]["nvlink"] == []


@async_test
async def test_without_topo_the_daemon_grants_the_lowest_numbers_and_refuses_a_link(tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}])
    async with gpu_running(scenario) as h:
        await until(lambda: h.services.leases.topology.why is not None)  # read, and failed
        status, grant = await h.call("/request?gpu=2")
        assert status == 200 and [g["info"]["number"] for g in grant] == [0, 1]
        status, refused = await h.call("/request?gpu=1&link=numa")
        assert status == 422 and "`" in refused["error"] and "topo -m` failed" in refused["error"]
        assert (await h.ok("/status"))[grant[0]["uuid"]]["topology"] is None


@pytest.mark.parametrize(
    "scenario, status, said",
    [
        (
            {"topology": "nvlink-pairs"},
            "ok",
            "NVLink between 0, 2; 1, 3; NUMA node 0: 0, 1; "
            "NUMA node 1: 2, 3: the best-connected free GPUs are granted",
        ),
        ({"topology": "pcie-pairs", "topo_format": "r440"}, "ok", "no NVLink; cpus 0-15: 0, 1"),
        ({}, "degraded", "Option topo is not recognized"),
        (
            {"topology": "nvlink-all", "faults": {"topo": {"hang": True}}},
            "degraded",
            "no answer in 1s: killed",
        ),
        (
            {"topology": "nvlink-all", "devices": [{}, {}, {"mig": "Enabled"}, {}]},
            "degraded",
            "MIG is on for GPU 2: the lowest free numbers are granted",
        ),
    ],
)
def test_the_doctor_says_how_the_gpus_are_linked_or_why_not(tmp_path, scenario, status, said):
    import asyncio
    from dataclasses import replace

    from patroller.config import Config
    from patroller.doctor.gpu import probe
    from patroller.doctor.gpuchecks import topology

    file = ScenarioFile(str(tmp_path / "s.json"), **{"devices": [{}, {}, {}, {}], **scenario})
    hangs = bool(scenario.get("faults"))  # only then may the command be cut short
    config = replace(
        Config(),
        nvidia_smi=file.command,
        topology_timeout=1.0 if hangs else Config.topology_timeout,
    )
    result = topology(asyncio.run(probe(config)))
    assert (result.status, result.check) == (status, "GPU topology") and said in result.detail, (
        result
    )


def test_a_waiter_that_insists_on_a_link_holds_back_no_later_one_that_fits():
    clock = FakeClock()
    leases = pairs_host(clock)
    for user in (BOB, CAROL, host_user("dave", 1004)):
        leases.request(user, {"gpu": 1})  # 0, 1, 2: 3 is free
    granted: dict[str, list[int]] = {}
    leases.wait(
        ALICE, {"gpu": 2}, lambda ds: granted.setdefault("alice", numbers(ds)), link="nvlink"
    )
    clock.advance(1)
    leases.wait(CAROL, {"gpu": 2}, lambda ds: granted.setdefault("carol", numbers(ds)))
    leases.release(BOB)  # 0 joins 3: two GPUs free, not linked by NVLink (SYS)
    assert granted == {"carol": [0, 3]}


def test_ties_in_the_lease_rules_go_to_the_users_last_gpu_then_the_oldest_release():
    clock = FakeClock()
    leases = lease_manager(clock, Inventory(devices(4)))
    leases.topology = Topology(
        {(f"GPU-{a}", f"GPU-{b}"): "NODE" for a, b in itertools.combinations(range(4), 2)},
        {f"GPU-{i}": "0" for i in range(4)},
    )
    for user, _number in ((BOB, 2), (CAROL, 3), (ALICE, 1)):
        leases.request(user, {"gpu": 1})  # 0, then 1, then 2: lowest first, none released yet
    leases.release(ALICE)  # 2, freed at 1000
    clock.advance(5)
    leases.release(CAROL)  # 1, freed at 1005
    clock.advance(5)
    leases.release(BOB)  # 0, freed at 1010
    assert numbers(leases.request(CAROL, {"gpu": 1})) == [1]  # the one she held last
    assert numbers(leases.request(ALICE, {"gpu": 1})) == [2]  # hers too
    assert numbers(leases.request(CAROL, {"gpu": 1})) == [3]  # never held: before 0 (1010)


def test_the_command_line_asks_for_a_link(tmp_path):
    import subprocess
    import sys
    import time

    from helpers import ROOT, ServerProcess

    from patroller import client

    scenario = ScenarioFile(
        str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}], topology="nvlink-pairs"
    )
    server = ServerProcess("--nvidia-smi", scenario.command, "--lease", "300").start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "PATROLLER_"))}

    def cli(command, *args):
        return subprocess.run(
            [sys.executable, "-m", "patroller.cli", command, "--server", server.server, *args],
            env={**env, "PYTHONPATH": ROOT},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    try:
        deadline = time.monotonic() + 20
        while all(v["topology"] is None for v in client.devices(server.server).values()):
            assert time.monotonic() < deadline, server.log
            time.sleep(0.05)
        reserved = cli("reserve", "-n", "2", "--link", "numa")
        assert (reserved.returncode, reserved.stdout) == (0, "0,1\n"), reserved
        ran = cli(
            "run", "-n", "2", "--link", "nvlink", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"
        )
        assert (ran.returncode, ran.stdout) == (75, ""), ran  # 2 and 3: PHB, not NVLink
        ran = cli(
            "run", "-n", "2", "--link", "numa", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"
        )
        assert (ran.returncode, ran.stdout) == (0, "2,3\n"), ran
        waited = cli("wait", "-n", "3", "--link", "nvlink", "--timeout", "5")
        assert waited.returncode == 77 and "no 3 gpu of this host" in waited.stderr, waited
        wrong = cli("reserve", "--link", "pcie")
        assert wrong.returncode == 2 and "--link" in wrong.stderr, wrong
    finally:
        server.stop()


def test_the_queue_says_which_link_a_waiter_insists_on():
    from patroller.cli.records import queue_table
    from patroller.cli.render import queue_line
    from patroller.http.views import queue_view

    leases = pairs_host(FakeClock())
    leases.request(BOB, {"gpu": 4})
    leases.wait(ALICE, {"gpu": 2}, lambda ds: None, link="nvlink")
    leases.wait(CAROL, {"gpu": 1}, lambda ds: None)
    shown = queue_view(leases)
    assert [(w["user"], w["link"]) for w in shown] == [("alice", "nvlink"), ("carol", None)]
    assert "2 GPUs (nvlink)" in queue_table(shown) and "1 GPU " in queue_table(shown)
    assert queue_line(shown[0]).startswith("waiting 1: alice wants 2 GPUs linked by nvlink (")
