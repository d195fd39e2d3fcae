"""A daemon at its open-file limit: it keeps serving, stays quiet and idle, and recovers.

The daemon runs as a real process limited to 64 descriptors (RLIMIT_NOFILE); the test opens
connections until it cannot accept more. Found on the first version: accept() failed with EMFILE
in a loop, 100% CPU and 358 MB of log a minute.
"""
import os
import resource
import select
import socket
import time
from typing import List

from helpers import ServerProcess

LIMIT = 64  # descriptors the daemon may hold: a test-mode daemon needs about 10 of them
FLOOD = 100  # connections opened: more than it can accept, fewer than the listen backlog (128)
HOLD = 3.0  # seconds the daemon is held at its limit while it is watched
REQUEST = b"GET /devices HTTP/1.1\r\nHost: patroller\r\n\r\n"


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def answered(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """The start of the answer to one request on a keep-alive connection."""
    sock.settimeout(timeout)
    sock.sendall(REQUEST)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the connection was closed"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    return head


def connect(server: ServerProcess) -> socket.socket:
    host, port = server.server.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_at_the_open_file_limit_it_serves_open_connections_quietly_and_recovers():
    server = ServerProcess("--test", preexec_fn=limited).start()
    flood: List[socket.socket] = []
    try:
        pid = server.process.pid
        keep = connect(server)
        assert answered(keep).startswith(b"HTTP/1.1 200")
        for _ in range(FLOOD):
            sock = connect(server)
            sock.sendall(REQUEST)
            flood.append(sock)
        time.sleep(1)  # what it can accept, it answers at once
        ready, _, _ = select.select(flood, [], [], 0)
        assert 0 < len(ready) < FLOOD, "the flood did not reach the daemon's limit"

        lines, cpu, wall = len(server.log.splitlines()), cpu_seconds(pid), time.monotonic()
        for _ in range(int(HOLD)):
            assert answered(keep).startswith(b"HTTP/1.1 200")  # the open connection is served
            time.sleep(1)
        cpu, wall = cpu_seconds(pid) - cpu, time.monotonic() - wall
        grew = len(server.log.splitlines()) - lines
        print(f"at the limit for {wall:.1f} s: CPU {cpu:.2f} s ({100 * cpu / wall:.0f}% of one "
              f"core), {grew} log lines")
        # A bound on a spin, not a speed: the daemon idles at under 1% of a core here.
        assert cpu < 0.2 * wall, f"{cpu:.2f} s of CPU in {wall:.1f} s: accept() is retried in a loop"
        assert grew <= 3, server.log[-3000:]  # one line a minute at most, not one per retry
        assert "cannot accept connections: Too many open files" in server.log

        for sock in flood:
            sock.close()
        flood.clear()
        fresh = connect(server)
        assert answered(fresh).startswith(b"HTTP/1.1 200")
        wait_for(lambda: "accepting connections again" in server.log)
        assert "Traceback" not in server.log and " ERROR " not in server.log, server.log[-3000:]
        keep.close()
        fresh.close()
    finally:
        for sock in flood:
            sock.close()
        assert server.stop() == 0
