"""The readers of a process's /proc entry (identify/procfs.py) on what a process may put there:
an environment of the caller's making (a Slurm job's variables are read from it), a uid that
changed. Real child processes and the real /proc; a written tree where the kernel's own cannot
show the case."""
import subprocess
import time

import pytest

from patroller.identify import procfs
from patroller.identify.resolver import SLURM_ENV

NOBODY = 65534


def sleeping(env):
    """`sleep` with exactly this environment (bytes, as execve takes it), once the kernel shows
    it (Popen returns as the exec begins, before the new environment is in place)."""
    process = subprocess.Popen(["/bin/sleep", "60"], env=env)
    deadline = time.monotonic() + 10
    while not environ_size(process.pid):
        assert time.monotonic() < deadline, "the environment never showed"
        time.sleep(0.01)
    return process


def environ_size(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return len(f.read())


def test_the_environment_gives_the_names_asked_whatever_else_it_holds():
    # A value may hold "=", and the bytes of a name or value are the caller's to choose:
    # neither stops the reading, nor is taken for another variable.
    process = sleeping({b"SLURM_JOB_ACCOUNT": b"physics=gpu", b"CAF\xc3\x89": b"x",
                        b"SLURM_JOB_PARTITION": b"a100-\xff", b"\xff\xfe": b"\xff",
                        b"SLURM_JOB_ACCOUNTING": b"not this one"})
    try:
        found = procfs.environ(process.pid, SLURM_ENV + ("SLURM_JOB_QOS",))
    finally:
        process.kill()
        process.wait()
    assert found == {"SLURM_JOB_ACCOUNT": "physics=gpu", "SLURM_JOB_PARTITION": "a100-\ufffd"}
    with pytest.raises(OSError):  # gone
        procfs.environ(process.pid, SLURM_ENV)


def test_no_more_than_the_first_mib_of_an_environment_is_read():
    # An environment can be made as big as the kernel lets arguments be (a quarter of the
    # stack limit): what lies past its first MiB is not read.
    filler = {f"PAD{n}".encode(): b"x" * (100 << 10) for n in range(12)}  # 1.2 MiB
    process = sleeping({b"SLURM_JOB_PARTITION": b"a100", **filler,
                        b"SLURM_JOB_ACCOUNT": b"physics"})
    try:
        assert (1 << 20) < environ_size(process.pid) < (2 << 20)
        found = procfs.environ(process.pid, SLURM_ENV)
    finally:
        process.kill()
        process.wait()
    assert found == {"SLURM_JOB_PARTITION": "a100"}


def test_a_processes_uid_is_its_real_uid(tmp_path):
    # /proc/<pid>/status: real, effective, saved and file-system uids; a setuid program runs
    # with an effective uid that is not its user's.
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "status").write_text("Name:\tsu\nUid:\t1000\t0\t0\t0\nGid:\t1000\t0\t0\t0\n")
    assert procfs.uid(4242, str(tmp_path)) == 1000
    assert procfs.uids(4242, str(tmp_path)) == (1000, 0, 0, 0)
    assert procfs.uid(4343, str(tmp_path)) is None  # no such process
