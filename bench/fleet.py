"""The fleet at 1,000 hosts: one daemon with --fleet over real test-mode daemons (300; in quick
mode 10 of 30 hosts; fewer where memory does not hold them, said in the result), topped up with
replicas (bench/replicas.py: one process answering a real daemon's bodies on many ports), plus
5 refusing ports and 5 silent listeners. Measures /fleet.json (wrk, 4 connections: pages that
poll it back to back; and 1), the fleet daemon's own /status against a plain daemon's (wrk, 32
connections each, in turn three times: the medians), the fleet daemon's CPU while it polls, and
`patroller status --hosts` over 100 live, 5 refusing and 5 silent hosts.

PBENCH_FLEET_ROOT runs the daemons and the command line from another checkout (the figures
before a change: the same step over the old code).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from .harness import ROOT, cpu_seconds, have_wrk, listening_port, middle, ratio, wrk

DAEMON_MIB = 40  # a test-mode daemon's RSS, about (38 MiB measured)
RESERVE_MIB = 4096  # left free for everything else on the machine
INTERVAL = 5.0  # --fleet-interval: the default
GZIP = "Accept-Encoding: gzip, deflate, br"  # what a browser's page asks with


def available_mib() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("MemAvailable:"))


class TestDaemon:
    """`python -m patroller --test` on an ephemeral loopback port."""

    def __init__(self, root: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "patroller",
                "--test",
                "--config",
                "none",
                "--port",
                "0",
                "--address",
                "127.0.0.1",
                "--log-level",
                "warning",
                "--state-dir",
                "none",
                *args,
            ],
            cwd=root,
            env={**os.environ, "PYTHONPATH": root},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.port = 0

    def wait(self, deadline: float) -> TestDaemon:
        while not self.port:
            if self.process.poll() is not None:
                raise RuntimeError(f"a test-mode daemon exited: {self.process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("a test-mode daemon did not start")
            self.port = listening_port(self.process.pid)
            time.sleep(0.05)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, *headers: str) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            extra = "".join(f"{header}\r\n" for header in headers)
            s.sendall(
                f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode()
            )
            chunks = []
            while True:
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).split(b"\r\n\r\n", 1)[1]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()

    def reap(self) -> None:
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_many(root: str, count: int, log: Any) -> list[TestDaemon]:
    """`count` test-mode daemons, started a batch at a time (the machine has two cores)."""
    started: list[TestDaemon] = []
    try:
        for first in range(0, count, 16):
            batch = [TestDaemon(root) for _ in range(min(16, count - first))]
            started += batch
            for daemon in batch:
                daemon.wait(time.monotonic() + 120)
            if first and first % 80 == 0:
                log(f"fleet: {len(started)} test-mode daemons up")
    except BaseException:
        stop_all(started)
        raise
    return started


def stop_all(daemons: list[TestDaemon]) -> None:
    for daemon in daemons:
        daemon.stop()
    for daemon in daemons:
        daemon.reap()


class Farm:
    """The hosts of a fleet daemon and the daemon (`poller`) once it hears them all."""

    def __init__(self) -> None:
        self.skipped: str | None = None  # why there is none
        self.facts: dict[str, Any] = {}
        self.live: list[TestDaemon] = []
        self.hosts: list[str] = []  # the answering ones: real daemons first, then replicas
        self.refusing: list[str] = []
        self.quiet: list[str] = []
        self.listing = ""  # the file of every host, as --fleet-file reads it
        self.poller: TestDaemon | None = None

    def described(self) -> dict[str, Any]:
        return dict(self.facts)


SHARED = "fleet daemons"  # the key of the test-mode daemons the fleet steps share in ctx.shared


def shared_daemons(ctx: Any, root: str, count: int, log: Any) -> tuple[list[TestDaemon], bool]:
    """`count` test-mode daemons of `root`, and whether to leave them running: the fleet step
    starts them and leaves them to the fleet_at_load step where that step runs next (starting
    ten Python daemons takes some 10 s of two cores), which takes them over and stops them."""
    kept = ctx.shared.pop(SHARED, None)
    if kept is not None:
        if kept[0] == (root, count) and all(d.process.poll() is None for d in kept[1]):
            log(f"fleet: {count} test-mode daemons taken over from the fleet step")
            return kept[1], False
        stop_all(kept[1])
    daemons = start_many(root, count, log)
    if "fleet_at_load" in ctx.steps and ctx.step == "fleet":
        ctx.shared[SHARED] = ((root, count), daemons)
        return daemons, True
    return daemons, False


@contextlib.contextmanager
def fleet_hosts(
    root: str, hosts_wanted: int, daemons_wanted: int, log: Any, ctx: Any = None
) -> Iterator[Farm]:
    """`daemons_wanted` test-mode daemons (fewer where memory does not hold them, said in
    `facts`), topped up to `hosts_wanted` with replicas, 5 refusing ports and 5 silent
    listeners, and a daemon with --fleet over them all that has heard every answering one.
    With `ctx`, the daemons are shared between the fleet steps (shared_daemons)."""
    farm = Farm()
    keep = False
    available = available_mib()
    daemons = min(daemons_wanted, max(0, (available - RESERVE_MIB) // DAEMON_MIB))
    farm.facts = {
        "root": "this checkout" if root == ROOT else root,
        "memory_available_mib": available,
    }
    if daemons < daemons_wanted:
        farm.facts["scaled_down"] = (
            f"{daemons} test-mode daemons, not {daemons_wanted}: "
            f"{available} MiB available, {DAEMON_MIB} MiB each, "
            f"{RESERVE_MIB} MiB kept free"
        )
    if daemons < 10:
        farm.skipped = farm.facts.get("scaled_down", "no memory")
        yield farm
        return
    others: list[TestDaemon] = []
    silent: list[socket.socket] = []
    replicas: subprocess.Popen | None = None
    where = tempfile.mkdtemp(prefix="pbench-fleet")
    try:
        began = time.monotonic()
        if ctx is None:
            farm.live = start_many(root, daemons, log)
        else:
            farm.live, keep = shared_daemons(ctx, root, daemons, log)
        farm.facts["start_s"] = round(time.monotonic() - began, 1)
        hosts = [f"127.0.0.1:{d.port}" for d in farm.live]
        wanted = hosts_wanted - daemons
        if wanted > 0:
            for path in ("/status", "/devices"):
                with open(os.path.join(where, path[1:]), "wb") as f:
                    f.write(farm.live[0].get(path))
            replicas = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.replicas",
                    os.path.join(where, "status"),
                    os.path.join(where, "devices"),
                    str(wanted),
                ],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert replicas.stdout is not None
            hosts += [f"127.0.0.1:{port}" for port in replicas.stdout.readline().split()]
        for _ in range(5):
            with socket.socket() as s:  # bound, then closed: nothing listens there
                s.bind(("127.0.0.1", 0))
                farm.refusing.append(f"127.0.0.1:{s.getsockname()[1]}")
        for _ in range(5):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(64)
            silent.append(s)
        farm.quiet = [f"127.0.0.1:{s.getsockname()[1]}" for s in silent]
        farm.hosts = hosts
        listing = farm.listing = os.path.join(where, "fleet")
        with open(listing, "w", encoding="utf-8") as f:
            f.write("\n".join(hosts + farm.refusing + farm.quiet) + "\n")
        farm.facts.update(
            hosts=len(hosts) + 10,
            test_mode_daemons=daemons,
            replicas=max(0, wanted),
            refusing=5,
            silent=5,
        )
        log(f"fleet: {daemons} daemons, {max(0, wanted)} replicas, 5 refusing, 5 silent")
        farm.poller = TestDaemon(root, "--fleet-file", listing, "--fleet-interval", str(INTERVAL))
        others = [farm.poller]
        deadline = time.monotonic() + 120
        farm.poller.wait(deadline)
        began = time.monotonic()
        while True:
            totals = json.loads(farm.poller.get("/fleet.json"))["totals"]
            if totals["answering"] == len(hosts):
                break
            if time.monotonic() > deadline:  # a busy machine: some late every round
                if totals["answering"] < 0.9 * len(hosts):
                    raise RuntimeError(
                        f"the fleet daemon heard {totals['answering']} of {len(hosts)} hosts"
                    )
                farm.facts["answering_at_start"] = totals["answering"]
                break
            time.sleep(0.5)
        farm.facts["all_up_s"] = round(time.monotonic() - began, 1)
        yield farm
    finally:
        stop_all(others + ([] if keep else farm.live))
        for s in silent:
            s.close()
        if replicas is not None:
            assert replicas.stdin is not None
            replicas.stdin.close()
            replicas.wait(10)
        shutil.rmtree(where, ignore_errors=True)


def fleet(ctx: Any) -> dict[str, Any]:
    if not have_wrk():
        return {"skipped": "wrk is not installed"}
    root = os.environ.get("PBENCH_FLEET_ROOT", ROOT)
    # quick: 10 real daemons (the fewest it takes), the other 20 hosts replicas of them
    hosts_wanted, daemons_wanted = (30, 10) if ctx.quick else (1000, 300)
    plain = TestDaemon(root)
    try:
        with fleet_hosts(root, hosts_wanted, daemons_wanted, ctx.log, ctx) as farm:
            if farm.skipped:
                return {"skipped": farm.skipped}
            result = farm.described()
            poller = farm.poller
            assert poller is not None
            plain.wait(time.monotonic() + 120)
            # A whole round in the steady state, then its CPU over two rounds of polling. Quick
            # mode: its CPU over the round after the one that heard every host, no more.
            if not ctx.quick:
                time.sleep(INTERVAL)
            result["fleet_json_bytes"] = len(poller.get("/fleet.json"))
            seconds = ctx.wrk_seconds if ctx.quick else 20
            window = INTERVAL * (1 if ctx.quick else 2)
            cpu = cpu_seconds(poller.process.pid)
            time.sleep(window)
            result["poller_core_fraction"] = round(
                (cpu_seconds(poller.process.pid) - cpu) / window, 3
            )
            result["poller_cpu_window_s"] = window
            # As the fleet page asks (a browser accepts gzip); then as a client that does not.
            result["fleet_json"] = wrk(
                poller.url + "/fleet.json", seconds, connections=4, headers=[GZIP]
            )
            result["fleet_json_one_client"] = wrk(
                poller.url + "/fleet.json", seconds / 2, connections=1, headers=[GZIP]
            )
            result["fleet_json_plain"] = wrk(
                poller.url + "/fleet.json", seconds / 2, connections=4
            )
            # An older daemon (PBENCH_FLEET_ROOT) sends a body new this round plain until its
            # gzip is made: ask again until the answer is gzip (its magic number).
            for _ in range(50):
                gzipped = poller.get("/fleet.json", GZIP)
                if gzipped.startswith(b"\x1f\x8b"):
                    break
                time.sleep(0.1)
            result["fleet_json_gzip_bytes"] = len(gzipped)
            # The machine is shared: the two daemons in turn, three times (once in quick
            # mode), each side's median.
            turns: dict[str, list[dict[str, float]]] = {"poller": [], "plain": []}
            for _ in range(1 if ctx.quick else 3):
                for name, daemon in (("plain", plain), ("poller", poller)):
                    each = seconds if ctx.quick else max(5.0, seconds / 3)
                    turns[name].append(wrk(daemon.url + "/status", each))
            for name, runs in turns.items():
                result[f"status_{name}"] = {
                    key: middle(run[key] for run in runs) for key in runs[0]
                }
                result[f"status_{name}"]["p99_ms_each"] = [run["p99_ms"] for run in runs]
            result["status_p99_ratio"] = ratio(
                result["status_poller"]["p99_ms"], result["status_plain"]["p99_ms"]
            )
            result["status_hosts"] = status_hosts(
                root, farm.hosts[:100], farm.refusing, farm.quiet, 2 if ctx.quick else 5
            )
    finally:
        stop_all([plain])
    return result


def status_hosts(
    root: str, live: list[str], refusing: list[str], silent: list[str], runs: int
) -> dict[str, Any]:
    """Wall time of `patroller status --hosts` over `live`, `refusing` and `silent` hosts."""
    hosts = ",".join(live + refusing + silent)
    took = []
    late = 0
    for _ in range(runs):
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "patroller.cli", "status", "--hosts", hosts],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=root,
            env={**os.environ, "PYTHONPATH": root},
        )
        took.append(time.monotonic() - began)
        late = sum(1 for line in done.stdout.splitlines() if "  no answer yet: " in line)
    return {
        "hosts": f"{len(live)} live, {len(refusing)} refusing, {len(silent)} silent",
        "median_s": round(statistics.median(took), 2),
        "max_s": round(max(took), 2),
        "shown_no_answer_yet": late,
    }


def table(report: dict[str, Any]) -> str:
    """The fleet step's figures as docs/many-hosts.md shows them."""
    r = report["results"].get("fleet") or {}
    m = report["machine"]
    if "fleet_json" not in r:
        return f"The fleet step did not run: {r}"
    lines = [
        f"Measured {m['date']} on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, "
        f"{report['mode']} mode: {r['hosts']} hosts ({r['test_mode_daemons']} test-mode "
        f"daemons, {r['replicas']} replicas of one, {r['refusing']} refusing, "
        f"{r['silent']} silent), --fleet-interval {INTERVAL:g}"
        + (f"; {r['scaled_down']}" if "scaled_down" in r else "")
        + ".",
        "",
        "| what | measured | goal |",
        "| --- | --- | --- |",
        f"| `/fleet.json` p99 (wrk, 4 connections, gzip accepted as by the page), "
        f"{r['hosts']} hosts | "
        f"{r['fleet_json']['p99_ms']} ms ({r['fleet_json']['requests_per_s']}/s, "
        f"{r.get('fleet_json_gzip_bytes', '?')} bytes) | under 50 ms |",
        f"| `/fleet.json` p99, one client | {r['fleet_json_one_client']['p99_ms']} ms "
        f"({r['fleet_json_one_client']['requests_per_s']}/s) | |",
        *(
            [
                f"| `/fleet.json` p99, 4 connections without gzip | "
                f"{r['fleet_json_plain']['p99_ms']} ms ({r['fleet_json_plain']['requests_per_s']}"
                f"/s, {r['fleet_json_bytes']} bytes) | |"
            ]
            if "fleet_json_plain" in r
            else []
        ),
        f"| the fleet daemon's own `/status` p99 / a plain daemon's (wrk, 32 connections, "
        f"medians of {len(r['status_poller'].get('p99_ms_each', [0] * 3))} turns) | "
        f"{r['status_poller']['p99_ms']} ms / "
        f"{r['status_plain']['p99_ms']} ms ({r['status_p99_ratio']}x) | unaffected |",
        f"| the fleet daemon's CPU while it polls "
        f"({r.get('poller_cpu_window_s', 2 * INTERVAL):g} s) | "
        f"{round(100 * r['poller_core_fraction'], 1)}% of a core | |",
        f"| `patroller status --hosts`, {r['status_hosts']['hosts']} | median "
        f"{r['status_hosts']['median_s']} s, max {r['status_hosts']['max_s']} s | "
        "under 2 s |",
    ]
    return "\n".join(lines)
