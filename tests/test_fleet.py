"""`patroller status --hosts`: three real daemons, one stopped and one host that accepts and
never answers; each host is asked at once with its own timeout, and the dead ones are shown as
such without holding up the rest."""
import json
import os
import re
import socket
import subprocess
import sys
import urllib.request

import pytest

from helpers import ROOT, ServerProcess
from liars import LyingServer, trickle

ENV = {**os.environ, "PYTHONPATH": ROOT}


def patroller(*args, env=None):
    return subprocess.run([sys.executable, "-m", "patroller.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**ENV, **(env or {})})


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
    done = patroller("status", "--hosts", ",".join(fleet), "--host-timeout", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["GPU", "NAME", "STATE"]  # piped: every column
    at = {host: lines.index(next(line for line in lines if line.startswith(host + "  ")))
          for host in fleet}
    assert list(at.values()) == sorted(at.values())  # in the order given
    for host in (fleet[0], fleet[2]):
        assert lines[at[host]].startswith(f"{host}  8 GPUs: ")
        rows = lines[at[host] + 1:at[host] + 9]
        assert [row.split()[0] for row in rows] == [str(n) for n in range(8)]
    for host in (fleet[1], fleet[3]):  # a line of its own, saying why in full
        assert lines[at[host]].startswith(f"{host}  not answering: ")
        assert not re.match(r"\d+\s\s", lines[at[host] + 1])  # no GPU row under it
    assert lines[-1] == "4 hosts, 2 not answering; 16 GPUs: 9 free, 7 reserved"
    assert lines[at[fleet[0]]] == f"{fleet[0]}  8 GPUs: 1 free, 7 reserved"
    assert [line for line in lines[at[fleet[0]]:at[fleet[1]]] if " alice " in line]


def test_free_lists_the_hosts_with_that_many_free_gpus(fleet):
    hosts = ",".join(fleet)
    done = patroller("status", "--hosts", hosts, "--free", "2", "--host-timeout", "1")
    assert (done.returncode, done.stdout) == (0, f"{fleet[2]}  8 free\n"), done.stderr
    done = patroller("status", "--hosts", hosts, "--free", "1", "--host-timeout", "1")
    assert done.stdout == f"{fleet[2]}  8 free\n{fleet[0]}  1 free\n"
    done = patroller("status", "--hosts", hosts, "--free", "9", "--host-timeout", "1")
    assert done.returncode == 75 and "no host has 9 GPUs free now" in done.stderr


def test_the_same_as_json_from_a_file_or_the_environment(fleet, tmp_path):
    listing = tmp_path / "hosts"
    listing.write_text("# the lab\n" + "\n".join(fleet) + "\n")
    done = patroller("status", "--hosts-file", str(listing), "--json", "--host-timeout", "1")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)["hosts"]
    assert [h["host"] for h in answer] == fleet
    assert [h["free"] for h in answer] == [1, None, 8, None]
    assert answer[1]["error"] and answer[3]["error"] and answer[0]["error"] is None
    assert len(answer[2]["status"]) == len(answer[2]["devices"]) == 8
    by_env = patroller("status", "--free", "8", "--host-timeout", "1",
                       env={"PATROLLER_HOSTS": " ".join(fleet)})
    assert by_env.stdout == f"{fleet[2]}  8 free\n", by_env.stderr


def test_free_without_hosts_is_this_hosts_and_a_missing_file_is_a_usage_error(fleet, tmp_path):
    done = patroller("status", "--free", "1", "--server", fleet[0])
    assert (done.returncode, done.stdout) == (0, f"{fleet[0]}  1 free\n"), done.stderr
    done = patroller("status", "--hosts-file", str(tmp_path / "none"))
    assert done.returncode == 2 and "--hosts-file" in done.stderr


def test_a_host_that_trickles_its_answer_is_left_behind_and_the_command_ends(fleet):
    slow = LyingServer({"/status": trickle}).start()
    try:
        done = patroller("status", "--hosts", f"{fleet[0]},{slow.host}", "--host-timeout", "1")
    finally:
        slow.shutdown()
    assert done.returncode == 0, done.stderr  # before: it never ended (a pool's thread, joined)
    assert f"{slow.host}  not answering: no answer within 1 s" in done.stdout
