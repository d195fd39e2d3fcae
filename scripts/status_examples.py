"""Take the bodies that docs/command-line.md's `patroller status` examples are drawn from, from
live daemons, into tests/fixtures/status/, and print each example as the command line draws it
in 80 columns: paste them into the docs. tests/test_status_table.py draws each fixture again
and checks that the docs say exactly that.

    sudo .venv/bin/python scripts/status_examples.py [gpuhost] [testmode] [fleet]

Root: a process of `nobody` shares a GPU. Three scenes:
- gpuhost.json: a daemon on the simulator (4 A100s): GPU 0 reserved for a lease, GPU 1 claimed
  by its holder's process, GPU 2 reserved and shared with nobody's process, GPU 3 held for a
  `patroller run` that runs `sleep 30`;
- testmode.json: a test-mode daemon a few seconds after alice and bob reserved every GPU, carol
  and test-user (this command line, in test mode) waiting; with /whoami, for `--mine`;
- fleet.json: `--hosts` over two test-mode daemons (the first two GPUs of one, the first of the
  other, with alice's reservation), a stopped one (its real error and state) and one whose
  /status has `users` as a string (answers.check's real message); the addresses are renamed
  gpu1:8080... tests/test_status_table.py checks that a stopped host and a lying one answer
  so today.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from helpers import ScenarioFile, ServerProcess

from patroller import answers
from patroller.cli import fleet

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "status")
ENV = {**os.environ, "PYTHONPATH": ROOT}


def get(server: str, path: str) -> Any:
    try:
        with urllib.request.urlopen(f"http://{server}{path}", timeout=60) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return json.loads(error.read())


def until(what: str, test: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            raise SystemExit(f"status_examples: {what}: not seen within {timeout} s")
        time.sleep(0.1)


def bodies(server: str) -> dict[str, Any]:
    return {
        "status": get(server, "/status"),
        "devices": get(server, "/devices"),
        "queue": get(server, "/queue"),
        "users": get(server, "/users"),
    }


def save(name: str, scene: dict[str, Any]) -> None:
    os.makedirs(FIXTURES, exist_ok=True)
    with open(os.path.join(FIXTURES, name), "w", encoding="utf-8") as f:
        json.dump(scene, f, indent=1)
        f.write("\n")


def gpuhost() -> None:
    with tempfile.TemporaryDirectory() as folder:
        scenario = ScenarioFile(os.path.join(folder, "scenario.json"), devices=[{}] * 4)
        daemon = ServerProcess("--nvidia-smi", scenario.command, "--lease", "300").start()
        mine = subprocess.Popen(["sleep", "600"])
        theirs = subprocess.Popen(["sleep", "600"], preexec_fn=lambda: os.setuid(65534))
        run = None
        try:
            server = daemon.server
            claim = lambda n: get(server, "/status")[uuid(server, n)]["claim"]
            scenario.write(
                processes=[
                    {"pid": mine.pid, "gpu": 1, "name": "python", "used_mib": 30000, "sm": 93}
                ]
            )
            until("GPU 1 claimed", lambda: claim(1)["state"] == "claimed")
            assert [d["info"]["number"] for d in get(server, "/request?gpu=2")] == [0, 2]
            scenario.write(
                processes=[
                    {"pid": mine.pid, "gpu": 1, "name": "python", "used_mib": 30000, "sm": 93},
                    {"pid": theirs.pid, "gpu": 2, "name": "python3", "used_mib": 2048, "sm": 12},
                ]
            )
            until("GPU 2 shared", lambda: claim(2)["state"] == "shared")
            run = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "patroller.cli",
                    "run",
                    "-q",
                    "--server",
                    server,
                    "--",
                    "sleep",
                    "30",
                ],
                env=ENV,
            )
            until("GPU 3 held for the run", lambda: claim(3)["held_for_pid"] == run.pid)
            until(
                "every figure sampled",
                lambda: all(
                    p.get("fb") is not None for n in (1, 2) for p in claim(n)["process_detail"]
                ),
            )
            time.sleep(5)  # the lease counts down a little, the claim ages
            save("gpuhost.json", {"command": "patroller status", **bodies(server)})
        finally:
            for process in (mine, theirs, run):
                if process is not None:
                    process.kill()
                    process.wait()
            daemon.stop()


def uuid(server: str, number: int) -> str:
    return next(u for u, info in get(server, "/devices").items() if info["number"] == number)


def testmode() -> None:
    daemon = ServerProcess("--test", "--lease", "10").start()
    waiters: list[threading.Thread] = []
    try:
        server = daemon.server
        get(server, "/request?gpu=2&user=alice@example.org")
        get(server, "/request?gpu=1&user=bob")
        time.sleep(4)
        get(server, "/request?gpu=5&user=alice@example.org")
        for path in ("/wait?gpu=1&user=carol&timeout=60", "/wait?gpu=2&timeout=60&hold=process"):
            waiters.append(threading.Thread(target=get, args=(server, path)))
            waiters[-1].start()
            time.sleep(0.5)
        until("two waiting", lambda: len(get(server, "/queue")) == 2)
        time.sleep(2)
        save(
            "testmode.json",
            {"command": "patroller status", "whoami": get(server, "/whoami"), **bodies(server)},
        )
    finally:
        daemon.stop()
        for waiter in waiters:
            waiter.join()


def fleet_scene() -> None:
    up = [ServerProcess("--test", "--lease", "300").start() for _ in range(3)]
    stopped = up.pop()
    stopped.stop()
    try:
        get(up[0].server, "/request?gpu=1&user=alice@example.org")
        time.sleep(3)
        names = {
            up[0].server: "gpu1:8080",
            stopped.server: "gpu2:8080",
            up[1].server: "gpu3:8080",
            "liar": "gpu4:8080",
        }
        hosts = []
        for answer in fleet.ask_all([up[0].server, stopped.server, up[1].server], 10):
            host = {
                "host": names[answer.host],
                "status": answer.status,
                "devices": answer.devices,
                "state": answer.shown_state(),
                "error": answer.error and answer.error.replace(answer.host, names[answer.host]),
            }
            keep = 2 if answer.host == up[0].server else 1  # a short example
            if answer.devices is not None:
                host["devices"] = dict(list(answer.devices.items())[:keep])
                host["status"] = {u: answer.status[u] for u in host["devices"]}
            hosts.append(host)
        lying = json.loads(json.dumps(hosts[2]["status"]))
        first = next(iter(lying))
        lying[first]["claim"]["users"] = "alice"
        try:
            answers.check(lying, hosts[2]["devices"], fleet.HOST_MAX_GPUS)
        except answers.BadAnswer as exc:
            hosts.append(
                {
                    "host": "gpu4:8080",
                    "status": None,
                    "devices": None,
                    "state": fleet.DOWN,
                    "error": fleet.said(f"bad answer: {exc}"),
                }
            )
        save(
            "fleet.json",
            {
                "command": "patroller status --hosts gpu1:8080,gpu2:8080,gpu3:8080,gpu4:8080",
                "hosts": hosts,
            },
        )
    finally:
        for server in up:
            server.stop()


SCENES = {"gpuhost": gpuhost, "testmode": testmode, "fleet": fleet_scene}


def main() -> None:
    """Take the scenes named on the command line (gpuhost, testmode, fleet; default: all),
    then print every example."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from test_status_table import drawn, scenes

    for name in sys.argv[1:] or list(SCENES):
        SCENES[name]()
    for name, scene in scenes().items():
        for command, text in drawn(scene):
            print(f"--- {name}\n$ {command}\n{text}", end="")


if __name__ == "__main__":
    main()
