"""What it costs to identify a TCP caller on this host when some user parks processes full of
descriptors (as found: 100 processes of 1,000 descriptors each, by uid 65534, made another
user's first /request take 0.6 s, and 8 at once 7-10 s). The cost is counted in descriptors
read (/metrics.json `caller_descriptors_read`); its time is the benchmark's (`identity`).
Real daemon, real processes of other uids, real /proc."""

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest
from helpers import ScenarioFile, ServerProcess, need_root, python_for

from patroller.identify.holders import HolderSearch, Search, candidates

NOBODY = 65534
PROCESSES, DESCRIPTORS = 100, 1000
PARKED = PROCESSES * DESCRIPTORS

PARKER = r"""
import os, resource, signal, socket, sys, time
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
print(" ".join(map(str, [os.getpid()] + children)), flush=True)
sys.stdin.read()  # until the test closes our stdin
for pid in children:
    os.kill(pid, signal.SIGKILL)
"""

# A client holding `extra` descriptors of its own connects, prints its pid, and when told asks
# for a GPU on that connection and prints the answer's status.
CLIENT = r"""
import http.client, os, sys
url, extra = sys.argv[1], int(sys.argv[2])
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(extra)]
host, port = url.split("//")[1].split(":")
connection = http.client.HTTPConnection(host, int(port), timeout=60)
connection.connect()
print(os.getpid(), flush=True)
sys.stdin.readline()
connection.request("GET", "/request?gpu=1")
answer = connection.getresponse()
print(answer.status, answer.read().decode())
"""

# A process holding `n` descriptors, then three connections to a port on loopback: it prints
# the inodes of its connections and waits for its stdin to close.
CALLERS = r"""
import os, resource, socket, sys
n, port = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 64), hard))
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(n)]
connections = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
print(" ".join(str(os.fstat(c.fileno()).st_ino) for c in connections), flush=True)
sys.stdin.read()
"""


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=20) as answer:
        return json.loads(answer.read())


class Parked:
    """uid 65534's 100 processes of 1,000 descriptors each, alive until stopped."""

    def __init__(self):
        self.parker = subprocess.Popen(
            [python_for(NOBODY), "-c", PARKER, str(PROCESSES), str(DESCRIPTORS)],
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pids = [int(pid) for pid in self.parker.stdout.readline().split()]
        assert len(self.pids) == PROCESSES
        assert all(len(os.listdir(f"/proc/{pid}/fd")) >= DESCRIPTORS for pid in self.pids)

    def stop(self):
        self.parker.stdin.close()
        self.parker.wait(timeout=30)


@pytest.fixture
def server(tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}])
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--lease",
        "300",
        env={"PATROLLER_STATE_DIR": str(tmp_path / "state")},
    ).start()
    yield server
    assert server.stop() == 0


class Client:
    """A client process of `uid`, connected, its request not yet sent."""

    def __init__(self, server, uid, extra):
        self.server = server
        self.process = subprocess.Popen(
            [python_for(uid), "-c", CLIENT, server.url, str(extra)],
            user=uid,
            group=uid,
            extra_groups=[],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = int(self.process.stdout.readline())

    def first_call(self):
        """(the answer's status, descriptors the daemon read to identify the caller)."""
        before = get(self.server.url, "/metrics.json")["caller_descriptors_read"]
        out, _ = self.process.communicate("go\n", timeout=120)
        assert self.process.returncode == 0
        read = get(self.server.url, "/metrics.json")["caller_descriptors_read"] - before
        return out.split()[0], read


def test_another_users_parked_descriptors_are_not_read(server):
    # As found, and harder: uid 65534 parks its descriptors after root's client has connected,
    # so its processes are the newest, and root's client holds more descriptors than any of
    # them; only the search's restriction to the socket's uid keeps them unread.
    need_root("the descriptors are parked by uid 65534")
    client = Client(server, 0, extra=DESCRIPTORS + 500)
    parked = Parked()
    try:
        answer, read = client.first_call()
    finally:
        parked.stop()
    assert answer == "200"
    assert read < PARKED / 10, f"{read} descriptors read to identify root's first call"


def test_a_new_caller_of_the_same_uid_is_found_before_the_parked_descriptors(server):
    # uid 65534's own client, started after them: the newest processes are read first.
    need_root("the descriptors are parked by uid 65534")
    for _ in range(3):  # the pids may wrap round between the parked and the client: again
        parked = Parked()
        client = Client(server, NOBODY, extra=0)
        if client.pid > max(parked.pids):
            break
        client.process.kill()
        client.process.wait()
        parked.stop()
    try:
        answer, read = client.first_call()
    finally:
        parked.stop()
    assert answer == "200"
    assert read < DESCRIPTORS, f"{read} descriptors read to identify the new client"


def test_the_search_stops_at_its_budget_and_names_nobody():
    # This process holds the socket, behind more descriptors than the budget lets be read.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(50)]  # newer than the socket
    inode = os.fstat(client.fileno()).st_ino
    try:
        whole = HolderSearch("/proc", budget=10**6, remembered=16, descriptors=1024).find(
            inode, os.geteuid(), [os.getpid()]
        )
        assert whole.pid == os.getpid() and not whole.exhausted and whole.read > 50
        cut = HolderSearch("/proc", budget=20, remembered=16, descriptors=1024).find(
            inode, os.geteuid(), [os.getpid()]
        )
        assert cut.pid is None and cut.exhausted and cut.read == 20
    finally:
        for fd in held:
            os.close(fd)
        client.close()
        server.close()


def test_sockets_seen_in_a_search_are_found_at_once_later():
    # Callers at once: a search reads the processes that turn out not to hold its socket, and
    # passes the others' sockets, which it then knows. Two processes of this uid, each with
    # 2,000 descriptors and then three connections: whichever the search reads second would be
    # found only after the other's 2,000 descriptors, were its sockets not known from before.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CALLERS, str(DESCRIPTORS * 2), str(server.getsockname()[1])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        inodes = {
            child.pid: [int(i) for i in child.stdout.readline().split()] for child in children
        }
        # Room for every socket of this uid on the machine (other root processes hold
        # thousands where other work runs), so that none of the children's is forgotten.
        search = HolderSearch("/proc", budget=10**6, remembered=10**6, descriptors=10**6)
        nowhere = search.find(1, os.geteuid())  # no process holds it: every one of ours is read
        assert nowhere.pid is None and nowhere.read >= 2 * DESCRIPTORS * 2
        second = [pid for pid in candidates(os.geteuid(), "/proc") if pid in inodes][-1]
        for inode in inodes[second]:
            found = search.find(inode, os.geteuid())
            assert found.pid == second
            assert found.read <= 3, f"{found.read} descriptors read: not known from before"
    finally:
        for child in children:
            child.kill()
            child.wait()
        server.close()


def test_candidates_are_the_uids_processes_newest_first():
    first = [1, os.getpid()]  # pid 1 is root's: first only when we are root
    mine = candidates(os.geteuid(), "/proc", first)
    ours = [pid for pid in first if os.stat(f"/proc/{pid}").st_uid == os.geteuid()]
    assert mine[: len(ours)] == ours
    rest = mine[len(ours) :]
    assert rest == sorted(rest, reverse=True) and os.getpid() not in rest
    assert all(
        os.stat(f"/proc/{pid}").st_uid == os.geteuid()
        for pid in rest
        if os.path.exists(f"/proc/{pid}")
    )
    assert not set(mine) & set(
        pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if not owned(pid)
    )


def owned(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except FileNotFoundError:
        return True  # gone meanwhile: whatever it was


def test_without_a_readable_proc_no_holder_is_named_and_the_reads_add_up(tmp_path):
    # A /proc (--proc-root) that cannot be listed names nobody and may hide the holder (the
    # socket's creator then stands, callers.py), at no cost; the descriptors read by each search
    # add up in `read`, as /metrics.json's `caller_descriptors_read` shows them.
    blind = HolderSearch(str(tmp_path / "no-proc"), budget=10**6, remembered=16, descriptors=1024)
    assert blind.find(1, os.geteuid()) == Search(None, True, 0, False) and blind.read == 0
    search = HolderSearch("/proc", budget=10**6, remembered=16, descriptors=1024)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    try:
        found = [
            search.find(os.fstat(client.fileno()).st_ino, os.geteuid(), [os.getpid()])
            for _ in range(2)
        ]
    finally:
        client.close()
        server.close()
    assert [f.pid for f in found] == [os.getpid()] * 2
    assert search.read == found[0].read + found[1].read > 2
