"""What a TCP caller's first call costs while another user parks descriptors: uid 65534 holds
100 processes of 1,000 descriptors each, and fresh client processes (each a first call, on a
new connection) time /request from connect to answer: alone, eight at once, and of the same
uid as the parked ones. Needs root (the descriptors are parked by another uid)."""

from __future__ import annotations

import os
import statistics
import subprocess
from collections.abc import Callable
from typing import Any

from .harness import Daemon

NOBODY = 65534
PROCESSES, DESCRIPTORS = 100, 1000
CLIENT_PYTHON = "/usr/bin/python3"  # stdlib only; one every uid may run

PARKER = r"""
import os, resource, signal, socket, sys
processes, descriptors = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, descriptors + 64), hard))
held = [end for _ in range(descriptors // 2) for end in socket.socketpair()]
children = []
for _ in range(processes - 1):
    pid = os.fork()
    if pid == 0:
        signal.pause()
        os._exit(0)
    children.append(pid)
print(len(children) + 1, flush=True)
sys.stdin.read()
for pid in children:
    os.kill(pid, signal.SIGKILL)
"""

CLIENT = r"""
import http.client, json, sys, time
port = int(sys.argv[1])
sys.stdin.readline()  # go
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
began = time.perf_counter()
connection.request("GET", "/request?gpu=1")
answer = connection.getresponse()
body = answer.read()
took = time.perf_counter() - began
if answer.status == 200:
    connection.request("GET", "/release?uuid=" + json.loads(body)[0]["uuid"])
    connection.getresponse().read()
print(answer.status, took * 1000)
"""


def _clients(port: int, uid: int, count: int) -> list[float]:
    """Milliseconds each of `count` fresh clients of `uid`, let go together, took."""
    started = [
        subprocess.Popen(
            [CLIENT_PYTHON, "-c", CLIENT, str(port)],
            user=uid,
            group=uid,
            extra_groups=[],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    for client in started:
        client.stdin.write("go\n")
        client.stdin.flush()
    took = []
    for client in started:
        out, _ = client.communicate(timeout=300)
        status, ms = out.split()
        if status != "200":
            raise RuntimeError(f"a client of uid {uid} got {status}")
        took.append(float(ms))
    return took


def _firsts(port: int, uid: int, repeats: int) -> dict[str, float]:
    samples = [_clients(port, uid, 1)[0] for _ in range(repeats)]
    return {"median_ms": round(statistics.median(samples), 1), "max_ms": round(max(samples), 1)}


def _at_once(port: int, uid: int, rounds: int) -> dict[str, float]:
    samples = [ms for _ in range(rounds) for ms in _clients(port, uid, 8)]
    return {"median_ms": round(statistics.median(samples), 1), "max_ms": round(max(samples), 1)}


def first_calls(repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    """First calls' times with no descriptors parked, then with 100,000 parked by uid 65534."""
    if os.geteuid() != 0:
        return {"skipped": "needs root: the descriptors are parked by uid 65534"}
    daemon = Daemon(8, interval=1.0).start()
    parker: subprocess.Popen | None = None
    try:
        result: dict[str, Any] = {
            "parked_descriptors": PROCESSES * DESCRIPTORS,
            "alone": _firsts(daemon.port, 0, repeats),
        }
        parker = subprocess.Popen(
            [CLIENT_PYTHON, "-c", PARKER, str(PROCESSES), str(DESCRIPTORS)],
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if int(parker.stdout.readline()) != PROCESSES:
            raise RuntimeError("the parked processes did not start")
        result["another_uid"] = _firsts(daemon.port, 0, repeats)
        result["another_uid_8_at_once"] = _at_once(daemon.port, 0, max(1, repeats // 4))
        result["same_uid"] = _firsts(daemon.port, NOBODY, repeats)
        result["descriptors_read"] = daemon.ok("/metrics.json").get("caller_descriptors_read")
    finally:
        if parker is not None:
            parker.stdin.close()
            parker.wait(timeout=60)
        daemon.stop()
    log(f"callers: {result}")
    return result
