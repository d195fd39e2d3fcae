"""The daemon on a real Slurm node: a one-node cluster of the tests' own (tests/slurm.py:
munged, slurmctld and slurmd with four GRES GPUs, proctrack/cgroup, the project's prolog and
epilog writing the job map), jobs submitted with sbatch as nobody, and the simulator listing the
jobs' real pids on their GPUs. Never skipped under CI=true (the fixture must start)."""

import subprocess

from helpers import NOBODY, ScenarioFile, async_test, gpu_running, until

DEVICES = [{}, {}, {}, {}]  # as many as the node's GRES GPUs: index N is /dev/nvidiaN
SLEEP = "#!/bin/sh\nsleep 300\n"  # the batch shell and its sleep: two processes in the job


def on_gpu(pids: list[int], gpu: int, name: str = "python") -> list[dict]:
    return [{"pid": pid, "gpu": gpu, "name": name} for pid in pids]


@async_test
async def test_a_jobs_gpu_is_its_own_until_the_epilog_then_grantable_again(slurm_node, tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=DEVICES)
    async with gpu_running(scenario, slurm_job_map=slurm_node.job_map, job_map_every=0.1) as h:
        job = slurm_node.sbatch(SLEEP, gpus=1, account="vision-lab")
        outsider = None
        try:
            slurm_node.wait_state(job, "RUNNING")
            (gpu,) = slurm_node.job_gpus(job)
            uuid = h.services.inventory.by_number(gpu).uuid
            state = lambda: h.services.leases.state(uuid)

            # Allocated, nothing of the job on the GPU yet: shown with its job and user.
            await until(lambda: state() == "allocated", timeout=20)
            claim = (await h.ok("/status"))[uuid]["claim"]
            assert claim["jobs"] == [
                {
                    "id": job,
                    "user": "nobody",
                    "uid": NOBODY,
                    "account": "vision-lab",
                    "partition": "gpu",
                }
            ]
            assert claim["user"]["user"] == "nobody" and claim["hold"] == "slurm"

            # Never granted: the other three are, all four are not.
            status, busy = await h.call("/request?gpu=4")
            assert status == 409 and busy["free"] == {"gpu": 3}, busy
            granted = await h.ok("/request?gpu=3")
            assert uuid not in {d["uuid"] for d in granted}
            await h.call("/release", "POST", b"")

            # The job computes on it: its processes, in its cgroup, claim it.
            pids = slurm_node.wait_pids(job, count=2)
            scenario.write(processes=on_gpu(pids, gpu))
            await until(lambda: state() == "claimed", timeout=20)
            holder = (await h.ok("/status"))[uuid]["claim"]["user"]
            assert holder["source"] == "slurm" and holder["uid"] == NOBODY
            assert holder["job"]["id"] == job and holder["job"]["account"] == "vision-lab"
            assert (await h.ok("/users"))[holder["user"]]["jobs"] == [job]
            # It asked Slurm for the GPU: no use without asking, anywhere it is shown.
            mine = (await h.ok("/users"))[holder["user"]]
            assert mine["unreserved"] == 0 and mine["trespassing"] == 0, mine
            assert (await h.ok("/status"))[uuid]["claim"]["asked"] is True
            metrics = (await h.http.fetch(h.url + "/metrics")).body.decode()
            assert f'patroller_user_gpus_unreserved{{user="{holder["user"]}"}} 0.0' in metrics

            # A host process outside the job on its GPU trespasses, and is told once.
            outsider = subprocess.Popen(["sleep", "300"])
            scenario.write(processes=on_gpu(pids, gpu) + on_gpu([outsider.pid], gpu, "sleep"))
            await until(lambda: state() == "shared", timeout=20)
            trespasses = [e for e in await h.ok("/history") if e["event"] == "trespass"]
            assert [(e["user"], e["pid"], e["why"], e["jobs"]) for e in trespasses] == [
                ("root", outsider.pid, "outside_job", [job])
            ]
            assert (await h.ok("/users"))["root"]["trespassing"] == 1
            assert (await h.ok("/users"))["root"]["unreserved"] == 1  # it asked nobody

            # scancel: the epilog removes the job's file; with the processes gone the GPU is
            # free, and granted again.
            slurm_node.cancel(job)
            assert slurm_node.job_map_of(job) == {}
            outsider.kill()
            scenario.write(processes=[])
            await until(lambda: state() == "free", timeout=20)
            granted = await h.ok("/request?gpu=4")
            assert uuid in {d["uuid"] for d in granted}
            events = [e["event"] for e in await h.ok("/history")]
            assert "allocated" in events and "deallocated" in events
        finally:
            if outsider is not None:
                outsider.kill()
                outsider.wait()
            slurm_node.cancel(job)


@async_test
async def test_two_jobs_on_two_gpus_each_hold_their_own(slurm_node, tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=DEVICES)
    async with gpu_running(scenario, slurm_job_map=slurm_node.job_map, job_map_every=0.1) as h:
        first = slurm_node.sbatch(SLEEP, gpus=1)
        second = slurm_node.sbatch(SLEEP, gpus=2, account="physics")
        try:
            for job in (first, second):
                slurm_node.wait_state(job, "RUNNING")
            gpus = {job: slurm_node.job_gpus(job) for job in (first, second)}
            uuids = {
                job: [h.services.inventory.by_number(n).uuid for n in numbers]
                for job, numbers in gpus.items()
            }

            def allocated_to(uuid):
                allocation = h.services.leases.holds[uuid].allocation
                return list(allocation.ids()) if allocation is not None else []

            await until(
                lambda: all(allocated_to(u) == [job] for job in uuids for u in uuids[job]),
                timeout=20,
            )
            status = await h.ok("/status")
            assert sorted(
                status[u]["claim"]["jobs"][0]["account"] or "" for u in uuids[second]
            ) == ["physics", "physics"]
            free = [u for u in status if status[u]["claim"]["state"] == "free"]
            assert len(free) == 1  # 4 GPUs, 3 allocated
            # The first job's process on the second job's GPU: another job trespasses.
            pids = slurm_node.wait_pids(first, count=2)
            scenario.write(processes=on_gpu(pids[:1], gpus[second][0]))
            await until(lambda: h.services.leases.state(uuids[second][0]) == "shared", timeout=20)
            [trespass] = [e for e in await h.ok("/history") if e["event"] == "trespass"]
            assert trespass["job"] == first and trespass["jobs"] == [second]
        finally:
            slurm_node.cancel(first)
            slurm_node.cancel(second)


# Inside her job a user sets the variable Slurm set, and runs her work under it.
def environ(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


CHOSEN = "#!/bin/sh\nexport SLURM_JOB_ACCOUNT=physics SLURM_JOB_PARTITION=debug\nexec sleep 300\n"


@async_test
async def test_a_job_that_names_another_account_is_billed_to_its_own(slurm_node, tmp_path):
    """The attack on a real node: the job is submitted to account vision-lab, and its process
    runs with SLURM_JOB_ACCOUNT=physics in its environment. The prolog's job map says
    vision-lab, and /usage bills the job's GPU-time there: physics appears nowhere."""
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=DEVICES)
    async with gpu_running(
        scenario,
        slurm_job_map=slurm_node.job_map,
        job_map_every=0.1,
        state_dir=str(tmp_path / "state"),
        usage_interval=0.2,
    ) as h:
        job = slurm_node.sbatch(CHOSEN, gpus=1, account="vision-lab")
        try:
            slurm_node.wait_state(job, "RUNNING")
            (gpu,) = slurm_node.job_gpus(job)
            uuid = h.services.inventory.by_number(gpu).uuid
            (pid,) = slurm_node.wait_pids(job, count=1)
            # the attack is in place once the script's shell has exec'd its process (found
            # before it, the shell's own environment is the one slurmd gave)
            await until(lambda: b"SLURM_JOB_ACCOUNT=physics\0" in environ(pid), timeout=20)
            scenario.write(processes=[{"pid": pid, "gpu": gpu, "name": "python", "sm": 90}])
            await until(lambda: h.services.leases.state(uuid) == "claimed", timeout=20)
            store = h.services.usage
            settled = store.intervals
            await until(lambda: store.intervals > settled + 2, timeout=20)
            rows = {
                row["key"]: row["hours"]
                for row in (await h.ok("/usage?by=slurm_account&since=1h"))["rows"]
            }
            assert "physics" not in rows and rows["vision-lab"]["active"] > 0, rows
            holder = (await h.ok("/status"))[uuid]["claim"]["user"]
            assert holder["job"]["account"] == "vision-lab", holder
            assert holder["job"].get("partition") != "debug"
        finally:
            slurm_node.cancel(job)
