"""A Slurm job's processes: the job and step its cgroup names, its user, and the job's account
and partition from the job map alone, never from the process's environment, which its user
writes (parser fixtures for every path shape; then a real process in a real cgroup of Slurm's
shape, made here as slurmstepd makes it, and the daemon on the simulator)."""

import pytest
from helpers import (
    NOBODY,
    ScenarioFile,
    async_test,
    gpu_running,
    known_claim,
    slurm_job_process,
    until,
)

from patroller.config import Config
from patroller.identify.cgroups import SlurmStep, parse_cgroup, parse_slurm
from patroller.identify.resolver import ProcessIdentifier


@pytest.mark.parametrize(
    "text,step",
    [
        ("6:freezer:/slurm_vm/uid_65534/job_4242/step_0\n", SlurmStep("4242", "0", 65534)),
        (
            "4:memory:/slurm/uid_1000/job_7/step_batch/task_0\n0::/\n",
            SlurmStep("7", "batch", 1000),
        ),
        ("4:memory:/slurm/job_7/step_batch/task_0\n0::/\n", SlurmStep("7", "batch")),
        # a host process seen from inside a cgroup namespace: the leading '..' are passed over
        ("0::/../../system.slice/slurmstepd.scope/job_4242/step_0\n", SlurmStep("4242", "0")),
        (
            "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
            SlurmStep("4242", "0"),
        ),
        (
            "0::/system.slice/node1_slurmstepd.scope/job_77/step_extern\n",
            SlurmStep("77", "extern"),
        ),
        (
            "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_interactive/user/task_0\n",
            SlurmStep("sEKNKTV3WPV500", "interactive"),
        ),  # Slurm 26.05: the job's SLUID
        (
            "0::/system.slice/slurmstepd.scope/job_sEKNKTV3WPV500/step_3\n",
            SlurmStep("sEKNKTV3WPV500", "3"),
        ),
    ],
)
def test_every_slurm_path_shape_names_its_job_and_step(text, step):
    assert parse_slurm(text) == step and parse_cgroup(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "0::/slurm/uid_1000/\n",  # the user's directory, no job
        "0::/system.slice/slurmstepd.scope/4242/step_0\n",  # a bare number is no job directory
        "0::/system.slice/slurmstepd.scope/job_4242/step_x\n",
        "0::/system.slice/slurmstepd.scope/system\n",  # slurmstepd itself
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/docker/" + "a" * 64 + "\n",
        "garbage\n",
        # Slurm's names anywhere but where slurmd puts them: a user's delegated subtree, say
        "0::/user.slice/user-23002.slice/user@23002.service/app_slurmstepd.scope/job_4242/step_0\n",
        "0::/user.slice/user-23002.slice/user@23002.service/system.slice/slurmstepd.scope/job_4242/"
        "step_0\n",
        "1:name=systemd:/user.slice/user-23002.slice/user@23002.service/slurm/uid_23001/job_4242/"
        "step_0\n",
        "0::/system.slice/docker-" + "a" * 64 + ".scope/slurmstepd.scope/job_4242/step_0\n",
        "0::/my-lab/slurm_node1/uid_1000/job_7/step_0\n",
        "0::/machine.slice/slurmstepd.scope/job_4242/step_0\n",  # v2's: under system.slice only
        "0::/system.slice/slurmstepd.scope/job_4242\n",  # the job, no step
    ],
)
def test_other_processes_are_in_no_job(text):
    assert parse_slurm(text) is None


@pytest.fixture
def job_process():
    """`sleep` as uid 65534 in a job step's cgroup, whose environment says an account and a
    partition (as its user may set them: SLURM_JOB_ACCOUNT=physics)."""
    with slurm_job_process("4242", account="physics", partition="debug") as pid:
        yield pid


@async_test
async def test_a_job_process_is_its_user_with_its_job_and_step_never_its_environments_account(
    job_process,
):
    identity = await ProcessIdentifier(Config()).resolve(job_process)
    assert identity.source == "slurm" and identity.uid == NOBODY
    assert identity.user == identity.account and identity.user not in ("unknown", "")
    assert dict(identity.job) == {"id": "4242", "step": "0"}  # no account, no partition


@async_test
async def test_a_computing_jobs_gpu_shows_its_job_and_user(job_process, tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    async with gpu_running(scenario) as h:
        scenario.write(processes=[{"pid": job_process, "gpu": 1, "name": "python"}])
        uuid = h.uuids()[1]
        await until(lambda: known_claim(h.services.leases, uuid))
        holder = (await h.ok("/status"))[uuid]["claim"]["user"]
        assert holder["source"] == "slurm" and holder["job"]["id"] == "4242"
        assert holder["job"] == {"id": "4242", "step": "0"}  # its environment names nothing
        users = await h.ok("/users")
        assert users[holder["user"]]["jobs"] == ["4242"]
        metrics = (await h.http.fetch(h.url + "/metrics")).body.decode()
        line = [
            m
            for m in metrics.splitlines()
            if m.startswith("patroller_gpu_holder_info{") and f'uuid="{uuid}"' in m
        ]
        assert len(line) == 1 and 'job="4242"' in line[0], line
        # Only there: no other series of the GPU carries the job.
        assert all(
            'job="4242"' not in m
            for m in metrics.splitlines()
            if not m.startswith("patroller_gpu_holder_info{")
        )


@async_test
async def test_a_job_is_billed_to_the_job_maps_account_not_the_one_its_environment_says(
    job_process, tmp_path
):
    """The attack: inside her job a user sets SLURM_JOB_ACCOUNT=physics to bill her GPU-time to
    an account of her choosing (under --hide-users, to learn which names others used). The job
    map, which root's prolog writes, says vision-lab: her GPU-time is billed there; a job the map
    does not list, whatever its environment says, to no account at all."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "1").write_text(f"4242 uid={NOBODY} account=vision-lab partition=gpu\n")
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}])
    with slurm_job_process("4343", account="physics") as unlisted:
        async with gpu_running(
            scenario,
            slurm_job_map=str(jobs),
            job_map_every=0.05,
            state_dir=str(tmp_path / "state"),
            usage_interval=0.2,
        ) as h:
            uuid = h.uuids()
            await until(lambda: h.services.leases.state(uuid[1]) == "allocated")
            scenario.write(
                processes=[
                    {"pid": job_process, "gpu": 1, "sm": 90},
                    {"pid": unlisted, "gpu": 2, "sm": 90},
                ]
            )
            await until(
                lambda: (
                    h.services.leases.state(uuid[1]) == "claimed"
                    and known_claim(h.services.leases, uuid[2])
                )
            )
            store = h.services.usage
            settled = store.intervals
            await until(lambda: store.intervals > settled + 2)
            rows = {
                row["key"]: row["hours"]
                for row in (await h.ok("/usage?by=slurm_account&since=1h"))["rows"]
            }
            assert "physics" not in rows and "debug" not in rows, rows
            assert rows["vision-lab"]["active"] > 0
            assert set(rows) <= {"vision-lab", None, ""}, rows
            by_job = {
                row["key"]: row["hours"] for row in (await h.ok("/usage?by=job&since=1h"))["rows"]
            }
            assert by_job["4343"]["unreserved"] > 0  # counted, for its job, to no account
            status = await h.ok("/status")
            assert status[uuid[1]]["claim"]["user"]["job"] == {
                "id": "4242",
                "account": "vision-lab",
                "partition": "gpu",
            }  # the map's
            assert status[uuid[2]]["claim"]["user"]["job"] == {"id": "4343", "step": "0"}
