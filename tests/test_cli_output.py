"""What the command line prints, as a new user meets it: every table fitted to 80 columns and
no name cut when it fits (piped or wider), `report --by gpu,user` by the GPU's number, the
report's range said as the whole hours it counts, `--tz` with a negative offset, a trespasser
on a Slurm job's GPU said as one, whose processes a release waits for, and a pipe closed early
ended quietly. Against real daemons (test mode with a usage store, the simulator, a process in
a real job's cgroup) and real pipes."""

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request

import pytest
from helpers import (
    NOBODY,
    ROOT,
    ScenarioFile,
    ServerProcess,
    async_test,
    gpu_running,
    need_root,
    slurm_job_process,
    until,
)
from test_cli import ENV, call, claims, eventually, gpuhost, on_gpu, scenario, uuid_of  # noqa: F401 (fixtures)
from test_report import stored

from patroller import client
from patroller.cli import status as status_table
from patroller.cli.arguments import offsets_joined
from patroller.cli.records import history_table, queue_table, users_table
from patroller.cli.usage import table as report_table
from patroller.cli.usage import title
from patroller.cli.usageanswers import summed
from patroller.core.usage import Party

ALICE = "alice@example.org"
LONG = "a.rather.long.name.for.a.person@research-computing.example.org"  # 62 characters
COMMANDS = [
    ("report",),
    ("report", "--by", "gpu"),
    ("report", "--by", "gpu,user"),
    ("report", "--by", "user,day"),
    ("history",),
    ("users",),
    ("queue",),
]


def patroller(*args, columns=None, **kwargs):
    env = {name: value for name, value in ENV.items() if name != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "patroller.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    """A test-mode daemon whose store holds 2 h of LONG's GPU and a free one, where ALICE and
    LONG hold GPUs, bob has held one and carol waits: every table has rows."""
    state = stored(
        tmp_path_factory.mktemp("output") / "state", 120, Party(user=LONG, account="long")
    )
    daemon = ServerProcess(
        "--test", "--lease", "300", "--state-dir", str(state), "--usage-interval", "1h"
    ).start()
    server = daemon.server
    assert call(server, f"/request?gpu=2&user={ALICE}")[0] == 200
    assert call(server, f"/request?gpu=5&user={LONG}&hold=2h")[0] == 200
    assert call(server, "/request?gpu=1&user=bob")[0] == 200
    assert call(server, "/release?user=bob")[0] == 200
    waiting = threading.Thread(
        target=urllib.request.urlopen,
        kwargs={"url": f"http://{server}/wait?gpu=4&user=carol&timeout=3600", "timeout": 3600},
    )
    waiting.start()
    eventually(lambda: client.queue(server), what="carol waiting")
    yield server
    for user in (ALICE, LONG):  # carol is served, and her wait ends
        call(server, f"/release?user={user}")
    waiting.join(60)
    daemon.stop()


def waited(text):
    """The text's words, its durations (carol's wait: 59s, then 1m00s) said alike."""
    return [
        re.sub(r"\b[\d.]+[dhms](\d+[dhms])*\b", "T", line).split() for line in text.splitlines()
    ]


def widest(text):
    return max(len(line) for line in text.splitlines())


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_every_table_fits_80_columns_and_cuts_no_name_piped_or_wide(busy, args):
    piped = patroller(*args, "--server", busy)
    assert piped.returncode == 0, piped.stderr
    if args not in (("queue",), ("report", "--by", "gpu")):  # carol's; GPUs alone
        assert LONG in piped.stdout, piped.stdout  # whole, however long
    assert "…" not in piped.stdout
    wide = patroller(*args, "--server", busy, columns=200)
    assert waited(wide.stdout) == waited(piped.stdout)  # it fits: nothing gives way
    narrow = patroller(*args, "--server", busy, columns=80)
    assert narrow.returncode == 0, narrow.stderr
    assert widest(narrow.stdout) <= 80, narrow.stdout
    if args[0] == "users":
        assert ALICE in narrow.stdout  # it fits in 80 columns: it is not cut
    if args in (("report",), ("history",)):
        assert ALICE in narrow.stdout or args == ("report",)


def test_by_gpu_and_user_shows_each_gpus_number_and_its_user(busy):
    done = patroller("report", "--by", "gpu,user", "--server", busy)
    lines = done.stdout.splitlines()
    header = next(n for n, line in enumerate(lines) if line.startswith("GPU "))
    assert lines[header].split()[:3] == ["GPU", "USER", "GPU-HOURS"]
    keys = [line.split()[:2] for line in lines[header + 1 :] if re.match(r"\d+\s", line)]
    assert keys == [["0", LONG], ["1", "(none)"]], done.stdout  # not the uuids GPU-a, GPU-b
    assert "GPU-a" not in done.stdout
    answer = client.get_json(busy, "/usage?by=gpu,user")  # over two hosts: each one's GPUs
    both = summed([("gpu1:8080", answer), ("gpu2:8080", answer)])
    text = report_table(both)
    assert [line.split()[:3] for line in text.splitlines() if line.startswith("gpu")] == [
        ["gpu1:8080", "0", LONG],
        ["gpu2:8080", "0", LONG],
        ["gpu1:8080", "1", "(none)"],
        ["gpu2:8080", "1", "(none)"],
    ], text


def test_a_narrow_terminal_gives_way_in_the_tables_order(busy):
    """At 80 columns the report says two headers short, leaves out the categories nobody has
    hours in (and says which), and cuts the long name last; history shortens its times."""
    report = patroller("report", "--server", busy, columns=80).stdout
    header = next(line for line in report.splitlines() if line.startswith("USER"))
    assert header.split()[1:4] == ["HOURS", "SHARE", "ACTIVE"]
    assert report.splitlines()[-1] == "no GPU-time in UNUSED, TRESPASS, UNASKED, LOST"
    assert LONG[:23] + "…" in report
    history = patroller("history", "--server", busy, columns=80).stdout
    assert re.match(r"\d\d-\d\d \d\d:\d\d:\d\d  grant ", history.splitlines()[1]), history
    assert re.search(r"\bhold=\d+[smhd]\b", history), history  # the hold's length, as said


def test_the_tables_fit_at_80_from_the_live_bodies(busy):
    events = client.get_json(busy, "/history")
    users = client.users(busy)
    waiters = client.queue(busy)
    answer = client.get_json(busy, "/usage?by=user")
    for text in (
        history_table(events, width=80),
        users_table(users, width=80),
        queue_table(waiters, width=80),
        report_table(answer, width=80),
    ):
        assert widest(text) <= 80, text
    assert widest(history_table(events)) > 80  # every character, piped
    busiest = json.loads(json.dumps(answer))  # hours in every category: none to leave out
    for hours in (busiest["rows"][0]["hours"], busiest["total"]["hours"]):
        hours.update({category: 1234.5 for category in hours})
    text = report_table(busiest, width=80)
    assert widest(text) <= 80 and "no GPU-time in" not in text, text
    assert LONG[:10] in text and LONG not in text  # the name gave way last, to what was left
    assert LONG in users_table(users) and LONG not in users_table(users, width=80)


def test_the_range_line_says_the_whole_hours_counted_and_since_when_there_are_records():
    answer = {
        "by": "user",
        "since": "2026-12-04T04:10:00.000+00:00",
        "until": "2026-12-04T05:10:00.000+00:00",
        "first": "2026-12-04T04:00:00.000+00:00",
    }
    assert title(answer) == [
        "GPU-hours by user in the whole hours from 2026-12-04T04:00Z to 2026-12-04T06:00Z (2h)"
    ]  # the hour of 05:10 counts whole
    later = {
        **answer,
        "since": "2026-12-03T04:10:00.000+00:00",
        "until": "2026-12-04T05:00:00.000+00:00",
    }
    assert title(later, 80) == [
        "GPU-hours by user in the whole hours",
        "from 2026-12-03T04:00Z to 2026-12-04T05:00Z (1d01h)",
        "nothing recorded before 2026-12-04T04:00Z",
    ]
    assert title({**later, "first": None}) == [
        "GPU-hours by user in the whole hours from 2026-12-03T04:00Z to 2026-12-04T05:00Z (1d01h)"
    ]


def test_a_negative_offset_is_taken_as_written_spaced_or_joined(busy):
    for words in (("--tz", "-10:00"), ("--tz=-10:00",), ("--tz", "-0930")):
        done = patroller("report", *words, "--json", "--by", "day", "--server", busy)
        assert done.returncode == 0, (words, done.stderr)
        assert json.loads(done.stdout)["tz"] == words[-1].split("=")[-1]
    table = patroller("report", "--by", "hour", "--tz", "-10:00", "--server", busy)
    assert table.returncode == 0 and "HOUR" in table.stdout, table.stderr
    assert offsets_joined(["report", "--tz", "+02:00"]) == ["report", "--tz=+02:00"]
    assert offsets_joined(["run", "--", "tool", "--tz", "-1"]) == [
        "run",
        "--",
        "tool",
        "--tz",
        "-1",
    ]  # a command's own
    assert offsets_joined(["report", "--tz", "-x"]) == ["report", "--tz", "-x"]


# --- a trespasser on a Slurm job's GPU --------------------------------------------------------


@async_test
async def test_a_process_outside_a_jobs_gpu_is_shown_trespassing_not_as_the_job(tmp_path):
    """Job 4242 of nobody holds GPU 1 (the job map says so) and its process runs there; another
    process of nobody, in no job, runs there too. /status marks that one `trespass`, as /users
    counts it, and `status` shows it as trespassing, with a note; not as `nobody (job 4242)`."""
    need_root("a job's cgroup, a process of uid 65534")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "1").write_text(f"4242 uid={NOBODY} account=vision-lab partition=gpu\n")
    simulated = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    outsider = subprocess.Popen(["sleep", "300"], user=NOBODY, group=NOBODY, extra_groups=[])
    try:
        with slurm_job_process("4242") as member:
            async with gpu_running(simulated, slurm_job_map=str(jobs), job_map_every=0.05) as h:
                uuid = h.uuids()[1]
                await until(lambda: h.services.leases.state(uuid) == "allocated")
                simulated.write(
                    processes=[
                        {"pid": member, "gpu": 1, "name": "python"},
                        {"pid": outsider.pid, "gpu": 1, "name": "miner"},
                    ]
                )
                hold = h.services.leases.holds[uuid]
                await until(
                    lambda: (
                        len(hold.processes) == 2
                        and hold.holder is not None
                        and not any(o.identifying for o in hold.processes.values())
                    )
                )
                body, devices = await h.ok("/status"), await h.ok("/devices")
                users = await h.ok("/users")
    finally:
        outsider.kill()
        outsider.wait()
    detail = {p["pid"]: p["trespass"] for p in body[uuid]["claim"]["process_detail"]}
    assert detail == {member: False, outsider.pid: True}
    name = body[uuid]["claim"]["user"]["user"]
    assert users[name]["trespassing"] == 1
    text = status_table.format_status(body, devices)
    lines = {line.split()[1]: line for line in text.splitlines() if "└" in line}
    assert f"{name} (job 4242)" in lines[str(member)]
    assert f"{name} (trespassing)" in lines[str(outsider.pid)]
    assert "job 4242" not in lines[str(outsider.pid)]
    assert (
        f"GPU 1: process {outsider.pid} of {name} runs outside job 4242: trespassing"
        in text.splitlines()
    )


# --- whose processes a release waits for ------------------------------------------------------

NOBODY_HOLDS = """
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/request?gpu=1&hold=1h", timeout=30) as answer:
    print(json.loads(answer.read())[0]["info"]["number"])
"""


def test_root_releasing_a_gpu_in_use_is_told_whose_processes_it_waits_for(gpuhost, scenario):
    need_root("root releases uid 65534's GPU while its process runs")
    server = gpuhost.server
    taken = subprocess.run(
        ["/usr/bin/python3", "-c", NOBODY_HOLDS, f"http://{server}"],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert taken.returncode == 0, taken.stderr
    number = int(taken.stdout)
    theirs = subprocess.Popen(["sleep", "300"], user=NOBODY, group=NOBODY, extra_groups=[])
    try:
        scenario.write(processes=on_gpu((theirs.pid, number)))
        eventually(
            lambda: (
                claims(server)[uuid_of(server, number)]["state"] == "claimed"
                and claims(server)[uuid_of(server, number)]["processes"]
            ),
            what="claimed",
        )
        whose = claims(server)[uuid_of(server, number)]["user"]["user"]
        done = patroller("release", str(number), "--reason", "stuck", "--server", server)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"GPU {number} will be free when {whose}'s processes on it end\n"
    finally:
        theirs.kill()
        theirs.wait()


# --- a reader that leaves early ---------------------------------------------------------------


def closed_pipe():
    """A pipe whose reader has already gone: every write to it fails (EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    return write


BUFFERED = {name: value for name, value in ENV.items() if name != "PYTHONUNBUFFERED"}


@pytest.mark.parametrize(
    "env", [BUFFERED, {**ENV, "PYTHONUNBUFFERED": "1"}], ids=["buffered", "unbuffered"]
)  # a shell's; then each print writes
@pytest.mark.parametrize(
    "args",
    [("report", "--json"), ("report",), ("history",), ("status",), ("status", "--json")],
    ids=" ".join,
)
def test_a_pipe_closed_before_the_output_ends_quietly(busy, args, env):
    out = closed_pipe()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "patroller.cli", *args, "--server", busy],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(out)
    assert done.stderr == "" and done.returncode == 141, done.stderr  # 128 + SIGPIPE


def test_status_watch_into_head_ends_when_head_does(busy):
    """`patroller status --watch 1 | head -3`: head reads three lines and leaves; the next
    redraw finds the pipe closed and the command ends, saying nothing."""
    head = subprocess.Popen(["head", "-3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    watch = subprocess.Popen(
        [sys.executable, "-m", "patroller.cli", "status", "--watch", "0.5", "--server", busy],
        env=BUFFERED,
        cwd=ROOT,
        stdout=head.stdin,
        stderr=subprocess.PIPE,
        text=True,
    )
    head.stdin.close()  # the watch holds the pipe's only writing end
    try:
        shown = head.stdout.read()
        assert head.wait(30) == 0 and len(shown.splitlines()) == 3
        assert watch.wait(30) == 141
        assert watch.stderr.read() == ""
    finally:
        watch.kill()
        watch.wait()
        head.stdout.close()
        watch.stderr.close()
