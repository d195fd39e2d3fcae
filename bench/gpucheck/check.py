"""The GPU check's steps, in order, each timed and recorded (`Step`): the doctor; the captures
of nvidia-smi's answers; the project's parsers over them; the daemon on the real nvidia-smi;
two throwaway users' CUDA processes, each attributed to its user with its memory within the
deadline; claim() from a third user's script, its process on the GPU granted, shown claimed;
everything released. Whatever happens, the users, their processes and the daemon are gone
at the end."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench.gpucheck.host import ROOT, CheckFailed, Daemon, User, capture, copy_client, python_for

CLAIMANT = """
import json, os, sys
from client import claim, release
from worker import hold
if not claim(1, server=sys.argv[1], timeout=float(sys.argv[2])):
    print("failed no GPU was granted", flush=True)
    sys.exit(1)
backend, held = hold(sys.argv[3], sys.argv[4], int(sys.argv[5]))
print(f"ready {os.getpid()} {backend} {os.environ['CUDA_VISIBLE_DEVICES']}", flush=True)
sys.stdin.read()
release()
"""


@dataclass
class Step:
    name: str
    ok: bool | None = None  # None: not reached
    seconds: float = 0.0
    detail: str = ""


class Check:
    """One run of the check; `options` as __main__ parses them."""

    def __init__(self, options: Any, out: str, log: Callable[[str], None]) -> None:
        self.options = options
        self.out = out
        self.log = log
        self.work = tempfile.mkdtemp(prefix="gpucheck-", dir="/tmp")
        os.chmod(self.work, 0o755)  # the throwaway users read the client and worker here
        self.steps: list[Step] = []
        self.facts: dict[str, Any] = {}
        self.users: list[User] = []
        self.workers: list[subprocess.Popen] = []
        self.daemon: Daemon | None = None

    def run(self) -> bool:
        plan = [
            ("doctor", self.doctor),
            ("captures", self.captures),
            ("parsers", self.parsers),
            ("daemon", self.start_daemon),
            ("users", self.make_users),
            ("processes attributed", self.processes),
            ("claim", self.claim),
            ("released", self.released),
        ]
        try:
            for name, step in plan:
                if not self.step(name, step) and name in ("daemon", "users"):
                    break  # what follows needs them
        finally:
            self.step("cleaned up", self.clean_up)
        for name, _ in plan:
            if name not in {s.name for s in self.steps}:
                self.steps.insert(len(self.steps) - 1, Step(name, None, 0.0, "not reached"))
        return all(s.ok for s in self.steps)

    def step(self, name: str, action: Callable[[], str]) -> bool:
        self.log(f"{name} ...")
        began = time.monotonic()
        try:
            detail, ok = action(), True
        except CheckFailed as exc:
            detail, ok = str(exc), False
        except Exception as exc:  # a step that breaks is a failed step, not a lost run
            detail, ok = f"{type(exc).__name__}: {exc}", False
        self.steps.append(Step(name, ok, round(time.monotonic() - began, 2), detail))
        self.log(f"{name}: {'ok' if ok else 'FAILED'}: {detail}")
        return ok

    def result(self) -> dict[str, Any]:
        return {
            "ok": all(s.ok for s in self.steps),
            **self.facts,
            "steps": [asdict(s) for s in self.steps],
        }

    # -- the steps ------------------------------------------------------------------------

    def doctor(self) -> str:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "patroller",
                "doctor",
                "--json",
                "--nvidia-smi",
                self.options.nvidia_smi,
                "--port",
                "0",
                "--address",
                "127.0.0.1",
                "--state-dir",
                os.path.join(self.work, "state"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT},
            timeout=240,
        )
        with open(os.path.join(self.out, "doctor.json"), "w") as f:
            f.write(done.stdout)
        try:
            results = json.loads(done.stdout)
        except ValueError:
            raise CheckFailed(
                f"patroller doctor said no JSON (status {done.returncode}): "
                f"{done.stderr.strip()[-300:]}"
            ) from None
        self.facts["doctor"] = results
        bad = [f"{r['check']}: {r['status']}" for r in results if r["status"] != "ok"]
        if done.returncode != 0:
            raise CheckFailed(f"status {done.returncode}; " + "; ".join(bad))
        return f"{len(results)} checks, nothing failed" + (f" ({'; '.join(bad)})" if bad else "")

    def captures(self) -> str:
        folder = os.path.join(self.out, "captures")
        os.makedirs(folder, exist_ok=True)
        found = capture(self.options.nvidia_smi, folder, self.options.seconds)
        self.facts.update(driver=found["driver"], gpu=found["gpu"])
        self.facts["captures"] = found["files"]
        failing = {k: v for k, v in found["statuses"].items() if v != 0}
        if failing:
            raise CheckFailed(f"nvidia-smi failed: {failing}")
        return f"{found['gpu']}, driver {found['driver']}: {', '.join(found['files'].values())}"

    def parsers(self) -> str:
        from patroller.observe.nvsmi.discovery import parse_inventory
        from patroller.observe.nvsmi.parsers import DmonParser, PmonParser

        folder = os.path.join(self.out, "captures")
        texts = {}
        for what, name in self.facts.get("captures", {}).items():
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                texts[what] = f.read()
        if "q-x" not in texts:
            raise CheckFailed("no -q -x capture to read")
        found = parse_inventory(texts["q-x"])
        numbers = {d.number for d in found.devices}
        said = [f"-q -x: {len(found.devices)} GPU(s), {len(found.warnings)} warning(s)"]
        trouble = list(found.warnings)
        for kind, parser in (("dmon", DmonParser()), ("pmon", PmonParser())):
            rows = [r for r in map(parser.feed, texts.get(kind, "").splitlines()) if r]
            seen = {r.gpu for r in rows}
            said.append(f"{kind}: {len(rows)} rows, {parser.skipped} skipped")
            if parser.skipped or seen != numbers:
                trouble.append(
                    f"{kind}: GPUs {sorted(seen)} of {sorted(numbers)}, "
                    f"{parser.skipped} line(s) skipped ({parser.last_skipped!r})"
                )
        if trouble:
            raise CheckFailed("; ".join(said + trouble))
        return "; ".join(said)

    def start_daemon(self) -> str:
        self.daemon = Daemon(
            [
                "--nvidia-smi",
                self.options.nvidia_smi,
                "--state-dir",
                os.path.join(self.work, "state"),
                "--socket",
                os.path.join(self.work, "api.sock"),
            ],
            os.path.join(self.out, "daemon.log"),
        )
        self.daemon.wait_ready(120)
        devices = self.daemon.devices()
        self.facts["gpus"] = len(devices)
        self.numbers = {info["number"]: uuid for uuid, info in devices.items()}
        return f"{self.daemon.url}, {len(devices)} GPU(s)"

    def make_users(self) -> str:
        self.lib = copy_client(self.work)
        for role in ("a", "b", "c"):
            self.users.append(User(role))
        candidates = [
            self.options.python,
            sys.executable,
            os.path.realpath(sys.executable),
            "/usr/bin/python3",
            shutil.which("python3") or "",
        ]
        self.pythons = [python_for(user, candidates) for user in self.users]
        return ", ".join(
            f"{u.name} (uid {u.uid}, {p})" for u, p in zip(self.users, self.pythons, strict=False)
        )

    def environment(self, user: User, **more: str) -> dict[str, str]:
        home = os.path.join(self.work, f"home-{user.name}")
        os.makedirs(home, exist_ok=True)
        os.chown(home, user.uid, user.gid)
        return {
            **os.environ,
            "HOME": home,
            "USER": user.name,
            "LOGNAME": user.name,
            "PYTHONPATH": self.lib,
            **more,
        }

    def processes(self) -> str:
        assert self.daemon is not None
        gpus = len(self.numbers)
        said = []
        for index, (user, python) in enumerate(zip(self.users[:2], self.pythons, strict=False)):
            number = index % gpus
            process = subprocess.Popen(
                [
                    python,
                    os.path.join(self.lib, "worker.py"),
                    "--cuda",
                    self.options.cuda,
                    "--libcuda",
                    self.options.libcuda,
                    "--mib",
                    str(self.options.mib),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd="/",
                env=self.environment(
                    user, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(number)
                ),
                **user.who(),
            )
            self.workers.append(process)
            pid, backend = ready(process, 120)
            waited = self.attributed(self.numbers[number], pid, user.name)
            said.append(f"{user.name}'s pid {pid} ({backend}) on GPU {number} in {waited:.2f} s")
        return "; ".join(said)

    def attributed(self, uuid: str, pid: int, name: str, state: str | None = None) -> float:
        """Seconds until /status shows `pid` on `uuid` as `name`'s, with memory (and the
        device in `state`); CheckFailed after the deadline."""
        assert self.daemon is not None
        began = time.monotonic()
        seen: Any = None
        while time.monotonic() - began < self.options.deadline:
            claim = self.daemon.status()[uuid]["claim"]
            seen = [p for p in claim.get("process_detail") or [] if p["pid"] == pid]
            if (
                seen
                and seen[0]["user"] == name
                and (seen[0].get("fb") or 0) > 0
                and (state is None or claim["state"] == state)
            ):
                return time.monotonic() - began
            time.sleep(0.05)
        raise CheckFailed(
            f"pid {pid} not shown as {name}'s on {uuid} with its memory"
            f"{f' and the GPU {state}' if state else ''} within "
            f"{self.options.deadline:g} s: {seen or 'not listed'} "
            f"({claim['state']})"
        )

    def claim(self) -> str:
        assert self.daemon is not None
        for process in self.workers:  # free the GPUs they were on: their processes end,
            stop(process)  # and their leases, which would run on for --lease, are given back
        for number in range(min(2, len(self.numbers))):
            self.daemon.release(self.numbers[number])
        user, python = self.users[2], self.pythons[2]
        process = subprocess.Popen(
            [
                python,
                "-c",
                CLAIMANT,
                self.daemon.url[len("http://") :],
                "120",
                self.options.cuda,
                self.options.libcuda,
                str(self.options.mib),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
            env=self.environment(user),
            **user.who(),
        )
        self.workers.append(process)
        pid, backend, visible = ready(process, 180, with_visible=True)
        uuid = self.numbers[int(visible.split(",")[0])]
        waited = self.attributed(uuid, pid, user.name, state="claimed")
        holder = self.daemon.status()[uuid]["claim"]["user"]["user"]
        if holder != user.name:
            raise CheckFailed(f"GPU {visible} is claimed by {holder}, not {user.name}")
        self.claimed = (uuid, process)
        return (
            f"{user.name}'s pid {pid} ({backend}) granted GPU {visible}, claimed in {waited:.2f} s"
        )

    def released(self) -> str:
        assert self.daemon is not None
        uuid, process = self.claimed
        began = time.monotonic()
        stop(process)
        while time.monotonic() - began < self.options.deadline:
            if self.daemon.status()[uuid]["claim"]["state"] == "free":
                return f"GPU free again {time.monotonic() - began:.2f} s after release"
            time.sleep(0.05)
        raise CheckFailed(f"{uuid} not free {self.options.deadline:g} s after release")

    def clean_up(self) -> str:
        for process in self.workers:
            stop(process)
        status = self.daemon.stop() if self.daemon is not None else None
        for user in self.users:
            user.remove()
        shutil.rmtree(self.work, ignore_errors=True)
        return f"{len(self.users)} user(s) removed" + (
            f", patroller stopped (status {status})" if self.daemon is not None else ""
        )


def ready(process: subprocess.Popen, timeout: float, with_visible: bool = False) -> tuple:
    """(pid, backend[, visible]) from a worker's `ready` line; CheckFailed otherwise."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise CheckFailed(f"the CUDA process said nothing in {timeout:g} s")
    words = process.stdout.readline().split()
    if len(words) < 4 or words[0] != "ready":
        raise CheckFailed(f"the CUDA process: {' '.join(words) or 'exited'}")
    found = (int(words[1]), words[2])
    return (*found, words[3]) if with_visible else found


def stop(process: subprocess.Popen) -> None:
    """Close its input (it lets go and exits); kill it if it does not."""
    if process.stdin is not None and not process.stdin.closed:
        try:
            process.stdin.close()
        except OSError:
            pass
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
