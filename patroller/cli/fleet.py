"""`patroller status --hosts h1:port,h2:port,...`: the GPUs of many hosts in one table.

Every request goes out at once (a task each on one event loop, cli/asking.py: /status and
/devices of every host, and /whoami with --mine), and the table is drawn at one overall deadline
(--deadline, else PATROLLER_HOSTS_DEADLINE, else DEADLINE = 1.5 s) whatever the hosts do: a host
not answered by then is "no answer yet", one that refuses "refused", one that fails or answers
nothing within --host-timeout "not answering" and why; each is a line of its own and never holds
up the rest. A request still waiting on a silent host at the deadline is cancelled. A host that
answers more than HOST_MAX_BYTES (nothing past them is read) or other than Patroller's schema
says (answers.check) is "not answering: bad answer: " and why. `--free N` lists the hosts with N
free GPUs now (answers.free), most free first; `--json` gives the same as JSON; `--mine` keeps
the caller's GPUs, the caller as each host's /whoami names them. The hosts come from `--hosts`,
else `--hosts-file` (one a line, `#` comments), else PATROLLER_HOSTS."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import patroller.cli.asking as asking
from patroller import answers, client, durations, hosts
from patroller.answers import BadAnswer, check
from patroller.cli.exits import EX_TEMPFAIL, EX_USAGE, Failure
from patroller.cli.status import is_mine, tables
from patroller.durations import describe
from patroller.safetext import printable

FLEET_TIMEOUT = 5.0  # seconds a host may take to answer (--host-timeout)
DEADLINE = 1.5  # seconds, in all, before the table is drawn (--deadline)
DEADLINE_VARIABLE = "PATROLLER_HOSTS_DEADLINE"
# What a host that is not shown is: it refused the connection; it had not answered at the
# deadline; anything else (a timeout, a failure, a bad answer).
REFUSED, LATE, DOWN = "refused", "no answer yet", "not answering"
HOST_MAX_BYTES = 1 << 20  # bytes of a host's answer read at most: the daemon's --fleet-max-bytes
HOST_MAX_GPUS = 256  # GPUs a host may list: the daemon's Config.fleet_max_gpus
ERROR_SHOWN = 200  # characters of why a host is not shown, at most (a host's own words in it)


@dataclass
class HostAnswer:
    """What one host answered: its /status and /devices, or why there is none."""

    host: str
    status: dict[str, Any] | None = None
    devices: dict[str, Any] | None = None
    error: str | None = None
    me: str | None = None  # with --mine: the caller's user there, as its /whoami says
    state: str | None = None  # with an error: REFUSED, LATE or DOWN (None: DOWN)

    def shown_state(self) -> str:
        return "up" if self.error is None and self.status is not None else self.state or DOWN

    def free(self) -> int:
        """GPUs one could reserve there now (answers.free), on a host that answered."""
        if self.status is None or self.devices is None:
            return 0
        return sum(
            1
            for uuid, info in self.devices.items()
            if answers.free(info, self.status.get(uuid) or {})
        )


def server_name(server: str | None) -> str:
    """The one server, as the user named it (--server, PATROLLER_SERVER) or the default."""
    return server or os.environ.get("PATROLLER_SERVER") or client.DEFAULT_SERVER


def hosts_from(given: str | None, path: str | None) -> list[str]:
    """The hosts asked for: `--hosts a,b`, else the lines of `--hosts-file`, else
    PATROLLER_HOSTS; each once, in the order given. OSError if the file cannot be read."""
    if given is None and path is not None:
        return hosts.read(path)
    return hosts.split(os.environ.get("PATROLLER_HOSTS", "") if given is None else given)


def _answer(host: str, got: dict[str, Any], mine: bool, deadline: float) -> HostAnswer:
    """One host's answer from what its requests got by the deadline (a body, or what was
    raised; a path missing: not answered yet)."""
    errors = [e for e in got.values() if isinstance(e, BaseException)]
    if errors:
        error = errors[0]
        if isinstance(error.__context__, ConnectionRefusedError):  # client says why in words
            return HostAnswer(host, error="connection refused", state=REFUSED)
        if isinstance(error, BadAnswer):
            return HostAnswer(host, error=said(f"bad answer: {error}"), state=DOWN)
        if got.get("/whoami") is error:
            return HostAnswer(host, error=said(f"cannot tell who you are there: {error}"))
        return HostAnswer(host, error=said(str(error) or type(error).__name__), state=DOWN)
    if not all(path in got for path in paths(mine)):
        return HostAnswer(host, error=f"none within the {describe(deadline)} deadline", state=LATE)
    status, devices = got["/status"], got["/devices"]
    try:
        check(status, devices, HOST_MAX_GPUS)
    except BadAnswer as exc:
        return HostAnswer(host, error=said(f"bad answer: {exc}"), state=DOWN)
    if not mine:
        return HostAnswer(host, status, devices)
    me = got["/whoami"]
    if not isinstance(me, dict) or not isinstance(me.get("user"), str):
        return HostAnswer(
            host, error=f"cannot tell who you are there: {host}: /whoami names no user"
        )
    return HostAnswer(host, status, devices, me=me["user"])


def paths(mine: bool) -> tuple[str, ...]:
    return ("/status", "/devices", "/whoami") if mine else ("/status", "/devices")


def whoami(server: str | None, timeout: float = FLEET_TIMEOUT) -> str:
    """The caller's user as the server takes it (/whoami): what --mine keeps the GPUs of.
    RequestRefused when it cannot identify the caller (or is older than /whoami);
    ServerUnreachable when it answers no user."""
    me = client.get_json(server, "/whoami", timeout, HOST_MAX_BYTES)
    if not isinstance(me, dict) or not isinstance(me.get("user"), str):
        raise client.ServerUnreachable(f"{server_name(server)}: /whoami names no user")
    return me["user"]


def said(why: str) -> str:
    """`why` cut to ERROR_SHOWN characters: a host's own words in it are the host's choice."""
    return why if len(why) <= ERROR_SHOWN else why[: ERROR_SHOWN - 1] + "…"


def deadline_from(given: float | None) -> float:
    """The overall deadline: --deadline, else PATROLLER_HOSTS_DEADLINE, else DEADLINE.
    Failure (usage) when the variable is not a number of seconds."""
    if given is not None:
        return given
    text = os.environ.get(DEADLINE_VARIABLE)
    if not text:
        return DEADLINE
    try:
        value = durations.parse(text)
    except ValueError as exc:
        raise Failure(f"{DEADLINE_VARIABLE}: {exc}", EX_USAGE) from None
    return value


def age() -> float:
    """Seconds since this process started (Linux: /proc; elsewhere 0): the deadline counts the
    interpreter's own start too, which can take a good part of a second on a busy machine."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def ask_all(
    hosts: list[str],
    timeout: float,
    mine: bool = False,
    deadline: float | None = None,
    spent: float = 0.0,
) -> list[HostAnswer]:
    """Every host's answer, in the order given (and with `mine`, who the caller is there):
    every request sent at once, each bounded by `timeout`, and all that came back by
    `deadline` seconds from the start, `spent` seconds ago (None: as long as one request may
    take, plus a second); a host not answered by then is LATE."""
    if not hosts:
        return []
    wait = timeout + 1 if deadline is None else max(0.1, deadline - spent)
    requests = [(host, path) for host in hosts for path in paths(mine)]
    came = asyncio.run(asking.ask(requests, timeout, HOST_MAX_BYTES, wait))
    got: list[dict[str, Any]] = [{} for _ in hosts]
    for n, answer in came.items():
        got[n // len(paths(mine))][requests[n][1]] = answer
    return [
        _answer(host, answers, mine, wait if deadline is None else deadline)
        for host, answers in zip(hosts, got, strict=True)
    ]


Answer = TypeVar("Answer")


def at_once(
    hosts: list[str], ask: Callable[[str], Answer], deadline: float, late: Callable[[str], Answer]
) -> list[Answer]:
    """`ask(host)` for every host at once (up to 32 threads), in the order given; `late(host)`
    for a host not done within `deadline` seconds in all. The threads are daemon threads: one
    stuck on a host that trickles its answer (each read within the timeout) is left behind, and
    does not hold the command's exit (a pool's threads are joined at exit)."""
    if not hosts:
        return []
    found: dict[int, Any] = {}
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

    end = time.monotonic() + deadline
    for _ in range(min(32, len(hosts))):
        threading.Thread(target=work, name="ask-host", daemon=True).start()
    finished.wait(max(0.0, end - time.monotonic()))
    with lock:
        answers = [found[n] if n in found else late(host) for n, host in enumerate(hosts)]
    for answer in answers:
        if isinstance(answer, Exception):
            raise answer
    return answers


def fleet_table(
    answers: list[HostAnswer], colour: bool = False, width: int | None = None, mine: bool = False
) -> str:
    """One table for every host: a heading line per host (its GPUs by state), then a row per
    GPU and a line per process, fitted to `width` together; a host that did not answer is its
    heading line alone, saying why in full, which widens no row. Then the totals. `mine`: only
    the GPUs of the caller as each host names them (`me`)."""
    groups: list[Any] = []
    states: dict[str, int] = {}
    for answer in answers:
        host = printable(answer.host)  # as a hosts file says it; its colour after
        name = f"\033[1m{host}\033[0m" if colour else host
        if answer.status is None or answer.devices is None:
            why = printable(f"{answer.state or DOWN}: {answer.error or '?'}")  # its own words
            groups.append((f"{name}  " + (f"\033[31m{why}\033[0m" if colour else why), []))
            continue
        devices = [(info, answer.status.get(uuid) or {}) for uuid, info in answer.devices.items()]
        counts: dict[str, int] = {}
        for _, entry in devices:
            state = str((entry.get("claim") or {}).get("state", "?"))
            counts[state] = counts.get(state, 0) + 1
            states[state] = states.get(state, 0) + 1
        if mine and answer.me is not None:
            devices = [(info, entry) for info, entry in devices if is_mine(entry, answer.me)]
        groups.append((f"{name}  {gpus_said(counts)}", devices))
    down = [a.state or DOWN for a in answers if a.status is None]
    total = (
        f"{len(answers)} host{'s' if len(answers) != 1 else ''}"
        + "".join(
            f", {down.count(state)} {state}" for state in (REFUSED, LATE, DOWN) if state in down
        )
        + f"; {gpus_said(states)}"
    )
    if not any(devices for _, devices in groups):  # no GPU to show: no table head either
        return "".join(heading + "\n" for heading, _ in groups) + total + "\n"
    return tables(groups, colour, width) + total + "\n"


def gpus_said(states: dict[str, int]) -> str:
    """'8 GPUs: 7 free, 1 reserved'."""
    gpus = sum(states.values())
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    return f"{gpus} GPU{'s' if gpus != 1 else ''}" + (f": {counts}" if counts else "")


def free_hosts(answers: list[HostAnswer], wanted: int) -> list[tuple[str, int]]:
    """(host, free GPUs) of the hosts with at least `wanted` free now, most free first."""
    found = [(a.host, a.free()) for a in answers if a.status is not None]
    return sorted([(h, n) for h, n in found if n >= wanted], key=lambda hn: -hn[1])


def free_lines(answers: list[HostAnswer], wanted: int) -> str:
    """'host  N free' for each host with `wanted` GPUs free now, most first; a Failure (status
    75) when none has."""
    found = free_hosts(answers, wanted)
    if not found:
        raise Failure(
            f"no host has {wanted} GPU{'s' if wanted != 1 else ''} free now", EX_TEMPFAIL
        )
    return "".join(f"{host}  {free} free\n" for host, free in found)


def fleet_json(answers: list[HostAnswer]) -> dict[str, Any]:
    """The same as JSON: every host's /status and /devices, or its error, and its free GPUs."""
    return {
        "hosts": [
            {
                "host": a.host,
                "state": a.shown_state(),
                "free": a.free() if a.status is not None else None,
                "status": a.status,
                "devices": a.devices,
                "error": a.error,
            }
            for a in answers
        ]
    }
