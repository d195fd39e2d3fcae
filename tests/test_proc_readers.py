"""The readers of a process's /proc entry (identify/procfs.py) on what a process may put there:
a uid that changed, a name of its choosing. Real child processes and the real /proc; a written
tree where the kernel's own cannot show the case."""

import os
import subprocess
import sys
import time

from helpers import async_test, need_root, process_in_cgroup

from patroller.config import Config
from patroller.core.identity import ProcessRef
from patroller.identify import procfs
from patroller.identify.resolver import ProcessIdentifier, host_identity

NOBODY = 65534


def test_a_processes_uid_is_its_real_uid(tmp_path):
    # /proc/<pid>/status: real, effective, saved and file-system uids; a setuid program runs
    # with an effective uid that is not its user's.
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "status").write_text(
        "Name:\tsu\nUid:\t1000\t0\t0\t0\nGid:\t1000\t0\t0\t0\n"
    )
    assert procfs.uid(4242, str(tmp_path)) == 1000
    assert procfs.uids(4242, str(tmp_path)) == (1000, 0, 0, 0)
    assert procfs.uid(4343, str(tmp_path)) is None  # no such process


NAMED = (
    "import ctypes, sys\n"
    "ctypes.CDLL(None).prctl(15, b'tr\\xffin) (x', 0, 0, 0)  # PR_SET_NAME\n"
    "print(flush=True)\n"
    "sys.stdin.read()\n"
)


def test_a_process_may_name_itself_anything():
    # The command name in stat and status is the process's own choice, bytes and parentheses
    # alike: what is read around it (its state, start time and uids) is read all the same,
    # and the process is alive.
    process = subprocess.Popen(
        [sys.executable, "-c", NAMED], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        process.stdout.readline()  # named
        with open(f"/proc/{process.pid}/stat", "rb") as f:
            raw = f.read()
        assert b"(tr\xffin) (x)" in raw
        start = int(raw.rsplit(b")", 1)[1].split()[19])
        found = procfs.stat(process.pid)
        assert found.start == start and found.state in ("R", "S")  # running, or reading
        assert procfs.is_alive(ProcessRef(process.pid, start))
        assert procfs.uids(process.pid) == (os.getuid(),) * 4
    finally:
        process.kill()
        process.wait()


def test_the_readers_read_the_hosts_proc_unless_told_another():
    me = os.getpid()
    with open("/proc/self/cgroup", encoding="ascii") as f:
        assert procfs.cgroup(me) == f.read()
    assert procfs.uids(me) == procfs.uids(me, "/proc") and procfs.uids(me)[0] == os.getuid()
    assert me in procfs.pids()
    with open(os.devnull) as held:
        fd = str(held.fileno())
        assert fd in procfs.descriptors(me) and procfs.descriptor_target(me, fd) == os.devnull
        numbers = [int(name) for name in procfs.descriptors(me)]
        assert numbers == sorted(numbers, reverse=True)  # newest first


def test_the_owner_of_a_user_namespace_is_any_uid_the_kernel_has():
    # uids run to 2**32 - 2: one above 2**31 is no negative number.
    need_root("the namespace is made by a uid above 2**31")
    high = 3_000_000_000
    process = subprocess.Popen(
        ["unshare", "--user", "sleep", "60"],
        user=high,
        group=high,
        extra_groups=[],
        cwd="/",
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while procfs.userns_owner(process.pid) is None:
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "the process never entered its namespace"
            time.sleep(0.02)
        assert procfs.userns_owner(process.pid) == high
    finally:
        process.kill()
        process.wait()


@async_test
async def test_a_process_in_a_cgroup_whose_name_is_not_ascii_is_still_its_users():
    # A user may name the cgroups of a subtree delegated to them as they like: the bytes of a
    # name neither stop the reading nor cost the process its account.
    with process_in_cgroup(f"/caf\u00e9-pt{os.getpid()}/job", NOBODY) as pid:
        assert f"/caf\ufffd\ufffd-pt{os.getpid()}/job" in procfs.cgroup(pid)
        identifier = ProcessIdentifier(Config())
        identity = await identifier.resolve(pid)
        identifier.close()
    assert identity == host_identity(NOBODY)
