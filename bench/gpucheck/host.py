"""What the GPU check needs of the host: throwaway users (useradd, userdel), a Python each may
run, the daemon as a child, its /status, and the captures of nvidia-smi's answers."""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERIAL = re.compile(r"<serial>[^<]*</serial>")


class CheckFailed(Exception):
    """A step cannot go on; the message says why, in one line."""


# -- users ----------------------------------------------------------------------------------


class User:
    """A throwaway account (useradd), removed with everything it runs."""

    def __init__(self, role: str) -> None:
        self.uid = _unused_uid(61000 + secrets.randbelow(3000))
        self.name = f"gpuck{self.uid}{role}"
        made = subprocess.run(
            [
                "useradd",
                "--uid",
                str(self.uid),
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                self.name,
            ],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise CheckFailed(f"useradd {self.name}: {made.stderr.strip()}")
        self.gid = pwd.getpwnam(self.name).pw_gid

    def who(self) -> dict[str, Any]:
        """subprocess arguments that run a command as this user."""
        return dict(user=self.uid, group=self.gid, extra_groups=[])

    def remove(self) -> None:
        for pid in pids_of(self.uid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while pids_of(self.uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run(["userdel", self.name], capture_output=True)


def _unused_uid(start: int) -> int:
    uid = start
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def pids_of(uid: int) -> list[int]:
    """Live processes whose real uid is `uid`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("Uid:") and int(line.split()[1]) == uid:
                        found.append(int(name))
                        break
        except OSError:
            continue
    return found


def python_for(user: User, candidates: Sequence[str]) -> str:
    """The first Python of `candidates` that `user` may run."""
    for candidate in candidates:
        if not candidate:
            continue
        try:
            done = subprocess.run(
                [candidate, "-c", "import ctypes, json"],
                capture_output=True,
                timeout=60,
                cwd="/",
                **user.who(),
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return candidate
    raise CheckFailed(f"no Python that {user.name} may run among {', '.join(candidates)}")


# -- the daemon -----------------------------------------------------------------------------


class Daemon:
    """`python -m patroller` on a loopback port of its choosing, its log in a file."""

    def __init__(self, flags: Sequence[str], log: str) -> None:
        self.url = ""
        self.path = log
        self.log = open(log, "w")  # noqa: SIM115 (closed when the child is stopped)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "patroller", "--port", "0", "--address", "127.0.0.1", *flags],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
        )

    def wait_ready(self, timeout: float) -> None:
        """Until it says where it serves (discovery may take a while on a large host)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                found = re.search(r" on (http://127\.0\.0\.1:\d+)", f.read())
            if found:
                self.url = found.group(1)
                return
            if self.process.poll() is not None:
                raise CheckFailed(
                    f"patroller exited with status {self.process.returncode}: see daemon.log"
                )
            time.sleep(0.05)
        raise CheckFailed(f"patroller did not start serving in {timeout:g} s: see daemon.log")

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/status", timeout=5) as answer:
            return json.loads(answer.read())

    def devices(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/devices", timeout=5) as answer:
            return json.loads(answer.read())

    def release(self, uuid: str) -> dict[str, Any]:
        """Give back a GPU whoever holds it (we are the host's root, as the kernel says); {}
        when nobody held it (409)."""
        request = urllib.request.Request(
            f"{self.url}/release?uuid={uuid}&reason=gpucheck", data=b"", method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                return {}
            raise

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return self.process.returncode


# -- captures -------------------------------------------------------------------------------


def run(
    argv: Sequence[str], timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """(status, stdout, stderr) of a command; status 127 when it cannot be started."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return 124, out, f"no answer in {timeout:g} s"
    return done.returncode, done.stdout, done.stderr


def anonymised(xml: str) -> str:
    """The -q -x document with every serial number zeroed (nothing else is changed)."""
    return SERIAL.sub("<serial>0000000000000</serial>", xml)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "unknown"


def capture(nvidia_smi: str, folder: str, seconds: int) -> dict[str, Any]:
    """nvidia-smi -q -x (serials zeroed), -L, and `seconds` samples of dmon -s pucvmet and of
    pmon -s um, written to `folder` as <driver>-<gpu>-<what>: the driver, the GPU, the files
    by what they hold (q-x, L, dmon, pmon) and each command's exit status."""
    argv = shlex.split(nvidia_smi)
    status, xml, said = run([*argv, "-q", "-x"], 120)
    if status != 0:
        raise CheckFailed(f"nvidia-smi -q -x failed with status {status}: {said or xml}"[:300])
    driver = re.search(r"<driver_version>([^<]+)</driver_version>", xml)
    name = re.search(r"<product_name>([^<]+)</product_name>", xml)
    stem = (
        f"{slug(driver.group(1) if driver else 'unknown')}-"
        f"{slug(name.group(1) if name else 'unknown')}"
    )
    env = {**os.environ, "NVSMI_SHOW_ALL_DEVICES": "1"}
    streams = {
        what: subprocess.Popen(
            [*argv, kind, "-s", select, "-c", str(seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for what, kind, select in (("dmon-pucvmet", "dmon", "pucvmet"), ("pmon-um", "pmon", "um"))
    }
    listed = run([*argv, "-L"], 60)
    files = {"q-x": anonymised(xml), "L": listed[1]}
    statuses = {"-q -x": status, "-L": listed[0]}
    for what, process in streams.items():
        try:
            out, err = process.communicate(timeout=seconds * 3 + 60)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        files[what.split("-")[0]] = out
        statuses[what.split("-")[0]] = process.returncode
    names = {"q-x": "q-x.xml", "L": "L.txt", "dmon": "dmon-pucvmet.txt", "pmon": "pmon-um.txt"}
    written = {}
    for what, text in files.items():
        written[what] = f"{stem}-{names[what]}"
        with open(os.path.join(folder, written[what]), "w", encoding="utf-8") as f:
            f.write(text)
    return {
        "driver": driver.group(1) if driver else None,
        "gpu": name.group(1) if name else None,
        "files": written,
        "statuses": statuses,
    }


def copy_client(folder: str) -> str:
    """A folder holding the client (one file, standard library only) and the worker, for
    the throwaway users' Pythons (they may not read the checkout)."""
    lib = os.path.join(folder, "lib")
    os.makedirs(lib, mode=0o755, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "patroller", "client.py"), os.path.join(lib, "client.py"))
    shutil.copy(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py"),
        os.path.join(lib, "worker.py"),
    )
    for name in os.listdir(lib):
        os.chmod(os.path.join(lib, name), 0o644)
    return lib
