"""The Slurm job map (--slurm-job-map): its format read from files on disk, and the daemon that
watches it: an allocated GPU shows its job and user and is never granted, a process outside
the job on it trespasses, an allocated GPU with nothing running is idle like a reservation, and
the GPU is grantable again once the file goes."""

import asyncio
import logging
import os
import subprocess
from dataclasses import replace as changed

import pytest
from helpers import (
    NOBODY,
    ScenarioFile,
    async_test,
    gpu_running,
    known_claim,
    running,
    slurm_job_process,
    until,
)

from patroller.config import Config
from patroller.core.devices import Inventory
from patroller.core.jobs import Allocation, Job
from patroller.observe.jobmap import (
    JobMapWatch,
    Reading,
    gpu_index,
    named,
    parse_files,
    parse_line,
    read_map,
)
from patroller.observe.signals import Signals
from patroller.observe.testmode import synthetic_inventory


@pytest.mark.parametrize(
    "line,job",
    [
        ("4242", Job("4242")),  # the plain format: one job id per line
        ("  4242  \n", Job("4242")),
        ("45916256 262563", Job("45916256", uid=262563)),  # id and uid, as some prologs write
        (
            "4242 uid=1001 user=carol account=physics partition=gpu",
            Job("4242", uid=1001, user="carol", account="physics", partition="gpu"),
        ),
        ("4242 sluid=sEKNKTV3WPV500 uid=1001", Job("4242", uid=1001, sluid="sEKNKTV3WPV500")),
        ("4242 colour=blue uid=x", Job("4242")),  # words it does not know, a uid that is none
        ("sEKNKTV3WPV500 1001", Job("sEKNKTV3WPV500", uid=1001)),  # a SLUID as the id
        # only the word right after the id may be a bare uid: a later number is no one's uid
        ("4242 account=physics 1001", Job("4242", account="physics")),
        ("4242 1001 2002", Job("4242", uid=1001)),
        # values of no sane shape are dropped, never echoed: control characters, markup, length
        (
            "4242 user=ca\x1brol account=<b>x</b> partition=" + "p" * 65 + " uid=12345678901",
            Job("4242"),
        ),
        ("4242 user=al\u00efce sluid=s123 account=vision-lab", Job("4242", account="vision-lab")),
    ],
)
def test_a_line_names_a_job_with_what_the_prolog_knew(line, job):
    assert parse_line(line) == job


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "# a comment",
        "42/../43",
        "4242;rm",
        "x" * 65,
        "4242_1",
        "abc",
        "1" * 21,
        "s123",
        "sekNKTV3WPV500",
        "\uff14\uff12",  # full-width digits are no job id
        "8f3a" * 16 + "\n",
    ],
)  # a pseudonyms key (hex) is no job id
def test_a_line_that_names_no_job_is_skipped(line):
    assert parse_line(line) is None


@pytest.mark.parametrize(
    "name,index",
    [
        ("0", 0),
        ("13", 13),
        ("3.1", 3),
        ("3.12", 3),
        (".3.new", None),
        ("3.tmp", None),
        ("gpu3", None),
        ("-1", None),
        ("", None),
        ("３", None),
    ],
)
def test_a_file_is_of_the_gpu_its_name_says(name, index):
    assert gpu_index(name) == index


def test_files_of_one_gpu_merge_their_jobs_once_each():
    found = parse_files(
        [("2", "10\n11\n"), ("2.1", "11\n12 uid=5\n"), ("5", "\n\n"), ("notes", "99\n")]
    )
    assert found == {2: Allocation((Job("10"), Job("11"), Job("12", uid=5)))}


def test_the_directory_is_read_with_users_named_from_uids(tmp_path):
    (tmp_path / "0").write_text("4242 uid=0\n")
    (tmp_path / "1").write_text("4243 uid=1001 user=carol\n")
    (tmp_path / ".1.tmp").write_text("9999\n")  # a prolog's file being written
    (tmp_path / "7").mkdir()
    found = read_map(str(tmp_path), 65536, lambda uid: {0: "root"}.get(uid))
    assert found.allocations == {
        0: Allocation((Job("4242", uid=0, user="root"),)),
        1: Allocation((Job("4243", uid=1001, user="carol"),)),
    }
    assert found.problems == {"7": "a directory: not read"}


def test_a_directory_not_there_holds_no_allocation_and_a_file_there_is_an_error(tmp_path):
    assert read_map(str(tmp_path / "none"), 65536, lambda uid: None).allocations == {}
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        read_map(str(tmp_path / "file"), 65536, lambda uid: None)


def test_a_huge_file_is_read_only_so_far(tmp_path):
    (tmp_path / "0").write_text("1\n" + "2" * 100000 + "\n3\n")
    (tmp_path / "1").write_text("4\n5" + "\n" * 1100)  # cut after a whole line: 5 is read
    found = read_map(str(tmp_path), 1024, lambda uid: None)
    assert found.allocations == {0: Allocation((Job("1"),)), 1: Allocation((Job("4"), Job("5")))}
    assert found.problems == {
        "0": "over 1024 bytes: the lines past them are not read",
        "1": "over 1024 bytes: the lines past them are not read",
    }


# -- the daemon ------------------------------------------------------------------------------


def write(path, text):
    """As the prolog writes: a dot file, renamed over."""
    temporary = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".new")
    with open(temporary, "w") as f:
        f.write(text)
    os.replace(temporary, path)


@async_test
async def test_an_allocated_gpu_shows_its_job_and_is_never_granted(tmp_path, caplog):
    jobs = tmp_path / "jobs"  # not there at start: the prolog makes it at the first job
    caplog.set_level(logging.INFO, logger="patroller.observe.jobmap")
    async with running(slurm_job_map=str(jobs), job_map_every=0.05) as h:
        assert (
            f"the Slurm job map {jobs} is not there yet: no GPU is allocated to a job until "
            "the prolog writes it" in [r.getMessage() for r in caplog.records]
        )
        uuid = h.uuids()[2]
        jobs.mkdir()
        write(str(jobs / "2"), "4242 uid=1001 user=carol account=physics partition=gpu\n")
        await until(lambda: h.services.leases.state(uuid) == "allocated")
        claim = (await h.ok("/status"))[uuid]["claim"]
        assert claim["state"] == "allocated" and claim["hold"] == "slurm"
        assert claim["user"]["user"] == "carol" and claim["user"]["job"]["id"] == "4242"
        assert claim["jobs"] == [
            {"id": "4242", "user": "carol", "uid": 1001, "account": "physics", "partition": "gpu"}
        ]
        granted = [(await h.ok("/request?gpu=1&user=alice"))[0]["uuid"] for _ in range(7)]
        assert uuid not in granted
        status, busy = await h.call("/request?gpu=1&user=bob")
        assert status == 409 and busy["free"] == {"gpu": 0}
        status, refused = await h.call(f"/release?uuid={uuid}&user=carol", "POST", b"")
        assert status == 403 and refused["jobs"] == ["4242"]
        # the epilog removes the file: the GPU is grantable again, and a waiter gets it
        os.remove(jobs / "2")
        [got] = await h.ok("/wait?gpu=1&user=bob&timeout=10")
        assert got["uuid"] == uuid
        events = [e["event"] for e in await h.ok("/history")]
        assert "allocated" in events and "deallocated" in events


@async_test
async def test_an_unreadable_map_keeps_the_allocations_known(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write(str(jobs / "0"), "4242 uid=1001 user=carol\n")
    async with running(slurm_job_map=str(jobs), job_map_every=0.05) as h:
        uuid = h.uuids()[0]
        await until(lambda: h.services.leases.state(uuid) == "allocated")
        os.rename(jobs, tmp_path / "away")
        jobs.write_text("not a directory")
        watch = next(m for m in h.services.monitors if m.name == "slurm_job_map")
        failures = watch.failures
        await until(lambda: watch.failures > failures + 2)
        assert h.services.leases.state(uuid) == "allocated"
        monitors = (await h.ok("/metrics.json"))["monitors"]
        assert monitors["slurm_job_map"]["state"] == "failing"
        jobs.unlink()
        jobs.mkdir()  # readable again, and empty: the job ended meanwhile
        await until(lambda: h.services.leases.state(uuid) == "free")
        assert (await h.ok("/metrics.json"))["monitors"]["slurm_job_map"]["state"] == "up"


@async_test
async def test_a_process_outside_the_job_on_its_gpu_trespasses(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    with slurm_job_process("4242", account="vision-lab", partition="gpu") as pid:
        outsider = subprocess.Popen(["sleep", "120"])  # root, on the host: in no job
        try:
            async with gpu_running(scenario, slurm_job_map=str(jobs), job_map_every=0.05) as h:
                uuid = h.uuids()[1]
                write(str(jobs / "1"), f"4242 uid={NOBODY}\n")  # ids and uids only
                await until(lambda: h.services.leases.state(uuid) == "allocated")
                scenario.write(processes=[{"pid": pid, "gpu": 1, "name": "python"}])
                await until(lambda: known_claim(h.services.leases, uuid))
                claim = (await h.ok("/status"))[uuid]["claim"]
                assert claim["user"]["uid"] == NOBODY and claim["user"]["job"]["id"] == "4242"
                scenario.write(
                    processes=[
                        {"pid": pid, "gpu": 1, "name": "python"},
                        {"pid": outsider.pid, "gpu": 1, "name": "sleep"},
                    ]
                )
                await until(lambda: h.services.leases.state(uuid) == "shared")
                trespasses = [e for e in await h.ok("/history") if e["event"] == "trespass"]
                assert len(trespasses) == 1 and trespasses[0]["pid"] == outsider.pid
                assert trespasses[0]["why"] == "outside_job" and trespasses[0]["jobs"] == ["4242"]
                users = await h.ok("/users")
                assert users["root"]["trespassing"] == 1
                assert users[claim["user"]["user"]]["trespassing"] == 0
                metrics = (await h.http.fetch(h.url + "/metrics")).body.decode()
                assert 'patroller_user_gpus_trespassing{user="root"} 1.0' in metrics
        finally:
            outsider.kill()
            outsider.wait()


@async_test
async def test_an_allocated_gpu_with_nothing_running_is_idle(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write(str(jobs / "0"), "4242 uid=1001 user=carol\n")
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    async with gpu_running(
        scenario, slurm_job_map=str(jobs), job_map_every=0.05, idle_after=0.5, idle_release=0.5
    ) as h:
        uuid = h.uuids()[0]
        await until(lambda: h.services.idle.idle_for(uuid) is not None)
        claim = (await h.ok("/status"))[uuid]["claim"]
        assert claim["state"] == "allocated" and claim["idle_for"] >= 0.5
        assert (await h.ok("/users"))["carol"]["idle"] == 1
        # --idle-release never ends a Slurm job's allocation: Slurm ends its jobs
        await until(lambda: h.services.idle.idle_for(uuid) > 2)
        assert h.services.leases.state(uuid) == "allocated"


def test_the_watch_matches_indices_to_devices_afresh_after_a_renumbering(tmp_path):
    """Two GPUs swap numbers (a GPU host's inventory can say so): the allocation follows the
    index, and the device that no longer has it is told so."""
    devices = list(synthetic_inventory(2))
    signals, told = Signals(), []
    signals.scheduler_allocation.connect(lambda sender, record: told.append(record), weak=False)
    watch = JobMapWatch(Inventory(devices), signals, Config(slurm_job_map=str(tmp_path)))
    allocation = {0: Allocation((Job("7"),))}
    watch.apply(allocation)
    watch.inventory = Inventory([changed(devices[0], number=1), changed(devices[1], number=0)])
    watch.reconfigure()
    watch.apply(allocation)
    assert [(r.uuid, r.allocation) for r in told] == [
        (devices[0].uuid, allocation[0]),
        (devices[0].uuid, None),
        (devices[1].uuid, allocation[0]),
    ]


def test_a_lost_gpu_is_allocated_to_no_job(tmp_path):
    """The map still names a GPU that has left the host (lost): nothing is allocated on it,
    and once it is back the map's job holds it."""
    devices = list(synthetic_inventory(2))
    signals, told = Signals(), []
    signals.scheduler_allocation.connect(lambda sender, record: told.append(record), weak=False)
    watch = JobMapWatch(
        Inventory([devices[0], changed(devices[1], lost=True)]),
        signals,
        Config(slurm_job_map=str(tmp_path)),
    )
    allocation = {0: Allocation((Job("7"),)), 1: Allocation((Job("8"),))}
    watch.apply(allocation)
    assert [(r.uuid, r.allocation) for r in told] == [(devices[0].uuid, allocation[0])]
    watch.inventory = Inventory(devices)
    watch.apply(allocation)
    assert [(r.uuid, r.allocation) for r in told][1:] == [(devices[1].uuid, allocation[1])]


def test_files_not_read_are_told_of_in_the_order_of_their_gpus(tmp_path, caplog):
    watch = JobMapWatch(synthetic_inventory(2), Signals(), Config(slurm_job_map=str(tmp_path)))
    watch.report(
        {"10": "a FIFO: not read", "9.1": "a link: not followed", "9": "a directory: not read"}
    )
    watch.report({"10": "a FIFO: not read", "2": "a FIFO: not read"})  # one new
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"the Slurm job map {tmp_path}: 3 file(s) ignored or not read whole: 9 (a directory: "
        "not read), 9.1 (a link: not followed), 10 (a FIFO: not read)",
        f"the Slurm job map {tmp_path}: 1 file(s) ignored or not read whole: 2 (a FIFO: not read)",
    ]


def test_gpus_the_host_does_not_have_are_told_of_once(tmp_path, caplog):
    watch = JobMapWatch(synthetic_inventory(2), Signals(), Config(slurm_job_map=str(tmp_path)))
    for _ in range(2):
        watch.apply({1: Allocation((Job("7"),)), 7: Allocation((Job("8"),))})
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "the Slurm job map names GPU(s) 7, which this host does not have: ignored (are "
        "Slurm's GRES indices nvidia-smi's?)"
    ]


def test_a_map_that_cannot_be_read_says_why_in_words(tmp_path, caplog):
    path = tmp_path / "jobs"
    path.write_text("")  # a file, where the directory should be
    watch = JobMapWatch(synthetic_inventory(2), Signals(), Config(slurm_job_map=str(path)))
    asyncio.run(watch.read())
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"cannot read the Slurm job map {path}: Not a directory; the allocations known are kept"
    ]


def test_a_job_named_from_its_uid_keeps_what_else_the_map_says():
    job = Job("4242", 1001, None, "physics", "gpu", "s0123456789ABC")
    assert named((job,), {}, lambda uid: "carol") == (
        Job("4242", 1001, "carol", "physics", "gpu", "s0123456789ABC"),
    )


def test_a_map_not_there_reads_as_nothing_and_other_names_are_not_looked_at(tmp_path):
    assert read_map(str(tmp_path / "none"), 4096, lambda uid: None) == Reading({}, frozenset(), {})
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    os.mkfifo(jobs / "README")  # no GPU's: never looked at, not even to say it is a FIFO
    (jobs / "0").write_text("4242\n")
    found = read_map(str(jobs), 4096, lambda uid: None)
    assert found.problems == {} and list(found.entries) == ["0"]


def test_a_file_longer_than_one_read_is_read_whole(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    ids = [str(100000 + n) for n in range(12000)]  # 84,000 bytes: two reads
    (jobs / "0").write_text("".join(f"{i}\n" for i in ids))
    found = read_map(str(jobs), 1 << 20, lambda uid: None)
    assert [job.id for job in found.allocations[0].jobs] == ids
