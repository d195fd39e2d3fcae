"""The kernel's Xid lines, parsed: `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., text`.

A line comes from /dev/kmsg (`<priority>,<sequence>,<microseconds since boot>,<flags>;<text>`),
or as `dmesg` or the journal print it (a `[  12.345678]` or `kernel:` before `NVRM:`). The
driver prints the pid and the process name where it knows them (`pid=1234, name=python3,`),
`pid='<unknown>', name=<unknown>,` where it does not, and neither in older drivers or for
faults of the GPU itself; a sub-code may follow the number (`149.38`, in newer tools' words).
Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):"
    r"(?P<device>[0-9a-fA-F]{2})(?:\.[0-7])?\): (?P<xid>\d{1,5})(?:\.\d+)?,\s*"
    r"(?:pid=(?P<pid>'?[^,]*?'?), name=(?P<name>[^,]*?),\s*)?(?P<text>.*)$"
)
_KMSG = re.compile(r"^\d+,\d+,(?P<usec>\d+),[^;]*;")
_PCI = re.compile(
    r"(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):"
    r"(?P<device>[0-9a-fA-F]{2})(?:\.[0-7])?$"
)


@dataclass(frozen=True)
class XidLine:
    """One Xid the kernel logged: the GPU by PCI address, the number, the process if named."""

    pci: str  # domain:bus:device, lower case, domain of 4 digits: `0000:3b:00`
    xid: int
    pid: int | None
    name: str | None  # as the driver printed it (the process's own name: not to be trusted)
    text: str  # the rest of the line
    uptime: float | None = None  # seconds since boot, where the line is /dev/kmsg's


def pci_key(address: str | None) -> str | None:
    """A PCI address as `0000:3b:00` (domain, bus, device), whichever way it is printed:
    `00000000:3B:00.0` (nvidia-smi), `0000:3b:00` (the kernel). None if it is not one."""
    found = _PCI.match((address or "").strip())
    if found is None:
        return None
    domain = int(found.group("domain") or "0", 16)
    return f"{domain:04x}:{found.group('bus').lower()}:{found.group('device').lower()}"


def parse_xid(line: str) -> XidLine | None:
    """The Xid in one kernel log line, or None if it has none."""
    found = _XID.search(line)
    if found is None:
        return None
    head = _KMSG.match(line)
    pid = (found.group("pid") or "").strip("'")
    name = found.group("name")
    return XidLine(
        pci=str(pci_key(f"{found.group('domain')}:{found.group('bus')}:{found.group('device')}")),
        xid=int(found.group("xid")),
        pid=int(pid) if pid.isdigit() else None,
        name=name if name and name != "<unknown>" else None,
        text=found.group("text").strip()[:300],
        uptime=int(head.group("usec")) / 1e6 if head else None,
    )
