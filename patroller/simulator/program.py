"""A fake nvidia-smi for tests: prints what real drivers print, driven by a JSON scenario.

Run as ``python -m patroller.simulator [--scenario FILE] <nvidia-smi arguments>``; the
scenario may instead be named by ``PATROLLER_SIM_SCENARIO`` (none: one idle r550 GPU). Answers
``-q -x`` (``-i`` too), ``-L`` (``--list-gpus``), ``dmon`` and ``pmon`` (``-i -c -d -s -o``),
``topo -m`` (from the ``topology`` key, see topo.py: absent, it fails as an old driver does)
and ``--query-compute-apps=<fields> --format=csv[,noheader][,nounits]`` (fields ``gpu_uuid pid
used_memory process_name gpu_bus_id gpu_name``; a name is printed as it is, commas and all,
unquoted like the real tool); anything else fails as nvidia-smi does. dmon/pmon re-read the
file whenever it changes (an unreadable or half-written file keeps the previous scenario), so a
test can start and stop processes live.

Scenario (every key optional; ``null`` statistics print as ``-``)::

    {"era": "r550",                # output shapes: "r384", "r470" or "r550" (NVIDIA-SMI.md)
     "driver_version": "550.54.15", "cuda_version": "12.4",    # defaults follow the era
     "doctype": "nvsmi_device_v12.dtd",                         # null: no DOCTYPE line
     "interval": 0.1,              # dmon/pmon seconds between samples unless -d (default 1)
     "show_all_devices": false,    # false: dmon/pmon watch the first four devices, like the
                                   # real one, unless -i or NVSMI_SHOW_ALL_DEVICES=1
     "devices": [{"name": "NVIDIA A100-SXM4-80GB", "brand": "NVIDIA", "arch": "Ampere",
                  "uuid": "GPU-...", "pci": "00000000:01:00.0", "minor": 1,
                  "memory_mib": 81920, "reserved_mib": 512, "mig": "Disabled",
                  "mig_devices": [{"gpu_instance_id": 1, "compute_instance_id": 0,
                                   "memory_mib": 9856, "profile": "1g.10gb",
                                   "uuid": "MIG-..."}],
                  "pmon_blind": false,   # true: pmon prints only `-` rows for this device
                  "pmon_no_figures": false,  # true: pmon lists its processes (in MIG mode too,
                                         # as 590-series drivers do) with `-` in every figure
                  "silent": false,       # true: dmon and pmon print no row for it, the others
                                         # go on, and no stream says it is lost
                  "health": {"remap_pending": false, "remap_failure": false,
                             "retire_pending": false, "retired_pages": 0,
                             "ecc_uncorrectable": 0, "slowdowns": ["hw_thermal_slowdown"],
                             "reset_required": false, "recovery_action": null,
                             "broken": null},   # -q -x's health sections (see below)
                  "stats": {"pwr": 61, "gtemp": 34, "mtemp": null, "sm": 97, "mem": 40,
                            "enc": 0, "dec": 0, "mclk": 1593, "pclk": 1410, "fb": 4096}}],
     "processes": [{"pid": 1426541, "gpu": 0, "type": "C", "name": "python",
                    "used_mib": 4096, "sm": 95, "mem": 40, "gi": 1, "ci": 0}],
     "faults": {"garbage_every": 5, "pmon": {"fail": "gpu_lost"}},
     "topology": "nvlink-pairs",   # what `topo -m` prints (simulator/topo.py: a named shape,
                                   # or a matrix; "numa" and "topo_format" there); absent: fails
     "legacy_mig_uuids": false,    # true: -L names MIG devices as R450-R465 drivers did
     "live_pids_only": false,      # true: leave out processes whose pid has exited
     "trace": "/tmp/pmon.trace"}   # pmon appends "<epoch time> <pid> <gpu>" when it first
                                   # prints a process (for reaction-time measurements)

Device indices are list positions (PCI order); ``minor`` may be in any order; ``"devices": []``
is a host with no GPU. ``arch`` defaults to the product name's architecture (H100/H200/GH200
Hopper; A100/A30/A10/A40/RTX A6000 Ampere; V100 Volta; P100/P40 Pascal; L4/L40/RTX 4090 Ada
Lovelace; B200/GB200 Blackwell; T4 Turing; a model number as a whole word, a letter may follow
as in L40S), else the era's default (Ampere; Pascal in r384); only r550 prints it.

Device figures follow the processes on it unless its ``stats`` set them (``stats`` keys are dmon
column names; r384's ``temp`` is ``gtemp``): ``sm`` and ``mem`` are the sums of its processes'
``sm``/``mem`` (at most 100), ``fb`` the sum of their ``used_mib``, and with load = ``sm``
(the ``stats`` one if set) ``pwr`` = 25 + 3 * load watts and ``gtemp`` = 30 + 0.4 * load
degrees (rounded). A process's ``gpu`` is a device index (list a pid twice to put it on two
devices); its pmon values are ``sm mem enc dec jpg ofa ccpm`` (``fb`` is ``used_mib``), ``-``
when absent; ``"name": ""`` prints ``-``.

MIG (r470 and r550; r384 ignores it): ``"mig": "Enabled"`` with ``mig_devices`` prints a
``<mig_device>`` per instance (index, gpu_instance_id, compute_instance_id, fb_memory_usage
whose used is the sum of ``used_mib`` of the processes in that GPU instance), else the text
``None``. A process on a MIG device prints ``gi``/``ci`` (default: the first instance's) as its
gpu_instance_id/compute_instance_id; elsewhere they are ``N/A``. As on real hosts, pmon gives no
per-process attribution in MIG mode: only the device's ``-`` row, though processes run. dmon
still prints the device, utilisation (``sm mem enc dec jpg ofa``) as ``-`` and ``-q -x``
gpu_util as ``N/A`` (``stats`` may still set them); power and temperature follow the hidden load.
``"pmon_blind": true`` makes pmon print only ``-`` for a device without MIG too (some GPUs and
drivers do). ``-q -x`` and ``--query-compute-apps`` (by the parent GPU's uuid) list them all.

``-L`` lists each GPU (``GPU 0: <name> (UUID: GPU-...)``) and under a GPU in MIG mode its MIG
devices, the only place nvidia-smi prints their uuids: ``  MIG 1g.10gb     Device  0: (UUID:
MIG-<uuid>)`` as R470 and later drivers do, or with ``"legacy_mig_uuids": true`` ``  MIG
1g.10gb Device 0: (UUID: MIG-GPU-<gpu uuid>/<gi>/<ci>)`` as R450 to R465 did. An instance's
``uuid`` defaults to a version-5 uuid of its GPU's uuid and instance ids (the same at every
call); its ``profile`` to ``<g>g.<gb>gb``, g the sevenths of the GPU's memory it has.

Health (``-q -x`` only; re-read at each call, so a test raises and clears a condition by
rewriting the file): every era prints ``<ecc_errors><volatile>`` (r384 as ``single_bit`` and
``double_bit`` with ``total``, later as ``sram_``/``dram_`` counts: ``ecc_uncorrectable`` is the
uncorrectable one), ``<retired_pages>`` (``retire_pending``: ``pending_retirement``, and from
r470 ``pending_blacklist``, Yes; ``retired_pages``: the double-bit ``retired_count``), the
clocks' reasons (``clocks_throttle_reasons`` before r550, ``clocks_event_reasons`` in r550;
each of ``slowdowns`` Active); r470 on ``<remapped_rows>`` (``remap_pending``,
``remap_failure``); r550 ``<gpu_reset_status>`` (``reset_required``); ``recovery_action`` a
``<gpu_recovery_action>`` as R570 on prints it (only when set); ``broken`` a text (``GPU is
lost``) printed for the GPU's temperature.

Devices that change: ``-q -x`` reads the scenario at each call. dmon/pmon choose their devices
once at start (``-i`` by index, uuid or PCI id; without it all, or the first four) and follow
each by uuid; when one disappears from the scenario the stream prints the era's "Unable to
determine the device handle for GPU<pci>: GPU is lost. Reboot the system to recover this GPU"
naming its PCI id and exits with status 15. A device added later does not appear until the
stream is restarted. Default uuids and PCI ids follow list positions: give them explicitly to
remove a device other than the last.

Fault knobs (in ``faults``; a nested object under ``"-q"``, ``"-L"``, ``"dmon"``, ``"pmon"``
or ``"--query-compute-apps"`` overrides them for that command only; all re-read live):

- ``fail``: literal text, or a name: ``no_driver`` (9), ``no_devices`` (6), ``mismatch`` (18),
  ``nvml_unknown``, ``handle_unknown`` (255), ``gpu_lost`` (15), ``not_supported`` (3). Printed on
  stdout like the real messages; ``fail_status`` overrides the status. Live in dmon/pmon: the
  stream ends with it.
- ``stderr``: text written to stderr when the command starts.
- ``exit_after_lines``: print N data rows then exit with ``exit_status`` (default 1).
- ``stall_after_lines``: after N data rows print nothing more but stay alive, stdout open (0:
  at once): a hung nvidia-smi, as Patroller sees one. Removing the knob resumes the stream; a
  restarted one prints N rows again, then stalls.
- ``ignore_sigterm``: dmon/pmon ignore SIGTERM, as a stuck one may: only SIGKILL ends them
  (a hanging query too, see ``hang``).
- ``hang``: ``-q -x``, ``-L`` and ``--query-compute-apps`` print nothing and never end, as a
  query stuck in the driver does (scope it with ``"-q"``, ``"-L"`` or
  ``"--query-compute-apps"``); SIGTERM ends them quietly unless ``ignore_sigterm`` is set too.
- ``garbage_every``: after every N data rows add a garbled line: empty, ``^C`` inside a copy of
  the row, or the row cut in half, in turn.
- ``repeat_header_every``: print the two header lines again every N intervals (default 30;
  0: only at the start).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import uuid as uuids
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from xml.sax.saxutils import escape

from patroller.simulator.topo import topo_matrix

Scenario = dict[str, Any]
COMMANDS = ("-q", "-L", "dmon", "pmon", "--query-compute-apps", "topo")
# The namespace of the MIG uuids the simulator makes up (uuid5 of GPU uuid and instance ids).
MIG_NAMESPACE = uuids.UUID("6d1c0e4a-3b8f-5e2a-9c71-4f0b2d8e6a13")

FAILURES = {
    "no_driver": (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        " Make sure that the latest NVIDIA driver is installed and running.",
        9,
    ),
    "no_devices": ("No devices were found", 6),
    "mismatch": ("Failed to initialize NVML: Driver/library version mismatch", 18),
    "nvml_unknown": ("Failed to initialize NVML: Unknown Error", 255),
    "handle_unknown": (
        "Unable to determine the device handle for GPU{sp}{pci}: Unknown Error",
        255,
    ),
    "gpu_lost": (
        "Unable to determine the device handle for GPU{sp}{pci}: GPU is lost."
        " Reboot the system to recover this GPU",
        15,
    ),
    "not_supported": ("Not supported on the device(s)\nFailed to process command line", 3),
}

UNITS = {
    "pwr": "W",
    "temp": "C",
    "gtemp": "C",
    "mtemp": "C",
    "sm": "%",
    "mem": "%",
    "enc": "%",
    "dec": "%",
    "jpg": "%",
    "ofa": "%",
    "mclk": "MHz",
    "pclk": "MHz",
    "pviol": "%",
    "tviol": "bool",
    "fb": "MB",
    "bar1": "MB",
    "ccpm": "MB",
    "sbecc": "errs",
    "dbecc": "errs",
    "pci": "errs",
    "rxpci": "MB/s",
    "txpci": "MB/s",
}

DEFAULT_STATS = {
    "pwr": 25,
    "gtemp": 30,
    "mtemp": None,
    "sm": 0,
    "mem": 0,
    "enc": 0,
    "dec": 0,
    "jpg": 0,
    "ofa": 0,
    "mclk": 1215,
    "pclk": 210,
    "pviol": 0,
    "tviol": 0,
    "bar1": 2,
    "ccpm": 0,
    "sbecc": None,
    "dbecc": None,
    "pci": 0,
    "rxpci": 0,
    "txpci": 0,
}

# dmon's utilisation columns: not available for a GPU in MIG mode (printed as `-`).
UTILISATION = ("sm", "mem", "enc", "dec", "jpg", "ofa")

# Power and temperature rise with the device's sm% (the load): idle + load * slope.
IDLE_PWR, PWR_PER_SM = 25, 3  # W: 25 idle, 325 at sm 100
IDLE_GTEMP, GTEMP_PER_SM = 30, 0.4  # C: 30 idle, 70 at sm 100

# product_architecture from the product name when the scenario gives no `arch`: a model
# number as a whole word ("GH200" is not "H200", "A100" is not "A10"; a letter may follow,
# as in "L40S" or "A10G").
ARCHITECTURES = (
    ("Hopper", ("H100", "H200", "GH200")),
    ("Ampere", ("A100", "A30", "A10", "A40", "A6000")),
    ("Volta", ("V100",)),
    ("Pascal", ("P100", "P40")),
    ("Ada Lovelace", ("L4", "L40", "RTX 4090")),
    ("Blackwell", ("B200", "GB200")),
    ("Turing", ("T4",)),
)

# -o D / -o T: (header, units, strftime) segments that lead every line.
STAMPS = {
    "D": ("Date       ", "YYYYMMDD   ", "%Y%m%d   "),
    "T": ("Time       ", "HH:MM:SS   ", "%H:%M:%S   "),
}


@dataclass(frozen=True)
class Era:
    """The output shapes of one driver generation."""

    dtd: str
    driver: str
    cuda: str | None
    width: int  # dmon and pmon metric columns
    pid_head: int  # the newest pmon prints its pid header one wider than its pid data
    pid_data: int
    type_head: int
    gap: str  # spaces before pmon's command column
    tail: str  # the newest drivers end lines with a space
    modern: bool  # MIG, gtemp/mtemp, instance ids (r470 on)
    arch: bool  # product_architecture (495 on) and fb reserved (510 on): r550 here
    newest: bool  # jpg/ofa/ccpm columns, gpu_power_readings, "GPU0000:..." (r550)


ERAS = {
    "r384": Era(
        "nvsmi_device_v9.dtd", "384.130", None, 5, 7, 7, 5, "   ", "", False, False, False
    ),
    "r470": Era(
        "nvsmi_device_v11.dtd", "470.199.02", "11.4", 5, 10, 10, 5, "   ", "", True, False, False
    ),
    "r550": Era(
        "nvsmi_device_v12.dtd", "550.54.15", "12.4", 6, 11, 10, 6, "    ", " ", True, True, True
    ),
}


class _Exit(Exception):
    """Stop with a message on stdout (where nvidia-smi prints its errors) and a status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message, self.status = message, status


class _Stop(BaseException):
    """Raised from a signal handler, so that no except clause swallows it."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _bad_args() -> _Exit:
    return _Exit("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 2)


def _check(scn: Any) -> Scenario:
    """The scenario if its shape is usable, else ValueError."""
    if not isinstance(scn, dict) or scn.get("era", "r550") not in ERAS:
        raise ValueError("a scenario is an object with era r384, r470 or r550")
    for key in ("devices", "processes"):
        items = scn.get(key, [])
        if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
            raise ValueError(f"{key} must be a list of objects")
    if not all("pid" in p for p in scn.get("processes", [])):
        raise ValueError("every process needs a pid")
    if not isinstance(scn.get("faults", {}), dict):
        raise ValueError("faults must be an object")
    interval = scn.get("interval", 1)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise ValueError("interval must be a positive number of seconds")
    return scn


class Source:
    """The scenario file, re-read when its stat changes; a bad read keeps the last good one."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: Any = None
        self.scenario: Scenario = {}
        if path:
            self._stamp = self._stat()
            with open(path, encoding="utf-8") as f:
                self.scenario = _check(json.load(f))

    def _stat(self) -> Any:
        st = os.stat(self.path)  # type: ignore[arg-type]  # refresh asks only with a path
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def refresh(self) -> Scenario:
        """The current scenario."""
        try:
            stamp = self._stat() if self.path else None
            if stamp != self._stamp:
                # a stamp of None (no path) equals the first one: never opened without a path
                with open(self.path, encoding="utf-8") as f:  # type: ignore[arg-type]
                    self.scenario = _check(json.load(f))
                self._stamp = stamp
        except (OSError, ValueError):
            pass  # a test is rewriting the file: try again next interval
        return self.scenario


def _era(scn: Scenario) -> Era:
    return ERAS[scn.get("era", "r550")]


def _architecture(name: str, modern: bool) -> str:
    """The architecture a product name belongs to; the era's default when unknown."""
    for arch, models in ARCHITECTURES:
        for model in models:
            if re.search(rf"(?<![A-Za-z0-9]){re.escape(model)}(?![0-9])", name, re.IGNORECASE):
                return arch
    return "Ampere" if modern else "Pascal"


def _devices(scn: Scenario) -> list[dict[str, Any]]:
    """The devices in index order, defaults filled in."""
    modern = _era(scn).modern
    raw = scn.get("devices", [{}])  # an explicit [] is a host whose GPUs are gone
    out = []
    for i, dev in enumerate(raw):
        full = {
            "uuid": f"GPU-{i:08x}-5a1e-4e57-8000-{i:012x}",
            "pci": f"00000000:{i + 1:02X}:00.0",
            "minor": i,
            "name": "NVIDIA A100-SXM4-80GB" if modern else "Tesla P100-PCIE-16GB",
            "brand": "NVIDIA" if modern else "Tesla",
            "memory_mib": 81920 if modern else 16280,
            "reserved_mib": 512,
            "mig": "Disabled",
        }
        full.update(dev)
        if "arch" not in dev:
            full["arch"] = _architecture(str(full["name"]), modern)
        full["index"] = i
        out.append(full)
    return out


def _mig(scn: Scenario, dev: dict[str, Any]) -> bool:
    """Whether the device is in MIG mode (eras before r470 have no MIG)."""
    return _era(scn).modern and dev["mig"] == "Enabled"


def _procs(scn: Scenario, index: int) -> list[dict[str, Any]]:
    procs = [p for p in scn.get("processes") or [] if p.get("gpu", 0) == index]
    if scn.get("live_pids_only"):  # like the driver: a process that has exited is not listed
        procs = [p for p in procs if os.path.exists(f"/proc/{p['pid']}")]
    return procs


def _attributed(scn: Scenario, dev: dict[str, Any]) -> list[dict[str, Any]]:
    """The processes pmon prints for the device: none in MIG mode or on a blind device, unless
    it prints them without figures (590-series drivers in MIG mode)."""
    if dev.get("pmon_no_figures"):
        return _procs(scn, dev["index"])
    if dev.get("pmon_blind") or _mig(scn, dev):
        return []
    return _procs(scn, dev["index"])


def _number(value: Any) -> float:
    """A process figure as a number; absent, null or text counts as 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if ok else 0


def _stats(scn: Scenario, dev: dict[str, Any]) -> dict[str, Any]:
    """dmon's figures for the device: the scenario's `stats`, else what its processes make."""
    procs = _procs(scn, dev["index"])
    given = dev.get("stats") or {}
    load = {c: int(round(min(100, sum(_number(p.get(c)) for p in procs)))) for c in ("sm", "mem")}
    stats = dict(DEFAULT_STATS, fb=sum(p.get("used_mib") or 0 for p in procs), **load)
    if _mig(scn, dev):  # no device-wide utilisation in MIG mode
        stats.update((c, None) for c in UTILISATION)
    stats.update(given)
    busy = _number(given["sm"]) if "sm" in given else load["sm"]
    if "pwr" not in given:
        stats["pwr"] = IDLE_PWR + int(round(busy * PWR_PER_SM))
    if "gtemp" not in given:
        stats["gtemp"] = IDLE_GTEMP + int(round(busy * GTEMP_PER_SM))
    stats.setdefault("temp", stats["gtemp"])
    return stats


def _faults(scn: Scenario, command: str) -> dict[str, Any]:
    raw = scn.get("faults") or {}
    knobs = {k: v for k, v in raw.items() if k not in COMMANDS}
    knobs.update(raw.get(command) or {})
    return knobs


def _failure(scn: Scenario, knob: str, faults: dict[str, Any], pci: str | None = None) -> _Exit:
    """The failure a knob names; a device message names `pci`, else the first device."""
    text, status = FAILURES.get(knob, (knob, 255))
    era, devs = _era(scn), _devices(scn)
    pci = pci or (devs[0]["pci"] if devs else "00000000:01:00.0")
    if knob in FAILURES:
        text = text.format(sp="" if era.newest else " ", pci=pci[-12:])
    if knob == "mismatch" and era.newest:
        text += "\nNVML library version: 570.124"
    return _Exit(text, int(faults.get("fail_status", status)))


def _start(scn: Scenario, command: str) -> dict[str, Any]:
    """The command's faults, after acting on those that apply at start."""
    faults = _faults(scn, command)
    if faults.get("stderr"):
        sys.stderr.write(str(faults["stderr"]).rstrip("\n") + "\n")
        sys.stderr.flush()
    if faults.get("fail"):
        raise _failure(scn, str(faults["fail"]), faults)
    if not _devices(scn):
        raise _Exit("No devices were found", 6)
    return faults


def _select(devs: list[dict[str, Any]], ids: str | None) -> list[int]:
    """Indices named by -i (index, uuid or PCI id), in index order."""
    if ids is None:
        return [d["index"] for d in devs]
    chosen = set()
    for item in ids.split(","):
        item = item.strip().lower()
        hits = [
            d["index"]
            for d in devs
            if item in (str(d["index"]), d["uuid"].lower(), d["pci"].lower(), d["pci"][4:].lower())
        ]
        if not hits:
            raise _Exit("No devices were found", 6)
        chosen.update(hits)
    return sorted(chosen)


# ---- -q -x -----------------------------------------------------------------------------------


def _xml(depth: int, items: Sequence[tuple[str, Any]]) -> list[str]:
    """Tab-indented elements: a list nests, a tuple is raw text lines, None is left out."""
    pad, out = "\t" * depth, []
    for tag, value in items:
        if isinstance(value, list):
            out += [f"{pad}<{tag}>"] + _xml(depth + 1, value) + [f"{pad}</{tag}>"]
        elif isinstance(value, tuple):
            out += [f"{pad}<{tag}>"] + [f"{pad}\t{line}" for line in value] + [f"{pad}</{tag}>"]
        elif value is not None:
            out.append(f"{pad}<{tag}>{escape(str(value))}</{tag}>")
    return out


def _na(value: Any, fmt: str) -> str:
    """A number with its unit; None is N/A; text such as `Unknown Error` goes as it is."""
    if value is None:
        return "N/A"
    return fmt.format(value) if isinstance(value, (int, float)) else str(value)


def _instances(scn: Scenario, dev: dict[str, Any]) -> list[dict[str, Any]]:
    """The device's MIG instances: its `mig_devices` while in MIG mode, else none."""
    return list(dev.get("mig_devices") or []) if _mig(scn, dev) else []


def _instance_ids(scn: Scenario, dev: dict[str, Any], proc: dict[str, Any]) -> tuple[Any, Any]:
    """A process's (gpu_instance_id, compute_instance_id): its gi/ci (else the first
    instance's) on a MIG device, N/A on a GPU without MIG, absent (None) before r470."""
    if not _era(scn).modern:
        return None, None  # gpu/compute instance ids arrived with MIG
    instances = _instances(scn, dev)
    if not instances:
        return "N/A", "N/A"
    first = instances[0]
    return (
        proc.get("gi", first.get("gpu_instance_id", 0)),
        proc.get("ci", first.get("compute_instance_id", 0)),
    )


def _xml_mig_devices(scn: Scenario, dev: dict[str, Any]) -> Any:
    """<mig_devices>: a <mig_device> per instance, or the text None."""
    era, instances = _era(scn), _instances(scn, dev)
    if not era.modern:
        return None
    if not instances:
        return ("None",)
    out = []
    for n, inst in enumerate(instances):
        gi = inst.get("gpu_instance_id", n + 1)
        total = inst.get("memory_mib", 9856)
        used = sum(
            p.get("used_mib") or 0
            for p in _procs(scn, dev["index"])
            if _instance_ids(scn, dev, p)[0] == gi
        )  # an instance's memory is its GI's
        out.append(
            (
                "mig_device",
                [
                    ("index", n),
                    ("gpu_instance_id", gi),
                    ("compute_instance_id", inst.get("compute_instance_id", 0)),
                    (
                        "fb_memory_usage",
                        [
                            ("total", f"{total} MiB"),
                            ("reserved", "0 MiB" if era.arch else None),
                            ("used", f"{used} MiB"),
                            ("free", f"{max(0, total - used)} MiB"),
                        ],
                    ),
                ],
            )
        )
    return out


def _xml_process(scn: Scenario, dev: dict[str, Any], proc: dict[str, Any]) -> tuple[str, Any]:
    gi, ci = _instance_ids(scn, dev, proc)
    return (
        "process_info",
        [
            ("gpu_instance_id", gi),
            ("compute_instance_id", ci),
            ("pid", proc["pid"]),
            ("type", proc.get("type", "C")),
            ("process_name", proc.get("name", "python")),
            ("used_memory", _na(proc.get("used_mib"), "{} MiB")),
        ],
    )


def _xml_gpu(scn: Scenario, dev: dict[str, Any]) -> list[str]:
    """One <gpu> element, with the elements this era's drivers print."""
    era, stats = _era(scn), _stats(scn, dev)
    modern = era.modern
    total, used = dev["memory_mib"], stats["fb"] or 0
    reserved = dev["reserved_mib"] if era.arch else 0
    memory = [
        ("total", f"{total} MiB"),
        ("reserved", f"{reserved} MiB" if era.arch else None),
        ("used", f"{used} MiB"),
        ("free", f"{max(0, total - reserved - used)} MiB"),
    ]
    domain, bus, rest = dev["pci"].split(":")
    mig = [("current_mig", dev["mig"]), ("pending_mig", dev["mig"])]
    items = [
        ("product_name", dev["name"]),
        ("product_brand", dev["brand"]),
        ("product_architecture", dev["arch"] if era.arch else None),
        ("display_mode", "Disabled"),
        ("persistence_mode", "Enabled"),
        ("mig_mode", mig if modern else None),
        ("mig_devices", _xml_mig_devices(scn, dev)),
        ("uuid", dev["uuid"]),
        ("minor_number", dev["minor"]),
        (
            "pci",
            [
                ("pci_bus", bus),
                ("pci_device", rest[:2]),
                ("pci_domain", domain[-4:]),
                ("pci_bus_id", dev["pci"]),
            ],
        ),
        ("fb_memory_usage", memory),
        (
            "utilization",
            [("gpu_util", _na(stats["sm"], "{} %")), ("memory_util", _na(stats["mem"], "{} %"))],
        ),
        (
            "temperature",
            [("gpu_temp", (dev.get("health") or {}).get("broken") or _na(stats["gtemp"], "{} C"))],
        ),
        (
            "gpu_power_readings" if era.newest else "power_readings",
            [("power_draw", _na(stats["pwr"], "{:.2f} W"))],
        ),
        *_xml_health(scn, dev),
        ("processes", [_xml_process(scn, dev, p) for p in _procs(scn, dev["index"])]),
    ]
    return [f'\t<gpu id="{escape(dev["pci"])}">'] + _xml(2, items) + ["\t</gpu>"]


# The clocks' event reasons each era prints, in its order (r384 printed the first four).
CLOCK_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "display_clocks_setting",
)


def _yes(value: Any) -> str:
    return "Yes" if value else "No"


def _xml_health(scn: Scenario, dev: dict[str, Any]) -> list[tuple[str, Any]]:
    """The sections of a <gpu> that say its health, in the era's shape, as its `health` sets
    them: ECC errors (volatile uncorrectable), retired pages, remapped rows (r470 on), the
    clocks' reasons (`clocks_event_reasons` in r550, `clocks_throttle_reasons` before), the
    reset status (r550) and the recovery action (only when set: R570 on)."""
    era, health = _era(scn), dev.get("health") or {}
    ecc = int(health.get("ecc_uncorrectable", 0))
    if era.modern:
        volatile: list[tuple[str, Any]] = [
            ("sram_correctable", 0),
            ("sram_uncorrectable", 0),
            ("dram_correctable", 0),
            ("dram_uncorrectable", ecc),
        ]
    else:
        volatile = [
            ("single_bit", [("device_memory", 0), ("total", 0)]),
            ("double_bit", [("device_memory", ecc), ("total", ecc)]),
        ]
    retired = int(health.get("retired_pages", 0))
    pages = [
        ("multiple_single_bit_retirement", [("retired_count", 0)]),
        ("double_bit_retirement", [("retired_count", retired)]),
        ("pending_blacklist", _yes(health.get("retire_pending")) if era.modern else None),
        ("pending_retirement", _yes(health.get("retire_pending"))),
    ]
    remapped = [
        ("remapped_row_corr", 0),
        (
            "remapped_row_unc",
            int(bool(health.get("remap_pending") or health.get("remap_failure"))),
        ),
        ("remapped_row_pending", _yes(health.get("remap_pending"))),
        ("remapped_row_failure", _yes(health.get("remap_failure"))),
    ]
    slowed = set(health.get("slowdowns") or ())
    section = "clocks_event_reason" if era.newest else "clocks_throttle_reason"
    reasons = [
        (f"{section}_{name}", "Active" if name in slowed else "Not Active")
        for name in (
            CLOCK_REASONS
            if era.modern
            else CLOCK_REASONS[:4] + tuple(n for n in CLOCK_REASONS[4:] if n in slowed)
        )
    ]
    return [
        (
            "gpu_reset_status",
            [
                ("reset_required", _yes(health.get("reset_required"))),
                ("drain_and_reset_recommended", "N/A"),
            ],
        )
        if era.newest
        else ("gpu_reset_status", None),
        ("gpu_recovery_action", health.get("recovery_action")),
        ("ecc_errors", [("volatile", volatile)]),
        ("retired_pages", pages),
        ("remapped_rows", remapped if era.modern else None),
        (f"{section}s", reasons),
    ]


def query_xml(scn: Scenario, ids: str | None) -> str:
    """The document `nvidia-smi -q -x` prints."""
    era, devs, now = _era(scn), _devices(scn), datetime.now()
    doctype = scn.get("doctype", era.dtd)
    lines = ['<?xml version="1.0" ?>']
    lines += [f'<!DOCTYPE nvidia_smi_log SYSTEM "{doctype}">'] if doctype else []
    lines += ["<nvidia_smi_log>"] + _xml(
        1,
        [
            ("timestamp", f"{now:%a %b} {now.day:2d} {now:%H:%M:%S %Y}"),
            ("driver_version", scn.get("driver_version", era.driver)),
            ("cuda_version", scn.get("cuda_version", era.cuda)),
            ("attached_gpus", len(devs)),
        ],
    )
    for i in _select(devs, ids):
        lines += _xml_gpu(scn, devs[i])
    return "\n".join(lines + ["</nvidia_smi_log>", ""])


def _mig_uuid(scn: Scenario, dev: dict[str, Any], gi: Any, ci: Any, inst: dict[str, Any]) -> str:
    """A MIG device's uuid in the form the scenario's drivers print."""
    if scn.get("legacy_mig_uuids"):
        return f"MIG-{dev['uuid']}/{gi}/{ci}"
    if inst.get("uuid"):
        return str(inst["uuid"])
    return "MIG-" + str(uuids.uuid5(MIG_NAMESPACE, f"{dev['uuid']}/{gi}/{ci}"))


def list_gpus(scn: Scenario, ids: str | None) -> str:
    """What `nvidia-smi -L` prints: each GPU, and the MIG devices of one in MIG mode."""
    devs, lines = _devices(scn), []
    legacy = bool(scn.get("legacy_mig_uuids"))
    for i in _select(devs, ids):
        dev = devs[i]
        lines.append(f"GPU {i}: {dev['name']} (UUID: {dev['uuid']})")
        for n, inst in enumerate(_instances(scn, dev)):
            gi = inst.get("gpu_instance_id", n + 1)
            ci = inst.get("compute_instance_id", 0)
            memory = inst.get("memory_mib", 9856)
            sevenths = max(1, round(7 * memory / max(1, dev["memory_mib"])))
            profile = inst.get("profile", f"{sevenths}g.{round(memory / 1024)}gb")
            mig = _mig_uuid(scn, dev, gi, ci, inst)
            lines.append(
                f"  MIG {profile} Device {n}: (UUID: {mig})"
                if legacy
                else f"  MIG {profile:<11} Device {n:>2}: (UUID: {mig})"
            )
    return "\n".join(lines + [""])


def query_apps(scn: Scenario, fields: Sequence[str], header: bool, units: bool) -> str:
    """The CSV `--query-compute-apps=...` prints: compute processes, by device."""
    names = {
        "gpu_uuid": "gpu_uuid",
        "pid": "pid",
        "used_memory": "used_gpu_memory [MiB]",
        "process_name": "process_name",
        "name": "process_name",
        "gpu_bus_id": "gpu_bus_id",
        "gpu_name": "gpu_name",
    }
    for field in fields:
        if field not in names:
            raise _Exit(f'Field "{field}" is not a valid field to query.', 2)
    lines = [", ".join(names[f] for f in fields)] if header else []
    for dev in _devices(scn):
        for proc in _procs(scn, dev["index"]):
            if "C" not in proc.get("type", "C"):
                continue
            mem = proc.get("used_mib")
            cells = {
                "gpu_uuid": dev["uuid"],
                "pid": proc["pid"],
                "gpu_bus_id": dev["pci"],
                "gpu_name": dev["name"],
                "process_name": proc.get("name", "python"),
                "used_memory": "[N/A]" if mem is None else f"{mem}{' MiB' if units else ''}",
            }
            cells["name"] = cells["process_name"]
            lines.append(", ".join(str(cells[f]) for f in fields))
    return "".join(line + "\n" for line in lines)


# ---- dmon / pmon ------------------------------------------------------------------------------


def _columns(era: Era, kind: str, select: str) -> list[str]:
    """The metric columns after gpu (and pmon's pid, type), in the tool's fixed group order."""
    extra_u = ["jpg", "ofa"] if era.newest else []
    ccpm = ["ccpm"] if era.newest else []
    if kind == "pmon":
        groups = {"u": ["sm", "mem", "enc", "dec"] + extra_u, "m": ["fb"] + ccpm}
    else:
        groups = {
            "p": ["pwr", "gtemp", "mtemp"] if era.modern else ["pwr", "temp"],
            "u": ["sm", "mem", "enc", "dec"] + extra_u,
            "c": ["mclk", "pclk"],
            "v": ["pviol", "tviol"],
            "m": ["fb", "bar1"] + ccpm,
            "e": ["sbecc", "dbecc", "pci"],
            "t": ["rxpci", "txpci"],
        }
    if not select or any(ch not in groups for ch in select):
        raise _bad_args()
    return [c for g in ("pucvmet" if kind == "dmon" else "um") if g in select for c in groups[g]]


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    return str(int(value)) if isinstance(value, float) else str(value)


class Table:
    """Header lines and rows of one dmon/pmon layout."""

    def __init__(self, era: Era, kind: str, select: str, stamp: str) -> None:
        self.era, self.kind, self.stamp = era, kind, stamp
        self.columns = _columns(era, kind, select)

    def _line(self, first: str, cells: Sequence[str], widths: Sequence[int], command: str) -> str:
        text = first + "".join(f" {c:>{w}}" for c, w in zip(cells, widths, strict=True))
        return text + (self.era.gap + command if self.kind == "pmon" else "")

    def headers(self) -> list[str]:
        """The two comment lines: names, then units."""
        w, pmon = self.era.width, self.kind == "pmon"
        widths = ([self.era.pid_head, self.era.type_head] if pmon else []) + [w] * len(
            self.columns
        )
        names = (["pid", "type"] if pmon else []) + self.columns
        units = (["#", "C/G"] if pmon else []) + [UNITS[c] for c in self.columns]
        head = self._line("# gpu", names, widths, "command") + self.era.tail
        unit = self._line("# Idx", units, widths, "name") + self.era.tail
        lead = [STAMPS[s] for s in "DT" if s in self.stamp]
        if lead:
            head = "#" + "".join(s[0] for s in lead) + head[1:]
            unit = "#" + "".join(s[1] for s in lead) + unit[1:]
        return [head, unit]

    def row(self, when: datetime, gpu: int, cells: Sequence[Any], command: str = "") -> str:
        """One data line."""
        pmon = self.kind == "pmon"
        widths = ([self.era.pid_data, 5] if pmon else []) + [self.era.width] * len(self.columns)
        lead = "".join(when.strftime(STAMPS[s][2]) for s in "DT" if s in self.stamp)
        command = (command or "-")[:15].ljust(15)  # cut and padded, as nvidia-smi does
        text = (" " + lead if lead else "") + self._line(
            f"{gpu:>5}", [_cell(c) for c in cells], widths, command
        )
        return text if pmon else text + self.era.tail

    def rows(self, scn: Scenario, watched: Sequence[tuple[int, dict[str, Any]]]) -> list[str]:
        """One interval: a (gpu column, device) pair's rows each, in order; pmon prints a row
        of `-` for a device with no process it can attribute."""
        now, out = datetime.now(), []
        for i, dev in watched:
            if self.kind == "dmon":
                stats = _stats(scn, dev)
                out.append(self.row(now, i, [stats.get(c) for c in self.columns]))
                continue
            procs = _attributed(scn, dev)
            for p in procs:
                values = [p.get("used_mib") if c == "fb" else p.get(c) for c in self.columns]
                if dev.get("pmon_no_figures"):
                    values = [None] * len(self.columns)
                cells = [p["pid"], p.get("type", "C")] + values
                out.append(self.row(now, i, cells, p.get("name", "python")))
            if not procs:
                out.append(self.row(now, i, [None] * (len(self.columns) + 2)))
        return out


def _options(args: Sequence[str]) -> dict[str, str]:
    """dmon/pmon options as {"i": .., "c": .., "d": .., "s": .., "o": ..}."""
    long = {
        "--id": "i",
        "--count": "c",
        "--delay": "d",
        "--select": "s",
        "--options": "o",
        "--filename": "f",
    }
    opts: dict[str, str] = {}
    it = iter(args)
    for arg in it:
        name, _, value = arg.partition("=")
        key = long.get(name) or (
            name[1:] if name in ("-i", "-c", "-d", "-s", "-o", "-f") else None
        )
        if key is None:
            raise _Exit(f"ERROR: Option {arg} is not recognized. Please run 'nvidia-smi -h'.", 2)
        opts[key] = value or next(it, "")
    return opts


def _positive(text: str | None, kind: type) -> Any | None:
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise _bad_args() from None
    if value <= 0:
        raise _bad_args()
    return value


class MonitorRun:
    """One dmon/pmon run: the counters that -c, faults and header repeats need."""

    def __init__(self, kind: str, opts: dict[str, str], all_env: bool) -> None:
        self.kind, self.ids, self.all_env = kind, opts.get("i"), all_env
        self.select = opts.get("s", "puc" if kind == "dmon" else "u")
        self.stamp = opts.get("o", "").upper()
        self.count = _positive(opts.get("c"), int)
        self.delay = _positive(opts.get("d"), float)
        if self.stamp.strip("DT"):
            raise _bad_args()
        self.rows = 0  # data rows printed, what the fault knobs count
        self.bursts = 0  # intervals printed
        self.traced: set = set()  # (pid, gpu) already written to the trace file
        self.handles: list[tuple[int, str, str]] = []  # (index, uuid, pci) chosen at start

    def watch(self, scn: Scenario) -> None:
        """Choose the devices once, at start, as the real tool takes its device handles: -i,
        else all or (like the real tool) only the first four. An unknown -i fails now."""
        devs = _devices(scn)
        chosen = _select(devs, self.ids)
        if self.ids is None and not (self.all_env or scn.get("show_all_devices")):
            chosen = chosen[:4]
        self.handles = [(i, devs[i]["uuid"], devs[i]["pci"]) for i in chosen]

    def watched(self, scn: Scenario) -> list[tuple[int, dict[str, Any]]]:
        """(gpu column, device now) for each device chosen at start, found by its uuid; one
        gone from the scenario is a lost GPU: the stream fails as the real one does."""
        by_uuid = {d["uuid"]: d for d in _devices(scn)}
        for _index, uuid, pci in self.handles:
            if uuid not in by_uuid:
                raise _failure(scn, "gpu_lost", {}, pci)
        return [(index, by_uuid[uuid]) for index, uuid, _ in self.handles]

    def interval(self, scn: Scenario) -> int | None:
        """Print one interval's burst; an exit status when the stream must end."""
        faults = _faults(scn, self.kind)
        if faults.get("fail"):
            raise _failure(scn, str(faults["fail"]), faults)
        if self._reached(faults, "stall_after_lines"):
            return None
        table = Table(_era(scn), self.kind, self.select, self.stamp)
        every = int(faults.get("repeat_header_every", 30) or 0)
        out = table.headers() if self.bursts == 0 or (every and self.bursts % every == 0) else []
        status = self._exit_status(faults)
        printing = [(i, dev) for i, dev in self.watched(scn) if not dev.get("silent")]
        rows = table.rows(scn, printing) if status is None else []
        for row in rows:
            if self._reached(faults, "stall_after_lines"):
                break
            out.append(row)
            self.rows += 1
            garbage = int(faults.get("garbage_every") or 0)
            if garbage and self.rows % garbage == 0:
                out.append(_garble(row, self.rows // garbage))
            status = self._exit_status(faults)
            if status is not None:
                break
        sys.stdout.write("".join(line + "\n" for line in out))
        sys.stdout.flush()  # the reader is a pipe: each burst must reach it now
        if self.kind == "pmon" and scn.get("trace") and rows:
            self._trace(scn)
        self.bursts += 1
        if status is None and self.count and self.bursts >= self.count:
            status = 0
        return status

    def _trace(self, scn: Scenario) -> None:
        """Append `<time> <pid> <gpu>` for each process printed for the first time."""
        now = time.time()
        fresh = [
            (p["pid"], i)
            for i, dev in self.watched(scn)
            for p in _attributed(scn, dev)
            if (p["pid"], i) not in self.traced
        ]
        if fresh:
            self.traced.update(fresh)
            with open(scn["trace"], "a", encoding="ascii") as f:
                f.write("".join(f"{now:.6f} {pid} {gpu}\n" for pid, gpu in fresh))

    def _reached(self, faults: dict[str, Any], knob: str) -> bool:
        return faults.get(knob) is not None and self.rows >= int(faults[knob])

    def _exit_status(self, faults: dict[str, Any]) -> int | None:
        if not self._reached(faults, "exit_after_lines"):
            return None
        return int(faults.get("exit_status", 1))


def _garble(row: str, n: int) -> str:
    """The n-th garbled line: empty, a ^C inside the row, the row cut short."""
    half = len(row) // 2
    return ["", row[:half] + "^C" + row[half:], row[:half]][(n - 1) % 3]


def monitor(kind: str, args: Sequence[str], source: Source, all_env: bool) -> int:
    """Run dmon or pmon until -c, a fault or a signal ends it."""
    stream = MonitorRun(kind, _options(args), all_env)
    scn = source.scenario
    if _start(scn, kind).get("ignore_sigterm"):
        _ignore_sigterm()
    stream.watch(scn)  # an unknown -i fails now, like the real tool
    Table(_era(scn), kind, stream.select, stream.stamp)  # so does a bad -s
    while True:
        status = stream.interval(scn)
        if status is not None:
            return status
        time.sleep(stream.delay or float(scn.get("interval", 1)))
        scn = source.refresh()


def _ignore_sigterm() -> None:
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:
        pass  # not the main thread: a test calling main() in-process


def _hang_if_asked(faults: dict[str, Any]) -> None:
    """The `hang` knob: print nothing, never end (until a signal ends the process)."""
    if not faults.get("hang"):
        return
    if faults.get("ignore_sigterm"):
        _ignore_sigterm()
    while True:
        time.sleep(3600)


def one_shot(args: list[str], scn: Scenario) -> int:
    """`-q -x`, `-L` or `--query-compute-apps`."""
    ids, flags, query, fmt = None, set(), None, None
    it = iter(args)
    for arg in it:
        name, _, value = arg.partition("=")
        if name in ("-i", "--id"):
            ids = value or next(it, "")
        elif name in ("-q", "--query", "-x", "--xml-format", "-L", "--list-gpus"):
            flags.add(name.lstrip("-")[0])
        elif name == "--query-compute-apps" and value:
            query = value
        elif name == "--format" and value:
            fmt = value.split(",")
        else:
            raise _Exit(f"ERROR: Option {arg} is not recognized. Please run 'nvidia-smi -h'.", 2)
    if flags == {"q", "x"} and query is None and fmt is None:
        _hang_if_asked(_start(scn, "-q"))
        sys.stdout.write(query_xml(scn, ids))
        return 0
    if flags and flags <= {"L", "l"} and query is None and fmt is None:
        _hang_if_asked(_start(scn, "-L"))
        sys.stdout.write(list_gpus(scn, ids))
        return 0
    if query and not flags and fmt and fmt[0] == "csv" and set(fmt[1:]) <= {"noheader", "nounits"}:
        _hang_if_asked(_start(scn, "--query-compute-apps"))
        text = query_apps(scn, query.split(","), "noheader" not in fmt, "nounits" not in fmt)
        sys.stdout.write(text)
        return 0
    raise _bad_args()


def topo(args: list[str], scn: Scenario) -> int:
    """`topo -m` (`--matrix`): the scenario's topology (simulator/topo.py)."""
    if args not in (["-m"], ["--matrix"]):
        raise _bad_args()
    _hang_if_asked(_start(scn, "topo"))
    try:
        text = topo_matrix(scn, len(_devices(scn)))
    except ValueError as exc:
        raise _Exit(f"simulator: {exc}", 2) from None
    if text is None:
        raise _Exit("ERROR: Option topo is not recognized. Please run 'nvidia-smi -h'.", 2)
    sys.stdout.write(text)
    return 0


def _take_scenario(args: list[str]) -> tuple[str | None, list[str]]:
    """Split our own --scenario FILE off nvidia-smi's arguments."""
    for i, arg in enumerate(args):
        if arg == "--scenario" and i + 1 < len(args):
            return args[i + 1], args[:i] + args[i + 2 :]
        if arg.startswith("--scenario="):
            return arg.split("=", 1)[1], args[:i] + args[i + 1 :]
    return None, args


def _on_signal(signum: int, frame: Any) -> None:
    raise _Stop(130 if signum == signal.SIGINT else 0)


def _run(args: list[str]) -> int:
    path, args = _take_scenario(args)
    path = path or os.environ.get("PATROLLER_SIM_SCENARIO") or None
    try:
        source = Source(path)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"simulator: cannot use scenario {path}: {exc}\n")
        return 2
    try:
        if args[:1] == ["topo"]:
            return topo(args[1:], source.scenario)
        if args and args[0] in ("dmon", "pmon"):
            all_env = os.environ.get("NVSMI_SHOW_ALL_DEVICES", "") not in ("", "0")
            return monitor(args[0], args[1:], source, all_env)
        return one_shot(args, source.scenario)
    except _Exit as exc:
        sys.stdout.write(exc.message + "\n")
        return exc.status


def main(argv: list[str] | None = None) -> int:
    """Act as nvidia-smi with argv; the exit status."""
    saved = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            saved[signum] = signal.signal(signum, _on_signal)
        except ValueError:
            pass  # not the main thread: a test calling main() in-process
    try:
        try:
            return _run(list(sys.argv[1:] if argv is None else argv))
        finally:
            sys.stdout.flush()
    except _Stop as stop:
        return stop.status
    except BrokenPipeError:
        # The reader went away; point stdout at /dev/null so the exit-time flush is quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if argv is not None:  # an in-process caller gets its handlers back; a process just exits
            for signum, handler in saved.items():
                signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
