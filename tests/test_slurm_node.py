"""The Slurm prolog and epilog of contrib/slurm: run by a real one-node cluster (tests/slurm.py:
munged, slurmctld and slurmd, four fake GPUs, jobs as nobody), and run directly with a crafted
environment in a temporary directory."""

import os
import re
import stat
import subprocess
import time

import pytest
from helpers import alive
from slurm import EPILOG, NOBODY, PROLOG, start_node

from patroller.observe.jobmap import read_map

EXAMPLE = os.path.join(os.path.dirname(PROLOG), "slurm.conf.example")
SLEEP = "#!/bin/sh\nsleep 300\n"  # a shell and its child: two processes in the batch step


def uid_of(pid):
    """The real, effective, saved and filesystem uids of a process."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        line = next(x for x in f if x.startswith("Uid:"))
    return {int(u) for u in line.split()[1:]}


def cgroup_of(pid):
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
        return f.read()


def map_line(job, uid=NOBODY, user="nobody", account=None, partition="gpu"):
    return " ".join(
        [job, f"uid={uid}", f"user={user}"]
        + ([f"account={account}"] if account else [])
        + [f"partition={partition}"]
    )


# -- the real cluster ----------------------------------------------------------------------------


def test_a_batch_job_runs_as_its_user_in_its_steps_cgroup_and_is_in_the_map_of_its_gpus(
    slurm_node,
):
    job = slurm_node.sbatch(SLEEP, gpus=2, account="vision-lab")
    try:
        slurm_node.wait_state(job, "RUNNING")
        pids = slurm_node.wait_pids(job, count=2)
        for pid in pids:
            assert uid_of(pid) == {NOBODY}, pid
            assert re.search(
                rf"^\d+:freezer:/\S*/uid_{NOBODY}/job_{job}/step_batch$", cgroup_of(pid), re.M
            ), cgroup_of(pid)
        gpus = slurm_node.job_gpus(job)
        assert len(gpus) == 2
        # The prolog ran (the processes start after it) and named the job in its GPUs' files,
        # and only there.
        expected = map_line(job, account="vision-lab")
        assert slurm_node.job_map_of(job) == {str(gpu): expected for gpu in gpus}
        assert slurm_node.script_env("prolog", job)["SLURM_JOB_GPUS"] == ",".join(map(str, gpus))
        mode = os.stat(slurm_node.job_map).st_mode
        assert stat.S_IMODE(mode) == 0o755, oct(mode)
        for gpu in gpus:
            assert (
                stat.S_IMODE(os.stat(os.path.join(slurm_node.job_map, str(gpu))).st_mode) == 0o644
            )
    finally:
        state = slurm_node.cancel(job)
    assert state == "CANCELLED"
    assert slurm_node.job_map_of(job) == {}
    for gpu in gpus:  # no other job held them: the files are gone
        assert not os.path.exists(os.path.join(slurm_node.job_map, str(gpu)))
    assert (0, job) in slurm_node.script_runs("prolog")
    assert (0, job) in slurm_node.script_runs("epilog")
    assert slurm_node.script_errors("prolog") == slurm_node.script_errors("epilog") == ""
    assert slurm_node.in_service(), (slurm_node.node_state(), slurm_node.node_reason())


def test_an_srun_job_step_is_step_0_and_leaves_the_map_when_it_ends(slurm_node):
    srun, job = slurm_node.srun_background(["sleep", "300"], gpus=1)
    try:
        slurm_node.wait_state(job, "RUNNING")
        pids = slurm_node.wait_pids(job)
        assert any(
            re.search(rf"^\d+:freezer:/\S*/uid_{NOBODY}/job_{job}/step_0$", cgroup_of(pid), re.M)
            for pid in pids
        ), [cgroup_of(p) for p in pids]
        assert all(uid_of(pid) == {NOBODY} for pid in pids)
        (gpu,) = slurm_node.job_gpus(job)
        assert slurm_node.job_map_of(job) == {str(gpu): map_line(job)}
    finally:
        slurm_node.cancel(job)
        srun.communicate(timeout=60)
    assert slurm_node.job_map_of(job) == {}
    assert not os.path.exists(os.path.join(slurm_node.job_map, str(gpu)))


def test_a_job_that_ends_by_itself_is_forgotten(slurm_node):
    job = slurm_node.sbatch("#!/bin/sh\nsleep 1\n", gpus=1)
    assert slurm_node.wait_finished(job) == "COMPLETED"
    assert (0, job) in slurm_node.script_runs("prolog")  # it was recorded, then removed
    assert slurm_node.job_map_of(job) == {}
    assert slurm_node.in_service()


def test_two_one_gpu_jobs_are_in_different_files_and_each_leaves_only_its_own(slurm_node):
    first = slurm_node.sbatch(SLEEP, gpus=1)
    second = slurm_node.sbatch(SLEEP, gpus=1, account="physics")
    try:
        for job in (first, second):
            slurm_node.wait_state(job, "RUNNING")
            slurm_node.wait_pids(job, count=2)
        (gpu1,), (gpu2,) = slurm_node.job_gpus(first), slurm_node.job_gpus(second)
        assert gpu1 != gpu2
        files = slurm_node.job_map_files()
        assert files[str(gpu1)] == [map_line(first)]
        assert files[str(gpu2)] == [map_line(second, account="physics")]
        slurm_node.cancel(first)
        files = slurm_node.job_map_files()
        assert str(gpu1) not in files and files[str(gpu2)] == [map_line(second, account="physics")]
    finally:
        slurm_node.cancel(first)
        slurm_node.cancel(second)
    assert slurm_node.job_map_of(second) == {}
    assert slurm_node.in_service(), (slurm_node.node_state(), slurm_node.node_reason())
    assert {(0, first), (0, second)} <= set(slurm_node.script_runs("epilog"))


def test_a_job_without_gpus_leaves_the_map_alone(slurm_node):
    job = slurm_node.sbatch(SLEEP)
    try:
        slurm_node.wait_pids(job, count=2)
        assert slurm_node.job_gpus(job) == []
        assert slurm_node.job_map_of(job) == {}
        assert (0, job) in slurm_node.script_runs("prolog")
    finally:
        slurm_node.cancel(job)
    assert slurm_node.in_service()


def test_a_job_may_open_only_its_own_gpus(slurm_node):
    """The devices cgroup (ConstrainDevices): its own device has no driver behind it (ENXIO),
    the others are refused (EPERM)."""
    probe = "; ".join(
        f"head -c1 {path} 2>&1 | sed 's/^/{i} /'" for i, path in enumerate(slurm_node.devices)
    )
    name = f"devices{time.monotonic_ns()}"
    done = slurm_node.srun(["sh", "-c", probe], gpus=1, name=name)
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    own = [i for i, text in said.items() if "No such device or address" in text]
    refused = [i for i, text in said.items() if "Operation not permitted" in text]
    assert len(own) == 1 and len(refused) == slurm_node.gpus - 1, said


def test_the_cluster_stops_cleanly_and_starts_again(slurm_node):
    """A second cluster beside the session's: its jobs' cgroups and processes are gone after
    stop(), no daemon of its own is left, and another starts after it."""
    for _ in range(2):
        node = start_node()
        try:
            assert node.startup < 30
            job = node.sbatch(SLEEP, gpus=1)
            pids = node.wait_pids(job, count=2)
            assert node.job_cgroups(job)
        finally:
            node.stop()
        assert all(process.poll() is not None for process in node.processes.values())
        assert node.job_cgroups(job) == []
        assert not any(alive(pid) for pid in pids)  # (a zombie is not: pid 1 reaps it)
        assert not os.path.exists(node.root)
    assert slurm_node.in_service()


def test_the_cluster_runs_the_lines_of_slurm_conf_example(slurm_node):
    """The tested configuration is the documented one: every line of the example, its
    /etc/slurm/ the cluster's own directory, is in the cluster's slurm.conf."""
    with open(EXAMPLE, encoding="utf-8") as f:
        wanted = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    assert {line.split("=")[0] for line in wanted} == {"Prolog", "Epilog", "PrologFlags"}
    with open(slurm_node.conf, encoding="utf-8") as f:
        conf = f.read().splitlines()
    for line in wanted:
        assert line.replace("/etc/slurm/", slurm_node.etc + "/") in conf, line


# -- the scripts, run directly -------------------------------------------------------------------


def run(script, map_dir, **env):
    """Run the prolog or epilog with only `env` and the job map; (exit status, stderr)."""
    environment = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PATROLLER_SLURM_JOB_MAP": str(map_dir),
        **env,
    }
    done = subprocess.run(
        ["/bin/sh", script], env=environment, capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stderr


def prolog(map_dir, job, gpus, **env):
    return run(PROLOG, map_dir, SLURM_JOB_ID=job, SLURM_JOB_GPUS=gpus, **env)


def epilog(map_dir, job, gpus="", **env):
    return run(EPILOG, map_dir, SLURM_JOB_ID=job, SLURM_JOB_GPUS=gpus, **env)


def lines(map_dir):
    return {
        name: (map_dir / name).read_text().splitlines() for name in sorted(os.listdir(map_dir))
    }


def test_two_jobs_on_one_gpu_and_one_leaving(tmp_path):
    jobmap = tmp_path / "map" / "slurm-job-map"  # made, parents too
    assert prolog(
        jobmap,
        "100",
        "0,1",
        SLURM_JOB_UID="1000",
        SLURM_JOB_USER="ana",
        SLURM_JOB_ACCOUNT="vision",
        SLURM_JOB_PARTITION="gpu",
    ) == (0, "")
    assert prolog(jobmap, "101", "1", SLURM_JOB_UID="1001", SLURM_JOB_USER="bo") == (0, "")
    assert lines(jobmap) == {
        "0": ["100 uid=1000 user=ana account=vision partition=gpu"],
        "1": ["100 uid=1000 user=ana account=vision partition=gpu", "101 uid=1001 user=bo"],
    }
    assert stat.S_IMODE(os.stat(jobmap).st_mode) == 0o755
    assert {stat.S_IMODE(os.stat(jobmap / name).st_mode) for name in "01"} == {0o644}
    assert epilog(jobmap, "100", "0,1") == (0, "")
    assert lines(jobmap) == {"1": ["101 uid=1001 user=bo"]}
    assert epilog(jobmap, "101", "1") == (0, "")
    assert lines(jobmap) == {}


def test_a_job_recorded_twice_has_one_line(tmp_path):
    prolog(tmp_path, "7", "2", SLURM_JOB_USER="ana")
    prolog(tmp_path, "8", "2")
    prolog(tmp_path, "7", "2", SLURM_JOB_USER="bo")
    assert lines(tmp_path) == {"2": ["8", "7 user=bo"]}


def test_a_sluid_is_recorded_and_read_back_as_the_same_job(tmp_path):
    """Slurm 26.05 names a job's cgroup after its SLUID: the prolog records it, so the daemon
    knows a process in that cgroup is the job's."""
    prolog(tmp_path, "4242", "1", SLURM_JOB_UID="1001", SLURM_JOB_SLUID="sEKNKTV3WPV500")
    assert lines(tmp_path) == {"1": ["4242 uid=1001 sluid=sEKNKTV3WPV500"]}
    found = read_map(str(tmp_path), 65536, lambda uid: None).allocations
    assert found[1].jobs[0].names() == ("4242", "sEKNKTV3WPV500")


def test_ids_only(tmp_path):
    for job in ("5", "6"):
        assert prolog(
            tmp_path, job, "3", SLURM_JOB_USER="ana", PATROLLER_SLURM_MAP_IDS_ONLY="1"
        ) == (0, "")
    assert lines(tmp_path) == {"3": ["5", "6"]}
    epilog(tmp_path, "5", "3")
    assert lines(tmp_path) == {"3": ["6"]}


@pytest.mark.parametrize("job", ["", "12;rm", "1 2", "../1", "12\n13", "$(id)"])
def test_a_bad_job_id_is_skipped_and_said(tmp_path, job):
    status, said = prolog(tmp_path / "map", job, "0")
    assert status == 0 and "SLURM_JOB_ID" in said
    assert not os.path.exists(tmp_path / "map")
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "0").write_text(f"{job}\n")
    status, said = epilog(tmp_path / "map", job, "0")
    assert status == 0 and "SLURM_JOB_ID" in said
    assert (tmp_path / "map" / "0").read_text() == f"{job}\n"


def test_a_bad_gpu_index_is_skipped_and_the_others_recorded(tmp_path):
    status, said = prolog(tmp_path, "9", "0,x1,,GPU-5f2e,2")
    assert status == 0 and "'x1'" in said and "'GPU-5f2e'" in said
    assert lines(tmp_path) == {"0": ["9"], "2": ["9"]}


def test_a_value_with_white_space_is_left_out(tmp_path):
    status, said = prolog(
        tmp_path, "9", "0", SLURM_JOB_USER="ana", SLURM_JOB_ACCOUNT="a\nb c", SLURM_JOB_UID="12x"
    )
    assert status == 0 and "account" in said and "uid" in said
    assert lines(tmp_path) == {"0": ["9 user=ana"]}


def test_the_gpus_come_from_cuda_visible_devices_only_without_slurm_job_gpus(tmp_path):
    run(PROLOG, tmp_path, SLURM_JOB_ID="1", CUDA_VISIBLE_DEVICES="3")
    run(PROLOG, tmp_path, SLURM_JOB_ID="2", GPU_DEVICE_ORDINAL="2")
    run(PROLOG, tmp_path, SLURM_JOB_ID="3", SLURM_JOB_GPUS="", CUDA_VISIBLE_DEVICES="1")
    assert lines(tmp_path) == {"2": ["2"], "3": ["1"]}


def test_the_epilog_removes_the_job_from_every_gpu_file_and_nothing_else(tmp_path):
    for name, text in {
        "0": "4 user=a\n5 user=b\n",
        "1.2": "4\n",
        "7": "45\n 4\n",
        "x4": "4\n",
        ".0.tmp": "4\n",
        "1.2.3": "4\n",
    }.items():
        (tmp_path / name).write_text(text)
    assert epilog(tmp_path, "4", "0") == (0, "")  # told GPU 0 only
    assert lines(tmp_path) == {
        ".0.tmp": ["4"],
        "0": ["5 user=b"],
        "1.2.3": ["4"],
        "7": ["45"],
        "x4": ["4"],
    }


def test_always_exits_0_when_the_map_cannot_be_made(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    status, said = prolog(blocker / "map", "1", "0")
    assert status == 0 and "cannot make" in said
    assert epilog(blocker / "map", "1", "0")[0] == 0
    # A map directory that cannot be written: the line cannot be recorded, and the prolog
    # still exits 0.
    if os.geteuid() != 0:
        readonly = tmp_path / "readonly"
        readonly.mkdir(mode=0o555)
        status, said = prolog(readonly, "1", "0")
        assert status == 0 and "cannot write" in said


@pytest.mark.parametrize("how", ["link", "group", "others", "owner"])
def test_a_map_others_may_write_to_is_left_alone(tmp_path, how):
    """As root, the scripts write only into a directory of their own that nobody else may
    write to: in another's, a link planted where they write would make root write anywhere
    (and the daemon refuses such a map)."""
    if how == "owner" and os.geteuid() != 0:
        pytest.skip("giving a directory away takes root")
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (real / "0").write_text("7\n")
    jobmap = real
    if how == "link":
        jobmap = tmp_path / "map"
        jobmap.symlink_to(real)
    elif how == "owner":
        os.chown(real, 4321, 4321)
    else:
        os.chmod(real, 0o775 if how == "group" else 0o757)
    before = lines(real)
    status, said = prolog(jobmap, "9", "0,1")
    assert status == 0 and str(jobmap) in said and "nothing recorded" in said
    assert lines(real) == before
    status, said = epilog(jobmap, "7", "0")
    assert status == 0 and "its lines are left" in said
    assert lines(real) == before
    if how != "link":  # made right, written again
        os.chown(real, os.geteuid(), os.getegid())
        os.chmod(real, 0o755)
        assert prolog(jobmap, "9", "1") == (0, "") and epilog(jobmap, "7", "0") == (0, "")
        assert lines(real) == {"1": ["9"]}


def test_prologs_at_once_lose_no_line(tmp_path):
    """Forty prologs of different jobs on one GPU at once: the lock keeps every line."""
    jobs = [str(n) for n in range(40)]
    started = [
        subprocess.Popen(
            ["/bin/sh", PROLOG],
            env={
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "PATROLLER_SLURM_JOB_MAP": str(tmp_path),
                "SLURM_JOB_ID": job,
                "SLURM_JOB_GPUS": "0,1",
            },
        )
        for job in jobs
    ]
    assert [process.wait(60) for process in started] == [0] * len(jobs)
    assert {name: sorted(found, key=int) for name, found in lines(tmp_path).items()} == {
        "0": jobs,
        "1": jobs,
    }
    stopping = [
        subprocess.Popen(
            ["/bin/sh", EPILOG],
            env={
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "PATROLLER_SLURM_JOB_MAP": str(tmp_path),
                "SLURM_JOB_ID": job,
                "SLURM_JOB_GPUS": "0,1",
            },
        )
        for job in jobs[::2]
    ]
    assert [process.wait(60) for process in stopping] == [0] * len(stopping)
    assert {name: sorted(found, key=int) for name, found in lines(tmp_path).items()} == {
        "0": jobs[1::2],
        "1": jobs[1::2],
    }
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]
