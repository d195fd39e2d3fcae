"""The checks of nvidia-smi, over what gpu.py's probe saw: where it is and which driver; each
command's answer and its time; MIG. Pure: no I/O."""

from __future__ import annotations

import re

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.core.health import problems_of
from patroller.doctor.gpu import GpuFacts, Ran, Stream
from patroller.doctor.results import Result, degraded, failed, ok
from patroller.durations import describe
from patroller.observe.nvsmi.listing import parse_list_gpus
from patroller.observe.nvsmi.parsers import parse_compute_apps
from patroller.observe.nvsmi.topo import TopoError, parse_topology
from patroller.observe.topology import bind

OLDEST_DRIVER = 384  # the oldest driver branch whose output Patroller's parsers were checked on
INSTALL = (
    "install the NVIDIA driver's utilities (the nvidia-utils package of the driver's "
    "branch), or give --nvidia-smi the command's full path"
)
# What nvidia-smi says when it fails (NVIDIA-SMI.md), and what to do about it.
FIXES: tuple[tuple[re.Pattern, str], ...] = (
    (
        re.compile(r"couldn't communicate with the NVIDIA driver", re.I),
        "the driver is not loaded: load it (modprobe nvidia) or reinstall it; dmesg says why",
    ),
    (
        re.compile(r"version mismatch", re.I),
        "the kernel module and nvidia-smi's library are of different versions (after an "
        "upgrade): reboot, or unload and load the nvidia modules",
    ),
    (
        re.compile(r"No devices were found", re.I),
        "the driver sees no GPU: check `lspci | grep -i nvidia` and dmesg",
    ),
    (
        re.compile(r"GPU is lost|requires reset", re.I),
        "a GPU fell off the bus: reboot the host (dmesg says which, Xid 79)",
    ),
    (
        re.compile(r"Unable to determine the device handle", re.I),
        "the driver cannot reach that GPU: dmesg says why (an Xid); a reset or a reboot may be "
        "needed",
    ),
    (
        re.compile(r"Failed to initialize NVML: Unknown Error", re.I),
        "inside a container, the host's systemd took the GPUs' device access away: restart the "
        "container (or give it the devices again)",
    ),
    (
        re.compile(r"Not supported on the device|Failed to process command line", re.I),
        "this GPU or driver refuses the command with every column group Patroller asks for: "
        "a newer driver may answer it",
    ),
    (
        re.compile(r"Insufficient Permissions|permission", re.I),
        "this user may not ask the driver: run Patroller as root",
    ),
)
RUN_BY_HAND = "run the command by hand to see what it says"


def fix_for(text: str) -> str:
    """How to make right what nvidia-smi said."""
    for pattern, fix in FIXES:
        if pattern.search(text):
            return fix
    return RUN_BY_HAND


def gpu_results(facts: GpuFacts | None, config: Config) -> list[Result]:
    """Every check of nvidia-smi, in the order the daemon meets them."""
    if config.test or facts is None:
        return [ok("nvidia-smi", "not used: --test serves synthetic devices")]
    inventory = facts.inventory
    assert inventory is not None
    if isinstance(inventory.answer.error, (FileNotFoundError, PermissionError)):
        what = (
            "was not found"
            if isinstance(inventory.answer.error, FileNotFoundError)
            else "is not executable"
        )
        return [failed("nvidia-smi", f"`{facts.argv[0]}` {what}", INSTALL)]
    found = [driver(facts), query(facts, config)]
    if facts.discovery is None or not facts.devices:
        return found
    return (
        found
        + [
            stream("nvidia-smi dmon", facts.dmon, facts, config),
            stream("nvidia-smi pmon", facts.pmon, facts, config),
            apps(facts, config),
            mig(facts),
            topology(facts),
        ]
        + health(facts)
    )


def driver(facts: GpuFacts) -> Result:
    """Where nvidia-smi is, its driver's version and branch, and the document's version."""
    where = " ".join(facts.argv) if len(facts.argv) > 1 else facts.found or facts.argv[0]
    found = facts.discovery
    version = found.driver_version if found is not None else None
    if version is None:
        why = "its -q -x gave no version" if found is not None else "-q -x gave no answer"
        return degraded(
            "nvidia-smi", f"{where}: driver version unknown ({why})", "see nvidia-smi -q -x below"
        )
    major = re.match(r"\d+", version)
    branch = int(major.group(0)) if major else None
    about = [f"R{branch} branch"] if branch else []  # none for a version without a number
    about.append(f"document nvsmi_device_v{facts.dtd}.dtd" if facts.dtd else "no DOCTYPE")
    said = f"{where}: driver {version} ({', '.join(about)})" + (
        f", CUDA {found.cuda_version}" if found and found.cuda_version else ""
    )
    if branch is not None and branch < OLDEST_DRIVER:
        return degraded(
            "nvidia-smi",
            f"{said}: older than any driver Patroller was checked against (R{OLDEST_DRIVER})",
            "update the NVIDIA driver",
        )
    return ok("nvidia-smi", said)


def query(facts: GpuFacts, config: Config) -> Result:
    """`-q -x`: the inventory, its time, what it lists."""
    ran = facts.inventory
    assert ran is not None
    name = "nvidia-smi -q -x"
    if not ran.worked:
        return failed(
            name,
            f"`{ran.shown}` {ran.trouble()}",
            fix_for(ran.text)
            if not ran.answer.timed_out
            else "nvidia-smi hangs: check the driver (dmesg) and start nvidia-persistenced",
        )
    if facts.unreadable is not None or facts.discovery is None:
        return failed(
            name,
            f"answered in {describe(ran.seconds)}, but not as nvidia-smi does: {facts.unreadable}",
            RUN_BY_HAND,
        )
    if not facts.devices:
        return failed(
            name,
            f"answered in {describe(ran.seconds)}, listing no GPU with a uuid",
            fix_for(ran.text),
        )
    gpus = ", ".join(f"{d.number} {d.name or 'unnamed'}" for d in facts.devices)
    said = f"answered in {describe(ran.seconds)}: {len(facts.devices)} GPU(s): {gpus}"
    if facts.discovery.warnings:
        return degraded(
            name,
            f"{said}; {len(facts.discovery.warnings)} warning(s), the first: "
            f"{facts.discovery.warnings[0]}",
            RUN_BY_HAND,
        )
    return _timely(name, said, ran, config.doctor_slow)


def _timely(name: str, said: str, ran: Ran, slow: float) -> Result:
    """Ok, or degraded when it took longer than `slow` s."""
    if ran.seconds > slow:
        return degraded(
            name,
            f"{said}: slow (over {describe(slow)})",
            "start nvidia-persistenced (persistence mode), so that NVML need not "
            "start afresh at each command",
        )
    return ok(name, said)


def stream(name: str, sample: Stream | None, facts: GpuFacts, config: Config) -> Result:
    """One sample of dmon or pmon: did it answer, with which columns, for every GPU? Without
    dmon the statistics are missing (degraded); without pmon no process has an owner (failed)."""
    assert sample is not None
    last = sample.runs[-1]
    pmon = name.endswith("pmon")
    if sample.select is None:
        result = failed if pmon else degraded
        return result(
            name,
            f"`{last.shown}` {last.trouble()}"
            + (": no process is attributed to its user" if pmon else ": no statistics"),
            fix_for(last.text),
        )
    said = (
        f"one sample in {describe(last.seconds)}, columns "
        f"{'-s ' + sample.select if sample.select else 'the default'}"
    )
    if len(sample.runs) > 1:
        refused = [r.shown.split(" -s ")[1].split()[0] for r in sample.runs[:-1]]
        said += f" ({' and '.join(refused)} refused)"
    if pmon:
        said += f", {len(sample.processes)} process row(s)"
    missing = sorted({d.number for d in facts.devices} - set(sample.gpus))
    if missing:
        return degraded(
            name,
            f"{said}; GPU {', '.join(map(str, missing))} printed no row",
            "a GPU that prints nothing is granted to nobody: check it with `nvidia-smi -i N -q`",
        )
    said += ", a row from every GPU"
    attributed = {row.gpu for row in sample.processes}
    blind = sorted(n for n in _listed_compute(facts) - attributed if not facts.devices[n].mig)
    if pmon and blind:
        return degraded(
            name,
            f"{said}; GPU {', '.join(map(str, blind))} has compute "
            "processes (-q -x) that pmon does not list: the cross-check "
            f"(--query-compute-apps, every {describe(config.cross_check_every)}) "
            "attributes them, later and without utilisation",
            "nothing to do if the cross-check works (below); a newer driver may list them",
        )
    if sample.select != (PMON_FIRST if pmon else DMON_FIRST):
        return degraded(name, said, "nothing to do: the daemon asks for fewer columns, as here")
    return ok(name, said)


DMON_FIRST, PMON_FIRST = "pucvmt", "um"


def _listed_compute(facts: GpuFacts) -> set:
    """The GPU indices where -q -x lists a compute process."""
    found = facts.discovery
    if found is None:
        return set()
    return {
        d.number
        for d in facts.devices
        if any((p.type or "C") != "G" for p in found.processes.get(d.uuid) or [])
    }


def apps(facts: GpuFacts, config: Config) -> Result:
    """--query-compute-apps: needed where pmon cannot attribute (MIG, blind GPUs)."""
    name = "nvidia-smi --query-compute-apps"
    ran = facts.apps
    assert ran is not None
    if not ran.worked:
        needed = any(d.mig for d in facts.devices)
        why = (
            "processes on MIG GPUs cannot be attributed"
            if needed
            else "processes that pmon does not list cannot be attributed"
        )
        result = failed if needed else degraded
        return result(name, f"`{ran.shown}` {ran.trouble()}: {why}", fix_for(ran.text))
    listed = parse_compute_apps(ran.answer.output)
    return _timely(
        name,
        f"answered in {describe(ran.seconds)}: {len(listed)} compute process(es)",
        ran,
        config.doctor_slow,
    )


def mig(facts: GpuFacts) -> Result:
    """MIG mode, and where it is on, the MIG devices' uuids (-L)."""
    on = [d for d in facts.devices if d.mig]
    if not on:
        return ok("MIG", "off on every GPU: pmon attributes every process")
    said = (
        "on for GPU "
        + ", ".join(
            f"{d.number} ({len((facts.discovery.mig if facts.discovery else {}).get(d.uuid, []))} "
            "instance(s))"
            for d in on
        )
        + ": a MIG GPU is reserved whole; its processes are "
        "attributed by --query-compute-apps"
    )
    ran = facts.listing
    if ran is None or not ran.worked:
        shown = ran.trouble() if ran is not None else "was not run"
        return degraded(
            "MIG",
            f"{said}; `nvidia-smi -L` {shown}: the MIG devices' uuids are "
            "unknown (the kubelet names them so)",
            fix_for(ran.text if ran else ""),
        )
    listing = parse_list_gpus(ran.answer.output)
    named = sum(len(v) for v in listing.mig.values())
    return ok("MIG", f"{said}; -L names {named} MIG device(s)")


FALLBACK = (
    "the lowest free numbers are granted, and a request with link= (nvlink, numa) is refused"
)


def topology(facts: GpuFacts) -> Result:
    """How the GPUs are linked (`topo -m`): the best-connected free set is granted; without it
    (an old driver, a failing command, MIG) the lowest numbers, as said."""
    ran = facts.topology
    if ran is None or not ran.worked:
        shown = ran.trouble() if ran is not None else "was not run"
        return degraded(
            "GPU topology",
            f"`nvidia-smi topo -m` {shown}: {FALLBACK}",
            fix_for(ran.text if ran else ""),
        )
    try:
        known = bind(parse_topology(ran.answer.output), Inventory(list(facts.devices)))
    except TopoError as exc:
        return degraded(
            "GPU topology",
            f"`nvidia-smi topo -m` printed no matrix Patroller can read ({exc}): {FALLBACK}",
            RUN_BY_HAND,
        )
    if not known:
        if known.why is None:  # one GPU: no two to link, nothing to choose between
            return ok("GPU topology", f"{len(facts.devices)} GPU(s): no other GPU to link to")
        return degraded("GPU topology", f"{known.why}: {FALLBACK}", RUN_BY_HAND)
    numbers = {d.uuid: d.number for d in facts.devices}
    groups = [g for g in known.groups(list(numbers)) if len(g) > 1]
    nodes: dict = {}
    for uuid, number in numbers.items():
        nodes.setdefault(known.node(uuid), []).append(number)
    if groups:
        links = "; ".join(", ".join(str(numbers[u]) for u in g) for g in groups)
        said = f"{len(numbers)} GPU(s); NVLink between {links}"
    else:
        said = f"{len(numbers)} GPU(s), no NVLink"
    for node, ns in nodes.items():
        said += f"; {_node_name(node)}: {', '.join(map(str, ns))}"
    mig_on = [d.number for d in facts.devices if d.mig]
    if mig_on:
        return degraded(
            "GPU topology",
            f"{said}; MIG is on for GPU {', '.join(map(str, mig_on))}: {FALLBACK}",
            "MIG instances are granted by number; turn MIG off to use the links",
        )
    return ok("GPU topology", f"{said}: the best-connected free GPUs are granted")


def health(facts: GpuFacts) -> list[Result]:
    """Each GPU's health as -q -x shows it now (core/health.py): degraded where the daemon
    grants it to nobody (the daemon works on: the GPU wants a reset or a repair), where its
    clocks are slowed, or where its memory has had uncorrectable errors since the last reset
    (one reading: no rise to see, the daemon watches for one)."""
    found = facts.discovery
    assert found is not None
    results = []
    for device in facts.devices:
        name = f"GPU {device.number} health"
        reading = found.health.get(device.uuid)
        problems = problems_of(reading, device.number, 0) if reading is not None else ()
        if not problems:
            results.append(
                ok(
                    name,
                    "healthy, as nvidia-smi -q -x shows it (the kernel log's "
                    "Xids are the daemon's to see)",
                )
            )
            continue
        said = [
            f"{reading.ecc_uncorrectable} uncorrectable ECC error(s) since the last reset"
            if p.code == "ecc_rising" and reading
            else p.words
            for p in problems
        ]
        withheld = any(p.grave and p.code != "ecc_rising" for p in problems)
        results.append(
            degraded(
                name,
                "; ".join(said) + (": the daemon grants it to nobody" if withheld else ""),
                "; ".join(p.action for p in problems),
            )
        )
    return results


def _node_name(node: str | None) -> str:
    """A NUMA node as the topology check says it ("cpus ..." where no node was printed)."""
    if node and not node.startswith("cpus"):
        return "NUMA node " + node
    return node or "no node"
