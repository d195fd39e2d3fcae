"""Pure parsing of `nvidia-smi -q -x`: the device inventory, its MIG instances and processes.

The XML changed across drivers (schema v9 to v13): elements appear, get renamed, or hold
text such as `N/A` or `Unknown Error` instead of a value. Every field is therefore optional
except the uuid, without which a device cannot be reserved.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from patroller.core.devices import Device, MigInstance
from patroller.core.health import Reading
from patroller.observe.nvsmi.health import health_reading


class DiscoveryError(ValueError):
    """The text is not an `nvidia-smi -q -x` document at all."""


@dataclass(frozen=True)
class ProcessInfo:
    """A process listed under one GPU by `nvidia-smi -q -x`."""

    pid: int
    type: str | None = None  # C, G or C+G
    name: str | None = None
    used_memory: str | None = None  # as printed, e.g. `1234 MiB`
    gpu_instance_id: int | None = None  # MIG only
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class Discovery:
    """What `nvidia-smi -q -x` says about the host."""

    driver_version: str | None
    devices: list[Device]
    # By device uuid: None where the document gives no process list, [] where it is empty.
    processes: dict[str, list[ProcessInfo] | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    cuda_version: str | None = None
    # By device uuid, every device: its MIG devices in document order; [] when MIG is off,
    # when the driver predates MIG (no <mig_devices>) or prints no list (`None`, `N/A`).
    mig: dict[str, list[MigInstance]] = field(default_factory=dict)
    # By device uuid, every device: total framebuffer in MiB; None when not printed as a number.
    memory_mib: dict[str, int | None] = field(default_factory=dict)
    # By device uuid, every device: what it says of its health (nvsmi/health.py).
    health: dict[str, Reading] = field(default_factory=dict)


# Texts that stand where a value should be: none of them is a value.
_NOT_VALUES = frozenset(
    {
        "",
        "n/a",
        "unknown",
        "unknown error",
        "not supported",
        "not available",
        "requested functionality has been deprecated",
        "insufficient permissions",
        "gpu is lost",
        "gpu requires reset",
    }
)
_UUID = re.compile(r"GPU-[0-9A-Za-z-]+")
_DIGITS = re.compile(r"\d+")
_MIB = re.compile(r"(\d+)\s*(?:MiB|MB)?")  # `24576 MiB`; no unit on some re-serialised documents
# Where the document starts: an XML declaration, a DOCTYPE or an element.
_START = re.compile(r"<[?!A-Za-z_]")


def _clean(text: str | None) -> str | None:
    """Stripped text, or None for the placeholders nvidia-smi prints instead of values."""
    if text is None:
        return None
    text = text.strip()
    if text.lower() in _NOT_VALUES or (text.startswith("[") and text.endswith("]")):
        return None  # `[N/A]`, `[Not Supported]`, `[Unknown Error]`, ...
    return text


def _text(parent: ET.Element, path: str) -> str | None:
    """The cleaned text of a child element, None when absent or not a value."""
    node = parent.find(path)
    return None if node is None else _clean(node.text)


def _int(text: str | None) -> int | None:
    """Digits as an int, anything else as None."""
    return int(text) if text is not None and _DIGITS.fullmatch(text) else None


def _excerpt(text: str, limit: int = 120) -> str:
    """The start of a text, quoted, for error messages."""
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _root(xml_text: str, warnings: list[str]) -> ET.Element:
    """The <nvidia_smi_log> element, or DiscoveryError with a readable reason."""
    if not xml_text or not xml_text.strip():
        raise DiscoveryError("nvidia-smi -q -x printed nothing")
    start = _START.search(xml_text)
    if start is None:
        raise DiscoveryError(f"nvidia-smi -q -x printed no XML: {_excerpt(xml_text)}")
    preamble = xml_text[: start.start()]
    if preamble.strip(" \t\r\n\ufeff"):
        warnings.append(f"ignored text before the XML document: {_excerpt(preamble)}")
    body = xml_text[start.start() :]
    if "<!ENTITY" in body:
        # nvidia-smi never declares entities; refusing them rules out entity expansion attacks.
        raise DiscoveryError("nvidia-smi -q -x output declares XML entities: refused")
    try:
        # expat does not load external DTDs, so the DOCTYPE line fetches nothing.
        root = ET.fromstring(body)
    except ET.ParseError as error:
        raise DiscoveryError(
            f"nvidia-smi -q -x output is not well-formed XML ({error}): {_excerpt(xml_text)}"
        ) from None
    if root.tag != "nvidia_smi_log":
        raise DiscoveryError(f"expected an <nvidia_smi_log> document, got <{root.tag}>")
    return root


def _total_mem(gpu: ET.Element) -> str | None:
    """Framebuffer size as printed (`24576 MiB`); the direct child, not a MIG device's."""
    total = _text(gpu, "fb_memory_usage/total")
    return total if total is not None and total[0].isdigit() else None


def _mib(text: str | None) -> int | None:
    """`24576 MiB` as 24576; None for anything that is not a size in MiB."""
    found = _MIB.fullmatch(text) if text is not None else None
    return int(found.group(1)) if found else None


def _mig_devices(gpu: ET.Element) -> list[MigInstance]:
    """The <mig_device> children of <mig_devices>; [] for `None`, `N/A` or no element."""
    node = gpu.find("mig_devices")
    if node is None:
        return []
    return [
        MigInstance(
            index=_int(_text(entry, "index")),
            gpu_instance_id=_int(_text(entry, "gpu_instance_id")),
            compute_instance_id=_int(_text(entry, "compute_instance_id")),
            memory_mib=_mib(_text(entry, "fb_memory_usage/total")),
        )
        for entry in node.findall("mig_device")
    ]


def _device(gpu: ET.Element, number: int) -> tuple[Device | None, str | None]:
    """The device at one index, or None and the reason it cannot be reserved."""
    pci = _clean(gpu.get("id")) or _text(gpu, "pci/pci_bus_id")
    uuid = _text(gpu, "uuid")
    if uuid is None or not _UUID.fullmatch(uuid):
        raw = gpu.findtext("uuid")
        return None, (
            f"GPU {number} ({pci or 'no PCI address'}) has no usable uuid "
            f"({'missing' if raw is None else repr(raw.strip())}): it cannot be reserved"
        )
    return Device(
        uuid=uuid,
        number=number,
        name=_text(gpu, "product_name"),
        brand=_text(gpu, "product_brand"),
        arch=_text(gpu, "product_architecture"),
        pci_address=pci,
        total_mem=_total_mem(gpu),
        minor_number=_int(_text(gpu, "minor_number")),
        mig_mode=_text(gpu, "mig_mode/current_mig"),
    ), None


def _processes(gpu: ET.Element, uuid: str, warnings: list[str]) -> list[ProcessInfo] | None:
    """The processes listed under one GPU: None when not reported, [] when there are none."""
    node = gpu.find("processes")
    if node is None:
        return None
    entries = node.findall("process_info")
    if not entries and (node.text or "").strip() not in ("", "None"):
        return None  # `N/A`, `Not Supported`: unknown, which is not the same as none
    found = []
    for entry in entries:
        pid = _int(_text(entry, "pid"))
        if pid is None:
            warnings.append(f"{uuid}: process entry without a readable pid skipped")
            continue
        found.append(
            ProcessInfo(
                pid=pid,
                type=_text(entry, "type"),
                name=_text(entry, "process_name"),
                used_memory=_text(entry, "used_memory"),
                gpu_instance_id=_int(_text(entry, "gpu_instance_id")),
                compute_instance_id=_int(_text(entry, "compute_instance_id")),
            )
        )
    return found


def parse_inventory(xml_text: str) -> Discovery:
    """Devices (numbered in document order, the nvidia-smi index) and processes from `-q -x`."""
    warnings: list[str] = []
    root = _root(xml_text, warnings)
    devices: list[Device] = []
    processes: dict[str, list[ProcessInfo] | None] = {}
    mig: dict[str, list[MigInstance]] = {}
    memory_mib: dict[str, int | None] = {}
    health: dict[str, Reading] = {}
    for number, gpu in enumerate(root.findall("gpu")):
        device, problem = _device(gpu, number)
        if device is not None and device.uuid in processes:
            problem, device = f"GPU {number} repeats uuid {device.uuid}: skipped", None
        if device is None:
            warnings.append(str(problem))
            continue
        devices.append(device)
        processes[device.uuid] = _processes(gpu, device.uuid, warnings)
        mig[device.uuid] = _mig_devices(gpu)
        # The direct child: a MIG device's own <fb_memory_usage> is its share, not the GPU's.
        memory_mib[device.uuid] = _mib(_text(gpu, "fb_memory_usage/total"))
        health[device.uuid] = health_reading(gpu)
    if not devices:
        warnings.append("nvidia-smi -q -x lists no reservable GPU")
    return Discovery(
        driver_version=_text(root, "driver_version"),
        devices=devices,
        processes=processes,
        warnings=warnings,
        cuda_version=_text(root, "cuda_version"),
        mig=mig,
        memory_mib=memory_mib,
        health=health,
    )
