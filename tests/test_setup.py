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
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    return holder


def waiter(locks, **env):
    return subprocess.Popen(
        ["sh", "-c", ". tests/apt-wait.sh; wait_for_apt"],
        cwd=ROOT,
        env={**os.environ, "APT_LOCKS": " ".join(map(str, locks)), **env},
        stderr=subprocess.PIPE,
        text=True,
    )


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


def oldest_python():
    """The oldest Python that setup.py claims (python_requires), as an interpreter here."""
    import glob
    import re
    import shutil

    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        claimed = re.search(r'python_requires=">=(3\.\d+)"', f.read()).group(1)
    found = [
        f"/usr/bin/python{claimed}",
        *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{claimed}.*/bin/python"))),
        shutil.which(f"python{claimed}"),
    ]  # last: a version manager's shim may name none
    return claimed, next((p for p in found if p and os.access(p, os.X_OK)), None)


def test_it_installs_and_serves_on_the_oldest_python_it_claims(tmp_path):
    """`pip install .` in a virtual environment of the oldest Python setup.py claims, with its
    dependencies as the package registry has them; then the daemon serves in test mode and the
    command line asks it."""
    import pytest

    claimed, python = oldest_python()
    if python is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must check the install on Python {claimed}, the oldest claimed")
        pytest.skip(f"no Python {claimed} here to check the install on")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", ROOT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sys; print(sys.version)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert version.startswith(claimed + "."), version
    server = subprocess.Popen(
        [str(venv / "bin" / "patroller"), "--test", "--port", "0", "--address", "127.0.0.1"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PATROLLER_STATE_DIR": ""},
    )
    try:
        line = ""
        while " on http://" not in line:
            line = server.stderr.readline()
            assert line, "the daemon exited at start"
        url = line.split(" on ", 1)[1].split(",")[0].strip()
        status = subprocess.run(
            [str(venv / "bin" / "patroller"), "status", "--server", url[len("http://") :]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0 and "A100" in status.stdout, status.stdout + status.stderr
        unit = subprocess.run(
            [str(venv / "bin" / "patroller"), "systemd-unit"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )  # package data too
        assert f"ExecStart={venv}/bin/patroller --socket" in unit.stdout, unit.stderr
    finally:
        server.terminate()
        server.wait(20)
