"""The command line people type: `patroller run|status|release|wait`.

Standard library and `patroller.client` only, so that it works wherever the client is installed
(a container with the socket directory mounted) without Tornado or Docker. `patroller` with
flags (or none) is still the server; patroller/main.py hands these four words to `main` here.

Exit statuses (sysexits.h where one fits): 0 done; 2 bad usage; 69 server unreachable
(EX_UNAVAILABLE); 75 busy, or not free in time (EX_TEMPFAIL); 77 refused by the server (EX_NOPERM:
any other 4xx, the server's error is printed); 126 command not executable; 127 command not
found; 130 interrupted (Ctrl-C) while waiting. Once `run` has started the command, the status
is the command's own.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import shutil
import sys
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, TextIO

from patroller import client
from patroller.client import PatrollerError, RequestRefused, ServerUnreachable

EX_OK = 0
EX_USAGE = 2
EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EX_NOPERM = 77
EX_NOEXEC = 126
EX_NOTFOUND = 127
EX_INTERRUPTED = 130

COMMANDS = ("run", "status", "release", "wait")
PROGRESS_EVERY = 1.0  # seconds between looks at the queue while waiting
QUEUE_GRACE = 3.0  # seconds the progress line waits for the request to show in /queue
PIPED_PROGRESS_EVERY = 10.0  # at most one progress line this often when stderr is not a terminal
CUT = "…"
WIDEST = {"NAME": 22, "USER": 32, "PROCESSES": 40}  # longer cells are cut
STATE_COLOURS = {"free": "32", "reserved": "33", "claimed": "36", "shared": "1;31",
                 "lost": "35"}


class Failure(Exception):
    """A command ends with a message for people and an exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one subcommand; its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        options = parser.parse_args(args)
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
        return int(exit_.code or 0)
    try:
        client.parse_server(options.server)
    except ValueError as exc:
        print(f"patroller: {exc}", file=sys.stderr)
        return EX_USAGE
    try:
        return options.handler(options)
    except Failure as failure:
        print(f"patroller: {failure}", file=sys.stderr)
        return failure.code
    except ServerUnreachable as exc:
        print(f"patroller: cannot reach the server: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    except RequestRefused as refused:
        print(f"patroller: the server refused: {error_text(refused)}", file=sys.stderr)
        return refused_code(refused)
    except KeyboardInterrupt:
        print("patroller: interrupted", file=sys.stderr)
        return EX_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", help="host[:port], http://host:port or unix:///path "
                        "(default: $PATROLLER_SERVER, else localhost)")
    parser = argparse.ArgumentParser(
        prog="patroller", description="Reserve and watch the GPUs of a Patroller host. "
        "`patroller` with flags and no command runs the server (patroller --help).")
    commands = parser.add_subparsers(dest="command", metavar="{run,status,release,wait}")
    commands.required = True

    run = commands.add_parser("run", parents=[common], help="run a command on reserved GPUs",
                              description="Reserve GPUs for as long as the command runs, "
                              "then run it in place with CUDA_VISIBLE_DEVICES set.")
    run.add_argument("-n", "--count", type=count_arg, default=1, help="how many (default 1)")
    run.add_argument("--wait", type=wait_arg, default=False, metavar="SECONDS|forever",
                     help="wait in the queue up to this long (default: do not wait)")
    run.add_argument("--resource", default="gpu", help="device group (default gpu)")
    run.add_argument("-q", "--quiet", action="store_true", help="no message before the command")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- command [args...]")
    run.set_defaults(handler=run_command)

    status = commands.add_parser("status", parents=[common], help="who holds which GPU",
                                 description="One row per GPU, then the waiting requests.")
    status.add_argument("--json", action="store_true", help="print the raw /status body")
    status.add_argument("--watch", nargs="?", type=seconds_arg, const=2.0, metavar="SECONDS",
                        help="redraw every SECONDS (default 2) until Ctrl-C")
    status.add_argument("--no-color", "--no-colour", dest="colour", action="store_false",
                        help="no colours even on a terminal (so does NO_COLOR)")
    status.set_defaults(handler=status_command)

    release = commands.add_parser("release", parents=[common], help="give reserved GPUs back",
                                  description="Release all your reservations, or the named.")
    release.add_argument("devices", nargs="*", metavar="UUID|NUMBER")
    release.set_defaults(handler=release_command)

    wait = commands.add_parser("wait", parents=[common], help="wait for GPUs, print numbers",
                               description="Wait for free GPUs, reserve them for the usual "
                               "lease and print their numbers: "
                               "CUDA_VISIBLE_DEVICES=$(patroller wait -n 2) python train.py")
    wait.add_argument("-n", "--count", type=count_arg, default=1, help="how many (default 1)")
    wait.add_argument("--timeout", type=seconds_arg, metavar="SECONDS",
                      help="give up after this long (default: wait for ever)")
    wait.add_argument("--resource", default="gpu", help="device group (default gpu)")
    wait.set_defaults(handler=wait_command)
    return parser


def count_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {value}")
    return value


def seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"a number of seconds, not {text!r}")
    return value


def wait_arg(text: str) -> Optional[float]:
    """Seconds, or None for 'forever'."""
    if text.lower() in ("forever", "inf", "infinity"):
        return None
    return seconds_arg(text)


# --- run ---------------------------------------------------------------------------------

def run_command(options: argparse.Namespace) -> int:
    """Reserve with hold=process, then exec the command in this very process."""
    command = list(options.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise Failure("run needs a command: patroller run -n 1 -- python train.py", EX_USAGE)
    check_command(command[0])
    granted = reserve_for_run(options)
    numbers = numbers_of(granted, "gpu")
    if numbers:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(numbers)
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if not options.quiet:
        print(f"patroller: {describe(granted)} reserved while pid {os.getpid()} runs: "
              f"{shlex.join(command)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        for device in granted:
            try:
                client.release(options.server, device["uuid"])
            except PatrollerError:
                pass  # the reservation ends with this process anyway
        code = EX_NOTFOUND if exc.errno == errno.ENOENT else EX_NOEXEC
        raise Failure(f"cannot run {command[0]}: {exc.strerror or exc}", code) from None
    return EX_OK  # not reached: exec replaced this process


def check_command(name: str) -> None:
    """Fail before reserving anything when the command cannot be run."""
    if "/" in name:
        if not os.path.exists(name):
            raise Failure(f"{name}: no such file", EX_NOTFOUND)
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise Failure(f"{name}: not executable", EX_NOEXEC)
        return
    if shutil.which(name) is not None:
        return
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if os.path.isfile(os.path.join(directory or ".", name)):
            raise Failure(f"{name}: not executable", EX_NOEXEC)
    raise Failure(f"{name}: command not found", EX_NOTFOUND)


def reserve_for_run(options: argparse.Namespace) -> List[Dict[str, Any]]:
    if options.wait is False:  # no --wait: ask once
        granted = client.reserve(options.count, options.server, 0, options.resource, "process")
        if granted is None:
            raise Failure(busy_message(options.server, options.count, options.resource)
                          + "; add --wait SECONDS or --wait forever to queue", EX_TEMPFAIL)
        return granted
    progress = Progress(options.server, options.count, options.resource, sys.stderr)
    progress.start()
    try:
        granted = client.reserve(options.count, options.server, options.wait, options.resource,
                                 "process")
    finally:
        progress.stop()
    if granted is None:
        raise Failure(f"{options.count} {options.resource} not free within "
                      f"{duration(options.wait or 0)}", EX_TEMPFAIL)
    return granted


class Progress:
    """One line on stderr while a request waits: place in the queue, holders, time waited.

    A daemon thread with connections of its own: the wait itself runs in the main thread, where
    Ctrl-C lands. On a terminal the line is redrawn in place; otherwise a line is printed when
    what it says changes, at most every PIPED_PROGRESS_EVERY seconds.
    """

    def __init__(self, server: Optional[str], count: int, resource: str, out: TextIO) -> None:
        self.server, self.count, self.resource, self.out = server, count, resource, out
        self.terminal = out.isatty()
        self.started = time.monotonic()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="patroller-progress", daemon=True)
        self._shown = False
        self._last_key: Optional[str] = None
        self._last_print = -PIPED_PROGRESS_EVERY

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        if self.terminal and self._shown:
            self.out.write("\r\033[K")
            self.out.flush()

    def _run(self) -> None:
        inventory: Dict[str, Any] = {}
        while not self._stopping.is_set():
            try:
                if not inventory:
                    inventory = client.devices(self.server)
                queued = optional_queue(self.server)
                claims = client.status(self.server)
            except PatrollerError:
                queued, claims = None, None
            if self._stopping.is_set():
                return
            waited = time.monotonic() - self.started
            if (queued is not None and waited < QUEUE_GRACE
                    and not any(w.get("pid") == os.getpid() for w in queued)):
                self._stopping.wait(PROGRESS_EVERY / 10)  # the request is not in the queue yet
                continue
            key = progress_message(self.count, self.resource, os.getpid(), queued, claims,
                                   inventory, None)
            self._show(key, progress_message(self.count, self.resource, os.getpid(), queued,
                                             claims, inventory, waited))
            self._stopping.wait(PROGRESS_EVERY)

    def _show(self, key: str, line: str) -> None:
        now = time.monotonic()
        if self.terminal:
            width = shutil.get_terminal_size().columns
            self.out.write("\r\033[K" + cut(line, max(width - 1, 20)))
        elif key != self._last_key and now - self._last_print >= PIPED_PROGRESS_EVERY:
            self.out.write(line + "\n")
            self._last_key, self._last_print = key, now
        else:
            return
        self.out.flush()
        self._shown = True


def progress_message(count: int, resource: str, pid: int, queued: Optional[List[Dict[str, Any]]],
                     claims: Optional[Dict[str, Any]], inventory: Dict[str, Any],
                     waited: Optional[float]) -> str:
    """'patroller: waiting for 2 gpu (12s): 1st of 3 in the queue; held by ...'; the time
    first, so that a line cut to the terminal's width keeps it."""
    waiting = f" ({duration(waited)})" if waited is not None else ""
    parts = [f"patroller: waiting for {count} {resource}{waiting}"]
    if queued is not None:
        mine = [w for w in queued if w.get("pid") == pid]
        if mine:
            parts.append(f"{ordinal(mine[0]['position'])} of {len(queued)} in the queue")
        else:
            parts.append(f"{len(queued)} in the queue")
    if claims is not None:
        parts.append(holders_summary(claims, inventory, resource))
    return parts[0] + (": " + "; ".join(parts[1:]) if parts[1:] else "")


def holders_summary(claims: Dict[str, Any], inventory: Dict[str, Any], resource: str) -> str:
    """'held by alice@example.org (0,1), bob (2); 1 free' for one device group."""
    held: Dict[str, List[str]] = {}
    free = 0
    for uuid, info in inventory.items():
        if info.get("group", "gpu") != resource:
            continue
        claim = (claims.get(uuid) or {}).get("claim") or {}
        if claim.get("state", "free") == "free":
            free += 1
            continue
        held.setdefault(user_name(claim.get("user")), []).append(str(info.get("number", "?")))
    if not held:
        return f"{free} free"
    return ("held by " + ", ".join(f"{who} ({','.join(numbers)})" for who, numbers in held.items())
            + f"; {free} free")


def busy_message(server: Optional[str], count: int, resource: str) -> str:
    try:
        summary = "; " + holders_summary(client.status(server), client.devices(server), resource)
    except PatrollerError:
        summary = ""
    return f"busy: {count} {resource} not free now{summary}"


def optional_users(server: Optional[str]) -> Optional[Dict[str, Any]]:
    """/users, or None from a server without it."""
    try:
        return client.users(server)
    except RequestRefused:
        return None


def optional_queue(server: Optional[str]) -> Optional[List[Dict[str, Any]]]:
    """/queue, or None from a server without it."""
    try:
        return client.queue(server)
    except RequestRefused:
        return None


# --- wait and release --------------------------------------------------------------------

def wait_command(options: argparse.Namespace) -> int:
    """Reserve for the usual lease (hold=lease) and print the numbers on stdout."""
    granted = client.reserve(options.count, options.server, options.timeout, options.resource,
                             "lease")
    if granted is None:
        within = "now" if options.timeout == 0 else f"within {duration(options.timeout or 0)}"
        raise Failure(f"{options.count} {options.resource} not free {within}", EX_TEMPFAIL)
    numbers = numbers_of(granted, options.resource)
    leases = [g["expires"] for g in granted if g.get("expires") is not None]
    lease = (f"start the job within {duration(min(leases))}, or the reservation lapses"
             if leases else "start the job soon, or the reservation lapses")
    print(f"patroller: {describe(granted)} reserved; {lease} (it then lasts while your "
          "processes run on them)", file=sys.stderr)
    print(",".join(numbers))
    return EX_OK


def release_command(options: argparse.Namespace) -> int:
    """Release everything, or the devices named by uuid or number."""
    if not options.devices:
        body = client.release(options.server)
        print(release_message(body))
        return EX_OK
    inventory = client.devices(options.server)
    failed = False
    for name in options.devices:
        try:
            uuid = uuid_of(name, inventory)
            label = f"GPU {name}" if name.isdigit() else name
            print(release_message(client.release(options.server, uuid), label))
        except RequestRefused as refused:
            print(f"patroller: cannot release {name}: {error_text(refused)}", file=sys.stderr)
            failed = True
        except Failure as failure:
            print(f"patroller: {failure}", file=sys.stderr)
            failed = True
    return EX_NOPERM if failed else EX_OK


def uuid_of(name: str, inventory: Dict[str, Any]) -> str:
    """A device's uuid from its uuid or its number (a GPU's, as nvidia-smi numbers them)."""
    if not name.isdigit():
        return name
    for uuid, info in inventory.items():
        if info.get("group", "gpu") == "gpu" and str(info.get("number")) == name:
            return uuid
    raise Failure(f"cannot release {name}: no GPU number {name} on this host", EX_NOPERM)


def release_message(body: Dict[str, Any], named: Optional[str] = None) -> str:
    """What /release answered, in words (for the device `named`, if one was)."""
    released = body.get("released") or []
    after = body.get("after_exit") or []
    lines = []
    if released:
        lines.append(f"released {describe(released)}")
    if after:
        lines.append(f"{describe(after)} will be free when your processes on "
                     f"{'it' if len(after) == 1 else 'them'} end")
    if lines:
        return "\n".join(lines)
    if named is not None:
        return f"nothing released: {named} is not reserved by you"
    return "nothing to release: you hold no reservation"


# --- status ------------------------------------------------------------------------------

def status_command(options: argparse.Namespace) -> int:
    colour = options.colour and use_colour(sys.stdout)
    if options.watch is None:
        print(render_status(options, colour), end="")
        return EX_OK
    terminal = sys.stdout.isatty()
    try:
        while True:
            try:
                text = render_status(options, colour)
            except PatrollerError as exc:
                text = f"patroller: {exc}\n"
            if terminal:
                sys.stdout.write("\033[H\033[J" + text)
            else:
                sys.stdout.write(text + "\n")
            sys.stdout.flush()
            time.sleep(options.watch)
    except KeyboardInterrupt:
        return EX_OK


def render_status(options: argparse.Namespace, colour: bool) -> str:
    claims = client.status(options.server)
    if options.json:
        return json.dumps(claims, separators=(",", ":")) + "\n"
    return format_status(claims, client.devices(options.server), optional_queue(options.server),
                         colour, optional_users(options.server))


def use_colour(out: TextIO) -> bool:
    """Colours on a terminal, unless NO_COLOR is set (https://no-color.org) or TERM=dumb."""
    return (out.isatty() and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM", "") != "dumb")


HEADERS = ("GPU", "NAME", "STATE", "USER", "PROCESSES", "UTIL", "MEMORY", "TEMP", "POWER", "TIME")


def format_status(claims: Dict[str, Any], inventory: Dict[str, Any],
                  queued: Optional[List[Dict[str, Any]]] = None, colour: bool = False,
                  users: Optional[Dict[str, Any]] = None) -> str:
    """The status table, then one line per waiting request, per user and notes on stale or
    idle devices."""
    rows = [device_row(uuid, info, claims.get(uuid) or {}) for uuid, info in inventory.items()]
    text = format_table(HEADERS, rows, colour)
    notes = []
    for uuid, info in inventory.items():
        entry = claims.get(uuid) or {}
        label = device_label(info)
        if entry.get("stale"):
            notes.append(f"{label}: statistics are stale (no sample for three intervals)")
        claim = entry.get("claim") or {}
        if claim.get("processes_stale"):
            notes.append(f"{label}: the process list is out of date; state and users may be wrong")
        if claim.get("idle_for") is not None:
            notes.append(f"{label}: idle for {duration(claim['idle_for'])} "
                         f"(held by {user_name(claim.get('user') or {})})")
        if claim.get("set_aside_for"):
            notes.append(f"{label}: free, set aside for {claim['set_aside_for']}, whose request "
                         "has waited past the starvation bound")
    notes.extend(queue_line(waiter) for waiter in queued or [])
    notes.extend(user_line(name, usage) for name, usage in (users or {}).items())
    return text + "".join(note + "\n" for note in notes)


def user_line(name: str, usage: Dict[str, Any]) -> str:
    """'user alice@example.org: 2 held (limit 4), 1 unused, 1 idle, 1 used without asking'."""
    limit = usage.get("limit")
    parts = [f"{usage.get('held', 0)} held" + (f" (limit {limit})" if limit is not None else "")]
    for key, words in (("reserved_unused", "unused"), ("idle", "idle"),
                       ("unreserved", "used without asking"), ("waiting", "waiting")):
        if usage.get(key):
            parts.append(f"{usage[key]} {words}")
    return f"user {name}: " + ", ".join(parts)


def device_row(uuid: str, info: Dict[str, Any], entry: Dict[str, Any]) -> List[str]:
    """The cells of one device's row."""
    claim = entry.get("claim") or {}
    state = claim.get("state", "?")
    users = claim.get("users") or ([claim["user"]] if claim.get("user") else [])
    number = str(info.get("number", "?"))
    if info.get("group", "gpu") != "gpu":
        number = f"{info.get('group')} {number}"
    return [number, short_name(info.get("name") or ""), state,
            ", ".join(dict.fromkeys(user_name(u) for u in users)) or "-",
            processes_cell(claim), percent(entry.get("sm")),
            memory_cell(entry.get("fb"), entry.get("fb_total") or info.get("total_mem")),
            unit(entry.get("gtemp"), "C"), unit(entry.get("power"), "W"), time_cell(claim)]


def format_table(headers: Sequence[str], rows: List[List[str]], colour: bool = False) -> str:
    """Left-aligned columns two spaces apart, widths from the content; long cells cut."""
    rows = [[cut(cell, WIDEST.get(header, 40)) for header, cell in zip(headers, row)]
            for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    state = list(headers).index("STATE") if "STATE" in headers else -1

    def line(cells: Sequence[str], header: bool) -> str:
        out = []
        for i, cell in enumerate(cells):
            padded = cell.ljust(widths[i]) if i < len(cells) - 1 else cell
            if colour and header:
                padded = f"\033[1m{padded}\033[0m"
            elif colour and i == state and cell in STATE_COLOURS:
                padded = f"\033[{STATE_COLOURS[cell]}m{cell}\033[0m" + padded[len(cell):]
            out.append(padded)
        return "  ".join(out).rstrip()

    return "".join(line(cells, i == 0) + "\n" for i, cells in enumerate([list(headers)] + rows))


def queue_line(waiter: Dict[str, Any]) -> str:
    wants = ", ".join(f"{n} {group}" for group, n in (waiter.get("wants") or {}).items())
    bound = f", while pid {waiter['pid']} lives" if waiter.get("pid") else ""
    return (f"waiting {waiter.get('position', '?')}: {waiter.get('user', '?')} wants {wants} "
            f"(for {duration(waiter.get('waited') or 0)}{bound})")


def short_name(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100-SXM4-80GB'."""
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name or "-"


def user_name(user: Optional[Dict[str, Any]]) -> str:
    """The e-mail, else the account, else the container's name, else the user string."""
    if not user:
        return "-"
    container = user.get("container") or {}
    return (user.get("email") or user.get("account") or container.get("name")
            or user.get("user") or "?")


def processes_cell(claim: Dict[str, Any]) -> str:
    detail = claim.get("process_detail")
    if detail:
        return ", ".join(" ".join([str(p["pid"]), *([p["command"]] if p.get("command") else []),
                                   *([f"{int(p['fb'])}MiB"] if p.get("fb") is not None else [])])
                         for p in detail)
    return ", ".join(str(pid) for pid in claim.get("processes") or []) or "-"


def time_cell(claim: Dict[str, Any]) -> str:
    if claim.get("held_for_pid"):
        return f"while pid {claim['held_for_pid']} lives"
    if claim.get("expires") is not None:
        return f"expires in {duration(claim['expires'])}"
    if claim.get("age") is not None:
        return f"for {duration(claim['age'])}"
    return "-"


def memory_cell(used: Any, total: Any) -> str:
    """'4096/81920 MiB' from the used MiB and the inventory's '81920 MiB'."""
    total_mib: Optional[int] = total if isinstance(total, int) else None
    if isinstance(total, str) and total.split() and total.split()[0].isdigit():
        total_mib = int(total.split()[0])
    if used is None and total_mib is None:
        return "-"
    return f"{'-' if used is None else int(used)}/{'-' if total_mib is None else total_mib} MiB"


def percent(value: Any) -> str:
    return "-" if value is None else f"{value}%"


def unit(value: Any, suffix: str) -> str:
    return "-" if value is None else f"{value}{suffix}"


def duration(seconds: float) -> str:
    """0.5s, 8s, 3m12s, 2h05m, 3d04h."""
    if 0 < seconds < 9.95 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    whole = max(int(round(seconds)), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(width - 1, 0)] + CUT


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# --- shared ------------------------------------------------------------------------------

def numbers_of(granted: Iterable[Dict[str, Any]], group: str) -> List[str]:
    return [str(d["info"]["number"]) for d in granted if d.get("group") == group]


def device_label(info: Dict[str, Any]) -> str:
    group = info.get("group", "gpu")
    return f"{'GPU' if group == 'gpu' else group} {info.get('number', '?')}"


def describe(granted: List[Dict[str, Any]]) -> str:
    """'GPUs 0,1' or 'GPU 2' (other groups by name) for grant entries."""
    by_group: Dict[str, List[str]] = {}
    for device in granted:
        by_group.setdefault(device.get("group", "gpu"), []).append(
            str((device.get("info") or {}).get("number", device.get("uuid"))))
    words = []
    for group, numbers in by_group.items():
        name = "GPU" if group == "gpu" else group
        words.append(f"{name}{'s' if len(numbers) > 1 else ''} {','.join(numbers)}")
    return " and ".join(words) or "nothing"


def error_text(refused: RequestRefused) -> str:
    return str(refused.body.get("error", refused.body)) if isinstance(refused.body, dict) \
        else str(refused.body)


def refused_code(refused: RequestRefused) -> int:
    """77 for a refusal (4xx), 69 for a server that cannot serve (5xx)."""
    return EX_UNAVAILABLE if refused.status >= 500 else EX_NOPERM


if __name__ == "__main__":
    sys.exit(main())
