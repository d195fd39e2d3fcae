"""`patroller status --hosts`: three real daemons, one stopped and one host that accepts and
never answers; every request goes out at once, each with its own timeout, the table is drawn at
one overall deadline whatever the hosts do, and the dead ones are shown as such (refused, not
answering, no answer yet) without holding up the rest."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from types import SimpleNamespace

import pytest
from helpers import ROOT, ServerProcess
from liars import LyingServer, trickle

ENV = {**os.environ, "PYTHONPATH": ROOT}
# A silent host is "not answering" after its --host-timeout, and the table waits for it: the
# deadline far beyond, so that a busy machine (an interpreter slow to start, a daemon slow to
# answer) never turns "not answering" into "no answer yet"; the timeout room for a live host.
TIMED = ("--host-timeout", "3", "--deadline", "60")


def patroller(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "patroller.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**ENV, **(env or {})},
    )


@pytest.fixture(scope="module")
def fleet():
    up = [ServerProcess("--test", "--lease", "300").start() for _ in range(3)]
    stopped = up.pop()
    stopped.stop()  # its port now refuses
    silent = socket.socket()  # accepts (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    hosts = [up[0].server, stopped.server, up[1].server, f"127.0.0.1:{silent.getsockname()[1]}"]
    urllib.request.urlopen(f"http://{up[0].server}/request?gpu=7&user=alice", timeout=30).read()
    yield hosts
    for server in up:
        server.stop()
    silent.close()


def test_one_table_for_every_host_and_the_dead_ones_said(fleet):
    done = patroller("status", "--hosts", ",".join(fleet), *TIMED)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["GPU", "NAME", "STATE"]  # piped: every column
    at = {
        host: lines.index(next(line for line in lines if line.startswith(host + "  ")))
        for host in fleet
    }
    assert list(at.values()) == sorted(at.values())  # in the order given
    for host in (fleet[0], fleet[2]):
        assert lines[at[host]].startswith(f"{host}  8 GPUs: ")
        rows = lines[at[host] + 1 : at[host] + 9]
        assert [row.split()[0] for row in rows] == [str(n) for n in range(8)]
    assert lines[at[fleet[1]]] == f"{fleet[1]}  refused: connection refused"
    assert lines[at[fleet[3]]].startswith(f"{fleet[3]}  not answering: ")  # its timeout
    for host in (fleet[1], fleet[3]):  # a line of its own, saying why in full
        assert not re.match(r"\d+\s\s", lines[at[host] + 1])  # no GPU row under it
    assert lines[-1] == "4 hosts, 1 refused, 1 not answering; 16 GPUs: 9 free, 7 reserved"
    assert lines[at[fleet[0]]] == f"{fleet[0]}  8 GPUs: 1 free, 7 reserved"
    assert [line for line in lines[at[fleet[0]] : at[fleet[1]]] if " alice " in line]


def test_free_lists_the_hosts_with_that_many_free_gpus(fleet):
    hosts = ",".join(fleet)
    done = patroller("status", "--hosts", hosts, "--free", "2", *TIMED)
    assert (done.returncode, done.stdout) == (0, f"{fleet[2]}  8 free\n"), done.stderr
    done = patroller("status", "--hosts", hosts, "--free", "1", *TIMED)
    assert done.stdout == f"{fleet[2]}  8 free\n{fleet[0]}  1 free\n"
    done = patroller("status", "--hosts", hosts, "--free", "9", *TIMED)
    assert done.returncode == 75 and "no host has 9 GPUs free now" in done.stderr


def test_the_same_as_json_from_a_file_or_the_environment(fleet, tmp_path):
    listing = tmp_path / "hosts"
    listing.write_text("# the lab\n" + "\n".join(fleet) + "\n")
    done = patroller("status", "--hosts-file", str(listing), "--json", *TIMED)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)["hosts"]
    assert [h["host"] for h in answer] == fleet
    assert [h["free"] for h in answer] == [1, None, 8, None]
    assert [h["state"] for h in answer] == ["up", "refused", "up", "not answering"]
    assert answer[1]["error"] and answer[3]["error"] and answer[0]["error"] is None
    assert len(answer[2]["status"]) == len(answer[2]["devices"]) == 8
    by_env = patroller("status", "--free", "8", *TIMED, env={"PATROLLER_HOSTS": " ".join(fleet)})
    assert by_env.stdout == f"{fleet[2]}  8 free\n", by_env.stderr


def test_free_without_hosts_is_this_hosts_and_a_missing_file_is_a_usage_error(fleet, tmp_path):
    done = patroller("status", "--free", "1", "--server", fleet[0])
    assert (done.returncode, done.stdout) == (0, f"{fleet[0]}  1 free\n"), done.stderr
    done = patroller("status", "--hosts-file", str(tmp_path / "none"))
    assert done.returncode == 2 and "--hosts-file" in done.stderr


def test_a_host_that_trickles_its_answer_is_left_behind_and_the_command_ends(fleet):
    slow = LyingServer({"/status": trickle, "/devices": trickle}).start()
    try:
        done = patroller("status", "--hosts", f"{fleet[0]},{slow.host}", "--host-timeout", "1")
    finally:
        slow.shutdown()
    assert done.returncode == 0, done.stderr  # before: it never ended (a pool's thread, joined)
    # --host-timeout bounds the whole answer, not each read: a byte every 0.2 s is not one
    why = f"{slow.host}  not answering: Patroller at {slow.host}: timed out"
    assert why in done.stdout, done.stdout


def silent_hosts(count):
    """Listeners that accept (the kernel's backlog) and never answer."""
    found = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        found.append(sock)
    return found


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_the_table_is_drawn_at_the_deadline_whatever_the_hosts_do(fleet, how):
    """Five silent hosts that a host timeout would wait on for 120 s: drawn at the deadline
    (4 s, room for the live hosts to answer on a busy machine), each "no answer yet", the live
    and refusing ones as ever."""
    silent = silent_hosts(5)
    try:
        quiet = [f"127.0.0.1:{s.getsockname()[1]}" for s in silent]
        hosts = ",".join(fleet[:3] + quiet)
        deadline = ["--deadline", "4"] if how == "flag" else []
        began = time.monotonic()
        done = patroller(
            "status",
            "--hosts",
            hosts,
            "--host-timeout",
            "120",
            *deadline,
            env={} if how == "flag" else {"PATROLLER_HOSTS_DEADLINE": "4"},
        )
        took = time.monotonic() - began
    finally:
        for sock in silent:
            sock.close()
    assert done.returncode == 0, done.stderr
    assert took < 120, took  # drawn at the deadline, not at the hosts' timeout
    lines = done.stdout.splitlines()
    for host in quiet:
        assert f"{host}  no answer yet: none within the 4s deadline" in lines, done.stdout
    assert f"{fleet[0]}  8 GPUs: 1 free, 7 reserved" in lines
    assert f"{fleet[1]}  refused: connection refused" in lines
    assert lines[-1] == "8 hosts, 1 refused, 5 no answer yet; 16 GPUs: 9 free, 7 reserved"


def test_a_deadline_that_is_not_a_duration_is_a_usage_error(fleet):
    done = patroller("status", "--hosts", fleet[0], env={"PATROLLER_HOSTS_DEADLINE": "soon"})
    assert done.returncode == 2 and "PATROLLER_HOSTS_DEADLINE" in done.stderr, done.stderr


class SlowStarts:
    """fleet's `time` and `threading`, with a clock that a thread's start moves on by a second:
    a machine so busy that starting the requests takes longer than the deadline."""

    def __init__(self):
        self.now = 1000.0
        clock = self

        class Thread(threading.Thread):
            def start(self):
                clock.now += 1.0
                super().start()

        self.time = SimpleNamespace(monotonic=lambda: self.now)
        self.threading = SimpleNamespace(Thread=Thread, Event=threading.Event, Lock=threading.Lock)


def answering_late(after):
    """A host that answers every request `after` seconds late (with `{}`, not Patroller's)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)

    def answer(conn):
        time.sleep(after)
        with conn:
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
            )

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return sock


def test_the_deadline_counts_the_time_the_requests_took_to_start(monkeypatch):
    """The table's deadline counts from the command's start: the seconds spent before the
    requests go out (the interpreter's start on a loaded machine; for `at_once`, starting a
    thread per host) are part of it, not added after it. Here they pass it, so a host that
    answers a moment later is no answer yet."""
    from patroller.cli import fleet as hosts_table

    slow = SlowStarts()
    monkeypatch.setattr(hosts_table, "time", slow.time)
    monkeypatch.setattr(hosts_table, "threading", slow.threading)
    late = answering_late(0.5)
    try:
        host = f"127.0.0.1:{late.getsockname()[1]}"
        # The command's own start took 1.2 s of the 1.5: the host's answer comes after it.
        [answer] = hosts_table.ask_all([host], timeout=30, deadline=1.5, spent=1.2)
        assert (answer.state, answer.error) == (hosts_table.LATE, "none within the 1.5s deadline")
        # Without that start, the same host is in time.
        [answer] = hosts_table.ask_all([host], timeout=30, deadline=1.5)
        assert (answer.status, answer.devices, answer.error) == ({}, {}, None), answer
        found = hosts_table.at_once(
            [host, host],
            lambda h: (time.sleep(0.5), "answered")[1],
            deadline=1.5,
            late=lambda h: "late",
        )
        assert found == ["late", "late"]
    finally:
        late.close()
