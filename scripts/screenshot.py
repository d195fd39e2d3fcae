"""Take docs/screenshot.png: the web page of a daemon on the simulator with a realistic scene.

    sudo .venv/bin/python scripts/screenshot.py [--out docs/screenshot.png] [--settle 240]

Eight simulated H100s (NVLink between all of them) and a private Docker Engine
(tests/dockerd.py: root, docker.io and busybox-static, as tests/setup.sh installs them) whose
labelled containers are the users: real `sleep` processes in those containers stand for their
training jobs on the GPUs, and requests come from host processes moved into a container's
cgroups, so the daemon identifies each user as it would on a real host. The scene: reservations
claimed by their owner's processes, a GPU shared with another user's process, a reservation for
a duration going idle, one held for a process, a lease counting down, a request waiting for
four GPUs, and free GPUs. The page is opened in headless Chromium (tests/browser.py) at
1400x1000 once the first snapshot is drawn and the scene has settled.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
sys.path[:0] = [ROOT, TESTS]

from browser import Browser
from dockerd import Container, Engine
from helpers import ScenarioFile, ServerProcess

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
USERS = {  # container labels: who, and their team
    "alice": {"user.email": "alice@example.org", "team": "vision"},
    "bob": {"user.email": "bob@example.org", "team": "speech"},
    "carol": {"user.email": "carol@example.org", "team": "vision"},
    "dave": {"user.email": "dave@example.org", "team": "nlp"},
    "erin": {"user.email": "erin@example.org", "team": "nlp"},
    "frank": {"user.email": "frank@example.org", "team": "speech"},
    "grace": {"user.email": "grace@example.org", "team": "robotics"},
}


def client(container: Container, url: str, path: str, stay: bool = False) -> subprocess.Popen:
    """A host process moved into `container`'s cgroups that asks `url + path` (and, with
    `stay`, lives on afterwards: a process a reservation is held for, or a waiter)."""
    code = (
        "import os, sys, time, urllib.request\n"
        f"sys.path[:0] = [{ROOT!r}, {TESTS!r}]\n"
        "from dockerd import Container\n"
        f"Container.adopt_pid({container.pid}, os.getpid())\n"
        f"print(urllib.request.urlopen({url + path!r}, timeout=600).read().decode(), flush=True)\n"
        + ("time.sleep(3600)\n" if stay else "")
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def asked(container: Container, url: str, path: str) -> str:
    process = client(container, url, path)
    out, _ = process.communicate(timeout=60)
    if process.returncode != 0 or '"uuid"' not in out:
        raise RuntimeError(f"{path}: {out}")
    return out


def scene(jobs: dict[str, list[int]], step: int) -> list[dict[str, Any]]:
    """The processes on the GPUs, their load wandering a little at each step."""
    wobble = random.Random(step)
    return [
        {
            "pid": jobs["alice"][0],
            "gpu": 0,
            "name": "python",
            "used_mib": 61440,
            "sm": 88 + wobble.randint(0, 10),
            "mem": 41,
        },
        {
            "pid": jobs["alice"][1],
            "gpu": 1,
            "name": "python",
            "used_mib": 60928,
            "sm": 84 + wobble.randint(0, 12),
            "mem": 39,
        },
        {
            "pid": jobs["carol"][0],
            "gpu": 3,
            "name": "torchrun",
            "used_mib": 40960,
            "sm": 55 + wobble.randint(0, 20),
            "mem": 30,
        },
        {
            "pid": jobs["dave"][0],
            "gpu": 3,
            "name": "jupyter-kernel",
            "used_mib": 12288,
            "sm": 10 + wobble.randint(0, 15),
            "mem": 6,
        },
        {
            "pid": jobs["erin"][0],
            "gpu": 4,
            "name": "vllm",
            "used_mib": 71680,
            "sm": 30 + wobble.randint(0, 40) * (step % 3 != 0),
            "mem": 22,
        },
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "screenshot.png"))
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--dark", action="store_true", help="as a system in dark mode sees it")
    parser.add_argument(
        "--settle",
        type=float,
        default=240,
        help="seconds of load before the picture (points on the sparklines)",
    )
    args = parser.parse_args()

    engine = Engine().start()
    directory = tempfile.TemporaryDirectory(prefix="patroller-screenshot-")
    server = None
    helpers: list[subprocess.Popen] = []
    page = None
    try:
        containers = {name: engine.run(labels=labels) for name, labels in USERS.items()}
        jobs = {
            "alice": [containers["alice"].pid, containers["alice"].exec_pid()],
            "carol": [containers["carol"].pid],
            "dave": [containers["dave"].pid],
            "erin": [containers["erin"].pid],
        }
        scenario = ScenarioFile(
            os.path.join(directory.name, "scenario.json"),
            interval=1,
            devices=[dict(H100, minor=n) for n in range(8)],
            processes=[],
            topology="nvlink-all",
        )
        server = ServerProcess(
            "--nvidia-smi",
            scenario.command,
            "--docker-host",
            engine.url,
            "--user-info-labels",
            "team",
            "--lease",
            str(args.settle + 600),
            "--idle-after",
            "20",
        ).start()
        url = server.url
        # alice asked for two GPUs and trains on them; carol for one, which dave's notebook
        # shares without asking; bob holds one for 8 h and does nothing with it; erin's GPU is
        # held for her process; frank's lease runs out in ten minutes unless his job starts.
        asked(containers["alice"], url, "/request?gpu=2")
        asked(containers["bob"], url, "/request?gpu=1&hold=8h")
        asked(containers["carol"], url, "/request?gpu=1")
        erin = client(containers["erin"], url, "/request?gpu=1&hold=process", stay=True)
        helpers.append(erin)
        erin.stdout.readline()
        asked(containers["frank"], url, "/request?gpu=1")
        step = 0
        scenario.write(processes=scene(jobs, step))
        # grace needs four GPUs at once: she waits.
        helpers.append(client(containers["grace"], url, "/wait?gpu=4", stay=True))

        page = Browser(width=args.width, height=args.height)
        page.color_scheme("dark" if args.dark else "light")
        page.open(url + "/")
        page.until(
            lambda: page.js("return document.body.dataset.rendered === '1'"),
            "the first snapshot drawn",
            timeout=30,
        )
        deadline = time.monotonic() + args.settle
        while time.monotonic() < deadline:
            time.sleep(5)
            step += 1
            scenario.write(processes=scene(jobs, step))
        page.until(
            lambda: page.js("return document.querySelectorAll('#queue li').length") == 1,
            "grace in the queue",
            timeout=30,
        )
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        page.screenshot(args.out)
        print(f"{args.out}: {os.path.getsize(args.out)} bytes")
    finally:
        if page is not None:
            page.quit()
        for process in helpers:
            process.kill()
            process.wait()
        if server is not None:
            server.stop()
        engine.stop()
        directory.cleanup()


if __name__ == "__main__":
    main()
