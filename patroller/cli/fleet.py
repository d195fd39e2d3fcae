"""`patroller status --hosts h1:port,h2:port,...`: the GPUs of many hosts in one table.

Every host is asked at once (a thread each), each with its own timeout: a host that does not
answer in time, or at all, is shown as such and never holds up the rest; so is one that answers
more than HOST_MAX_BYTES (nothing past them is read) or other than Patroller's schema says
(answers.check): "not answering: bad answer: " and why. `--free N` lists the hosts with N free
GPUs now, most free first; `--json` gives the same as JSON. The hosts come from `--hosts`, else
`--hosts-file` (one a line, `#` comments), else PATROLLER_HOSTS.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from patroller import client, hosts
from patroller.answers import BadAnswer, check
from patroller.cli.render import HEADERS, device_row, format_table

FLEET_TIMEOUT = 5.0  # seconds a host may take to answer (--host-timeout)
HOST_MAX_BYTES = 1 << 20  # bytes of a host's answer read at most: the daemon's --fleet-max-bytes
HOST_MAX_GPUS = 256  # GPUs a host may list: the daemon's Config.fleet_max_gpus
ERROR_SHOWN = 200  # characters of why a host is not shown, at most (a host's own words in it)


@dataclass
class HostAnswer:
    """What one host answered: its /status and /devices, or why there is none."""

    host: str
    status: Optional[Dict[str, Any]] = None
    devices: Optional[Dict[str, Any]] = None
    error: Optional[str] = None

    def free(self) -> int:
        """GPUs free now (not withheld), on a host that answered."""
        if self.status is None or self.devices is None:
            return 0
        return sum(1 for uuid, info in self.devices.items()
                   if info.get("group", "gpu") == "gpu" and not info.get("lost")
                   and ((self.status.get(uuid) or {}).get("claim") or {}).get("state") == "free"
                   and not ((self.status.get(uuid) or {}).get("claim") or {}).get("withheld"))


def hosts_from(given: Optional[str], path: Optional[str]) -> List[str]:
    """The hosts asked for: `--hosts a,b`, else the lines of `--hosts-file`, else
    PATROLLER_HOSTS; each once, in the order given. OSError if the file cannot be read."""
    if given is None and path is not None:
        return hosts.read(path)
    return hosts.split(os.environ.get("PATROLLER_HOSTS", "") if given is None else given)


def _ask(host: str, timeout: float) -> HostAnswer:
    try:
        status = client.get_json(host, "/status", timeout, HOST_MAX_BYTES)
        devices = client.get_json(host, "/devices", timeout, HOST_MAX_BYTES)
        check(status, devices, HOST_MAX_GPUS)
    except BadAnswer as exc:
        return HostAnswer(host, error=said(f"bad answer: {exc}"))
    except (client.PatrollerError, ValueError) as exc:  # ValueError: not a server's address
        return HostAnswer(host, error=said(str(exc) or type(exc).__name__))
    return HostAnswer(host, status, devices)


def said(why: str) -> str:
    """`why` cut to ERROR_SHOWN characters: a host's own words in it are the host's choice."""
    return why if len(why) <= ERROR_SHOWN else why[:ERROR_SHOWN - 1] + "…"


def ask_all(hosts: List[str], timeout: float) -> List[HostAnswer]:
    """Every host's answer, in the order given, within about `timeout` seconds in all."""
    if not hosts:
        return []
    pool = ThreadPoolExecutor(max_workers=min(32, len(hosts)))
    futures = [pool.submit(_ask, host, timeout) for host in hosts]
    wait(futures, timeout=timeout * 2 + 1)  # a request and its second, each bounded
    pool.shutdown(wait=False)  # a host stuck past that is left behind, not waited for
    return [f.result() if f.done() else
            HostAnswer(host, error=f"no answer within {timeout:g} s")
            for host, f in zip(hosts, futures)]


def fleet_table(answers: List[HostAnswer], colour: bool = False) -> str:
    """One table, a row per GPU with its host, a row per host that did not answer; then why
    each of those did not, in full (the table cuts it), and the totals."""
    rows: List[List[str]] = []
    states: Dict[str, int] = {}
    notes: List[str] = []
    for answer in answers:
        if answer.status is None or answer.devices is None:
            rows.append([answer.host, "-", "-", "not answering: " + (answer.error or "?")]
                        + ["-"] * (len(HEADERS) - 3))
            notes.append(f"{answer.host}: not answering: {answer.error or '?'}\n")
            continue
        for uuid, info in answer.devices.items():
            row = device_row(uuid, info, answer.status.get(uuid) or {})
            rows.append([answer.host] + row)
            states[row[2]] = states.get(row[2], 0) + 1
    down = sum(1 for a in answers if a.status is None)
    gpus = sum(states.values())
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    total = (f"{len(answers)} host{'s' if len(answers) != 1 else ''}"
             + (f", {down} not answering" if down else "")
             + f"; {gpus} GPU{'s' if gpus != 1 else ''}" + (f": {counts}" if counts else ""))
    return format_table(("HOST",) + HEADERS, rows, colour) + "".join(notes) + total + "\n"


def free_hosts(answers: List[HostAnswer], wanted: int) -> List[Tuple[str, int]]:
    """(host, free GPUs) of the hosts with at least `wanted` free now, most free first."""
    found = [(a.host, a.free()) for a in answers if a.status is not None]
    return sorted([(h, n) for h, n in found if n >= wanted], key=lambda hn: -hn[1])


def fleet_json(answers: List[HostAnswer]) -> Dict[str, Any]:
    """The same as JSON: every host's /status and /devices, or its error, and its free GPUs."""
    return {"hosts": [{"host": a.host, "free": a.free() if a.status is not None else None,
                       "status": a.status, "devices": a.devices, "error": a.error}
                      for a in answers]}
