"""nvidia-smi's children are started while gRPC runs (containerd's and the kubelet's clients):
none may die before it execs. As found: `-q -x` died of signal 6 in a loaded test run, gRPC's
poller, restarted in the forked child by its fork support, aborting on the descriptors the child
closes before exec (7 of 200 such children with grpcio 1.85). A fresh interpreter each time, so
that gRPC is imported as the daemon imports it."""

import subprocess
import sys

from helpers import ROOT

SPAWN = r"""
import asyncio, sys
from patroller.observe import grpcunix
from patroller.observe.child import Child

assert grpcunix.installed()  # gRPC imported the daemon's way
import grpc

channel = grpc.insecure_channel("unix:" + sys.argv[1])  # kept open: its poller runs
try:
    channel.unary_unary("/runtime.v1.Nothing/Here")(b"", timeout=0.2)
except grpc.RpcError:
    pass

async def main():
    died = []
    for _ in range(int(sys.argv[2])):
        child = await Child.start(["true"], None, 4096)
        code = await child.exited(30)
        if code != 0:
            died.append((code, child.said()[:200]))
    print(len(died), died[:1])

asyncio.run(main())
channel.close()
"""


def test_children_started_while_grpc_runs_all_reach_exec(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SPAWN, str(tmp_path / "nobody.sock"), "400"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("0 "), done.stdout
