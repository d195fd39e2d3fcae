"""The nvidia-smi parsers on real captures, published by other projects (see SOURCES.md).

Each capture is checked against a plain reading of the same file written here, so there are
no expected values per file: a capture dropped into tests/fixtures/nvsmi/real/ and named in
SOURCES.md is tested as it is.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

from patroller.observe.nvsmi.discovery import ProcessInfo, parse_inventory
from patroller.observe.nvsmi.parsers import DmonParser, DmonRow, PmonParser, PmonRow
from patroller.observe.nvsmi.topo import parse_topology

REAL = Path(__file__).parent / "fixtures" / "nvsmi" / "real"
SOURCES = REAL / "SOURCES.md"
CAPTURES = sorted(p.name for p in REAL.iterdir() if p.name != SOURCES.name)
XML = [name for name in CAPTURES if name.endswith(".xml")]
DMON = [name for name in CAPTURES if name.endswith(".txt") and "dmon" in name]
PMON = [name for name in CAPTURES if name.endswith(".txt") and "pmon" in name]
TOPO = [name for name in CAPTURES if name.endswith(".txt") and "topo" in name]

# Captures that end in a row cut short when the GPUs stopped answering (see SOURCES.md).
CUT_LAST_ROW = {"pubsum-k80-dmon-pucet-crash-a.txt", "pubsum-k80-dmon-pucet-crash-b.txt"}

Cell = int | float | str | None


# ---- the plain reading of -q -x ----------------------------------------------------------------


def text_of(node: ET.Element | None) -> str | None:
    """An element's stripped text; None when it is absent or says no value.

    The parser maps every placeholder nvidia-smi prints (`N/A`, `[Not Supported]`, ...) to
    None. Only those that these captures hold are listed here, so a capture with a new one
    fails until someone has looked at it.
    """
    if node is None or node.text is None:
        return None
    text = node.text.strip()
    return None if text in ("", "N/A") else text


def number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def mib(text: str | None) -> int | None:
    """`24576 MiB` as 24576."""
    found = re.fullmatch(r"(\d+) MiB", text or "")
    return int(found.group(1)) if found else None


def processes(gpu: ET.Element) -> list[ProcessInfo] | None:
    """The <process_info> entries directly under a <gpu>; None without a <processes> element."""
    node = gpu.find("processes")
    if node is None:
        return None
    return [
        ProcessInfo(
            pid=int(entry.findtext("pid", "").strip()),
            type=text_of(entry.find("type")),
            name=text_of(entry.find("process_name")),
            used_memory=text_of(entry.find("used_memory")),
            gpu_instance_id=number(text_of(entry.find("gpu_instance_id"))),
            compute_instance_id=number(text_of(entry.find("compute_instance_id"))),
        )
        for entry in node.findall("process_info")
    ]


@pytest.mark.parametrize("name", XML)
def test_discovery_reads_real_capture(name: str) -> None:
    raw = (REAL / name).read_bytes()
    found = parse_inventory(raw.decode("utf-8"))
    root = ET.fromstring(raw)
    gpus = root.findall("gpu")

    assert found.warnings == []
    assert found.driver_version == text_of(root.find("driver_version"))
    assert found.cuda_version == text_of(root.find("cuda_version"))
    assert len(found.devices) == len(gpus)
    for number_in_document, (device, gpu) in enumerate(zip(found.devices, gpus, strict=True)):
        uuid = gpu.findtext("uuid", "").strip()
        assert device.uuid == uuid
        assert device.number == number_in_document
        assert device.pci_address == gpu.get("id")
        assert device.name == text_of(gpu.find("product_name"))
        assert device.brand == text_of(gpu.find("product_brand"))
        assert device.arch == text_of(gpu.find("product_architecture"))
        assert device.minor_number == number(text_of(gpu.find("minor_number")))
        # The GPU's own framebuffer: a direct child, not that of one of its MIG devices.
        total = text_of(gpu.find("fb_memory_usage/total"))
        assert device.total_mem == total
        assert found.memory_mib[uuid] == mib(total)
        assert device.mig_mode == text_of(gpu.find("mig_mode/current_mig"))
        assert [
            (m.index, m.gpu_instance_id, m.compute_instance_id, m.memory_mib)
            for m in found.mig[uuid]
        ] == [
            (
                number(text_of(entry.find("index"))),
                number(text_of(entry.find("gpu_instance_id"))),
                number(text_of(entry.find("compute_instance_id"))),
                mib(text_of(entry.find("fb_memory_usage/total"))),
            )
            for entry in gpu.findall("mig_devices/mig_device")
        ]
        assert found.processes[uuid] == processes(gpu)


def test_real_captures_include_mig() -> None:
    """At least one capture has MIG enabled and lists MIG devices."""
    assert any(
        gpu.findtext("mig_mode/current_mig", "").strip() == "Enabled"
        and gpu.findall("mig_devices/mig_device")
        for name in XML
        for gpu in ET.parse(REAL / name).getroot().findall("gpu")
    )


# ---- the plain reading of dmon and pmon ---------------------------------------------------------


class Reading(NamedTuple):
    """What a plain reading finds in a dmon or pmon capture."""

    headers: int  # header lines, repeats included (units lines are not headers)
    rows: list[tuple[tuple[str, ...], list[str]]]  # (header, cells) of each readable data line
    damaged: list[str]  # data lines whose cells do not match their header, stripped


def lines(name: str) -> list[str]:
    """A capture's lines as a reader gets them: newlines kept."""
    with open(REAL / name, encoding="utf-8", newline="") as f:
        return f.readlines()


def read_plainly(text_lines: Sequence[str]) -> Reading:
    header: tuple[str, ...] = ()
    headers, rows, damaged = 0, [], []
    for line in text_lines:
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            words = tuple(text[1:].split())
            if "gpu" in words:
                header, headers = words, headers + 1
            continue
        if header and header[-1] == "command":
            # pmon pads the command to 15 characters; it is the rest of the line.
            cells = [cell.strip() for cell in text.split(None, len(header) - 1)]
        else:
            cells = text.split()
        if len(cells) == len(header):
            rows.append((header, cells))
        else:
            damaged.append(text)
    return Reading(headers, rows, damaged)


def cell(text: str) -> Cell:
    if text == "-":
        return None
    if re.fullmatch(r"\d+", text):
        return int(text)
    if re.fullmatch(r"\d+\.\d+", text):
        return float(text)
    return text


def check_damage(name: str, text_lines: Sequence[str], reading: Reading) -> None:
    """Only the known cut last rows are damaged."""
    if name in CUT_LAST_ROW:
        assert not text_lines[-1].endswith("\n")
        assert reading.damaged == [text_lines[-1].strip()]
    else:
        assert reading.damaged == []


@pytest.mark.parametrize("name", DMON)
def test_dmon_parser_reads_real_capture(name: str) -> None:
    text_lines = lines(name)
    reading = read_plainly(text_lines)
    check_damage(name, text_lines, reading)
    parser = DmonParser()
    rows = [row for row in map(parser.feed, text_lines) if row is not None]

    expected = []
    for header, cells in reading.rows:
        # The parser renames a few columns (`pwr` is `power`): compare values in column order.
        expected.append(
            (
                int(cells[header.index("gpu")]),
                [
                    cell(text)
                    for column, text in zip(header, cells, strict=True)
                    if column not in ("gpu", "date", "time")
                ],
            )
        )
    assert all(isinstance(row, DmonRow) for row in rows)
    assert [(row.gpu, list(row.values.values())) for row in rows] == expected
    assert parser.headers == reading.headers
    assert parser.skipped == len(reading.damaged)
    assert parser.last_skipped == (reading.damaged[-1] if reading.damaged else None)


@pytest.mark.parametrize("name", PMON)
def test_pmon_parser_reads_real_capture(name: str) -> None:
    text_lines = lines(name)
    reading = read_plainly(text_lines)
    check_damage(name, text_lines, reading)
    parser = PmonParser()
    rows = [row for row in map(parser.feed, text_lines) if row is not None]

    named = ("gpu", "pid", "type", "command", "date", "time")
    expected = []
    for header, cells in reading.rows:
        at = dict(zip(header, cells, strict=True))
        pid = cell(at["pid"])
        expected.append(
            PmonRow(
                gpu=int(at["gpu"]),
                pid=pid,
                # an idle device's row is all `-`
                type=None if pid is None else cell(at.get("type", "-")),
                command=None if pid is None else cell(at.get("command", "-")),
                values={
                    column: cell(text)
                    for column, text in zip(header, cells, strict=True)
                    if column not in named
                },
                date=cell(at["date"]) if "date" in at else None,
                time=cell(at["time"]) if "time" in at else None,
            )
        )
    assert rows == expected
    assert parser.headers == reading.headers
    assert parser.skipped == len(reading.damaged)
    assert parser.last_skipped == (reading.damaged[-1] if reading.damaged else None)


# ---- topo -m ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOPO)
def test_topo_parser_reads_real_capture(name: str) -> None:
    """Plainly: the rows that start with a GPU's name and hold an X; each row's cells are the
    words after the name, as many as the header names devices (NICs too)."""
    text = (REAL / name).read_text(encoding="utf-8")
    matrix = parse_topology(text)
    rows = {
        line.split()[0]: line.split()[1:]
        for line in text.splitlines()
        if line.split()[:1] and re.fullmatch(r"GPU\d+", line.split()[0]) and "X" in line.split()
    }
    header = next(
        line.split()
        for line in text.splitlines()
        if line.split()[:1] == ["GPU0"] and line.split()[1:2] != ["X"]
    )
    names = [w for w in header if re.fullmatch(r"GPU\d+|NIC\d+|mlx5_\d+", w)]
    assert [f"GPU{g}" for g in matrix.gpus] == list(rows)
    for a, cells in rows.items():
        # a row goes on past the devices' columns (CPU affinity, NUMA node): strict=False
        for b, word in zip(names, cells, strict=False):
            if b.startswith("GPU") and b != a:
                assert matrix.links[(int(a[3:]), int(b[3:]))] == word
        assert matrix.cpus[int(a[3:])] == cells[len(names)]
        numa = cells[len(names) + 1] if "NUMA" in header else None
        assert matrix.numa[int(a[3:])] == (None if numa == "N/A" else numa)
    assert len(matrix.links) == len(rows) * (len(rows) - 1)


# ---- the collection itself ----------------------------------------------------------------------


def test_every_capture_is_of_a_known_kind() -> None:
    """Each file is tested by one of the tests above, and each kind has captures."""
    assert sorted(XML + DMON + PMON + TOPO) == CAPTURES
    assert XML and DMON and PMON and TOPO


def test_sources_name_every_capture() -> None:
    """SOURCES.md has one section per file in the directory, and no other."""
    named = re.findall(r"^### `([^`]+)`$", SOURCES.read_text(encoding="utf-8"), re.MULTILINE)
    assert sorted(named) == CAPTURES
