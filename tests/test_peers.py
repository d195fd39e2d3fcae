"""The owner of a local TCP connection, from sock_diag, /proc/net/tcp{,6} and /proc/<pid>/fd."""

import os
import socket
import subprocess
import time

import pytest
from helpers import async_test, need_root, python_for
from tornado.iostream import IOStream

from patroller.identify.holders import HolderSearch
from patroller.identify.peers import left
from patroller.identify.sockets import (
    ESTABLISHED,
    SocketEntry,
    closed_reason,
    find_client,
    find_client_in_tables,
    is_loopback,
    normalize,
    owner_of,
    parse_net_tcp,
    socket_owner,
)

NOBODY = 65534


def find_holder(inode, uid):
    search = HolderSearch("/proc", budget=10**6, remembered=1024, descriptors=1024).find(
        inode, uid
    )
    return search.pid, search.hidden


TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 5151 1 0000000000000000 20 4 30 10 -1
   2: garbage line
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7000 1 0000000000000000 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:C350 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 7001 1 0000000000000000 20 4 30 10 -1
"""


def test_parse_ipv4_entries_and_skip_garbage():
    entries = list(parse_net_tcp(TCP))
    assert len(entries) == 2
    assert entries[1].local == ("127.0.0.1", 0xD431) and entries[1].remote == ("127.0.0.1", 8080)
    assert entries[1].uid == 1000 and entries[1].inode == 5151


def test_the_state_is_read_from_the_st_column():
    listening, connected = parse_net_tcp(TCP)
    assert listening.state == 0x0A and connected.state == ESTABLISHED


def test_parse_ipv6_and_mapped_ipv4():
    entries = list(parse_net_tcp(TCP6))
    assert entries[0].local == ("::1", 8080)
    assert entries[1].local == ("127.0.0.1", 50000) and entries[1].uid == 1001


def test_find_client_in_a_written_proc_tree(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(TCP)
    (tmp_path / "net" / "tcp6").write_text(TCP6)
    entry = find_client(("::ffff:127.0.0.1", 0xD431), ("127.0.0.1", 8080), proc=str(tmp_path))
    assert entry is not None and entry.uid == 1000
    assert (
        find_client(
            ("::ffff:127.0.0.1", 50000), ("::ffff:127.0.0.1", 8080), proc=str(tmp_path)
        ).uid
        == 1001
    )
    assert find_client(("127.0.0.1", 1), ("127.0.0.1", 8080), proc=str(tmp_path)) is None


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_find_the_owner_of_a_real_loopback_connection(family, host):
    try:
        server = socket.socket(family)
        server.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host} on this machine")
    with server:
        server.listen()
        with socket.create_connection(server.getsockname()[:2]) as client:
            accepted, peer = server.accept()
            with accepted:
                entry = find_client(peer[:2], accepted.getsockname()[:2])
                assert entry is not None and entry.uid == os.getuid()
                assert find_holder(entry.inode, entry.uid)[0] == os.getpid()
                # the kernel's answer (sock_diag) and the tables agree
                assert find_client_in_tables(peer[:2], accepted.getsockname()[:2]) == entry
                assert os.stat(f"/proc/self/fd/{client.fileno()}").st_ino == entry.inode


def test_a_connection_that_does_not_exist_is_not_found():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        assert find_client(("127.0.0.1", 1), server.getsockname()) is None


def test_loopback_and_normalize():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.2")
    assert not is_loopback("10.0.0.1") and not is_loopback("not an address")
    assert normalize("::ffff:10.1.2.3") == "10.1.2.3" and normalize("fe80::1%eth0") == "fe80::1"


TIME_WAIT = 6


def test_a_client_socket_once_closed_belongs_to_nobody():
    """What the kernel keeps of a client that closed first: TIME_WAIT, inode 0, uid 0."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.create_connection(server.getsockname())
        accepted, peer = server.accept()
        ours = accepted.getsockname()
        live = find_client(peer, ours)
        assert live.state == ESTABLISHED and live.inode != 0 and not closed_reason(live)
        assert find_holder(live.inode, live.uid) == (os.getpid(), False)
        assert owner_of(live, os.getpid(), hidden=False).pid == os.getpid()
        client.close()
        accepted.close()
        deadline = time.monotonic() + 10
        while find_client(peer, ours).state != TIME_WAIT:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        left = find_client(peer, ours)
        assert left.inode == 0 and left.uid == 0 and left == find_client_in_tables(peer, ours)
        assert "closed" in closed_reason(left) and owner_of(left, None, hidden=True).uid is None


# The kernel's forms of a connection from 192.168.1.205:40000 to the host's own 192.168.1.1:8080
# (the client's first and last bytes have the high bit set, so that the word the kernel prints
# has it in either byte order), in tcp and, as IPv4-mapped addresses of a dual-stack socket,
# in tcp6.
HIGH = ("192.168.1.205", 40000), ("192.168.1.1", 8080)
HIGH_TCP = (
    TCP.splitlines()[0]
    + """
   0: 0101A8C0:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: CD01A8C0:9C40 0101A8C0:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 6161 1 0000000000000000 20 4 30 10 -1
"""
)
HIGH_TCP6 = (
    TCP6.splitlines()[0]
    + """
   0: 0000000000000000FFFF0000CD01A8C0:9C40 0000000000000000FFFF00000101A8C0:1F90 01 00000000:00000000 00:00000000 00000000  1002        0 7002 1 0000000000000000 20 4 30 10 -1
"""
)


def proc_tree(tmp_path, **tables):
    """A /proc of the test's own with these net/ tables."""
    (tmp_path / "net").mkdir(parents=True)
    for name, text in tables.items():
        (tmp_path / "net" / name).write_bytes(text.encode("latin-1"))
    return str(tmp_path)


def test_a_client_at_a_high_address_is_found_in_either_table(tmp_path):
    both = proc_tree(tmp_path / "both", tcp=HIGH_TCP, tcp6=HIGH_TCP6)
    assert find_client_in_tables(*HIGH, both) == SocketEntry(*HIGH, 1000, 6161, ESTABLISHED)
    assert (
        find_client_in_tables(
            ("::ffff:192.168.1.205", 40000), ("::ffff:192.168.1.1", 8080), both
        ).inode
        == 6161
    )  # the same socket, however it is named
    # a table that cannot be read is skipped: the dual-stack socket is found in the other
    only_tcp6 = proc_tree(tmp_path / "tcp6", tcp6=HIGH_TCP6)
    assert find_client_in_tables(*HIGH, only_tcp6) == SocketEntry(*HIGH, 1002, 7002, ESTABLISHED)


def test_a_line_that_cannot_be_read_names_no_socket_not_even_the_next(tmp_path):
    # The connection's line with a uid that is no number, then another connection's line; a
    # byte that is not ASCII elsewhere in the table does not stop the reading.
    garbled = HIGH_TCP.replace("  1000        0 6161", "  1x00        0 6161") + (
        "   2: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1003"
        "        0 5152 1 0000000000000000 20 4 30 10 -1\n   3: caf\xe9\n"
    )
    proc = proc_tree(tmp_path, tcp=garbled)
    assert find_client_in_tables(*HIGH, proc) is None
    assert find_client_in_tables(("127.0.0.1", 0xD431), ("127.0.0.1", 8080), proc).uid == 1003


CLIENT = """
import socket, sys
family, host, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
sock = socket.socket(family)
sock.connect((host, port))
print(sock.getsockname()[1], flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize(
    "listen,connect",
    [
        ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "127.0.0.1")),
        ((socket.AF_INET6, "::1"), (socket.AF_INET6, "::1")),
        ((socket.AF_INET6, "::"), (socket.AF_INET, "127.0.0.1")),  # dual stack: ::ffff:127.0.0.1
    ],
    ids=["ipv4", "ipv6", "mapped"],
)
def test_the_kernel_names_the_uid_that_made_a_local_client_socket(listen, connect):
    # What the server asks as it accepts a connection (to count it against its caller's), and
    # then to find its caller: sock_diag's exact lookup, never the tables.
    need_root("the client runs as uid 65534")
    try:
        server = socket.socket(listen[0])
        if listen[0] == socket.AF_INET6:
            server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        server.bind((listen[1], 0))
    except OSError:
        pytest.skip(f"no {listen[1]} on this machine")
    with server:
        server.listen()
        client = subprocess.Popen(
            [
                python_for(NOBODY),
                "-c",
                CLIENT,
                str(int(connect[0])),
                connect[1],
                str(server.getsockname()[1]),
            ],
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            port = int(client.stdout.readline())
            accepted, peer = server.accept()
            with accepted:
                ours = accepted.getsockname()[:2]
                assert peer[1] == port
                assert socket_owner(peer[:2], ours) == NOBODY
                entry = find_client(peer[:2], ours)
                assert (entry.uid, entry.state) == (NOBODY, ESTABLISHED)
                assert entry.local == (normalize(peer[0]), port)
                assert entry.remote == (normalize(ours[0]), ours[1])
                inodes = {
                    os.stat(f"/proc/{client.pid}/fd/{fd}").st_ino
                    for fd in os.listdir(f"/proc/{client.pid}/fd")
                }
                assert entry.inode in inodes
                assert socket_owner((peer[0], 1), ours) is None  # no such connection
        finally:
            client.kill()
            client.wait()


def test_a_malformed_line_is_skipped_and_the_lines_after_it_read():
    lines = TCP.splitlines()
    garbled = "\n".join([lines[0], lines[3], lines[1], "   3: 0100007F:ZZZZ", lines[2]])
    assert [entry.inode for entry in parse_net_tcp(garbled)] == [4242, 5151]


@async_test
async def test_a_client_has_left_once_its_end_is_shut_or_its_stream_gone():
    ours, theirs = socket.socketpair()
    stream = IOStream(ours)
    assert not left(stream)  # connected, nothing said
    theirs.shutdown(socket.SHUT_WR)  # the client shut its side: the kernel says so at once
    assert left(stream)
    theirs.close()
    stream.close()
    assert left(stream) and left(None)  # a stream closed, or none at all
    ours, theirs = socket.socketpair()
    stream = IOStream(ours)
    ours.close()  # closed under the stream, which has not seen it
    assert left(stream)
    theirs.close()


def test_the_kernel_names_a_client_sockets_uid_above_2_to_the_31():
    # uids run to 2**32 - 2: the socket of a client of uid 3,000,000,000 is that uid's.
    need_root("the client runs as a uid above 2**31")
    high = 3_000_000_000
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = subprocess.Popen(
            [
                python_for(high),
                "-c",
                CLIENT,
                str(int(socket.AF_INET)),
                "127.0.0.1",
                str(server.getsockname()[1]),
            ],
            user=high,
            group=high,
            extra_groups=[],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            client.stdout.readline()
            accepted, peer = server.accept()
            with accepted:
                assert socket_owner(peer, accepted.getsockname()) == high
                assert find_client(peer, accepted.getsockname()).uid == high
        finally:
            client.kill()
            client.wait()
