"""What the search for a TCP caller's process remembers (holders.py): where it saw each socket,
and which descriptors it read. Memory only orders the reads: a descriptor handed to another
process, closed, or its number taken by another file, and a pid that another process took, are
read again and never name the process that was there. And what it saves: one client holding
hundreds of connections costs a few descriptors read per identification, not hundreds.
Real daemon on the simulator, real client processes (of root and of uid 65534), real /proc."""

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest
from helpers import ScenarioFile, ServerProcess, need_root, python_for, reuse_pid

from patroller.identify.holders import HolderSearch

NOBODY = 65534

# A client driven by its stdin, one command a line, one JSON answer a line:
#   connect NAME          a TCP connection to the daemon, kept as NAME: its descriptor
#   ask NAME PATH         GET PATH on it: [status, body]
#   burst PATH NAME...    GET PATH on each at once, then read every answer: their statuses
#   end NAME              close it, once the daemon has closed its end: its descriptor
#   listen PATH           a unix socket to receive a descriptor on
#   give NAME PATH        send NAME's descriptor to the process listening at PATH, close ours
#   take NAME             receive a descriptor on the socket listened on, keep it as NAME
#   open                  a file (/dev/null) at the lowest free descriptor: its number
#   files N               N more files: how many descriptors it holds
#   fork                  a child holding every descriptor, driven by the same stdin from now
#                         on; the parent closes its connections and waits: the child's pid
#   pid                   its pid
ACTOR = r"""
import json, os, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
kept, listener = {}, None

def say(value):
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()

def send(sock, path):
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())

def ask(sock, path):
    send(sock, path)
    return answer(sock)

def answer(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    length = int([l for l in lines if l.lower().startswith("content-length")][0].split(":")[1])
    while len(body) < length:
        body += sock.recv(65536)
    return [int(lines[0].split()[1]), json.loads(body)]

for line in sys.stdin:
    command, *args = line.split()
    if command == "connect":
        kept[args[0]] = socket.create_connection((host, port))
        say(kept[args[0]].fileno())
    elif command == "ask":
        say(ask(kept[args[0]], args[1]))
    elif command == "burst":
        for name in args[1:]:
            send(kept[name], args[0])
        say([answer(kept[name])[0] for name in args[1:]])
    elif command == "end":
        sock = kept.pop(args[0])
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
        say(sock.fileno())
        sock.close()
    elif command == "listen":
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(args[0])
        listener.listen(1)
        say(True)
    elif command == "give":
        with socket.socket(socket.AF_UNIX) as link:
            link.connect(args[1])
            socket.send_fds(link, [b"x"], [kept[args[0]].fileno()])  # in flight till taken
        kept.pop(args[0]).close()
        say(True)
    elif command == "take":
        link, _ = listener.accept()
        _, fds, _, _ = socket.recv_fds(link, 1, 1)
        link.close()
        kept[args[0]] = socket.socket(fileno=fds[0])
        say(fds[0])
    elif command == "open":
        say(os.open("/dev/null", os.O_RDONLY))
    elif command == "files":
        opened = [os.open("/dev/null", os.O_RDONLY) for _ in range(int(args[0]))]
        say(len(os.listdir("/proc/self/fd")))
    elif command == "fork":
        child = os.fork()
        if child:
            for sock in kept.values():
                sock.close()
            say(child)
            os.waitpid(child, 0)
            os._exit(0)
    elif command == "pid":
        say(os.getpid())
"""


class Actor:
    """One client process of `uid` (None: the test's own), driven line by line."""

    def __init__(self, server, uid=None):
        host, port = server.server.rsplit(":", 1)
        other = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        self.process = subprocess.Popen(
            [sys.executable if uid is None else python_for(uid), "-c", ACTOR, host, port],
            **other,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.process.pid

    def __call__(self, *command):
        self.process.stdin.write(" ".join(map(str, command)) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the client died at {command}"
        return json.loads(line)

    def stop(self):
        self.process.kill()
        self.process.wait()


@pytest.fixture
def server(tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}] * 4)
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--lease",
        "300",
        "--max-connections-per-caller",
        "10000",
        env={"PATROLLER_STATE_DIR": str(tmp_path / "state")},
    ).start()
    yield server
    assert server.stop() == 0


@pytest.fixture
def actors(server):
    started = []

    def start(uid=None):  # None: the test's own
        started.append(Actor(server, uid))
        return started[-1]

    yield start
    for actor in started:
        actor.stop()


def holder_of(actor, name):
    """The pid the daemon takes for the process calling on connection `name`, by a process
    hold (let go at once), or the refusal's status."""
    status, body = actor("ask", name, "/request?gpu=1&hold=process")
    if status != 200:
        return status
    actor("ask", name, f"/release?uuid={body[0]['uuid']}")
    return body[0]["held_for_pid"]


def handed_on(giver, taker, link):
    """The giver connects twice and is named on the first (its descriptors read, newest first:
    the second's socket is remembered where it is); then it hands the second to the taker over
    a unix socket at `link` (SCM_RIGHTS) and closes its own. The descriptor number it freed."""
    giver("connect", "first")
    handed = giver("connect", "second")
    assert holder_of(giver, "first") == giver.pid
    taker("listen", link)
    giver("give", "second", link)
    taker("take", "second")
    return handed


def read_so_far(server):
    with urllib.request.urlopen(server.url + "/metrics.json", timeout=20) as answer:
        return json.loads(answer.read())["caller_descriptors_read"]


def test_a_socket_handed_on_after_it_was_seen_names_its_new_holder(server, actors, tmp_path):
    # The first call reads the client's descriptors, newest first: the second connection's
    # socket is passed and remembered at its descriptor. Then it is handed to another
    # process (SCM_RIGHTS), closed here, and its number taken by a file: the remembered place
    # now holds something else, and the new holder is the one found.
    giver, taker = actors(), actors()
    handed = handed_on(giver, taker, str(tmp_path / "link"))
    assert giver("open") == handed  # the remembered descriptor is a file now
    assert holder_of(taker, "second") == taker.pid


def test_a_socket_whose_holder_ended_and_whose_pid_was_taken_names_its_new_holder(
    server, actors, tmp_path
):
    # As above, and the process that held it ends; another takes its pid and opens files at
    # the remembered descriptor numbers: only the one that holds the socket now is named.
    giver, taker = actors(), actors()
    handed = handed_on(giver, taker, str(tmp_path / "link"))
    giver.stop()
    newcomer = reuse_pid(giver.pid)
    if newcomer is None:
        pytest.skip("the kernel did not hand out the same pid again (ns_last_pid not writable)")
    try:
        # sleep's descriptors: 0-2 and none at `handed`; the number is read as nothing there
        assert not os.path.exists(f"/proc/{giver.pid}/fd/{handed}")
        assert holder_of(taker, "second") == taker.pid
    finally:
        newcomer.kill()
        newcomer.wait()


def test_a_forked_child_left_holding_the_socket_is_its_holder(server, actors):
    # fork: the child holds every descriptor its parent held, the remembered ones too; the
    # parent closes its copies (and lives on): the remembered places hold nothing now.
    parent = actors()
    parent("connect", "first")
    parent("connect", "second")
    assert holder_of(parent, "first") == parent.pid
    child = parent("fork")  # from now on the child answers
    assert child != parent.pid and parent("pid") == child
    assert holder_of(parent, "second") == child  # ("first" keeps its caller: one a connection)


def test_one_client_holding_hundreds_of_connections_costs_a_few_reads_each(server, actors):
    # Opened at once and asked oldest first: without memory each would be found only after
    # every newer connection's descriptor (about 11,000 reads for 150). Then as many more,
    # asked newest first: each would be found after the ones asked before it, were those not
    # known to be read already. Then new ones, one at a time. Each identification reads its
    # socket's descriptor once more, as its process's facts are read.
    need_root("the client runs as uid 65534, alone among its processes")
    client = actors(NOBODY)
    count = 150

    def asked(names):
        before = read_so_far(server)
        for name in names:
            assert client("ask", name, "/whoami")[0] == 200
        return read_so_far(server) - before

    for n in range(count):
        client("connect", n)
    oldest_first = asked(range(count))  # the first reads them all, then one read each
    assert oldest_first <= count + 20 + 2 * count, oldest_first
    for n in range(count, 2 * count):
        client("connect", n)
    newest_first = asked(reversed(range(count, 2 * count)))
    assert newest_first <= 3 * count, newest_first
    each = []
    for n in range(2 * count, 2 * count + 20):
        client("connect", n)
        each.append(asked([n]))
    assert max(each) <= 3, each
    # Asked all at once, with newer files than them not read yet: searched for side by side,
    # they would each read the same descriptors, were the searches of one uid not made one at
    # a time.
    names = range(2 * count + 20, 3 * count + 20)
    for n in names:
        client("connect", n)
    files = 400
    assert client("files", files) < 1000  # within the usual limit of 1,024
    before = read_so_far(server)
    assert client("burst", "/whoami", *names) == [200] * count
    at_once = read_so_far(server) - before
    assert at_once <= files + 3 * count, at_once  # the first: the files, them; then two each


def test_a_client_that_connects_again_in_place_of_an_ended_connection_costs_a_few_reads(
    server, actors
):
    # Long polls answered one by one, each followed by a new one: the new connection gets the
    # descriptor number of the one that ended (the lowest free), which was read before as
    # that one's socket. Were the ended connection's place not forgotten as it closed, each
    # would be found only after the client's other, already read, descriptors.
    need_root("the client runs as uid 65534, alone among its processes")
    client = actors(NOBODY)
    count = 150
    for n in range(count):
        client("connect", n)
    assert client("burst", "/whoami", *range(count)) == [200] * count
    each = []
    for n in range(count - 2, count // 2, -7):  # none of them the newest
        freed = client("end", n)
        assert client("connect", f"again{n}") == freed  # its number, as the kernel gives them
        before = read_so_far(server)
        assert client("ask", f"again{n}", "/whoami")[0] == 200
        each.append(read_so_far(server) - before)
    assert max(each) <= 3, each


def test_a_remembered_socket_is_not_named_for_another_uid():
    # This process's socket, remembered: asked for as uid 65534's, it is nobody's here.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    inode = os.fstat(client.fileno()).st_ino
    search = HolderSearch("/proc", budget=10**6, remembered=16, descriptors=10**5)
    try:
        assert search.find(inode, os.geteuid(), [os.getpid()]).pid == os.getpid()
        assert search.find(inode, os.geteuid()).read == 1  # remembered: one read
        if os.geteuid() != NOBODY:
            assert search.find(inode, NOBODY).pid is None
        assert search.holds(os.getpid(), inode)
    finally:
        client.close()
        listener.close()
    assert not search.holds(os.getpid(), inode)
