"""`patroller status --hosts h1:port,h2:port,...`: the GPUs of many hosts in one table.

Every host is asked at once (a thread each, up to 32), each with its own timeout: a host that does not
answer in time, or at all, is a line of its own saying so and why, and never holds up the
rest; so is one that answers more than HOST_MAX_BYTES (nothing past them is read) or other than
Patroller's schema says (answers.check): "not answering: bad answer: " and why. `--free N`
lists the hosts with N free GPUs now (answers.free), most free first; `--json` gives the same as
JSON; `--mine` asks each host who the caller is there (/whoami) and keeps their GPUs. The hosts come from `--hosts`, else
`--hosts-file` (one a line, `#` comments), else PATROLLER_HOSTS.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from patroller import answers, client, hosts
from patroller.answers import BadAnswer, check
from patroller.cli.exits import EX_TEMPFAIL, Failure
from patroller.cli.status import is_mine, tables
from patroller.cli.table import printable

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
    me: Optional[str] = None  # with --mine: the caller's user there, as its /whoami says

    def free(self) -> int:
        """GPUs one could reserve there now (answers.free), on a host that answered."""
        if self.status is None or self.devices is None:
            return 0
        return sum(1 for uuid, info in self.devices.items()
                   if answers.free(info, self.status.get(uuid) or {}))


def server_name(server: Optional[str]) -> str:
    """The one server, as the user named it (--server, PATROLLER_SERVER) or the default."""
    return server or os.environ.get("PATROLLER_SERVER") or client.DEFAULT_SERVER


def hosts_from(given: Optional[str], path: Optional[str]) -> List[str]:
    """The hosts asked for: `--hosts a,b`, else the lines of `--hosts-file`, else
    PATROLLER_HOSTS; each once, in the order given. OSError if the file cannot be read."""
    if given is None and path is not None:
        return hosts.read(path)
    return hosts.split(os.environ.get("PATROLLER_HOSTS", "") if given is None else given)


def _ask(host: str, timeout: float, mine: bool = False) -> HostAnswer:
    try:
        status = client.get_json(host, "/status", timeout, HOST_MAX_BYTES)
        devices = client.get_json(host, "/devices", timeout, HOST_MAX_BYTES)
        check(status, devices, HOST_MAX_GPUS)
    except BadAnswer as exc:
        return HostAnswer(host, error=said(f"bad answer: {exc}"))
    except (client.PatrollerError, ValueError) as exc:  # ValueError: not a server's address
        return HostAnswer(host, error=said(str(exc) or type(exc).__name__))
    if not mine:
        return HostAnswer(host, status, devices)
    try:
        return HostAnswer(host, status, devices, me=whoami(host, timeout))
    except client.PatrollerError as exc:
        return HostAnswer(host, error=said(f"cannot tell who you are there: {exc}"))


def whoami(server: Optional[str], timeout: float = FLEET_TIMEOUT) -> str:
    """The caller's user as the server takes it (/whoami): what --mine keeps the GPUs of.
    RequestRefused when it cannot identify the caller (or is older than /whoami);
    ServerUnreachable when it answers no user."""
    me = client.get_json(server, "/whoami", timeout, HOST_MAX_BYTES)
    if not isinstance(me, dict) or not isinstance(me.get("user"), str):
        raise client.ServerUnreachable(f"{server_name(server)}: /whoami names no user")
    return me["user"]


def said(why: str) -> str:
    """`why` cut to ERROR_SHOWN characters: a host's own words in it are the host's choice."""
    return why if len(why) <= ERROR_SHOWN else why[:ERROR_SHOWN - 1] + "…"


def ask_all(hosts: List[str], timeout: float, mine: bool = False) -> List[HostAnswer]:
    """Every host's answer, in the order given, within about `timeout` seconds in all (and
    with `mine`, who the caller is there)."""
    return at_once(hosts, lambda host: _ask(host, timeout, mine),
                   timeout * (3 if mine else 2) + 1,  # each request bounded
                   lambda host: HostAnswer(host, error=f"no answer within {timeout:g} s"))


Answer = TypeVar("Answer")


def at_once(hosts: List[str], ask: Callable[[str], Answer], deadline: float,
            late: Callable[[str], Answer]) -> List[Answer]:
    """`ask(host)` for every host at once (up to 32 threads), in the order given; `late(host)`
    for a host not done within `deadline` seconds in all. The threads are daemon threads: one
    stuck on a host that trickles its answer (each read within the timeout) is left behind, and
    does not hold the command's exit (a pool's threads are joined at exit)."""
    if not hosts:
        return []
    found: Dict[int, Any] = {}
    lock = threading.Lock()
    finished = threading.Event()
    pending = iter(range(len(hosts)))

    def work() -> None:
        while True:
            with lock:
                n = next(pending, None)
            if n is None:
                return
            try:
                answer: Any = ask(hosts[n])
            except Exception as exc:  # raised in the caller's thread, as it would have been
                answer = exc
            with lock:
                found[n] = answer
                if len(found) == len(hosts):
                    finished.set()

    for _ in range(min(32, len(hosts))):
        threading.Thread(target=work, name="ask-host", daemon=True).start()
    finished.wait(deadline)
    with lock:
        answers = [found[n] if n in found else late(host) for n, host in enumerate(hosts)]
    for answer in answers:
        if isinstance(answer, Exception):
            raise answer
    return answers


def fleet_table(answers: List[HostAnswer], colour: bool = False, width: Optional[int] = None,
                mine: bool = False) -> str:
    """One table for every host: a heading line per host (its GPUs by state), then a row per
    GPU and a line per process, fitted to `width` together; a host that did not answer is its
    heading line alone, saying why in full, which widens no row. Then the totals. `mine`: only
    the GPUs of the caller as each host names them (`me`)."""
    groups = []
    states: Dict[str, int] = {}
    for answer in answers:
        name = f"\033[1m{answer.host}\033[0m" if colour else answer.host
        if answer.status is None or answer.devices is None:
            why = printable(f"not answering: {answer.error or '?'}")  # a host's own words
            groups.append((f"{name}  " + (f"\033[31m{why}\033[0m" if colour else why), []))
            continue
        devices = [(info, answer.status.get(uuid) or {}) for uuid, info in answer.devices.items()]
        counts: Dict[str, int] = {}
        for _, entry in devices:
            state = str((entry.get("claim") or {}).get("state", "?"))
            counts[state] = counts.get(state, 0) + 1
            states[state] = states.get(state, 0) + 1
        if mine and answer.me is not None:
            devices = [(info, entry) for info, entry in devices if is_mine(entry, answer.me)]
        groups.append((f"{name}  {gpus_said(counts)}", devices))
    down = sum(1 for a in answers if a.status is None)
    total = (f"{len(answers)} host{'s' if len(answers) != 1 else ''}"
             + (f", {down} not answering" if down else "") + f"; {gpus_said(states)}")
    if not any(devices for _, devices in groups):  # no GPU to show: no table head either
        return "".join(heading + "\n" for heading, _ in groups) + total + "\n"
    return tables(groups, colour, width) + total + "\n"


def gpus_said(states: Dict[str, int]) -> str:
    """'8 GPUs: 7 free, 1 reserved'."""
    gpus = sum(states.values())
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    return f"{gpus} GPU{'s' if gpus != 1 else ''}" + (f": {counts}" if counts else "")


def free_hosts(answers: List[HostAnswer], wanted: int) -> List[Tuple[str, int]]:
    """(host, free GPUs) of the hosts with at least `wanted` free now, most free first."""
    found = [(a.host, a.free()) for a in answers if a.status is not None]
    return sorted([(h, n) for h, n in found if n >= wanted], key=lambda hn: -hn[1])


def free_lines(answers: List[HostAnswer], wanted: int) -> str:
    """'host  N free' for each host with `wanted` GPUs free now, most first; a Failure (status
    75) when none has."""
    found = free_hosts(answers, wanted)
    if not found:
        raise Failure(f"no host has {wanted} GPU{'s' if wanted != 1 else ''} free now",
                      EX_TEMPFAIL)
    return "".join(f"{host}  {free} free\n" for host, free in found)


def fleet_json(answers: List[HostAnswer]) -> Dict[str, Any]:
    """The same as JSON: every host's /status and /devices, or its error, and its free GPUs."""
    return {"hosts": [{"host": a.host, "free": a.free() if a.status is not None else None,
                       "status": a.status, "devices": a.devices, "error": a.error}
                      for a in answers]}
