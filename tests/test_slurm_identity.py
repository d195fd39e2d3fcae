"""A Slurm job's processes: the job and step its cgroup names, its user, and the job's account
and partition (parser fixtures for every path shape; then a real process in a real cgroup of
Slurm's shape, made here as slurmstepd makes it, and the daemon on the simulator)."""
import pytest

from helpers import known_claim
from helpers import NOBODY, ScenarioFile, async_test, gpu_running, slurm_job_process, until
from patroller.config import Config
from patroller.identify.cgroups import SlurmStep, parse_cgroup, parse_slurm
from patroller.identify.resolver import ProcessIdentifier


@pytest.mark.parametrize("text,step", [
    ("6:freezer:/slurm_vm/uid_65534/job_4242/step_0\n", SlurmStep("4242", "0", 65534)),
    ("4:memory:/slurm/uid_1000/job_7/step_batch/task_0\n0::/\n", SlurmStep("7", "batch", 1000)),
    ("4:memory:/slurm/job_7/step_batch/task_0\n0::/\n", SlurmStep("7", "batch")),
    # a host process seen from inside a cgroup namespace: the leading '..' are passed over
    ("0::/../../system.slice/slurmstepd.scope/job_4242/step_0\n", SlurmStep("4242", "0")),
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", SlurmStep("4242", "0")),
    ("0::/system.slice/node1_slurmstepd.scope/job_77/step_extern\n", SlurmStep("77", "extern")),
    ("0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_interactive/user/task_0\n",
     SlurmStep("sEKNKTV3WPV500", "interactive")),  # Slurm 26.05: the job's SLUID
    ("0::/system.slice/slurmstepd.scope/job_sEKNKTV3WPV500/step_3\n",
     SlurmStep("sEKNKTV3WPV500", "3")),
])
def test_every_slurm_path_shape_names_its_job_and_step(text, step):
    assert parse_slurm(text) == step and parse_cgroup(text) is None


@pytest.mark.parametrize("text", [
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
])
def test_other_processes_are_in_no_job(text):
    assert parse_slurm(text) is None


@pytest.fixture
def job_process():
    """`sleep` as uid 65534, with a job's environment, in a job step's cgroup."""
    with slurm_job_process("4242", account="vision-lab", partition="gpu") as pid:
        yield pid


@async_test
async def test_a_job_process_is_its_user_with_its_job_step_account_and_partition(job_process):
    identity = await ProcessIdentifier(Config()).resolve(job_process)
    assert identity.source == "slurm" and identity.uid == NOBODY
    assert identity.user == identity.account and identity.user not in ("unknown", "")
    assert dict(identity.job) == {"id": "4242", "step": "0", "account": "vision-lab",
                                  "partition": "gpu"}


@async_test
async def test_a_computing_jobs_gpu_shows_its_job_and_user(job_process, tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    async with gpu_running(scenario) as h:
        scenario.write(processes=[{"pid": job_process, "gpu": 1, "name": "python"}])
        uuid = h.uuids()[1]
        await until(lambda: known_claim(h.services.leases, uuid))
        holder = (await h.ok("/status"))[uuid]["claim"]["user"]
        assert holder["source"] == "slurm" and holder["job"]["id"] == "4242"
        assert holder["job"]["step"] == "0" and holder["job"]["account"] == "vision-lab"
        users = await h.ok("/users")
        assert users[holder["user"]]["jobs"] == ["4242"]
        metrics = (await h.http.fetch(h.url + "/metrics")).body.decode()
        line = [m for m in metrics.splitlines() if m.startswith("patroller_gpu_holder_info{")
                and f'uuid="{uuid}"' in m]
        assert len(line) == 1 and 'job="4242"' in line[0], line
        # Only there: no other series of the GPU carries the job.
        assert all('job="4242"' not in m for m in metrics.splitlines()
                   if not m.startswith("patroller_gpu_holder_info{"))
