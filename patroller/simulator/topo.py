"""`nvidia-smi topo -m` for the simulator, in the shapes real drivers print (the captures in
tests/fixtures/nvsmi/real/ show them).

Scenario keys (see program.py for the rest)::

    {"topology": "nvlink-pairs",   # a named shape, or a matrix: a list of rows of words
                                   # ([["X", "NV4"], ["NV4", "X"]]); absent: `topo` fails, as
                                   # on a driver or host without it
     "numa": [0, 0, 1, 1],         # each device's NUMA node (default: the shape's, else 0)
     "topo_format": "r550",        # "r440": spaces, `CPU Affinity` only; "r470": tabs, with
                                   # `NUMA Affinity`; "r550": tabs, `GPU NUMA ID` too, and a NIC
                                   # with its `NIC Legend` (default "r550")
     "faults": {"topo": {"fail": "not_supported", "hang": true}}}

Named shapes (n devices): ``nvlink-all`` (NV18 between every two), ``nvlink-pairs`` (devices
0-2, 1-3, 4-6, 5-7, ... bridged by NV4, the rest PHB within a NUMA half and SYS across),
``pcie-pairs`` (0-1, 2-3, ... behind one switch, PIX; PXB to the next pair within a half; SYS
across halves), ``two-numa`` (NODE within a half, SYS across), ``pcie`` (PHB between all).
Halves: the first half of the devices is NUMA node 0, the second node 1.
"""

from __future__ import annotations

from typing import Any

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""
SHAPES = ("nvlink-all", "nvlink-pairs", "pcie-pairs", "two-numa", "pcie")


def shape(name: str, n: int) -> list[list[str]]:
    """The matrix of a named shape for n devices; ValueError for an unknown name."""
    if name not in SHAPES:
        raise ValueError(f"unknown topology {name!r} (known: {', '.join(SHAPES)})")
    half = max(1, (n + 1) // 2)

    def word(a: int, b: int) -> str:
        if a == b:
            return "X"
        same_half = (a < half) == (b < half)
        if name == "nvlink-all":
            return "NV18"
        if name == "nvlink-pairs":
            if a // 4 == b // 4 and a % 2 == b % 2:
                return "NV4"
            return "PHB" if same_half else "SYS"
        if name == "pcie-pairs":
            if a // 2 == b // 2:
                return "PIX"
            return "PXB" if same_half else "SYS"
        if name == "two-numa":
            return "NODE" if same_half else "SYS"
        return "PHB"

    return [[word(a, b) for b in range(n)] for a in range(n)]


def numa_of(scn: dict[str, Any], n: int) -> list[int]:
    """Each device's NUMA node: the scenario's, else the halves (one node without halves)."""
    given = scn.get("numa")
    if isinstance(given, list) and len(given) == n:
        return [int(x) for x in given]
    half = max(1, (n + 1) // 2)
    two = scn.get("topology") in ("nvlink-pairs", "pcie-pairs", "two-numa")
    return [(1 if two and i >= half else 0) for i in range(n)]


def topo_matrix(scn: dict[str, Any], n: int) -> str | None:
    """What `topo -m` prints for n devices, or None where the scenario gives no topology."""
    given = scn.get("topology")
    if given is None:
        return None
    matrix = shape(given, n) if isinstance(given, str) else [list(map(str, r)) for r in given]
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise ValueError(f"the topology matrix must be {n} x {n}")
    fmt = scn.get("topo_format", "r550")
    numa = numa_of(scn, n)
    cpus = [f"{node * 16}-{node * 16 + 15}" for node in numa]
    nic = fmt == "r550"
    names = [f"GPU{i}" for i in range(n)] + (["NIC0"] if nic else [])
    trailing = (
        ["CPU Affinity"]
        + (["NUMA Affinity"] if fmt != "r440" else [])
        + (["GPU NUMA ID"] if fmt == "r550" else [])
    )
    rows = []
    for i in range(n):
        cells = [" X " if w == "X" and fmt != "r440" else w for w in matrix[i]]
        cells += ["PIX" if numa[i] == 0 else "SYS"] if nic else []
        extra = (
            [cpus[i]]
            + ([str(numa[i])] if fmt != "r440" else [])
            + (["", "N/A"] if fmt == "r550" else [])
        )
        rows.append([names[i], *cells, *extra])
    if nic:
        rows.append(["NIC0", *["PIX" if node == 0 else "SYS" for node in numa], " X "])
    if fmt == "r440":
        text = "".join(f"{c:<8}" for c in ["", *names]) + "CPU Affinity\n"
        text += "".join("".join(f"{c:<8}" for c in row).rstrip() + "\n" for row in rows)
    else:
        text = "\t" + "\t".join(names + trailing) + "\n"
        text += "".join("\t".join(row) + "\n" for row in rows)
    text += "\n" + LEGEND
    if nic:
        text += "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
    return text
