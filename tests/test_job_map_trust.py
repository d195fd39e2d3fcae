"""The Slurm job map is trusted as --state-dir is, and read with care even then.

Each attack is run for real: a throwaway user's directory or link, a directory others may write
to, a FIFO, links to a secret and a link loop, thousands of bad files, a file of a gigabyte.
A map that is not to be trusted is refused at start by a real `python -m patroller`, and one
that stops being trusted while the daemon runs is read no more; a bad file spoils itself alone,
is told of once, and nothing of what a file says is ever answered beyond the shapes of a job's
id and facts."""

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
from helpers import ROOT, ServerProcess, async_test, forked_as, running, until

from patroller.config import Config
from patroller.observe.jobmap import JobMapWatch, listed, read_map
from patroller.observe.signals import Signals
from patroller.observe.testmode import synthetic_inventory

LINE = "4242 uid=1001 user=carol account=physics partition=gpu\n"
SECRET = "31337 uid=0 user=topsecret account=classified\n"  # shaped as a job line, on purpose


@pytest.fixture
def shared():
    """A directory of root's, mode 1777 as /tmp is, that every user reaches."""
    path = tempfile.mkdtemp(prefix="pjm", dir="/tmp")
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def as_user(user, *command):
    """`command` run by the throwaway user."""
    subprocess.run(
        command,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        cwd="/",
        check=True,
        capture_output=True,
    )


def refused(map_dir):
    """Start a real daemon on `map_dir`; what it said as it exited (it must, with status 1)."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "patroller",
            "--test",
            "--port",
            "0",
            "--address",
            "127.0.0.1",
            "--slurm-job-map",
            str(map_dir),
        ],
        cwd=ROOT,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT, "PATROLLER_STATE_DIR": ""},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"it started on {map_dir}: {err}") from None
    assert process.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("patroller: the Slurm job map"), err
    return lines[0]


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=20) as answer:
        return json.loads(answer.read())


# -- at start --------------------------------------------------------------------------------


def test_a_map_others_may_write_to_is_refused_at_start(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text(LINE)
    for mode in (0o777, 0o775, 0o1777):
        os.chmod(jobs, mode)
        said = refused(jobs)
        assert f"is writable by others (mode {mode:o}, uid 0)" in said and "chmod 755" in said
    os.chmod(jobs, 0o755)
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    os.chmod(open_parent, 0o777)  # not sticky: anyone could replace the map in it
    (open_parent / "jobs").mkdir()
    said = refused(open_parent / "jobs")
    assert "which others may write to (mode 777, not sticky)" in said
    assert "--slurm-job-map" in said
    # Sound: root's, 0755 (and not there yet is no reason to refuse either).
    for sound in (jobs, tmp_path / "not-yet"):
        server = ServerProcess("--test", "--slurm-job-map", str(sound)).start()
        assert server.stop() == 0


def test_a_map_of_another_user_or_reached_through_their_link_is_refused_at_start(stranger, shared):
    # The user makes the map where the prolog would, and lists a job of theirs on GPU 0.
    theirs = os.path.join(shared, "jobs")
    as_user(stranger, "mkdir", "-m", "755", theirs)
    as_user(stranger, "sh", "-c", f"echo '666 user=mallory' > {theirs}/0")
    said = refused(theirs)
    assert f"is not root's or ours (mode 755, uid {stranger.uid})" in said
    # Or a link of theirs to a map of root's, anywhere on the path.
    roots = tempfile.mkdtemp(prefix="pjmroot", dir="/tmp")
    try:
        os.chmod(roots, 0o755)
        as_user(stranger, "ln", "-s", roots, os.path.join(shared, "map"))
        said = refused(os.path.join(shared, "map"))
        assert f"a link another user (uid {stranger.uid}) made" in said
        os.mkdir(os.path.join(roots, "jobs"))
        said = refused(os.path.join(shared, "map", "jobs"))
        assert f"is reached through {shared}/map, a link another user" in said
    finally:
        shutil.rmtree(roots)


# -- while running ---------------------------------------------------------------------------


@async_test
async def test_a_map_that_stops_being_trusted_is_read_no_more(stranger, shared, caplog):
    jobs = os.path.join(shared, "jobs")
    os.mkdir(jobs, 0o755)
    with open(os.path.join(jobs, "0"), "w") as f:
        f.write(LINE)
    with caplog.at_level(logging.INFO, logger="patroller"):
        async with running(slurm_job_map=jobs, job_map_every=0.05) as h:
            uuids = h.uuids()
            state = h.services.leases.state
            watch = next(m for m in h.services.monitors if m.name == "slurm_job_map")
            await until(lambda: state(uuids[0]) == "allocated")

            # A slip: the map is left writable by all. The user frees the job's GPU for
            # themselves and gives GPU 1 to a job of their own: neither is believed.
            os.chmod(jobs, 0o777)
            as_user(stranger, "sh", "-c", f"rm -f {jobs}/0; echo '666 user=mallory' > {jobs}/1")
            failures = watch.failures
            await until(lambda: watch.failures > failures + 5)
            assert state(uuids[0]) == "allocated" and state(uuids[1]) == "free"
            metrics = (await h.ok("/metrics.json"))["monitors"]["slurm_job_map"]
            assert metrics["state"] == "failing"
            said = [r.getMessage() for r in caplog.records if "not trusted" in r.getMessage()]
            assert len(said) == 1 and "is writable by others (mode 777, uid 0)" in said[0]
            assert "the allocations known are kept" in said[0]

            # Given away to the user: told anew, once, with the new reason.
            os.chown(jobs, stranger.uid, stranger.gid)
            os.chmod(jobs, 0o755)
            failures = watch.failures
            await until(lambda: watch.failures > failures + 5)
            said = [r.getMessage() for r in caplog.records if "not trusted" in r.getMessage()]
            assert (
                len(said) == 2 and f"not root's or ours (mode 755, uid {stranger.uid})" in said[1]
            )
            assert state(uuids[0]) == "allocated" and state(uuids[1]) == "free"

            # Made right again (and the user's file taken away): read again; the job ended
            # meanwhile, so its GPU is free.
            os.chown(jobs, 0, 0)
            os.remove(os.path.join(jobs, "1"))
            await until(lambda: state(uuids[0]) == "free")
            assert (await h.ok("/metrics.json"))["monitors"]["slurm_job_map"]["state"] == "up"
            assert state(uuids[1]) == "free"
            assert any("read again" in r.getMessage() for r in caplog.records)

            # The directory the map is in is left open to all, not sticky: the user puts a link
            # of theirs in the map's place, to a directory of root's that lists a job on GPU 1.
            decoy = tempfile.mkdtemp(prefix="pjmdecoy", dir="/tmp")
            try:
                os.chmod(decoy, 0o755)
                with open(os.path.join(decoy, "1"), "w") as f:
                    f.write("666 user=mallory\n")
                os.chmod(shared, 0o777)
                as_user(stranger, "sh", "-c", f"mv {jobs} {jobs}.old && ln -s {decoy} {jobs}")
                await until(
                    lambda: any(
                        f"a link another user (uid {stranger.uid}) made" in r.getMessage()
                        for r in caplog.records
                    )
                )
                failures = watch.failures
                await until(lambda: watch.failures > failures + 5)
                assert state(uuids[1]) == "free"
                assert watch.metrics().state == "failing"
            finally:
                shutil.rmtree(decoy)


def test_a_fifo_in_the_map_spoils_itself_alone_and_sigterm_still_stops_the_daemon(tmp_path):
    # As found: the watch opened the FIFO and waited on it for good: readings stuck, the
    # monitor "up", and SIGTERM obeyed only after 20 s.
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    os.mkfifo(jobs / "0")
    os.mkfifo(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", jobs / "2")  # a link to a FIFO: not followed
    (jobs / "1").write_text(LINE)
    server = ServerProcess("--test", "--slurm-job-map", str(jobs)).start()
    try:
        numbers = {d["number"]: uuid for uuid, d in get(server.url, "/devices").items()}
        deadline = time.monotonic() + 15
        while get(server.url, "/status")[numbers[1]]["claim"]["state"] != "allocated":
            assert time.monotonic() < deadline, server.log
            time.sleep(0.05)
        status = get(server.url, "/status")
        assert [status[numbers[n]]["claim"]["state"] for n in (0, 2)] == ["free", "free"]
        first = get(server.url, "/metrics.json")["monitors"]["slurm_job_map"]["readings"]
        deadline = time.monotonic() + 15
        while (
            get(server.url, "/metrics.json")["monitors"]["slurm_job_map"]["readings"] < first + 2
        ):  # read again and again, not stuck
            assert time.monotonic() < deadline, server.log
            time.sleep(0.1)
    finally:
        began = time.monotonic()
        assert server.stop(signal.SIGTERM, timeout=10) == 0
        took = time.monotonic() - began
    assert took < 3, f"SIGTERM took {took:.1f} s"
    warned = [line for line in server.log.splitlines() if "not read whole" in line]
    assert (
        len(warned) == 1
        and "0 (a FIFO: not read)" in warned[0]
        and "2 (a link: not followed)" in warned[0]
    )


@async_test
async def test_links_to_a_secret_and_a_link_loop_are_ignored_and_never_answered(tmp_path):
    # As found: a map file linked to the 0600 pseudonyms key made the key a job id, answered
    # in /release's 403 to anyone: with it every pseudonym could be turned back into a name.
    state_dir = tmp_path / "state"
    key = state_dir / "pseudonyms.key"
    secret = tmp_path / "secret"  # root's, 0600, and shaped like a line of the map
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    os.symlink(key, jobs / "0")
    os.symlink(secret, jobs / "1")
    os.symlink(jobs / "2", jobs / "2")  # a loop
    (jobs / "3").write_text(LINE)
    async with running(
        slurm_job_map=str(jobs), job_map_every=0.05, hide_users=True, state_dir=str(state_dir)
    ) as h:
        # The key's very text, in a file of the map's own (as root could copy it there): a
        # line of no job.
        shutil.copy(key, jobs / "4")
        uuids = h.uuids()
        watch = next(m for m in h.services.monitors if m.name == "slurm_job_map")
        readings = watch.readings
        await until(lambda: h.services.leases.state(uuids[3]) == "allocated")
        await until(lambda: watch.readings > readings + 3)  # the copy read too
        assert [h.services.leases.state(u) for u in uuids[:5]] == [
            "free",
            "free",
            "free",
            "allocated",
            "free",
        ]
        answers = []
        for path in (
            "/status",
            "/status?user=root",
            "/users?user=root",
            "/history",
            "/metrics.json",
            "/devices",
        ):
            answers.append(json.dumps(await h.ok(path)))
        answers.append((await h.http.fetch(h.url + "/metrics")).body.decode())
        for uuid in uuids[:5]:
            answers.append(
                json.dumps(await h.call(f"/release?uuid={uuid}&user=mallory", "POST", b""))
            )
        told = "\n".join(answers)
        the_key = key.read_text().strip()
        assert the_key not in told and the_key[:12] not in told
        assert "31337" not in told and "topsecret" not in told and "classified" not in told
        # the sound file is read (its job hidden from these callers, as --hide-users hides it)
        assert dict(h.services.leases.holder(uuids[3]).job)["id"] == "4242"


@async_test
async def test_thousands_of_bad_files_cost_a_line_or_two(tmp_path, caplog):
    # 5,000 files that cannot be used: links (dangling and looping), FIFOs, and regular files
    # of GPUs the host does not have. As found: 860 KB of log for 5,000 such files.
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text(LINE)
    for n in range(1, 5001):
        if n <= 1000:
            os.symlink(tmp_path / "nowhere", jobs / str(n))
        elif n <= 2000:
            os.mkfifo(jobs / str(n))
        elif n <= 3000:
            os.symlink(jobs / str(n), jobs / str(n))
        else:
            (jobs / str(n)).write_text(f"{n}\n")
    with caplog.at_level(logging.INFO, logger="patroller"):
        async with running(slurm_job_map=str(jobs), job_map_every=0.05) as h:
            watch = next(m for m in h.services.monitors if m.name == "slurm_job_map")
            await until(lambda: watch.readings >= 5, timeout=30)
            assert h.services.leases.state(h.uuids()[0]) == "allocated"
            lines = [r.getMessage() for r in caplog.records if r.name.endswith("jobmap")]
            assert len(lines) == 2, lines
            assert sum(len(line) for line in lines) < 1000
            assert (
                "3000 file(s) ignored or not read whole: 1 (a link: not followed)"
                in lines[0] + lines[1]
            )
            assert (
                "GPU(s) 3001, 3002, 3003, 3004, 3005, and 1995 more, which" in lines[0] + lines[1]
            )
            # One more goes bad: one more line, naming it alone. One is mended, and breaks
            # again: told again.
            os.remove(jobs / "3")
            os.mkfifo(jobs / "3")
            readings = watch.readings
            await until(lambda: watch.readings > readings + 2)
            os.remove(jobs / "5")
            (jobs / "5").write_text("")
            readings = watch.readings
            await until(lambda: watch.readings > readings + 2)
            os.remove(jobs / "5")
            os.symlink(jobs / "0", jobs / "5")
            readings = watch.readings
            await until(lambda: watch.readings > readings + 2)
            lines = [r.getMessage() for r in caplog.records if r.name.endswith("jobmap")]
            assert [line.split(": ", 1)[1] for line in lines[2:]] == [
                "1 file(s) ignored or not read whole: 3 (a FIFO: not read)",
                "1 file(s) ignored or not read whole: 5 (a link: not followed)",
            ], lines


def test_a_huge_file_is_read_no_further_than_the_limit(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    with open(jobs / "0", "w") as f:
        f.write(LINE + "4243\n")
        f.truncate(1 << 30)  # a gigabyte (sparse): the rest are NUL bytes, on one line
    with open("/proc/self/io") as f:
        before = int(next(line for line in f if line.startswith("rchar:")).split()[1])
    found = read_map(str(jobs), 65536, lambda uid: None)
    with open("/proc/self/io") as f:
        after = int(next(line for line in f if line.startswith("rchar:")).split()[1])
    assert after - before <= 65537 + 4096  # the file's first 64 KiB and a byte, and /proc
    assert [job.id for job in found.allocations[0].jobs] == ["4242", "4243"]
    assert found.problems == {"0": "over 65536 bytes: the lines past them are not read"}


def test_a_file_that_cannot_be_read_keeps_its_jobs_and_spoils_no_other(stranger, shared):
    """A daemon that does not run as root reads a map of root's; one of its files becomes
    unreadable to it: that GPU keeps the jobs last read of it, the others are read on."""
    jobs = os.path.join(shared, "jobs")
    os.mkdir(jobs, 0o755)
    for name, text in (("0", LINE), ("1", "4250 user=bo\n")):
        with open(os.path.join(jobs, name), "w") as f:
            f.write(text)
    os.chown(os.path.join(jobs, "0"), stranger.uid, stranger.gid)  # so that it can chmod it

    def watch():
        signals, told = Signals(), []
        signals.scheduler_allocation.connect(
            lambda sender, record: told.append(
                (record.uuid[-4:], record.allocation.ids() if record.allocation else None)
            ),
            weak=False,
        )
        inventory = synthetic_inventory(2)
        ours = JobMapWatch(inventory, signals, Config(slurm_job_map=jobs))

        async def readings():
            await ours.read()
            os.chmod(os.path.join(jobs, "0"), 0)  # unreadable to its owner, who is not root
            await ours.read()
            await ours.read()

        asyncio.run(readings())
        return (
            [(d.uuid[-4:], d.number) for d in inventory],
            told,
            ours.metrics().state,
            ours._problems,
        )

    devices, told, state, problems = forked_as(stranger, watch)
    number = dict(devices)
    assert sorted((number[uuid], ids) for uuid, ids in told) == [(0, ("4242",)), (1, ("4250",))]
    assert state == "up" and problems == {"0": "cannot be read: Permission denied"}


def test_each_kind_of_entry_not_read_says_what_it_is(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    os.mkfifo(jobs / "0")
    (jobs / "1").mkdir()
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(jobs / "2"))
    os.symlink(tmp_path / "elsewhere", jobs / "3")
    (jobs / "4").write_text(LINE)
    try:
        found = read_map(str(jobs), 65536, lambda uid: None)
    finally:
        listening.close()
    assert found.problems == {
        "0": "a FIFO: not read",
        "1": "a directory: not read",
        "2": "not a regular file: not read",
        "3": "a link: not followed",
    }
    assert list(found.allocations) == [4]


def test_a_warning_names_five_and_counts_the_rest():
    assert listed(str(n) for n in range(5)) == "0, 1, 2, 3, 4"
    assert listed(str(n) for n in range(7)) == "0, 1, 2, 3, 4, and 2 more"


@pytest.mark.parametrize(
    "text, limit, ids, problem",
    [
        (b"4242\n4243\n", 10, ["4242", "4243"], None),  # exactly the limit: read whole
        (b"4242\n4243\n", 9, ["4242"], "over 9 bytes: the lines past them are not read"),
        (b"4242\n\xff\xfe not utf-8\n4243\n", 1000, ["4242", "4243"], None),
    ],
)
def test_a_file_is_read_to_its_last_whole_line_within_the_limit(
    tmp_path, text, limit, ids, problem
):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_bytes(text)
    found = read_map(str(jobs), limit, lambda uid: None)
    assert [job.id for job in found.allocations[0].jobs] == ids
    assert found.problems == ({"0": problem} if problem else {})


# -- between the check and the use ----------------------------------------------------------


@pytest.mark.parametrize("change", ["mode", "owner"])
def test_a_map_that_stops_being_trusted_while_it_is_read_gives_nothing(tmp_path, change):
    """The directory is checked before it is read and again after: one that others could write
    to meanwhile (made 777, or given to another user, while its files are read) gives nothing
    of what was read. The change is made from inside the reading, deterministically: naming a
    job's user from its uid (`user_of`) is called between the two checks."""
    from patroller.config.trust import Untrusted

    if change == "owner" and os.geteuid() != 0:
        pytest.skip("giving a directory away takes root")
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o755)
    (jobs / "0").write_text("4242 uid=1001\n")  # a uid alone: its user is looked up
    looked_up = []

    def user_of(uid):
        looked_up.append(uid)
        if change == "mode":
            os.chmod(jobs, 0o777)
        else:
            os.chown(jobs, 65533, 65533)
        return "carol"

    with pytest.raises(Untrusted) as error:
        read_map(str(jobs), 65536, user_of)
    assert looked_up == [1001], "the change came between the checks"
    said = "writable by others (mode 777" if change == "mode" else "not root's or ours"
    assert said in str(error.value), error.value
    os.chmod(jobs, 0o755)
    if change == "owner":
        os.chown(jobs, 0, 0)
    assert (
        read_map(str(jobs), 65536, lambda uid: "carol").allocations[0].jobs[0].user == "carol"
    )  # trusted again: read again


def test_a_file_swapped_for_a_fifo_after_its_look_is_not_read(tmp_path, monkeypatch):
    """An entry is looked at (a regular file), then opened: what was opened is looked at again,
    and a FIFO put there between the two is not read. The swap is made as the look returns."""
    import types

    from patroller.observe import jobmap

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text(LINE)
    swapped = []

    def look_then_swap(name, *args, **kwargs):
        found = os.stat(name, *args, **kwargs)
        if name == "0" and not swapped:
            os.unlink(jobs / "0")
            os.mkfifo(jobs / "0")
            swapped.append(name)
        return found

    seen_as = {name: getattr(os, name) for name in dir(os) if not name.startswith("__")}
    monkeypatch.setattr(jobmap, "os", types.SimpleNamespace(**{**seen_as, "stat": look_then_swap}))
    found = read_map(str(jobs), 65536, lambda uid: None)
    assert swapped == ["0"]
    assert found.problems == {"0": "a FIFO: not read"} and found.allocations == {}
