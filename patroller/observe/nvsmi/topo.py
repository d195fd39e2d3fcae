"""The parser of `nvidia-smi topo -m`: the matrix of links between the GPUs, and each GPU's CPU
and NUMA affinity.

What drivers print differs (the real captures in tests/fixtures/nvsmi/real/ show it): a header
row of device names (`GPU0`.., and NICs as `mlx5_0` or `NIC0`), then `CPU Affinity`, and from
some driver on `NUMA Affinity`, and later `GPU NUMA ID`; one row per device; cells split by
tabs, by runs of spaces, or both (`X` on the diagonal, with or without spaces around it); NIC
rows with empty affinity cells; a `Legend:` and a `NIC Legend:` after the matrix. The header
is read for the columns, never positions; cells are split on whitespace (no cell holds a
space: an affinity is `0-23,48-71`). NIC rows and columns are read past: only links between
GPUs matter here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_GPU = re.compile(r"GPU(\d+)$")
# The columns after the device columns, as printed (several words each).
TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_ABSENT = ("", "N/A")


class TopoError(ValueError):
    """The output is not a `topo -m` matrix Patroller can read; the message says why."""


@dataclass(frozen=True)
class TopoMatrix:
    """The GPUs of `topo -m` by nvidia-smi index, the link word between every two (both
    orders), and each GPU's CPU affinity and NUMA node (None where the column is absent or
    says N/A)."""

    gpus: tuple[int, ...]
    links: dict[tuple[int, int], str] = field(default_factory=dict)
    cpus: dict[int, str | None] = field(default_factory=dict)
    numa: dict[int, str | None] = field(default_factory=dict)
    nics: tuple[str, ...] = ()


def _header(tokens: list[str]) -> tuple[list[str], list[str]]:
    """The device columns and the trailing columns of a header row's words."""
    text = " ".join(tokens)
    trailing = [name for name in TRAILING if name in text]
    for name in trailing:
        text = text.replace(name, "")
    return text.split(), trailing


def parse_topology(text: str) -> TopoMatrix:
    """The matrix of `nvidia-smi topo -m`'s output; TopoError if there is none to read."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _is_header(line)), None)
    if start is None:
        raise TopoError("no matrix: no header row naming GPU0")
    columns, trailing = _header(lines[start].split())
    gpus = [int(m.group(1)) for m in map(_GPU.match, columns) if m]
    nics = tuple(c for c in columns if not _GPU.match(c))
    rows: dict[int, list[str]] = {}
    cpus: dict[int, str | None] = {}
    numa: dict[int, str | None] = {}
    for line in lines[start + 1 :]:
        words = line.split()
        if not words or words[0].rstrip(":") == "Legend":
            if rows:
                break
            continue
        found = _GPU.match(words[0])
        if found is None:
            continue  # a NIC's row
        cells = words[1 : 1 + len(columns)]
        if len(cells) < len(columns):
            raise TopoError(
                f"the row of {words[0]} has {len(cells)} cells for {len(columns)} columns"
            )
        gpu = int(found.group(1))
        rows[gpu] = cells
        extra = dict(zip(trailing, words[1 + len(columns) :], strict=False))
        cpus[gpu] = _value(extra.get("CPU Affinity"))
        numa[gpu] = _value(extra.get("NUMA Affinity"))
    if sorted(rows) != sorted(gpus):
        raise TopoError(f"rows for GPUs {sorted(rows)} but columns for {sorted(gpus)}")
    links: dict[tuple[int, int], str] = {}
    for gpu, cells in rows.items():
        for column, word in zip(columns, cells, strict=False):
            other = _GPU.match(column)
            if other is None:
                continue
            peer = int(other.group(1))
            if (peer == gpu) != (word == "X"):
                raise TopoError(f"GPU{gpu} to {column} is {word!r}: X only on the diagonal")
            if peer != gpu:
                links[(gpu, peer)] = word
    return TopoMatrix(tuple(gpus), links, cpus, numa, nics)


def _is_header(line: str) -> bool:
    """The header row: device names from GPU0 on (GPU0's own row has X next)."""
    words = line.split()
    return bool(words) and words[0] == "GPU0" and (len(words) == 1 or words[1] != "X")


def _value(cell: str | None) -> str | None:
    return None if cell is None or cell in _ABSENT else cell
