"""tests/setup.sh waits for another apt-get (as found: it failed with status 100 while another
apt-get held the lock, and the README's `&&` then skipped the whole suite). The wait runs here
on locks of the test's own, held the way apt holds its own (fcntl), by a real other process."""
import os
import subprocess
import sys

from helpers import ROOT

HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()  # until the test says
"""


def hold(path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def waiter(locks, **env):
    return subprocess.Popen(["sh", "-c", ". tests/apt-wait.sh; wait_for_apt"], cwd=ROOT,
                            env={**os.environ, "APT_LOCKS": " ".join(map(str, locks)), **env},
                            stderr=subprocess.PIPE, text=True)


def test_setup_waits_for_the_package_lock_and_goes_on_when_it_is_free(tmp_path):
    locks = [tmp_path / "lock-frontend", tmp_path / "lists-lock"]
    for lock in locks:
        lock.write_text("")
    holder = hold(locks[1])
    try:
        waiting = waiter(locks + [tmp_path / "absent"])
        said = waiting.stderr.readline()
        assert "another apt-get or dpkg holds the package lock; waiting" in said
        assert waiting.poll() is None  # still waiting while the lock is held
    finally:
        holder.communicate("done\n", timeout=30)  # the other apt-get ends
    _, rest = waiting.communicate(timeout=30)
    assert waiting.returncode == 0 and "the package lock is free after" in rest


def test_setup_gives_up_on_a_lock_held_too_long(tmp_path):
    lock = tmp_path / "lock"
    lock.write_text("")
    holder = hold(lock)
    try:
        waiting = waiter([lock], APT_WAIT="1")
        _, said = waiting.communicate(timeout=60)
    finally:
        holder.communicate("done\n", timeout=30)
    assert waiting.returncode == 100 and "still held after 1 s; giving up" in said


def test_setup_does_not_wait_for_free_locks(tmp_path):
    lock = tmp_path / "lock"
    lock.write_text("")
    done = waiter([lock]).communicate(timeout=60)
    assert done == (None, "")
