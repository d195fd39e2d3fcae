"""What a user can make in the cgroup subtree systemd delegates to them, and that none of it
makes them someone else: real throwaway users, a real delegated subtree in each cgroup version,
processes the user moves there themselves, and the daemon on the simulator.

The attacks (trust round 4): a user makes `.../user@<them>.service/app_slurmstepd.scope/
job_4242/step_0` to pass for part of another user's Slurm job; or `.../user@<them>.service/
user-<alice>.slice/docker-<alice's container>.scope` (or `user-0.slice`) to pass for alice's
rootless container, or for root."""

import json
import logging
import os
import secrets
import subprocess
import time
from dataclasses import replace

import pytest
from delegated import Delegated
from helpers import (
    ScenarioFile,
    async_test,
    engines_in,
    gpu_running,
    need_root,
    python_for,
    slurm_job_process,
    until,
)

from patroller.config import Config
from patroller.identify import procfs
from patroller.identify.resolver import ProcessIdentifier, host_identity

VERSIONS = [1, 2]


@pytest.fixture(scope="module")
def accounts():
    """Two throwaway users, alice and mallory, with subordinate ids."""
    need_root("it makes users and delegates cgroups to them")
    from podman import Account

    made = []
    try:
        made.append(Account())
        made.append(Account())
        yield tuple(made)
    finally:
        for account in made:
            account.remove()


def delegated(account, version):
    """The account's delegated subtree in one cgroup version, or a skip where the host has
    none (CI has both: a v1 freezer and the unified hierarchy)."""
    try:
        return Delegated(account.uid, account.gid, version)
    except LookupError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(exc))


@pytest.fixture(params=VERSIONS)
def subtrees(request, accounts):
    """alice's and mallory's delegated subtrees, in one cgroup version."""
    alice, mallory = accounts
    trees = [delegated(alice, request.param), delegated(mallory, request.param)]
    try:
        yield trees
    finally:
        for tree in trees:
            tree.remove()


def identifier(tmp_path):
    """A resolver with every engine configured at a folder where none is running."""
    config = replace(
        Config(), **engines_in(str(tmp_path), docker_host=f"unix://{tmp_path}/d.sock")
    )
    return ProcessIdentifier(config)


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# -- Slurm: only slurmd's own placement names a job ---------------------------------------------

FORGED_STEPS = [
    "app_slurmstepd.scope/job_4242/step_0",
    "system.slice/slurmstepd.scope/job_4242/step_0",
    "slurm/uid_{victim}/job_4242/step_0",
]


@async_test
async def test_a_user_cannot_pose_as_part_of_anothers_slurm_job(accounts, subtrees, tmp_path):
    alice, mallory = accounts
    resolver = identifier(tmp_path)
    with slurm_job_process("4242", uid=alice.uid) as genuine:
        job = await resolver.resolve(genuine)
        posers = [
            subtrees[1].run(path.format(victim=alice.uid), "sleep", "600") for path in FORGED_STEPS
        ]
        found = [await resolver.resolve(p.pid) for p in posers]
    assert job.source == "slurm" and dict(job.job)["id"] == "4242" and job.uid == alice.uid
    for identity in found:
        assert identity == host_identity(mallory.uid) and not identity.job


@async_test
async def test_a_forged_step_on_a_jobs_gpu_trespasses_and_never_holds_it(
    accounts, subtrees, tmp_path
):
    """A job map of bare ids learns the job's user from its first process: a forged one must
    not be that process. It is a trespass on the job's GPU, and alice's own process holds it."""
    alice, mallory = accounts
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o755)
    (jobs / "0").write_text("4242\n")
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    async with gpu_running(
        scenario, slurm_job_map=str(jobs), job_map_every=0.05, **engines_in(str(tmp_path))
    ) as h:
        uuid = h.uuids()[0]
        await until(lambda: h.services.leases.state(uuid) == "allocated")
        poser = subtrees[1].run("app_slurmstepd.scope/job_4242/step_0", "sleep", "600")
        scenario.write(processes=[{"pid": poser.pid, "gpu": 0, "name": "python"}])
        await until(lambda: h.services.leases.state(uuid) == "shared")
        claim = (await h.ok("/status"))[uuid]["claim"]
        assert claim["user"]["user"] == "job 4242" and claim["user"]["uid"] is None, claim
        [trespass] = [e for e in await h.ok("/history") if e["event"] == "trespass"]
        assert trespass["user"] == mallory.name and trespass["why"] == "outside_job"
        assert trespass.get("job") is None and trespass["jobs"] == ["4242"]
        with slurm_job_process("4242", uid=alice.uid) as genuine:
            scenario.write(
                processes=[
                    {"pid": poser.pid, "gpu": 0, "name": "python"},
                    {"pid": genuine, "gpu": 0, "name": "python"},
                ]
            )
            await until(lambda: h.services.leases.holder(uuid).uid == alice.uid)
            assert h.services.leases.holder(uuid).user == alice.name
            assert h.services.leases.state(uuid) == "shared"  # mallory's is still not the job's


# -- rootless containers: the owner is the outermost user's, and the process must be theirs -----


@async_test
async def test_a_user_cannot_pose_as_anothers_rootless_container_or_as_root(
    accounts, subtrees, tmp_path, caplog
):
    alice, mallory = accounts
    resolver = identifier(tmp_path)
    aid, other = secrets.token_hex(32), secrets.token_hex(32)
    hers = subtrees[0].run(f"user.slice/docker-{aid}.scope", "sleep", "600")
    forged = [
        f"user-{alice.uid}.slice/docker-{aid}.scope",
        f"user-{alice.uid}.slice/user@{alice.uid}.service/user.slice/docker-{aid}.scope",
        f"user@{alice.uid}.service/docker-{aid}.scope",
        f"user-0.slice/user@0.service/user.slice/docker-{other}.scope",
    ]
    posers = [subtrees[1].run(path, "sleep", "600") for path in forged]
    twice = subtrees[1].run(forged[0], "sleep", "600")  # the same forgery again
    genuine = await resolver.resolve(hers.pid)
    found = [await resolver.resolve(p.pid) for p in posers + [twice]]
    assert genuine.container == (aid[:12], None) and genuine.uid == alice.uid
    assert genuine.account == alice.name
    for identity in found:
        assert identity == host_identity(mallory.uid) and identity.container is None
    said = [w.split(": ", 1)[1] for w in warnings(caplog) if "counts as its own account" in w]
    # one line per forgery, however many processes and paths make it
    assert sorted(said) == sorted(
        [
            f"its cgroup nests the slice of uid {alice.uid} in that of uid {mallory.uid}, around "
            f"container {aid[:12]}",
            f"its cgroup nests the slice of uid 0 in that of uid {mallory.uid}, around container "
            f"{other[:12]}",
        ]
    ), said


@async_test
async def test_a_rootless_containers_process_may_run_as_a_shifted_uid_of_its_users_namespace(
    accounts, subtrees, tmp_path, caplog
):
    """alice's rootless engine runs her container's processes in her user namespace, as her
    subordinate uids: they are hers (the kernel says who made the namespace). A process of
    another user in her container's cgroup, in a namespace of their own, is not."""
    alice, mallory = accounts
    alice.check_user_namespaces()
    resolver = identifier(tmp_path)
    aid = secrets.token_hex(32)
    inside = [
        "unshare",
        "--user",
        "--map-auto",
        "--map-root-user",
        "--",
        "setpriv",
        "--reuid=1000",
        "--regid=1000",
        "--clear-groups",
        "sleep",
        "600",
    ]
    hers = subtrees[0].run(f"user.slice/docker-{aid}.scope", *inside)
    deadline = time.monotonic() + 10
    while procfs.uid(hers.pid) == alice.uid or procfs.userns_owner(hers.pid) != alice.uid:
        assert hers.poll() is None, hers.stderr.read().decode()
        assert time.monotonic() < deadline, "the process never became a shifted uid"
        time.sleep(0.02)
    identity = await resolver.resolve(hers.pid)
    assert identity.container == (aid[:12], None) and identity.uid == alice.uid
    assert procfs.uid(hers.pid) >= Config.shifted_uids_from
    assert not [w for w in warnings(caplog) if "counts as its own account" in w]


ASK = r"""
import http.client, json, sys
host, port, *paths = sys.argv[1:]
answers = []
for path in paths:
    connection = http.client.HTTPConnection(host, int(port), timeout=20)
    connection.request("GET", path)
    answer = connection.getresponse()
    answers.append([answer.status, json.loads(answer.read())])
    connection.close()
print(json.dumps(answers))
"""


def ask_from(tree, where, h, *paths):
    """The answers to `paths`, asked over loopback TCP by the tree's user from the cgroup
    `where` (which they make)."""
    python = python_for(tree.uid)
    process = tree.run(
        where, python, "-c", ASK, "127.0.0.1", str(h.port), *paths, stdout=subprocess.PIPE
    )
    return process


@async_test
async def test_a_poser_can_neither_release_her_gpu_nor_see_her_name(accounts, subtrees, tmp_path):
    """The attack end to end: alice reserves a GPU from her rootless container; mallory, in a
    cgroup named after it under a copy of alice's slice in her own subtree, asks to release it
    and reads /status under --hide-users: refused, and alice's account is not shown to her."""
    alice, mallory = accounts
    aid = secrets.token_hex(32)
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    async with gpu_running(
        scenario,
        hide_users=True,
        **engines_in(str(tmp_path), rootless_docker_socket=None, rootless_podman_socket=None),
    ) as h:
        asking = ask_from(subtrees[0], f"user.slice/docker-{aid}.scope", h, "/request?gpu=1")
        out = await _output(asking)
        [[status, [grant]]] = out
        assert status == 200
        uuid = grant["uuid"]
        holder = h.services.leases.holder(uuid)
        assert holder.container == (aid[:12], None) and holder.account == alice.name
        posing = ask_from(
            subtrees[1],
            f"user-{alice.uid}.slice/docker-{aid}.scope",
            h,
            f"/release?uuid={uuid}",
            "/status",
        )
        [[refused, body], [_, status]] = await _output(posing)
        assert refused == 403, body
        assert h.services.leases.holder(uuid) == holder  # still hers
        assert alice.name not in json.dumps(status) and aid[:12] not in json.dumps(status)
        assert not [e for e in await h.ok("/history") if e["event"] == "release"]


async def _output(process):
    """What a caller printed, read off the event loop (the daemon answers it meanwhile)."""
    import asyncio

    loop = asyncio.get_running_loop()
    out, err = await loop.run_in_executor(None, process.communicate)
    assert process.returncode == 0, err.decode()
    return json.loads(out)
