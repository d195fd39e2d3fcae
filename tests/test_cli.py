"""The command line (`patroller run|status|release|wait`) against real daemons and processes."""

import json
import os
import pwd
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import ROOT, ScenarioFile, ServerProcess, alive, claimed_known, need_root

from patroller import client
from patroller.cli import render, status, table

TESTS = os.path.dirname(os.path.abspath(__file__))
ENV = {
    name: value
    for name, value in os.environ.items()
    if name not in ("PATROLLER_SERVER", "NO_COLOR", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
}
ENV["PYTHONPATH"] = ROOT
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def patroller(*args, timeout=60, **kwargs):
    """`python -m patroller.cli ARGS` to its end: the completed process, text captured."""
    return subprocess.run(
        [sys.executable, "-m", "patroller.cli", *args],
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def interruptible() -> None:
    """In the child, before it runs: Ctrl-C's default, whatever pytest was started with (a
    background `nohup pytest &` ignores SIGINT, and its children would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args, **kwargs):
    """`python -m patroller.cli ARGS` started in a process group of its own, as a shell would,
    with SIGINT's default disposition, as a terminal's foreground job has it."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        [sys.executable, "-m", "patroller.cli", *args],
        env=ENV,
        cwd=ROOT,
        text=True,
        start_new_session=True,
        preexec_fn=interruptible,
        **kwargs,
    )


def kill_group(started: subprocess.Popen) -> None:
    """Whatever the test started and left running, ended: the process group the child leads."""
    try:
        os.killpg(started.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    started.wait()


def call(server, path):
    """(status, body) of one raw request, for what the client does not do (test mode's user=)."""
    try:
        with urllib.request.urlopen(f"http://{server}{path}", timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def eventually(check, timeout=20.0, what="condition"):
    """check()'s first true value, asked every 50 ms; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached in time"
        time.sleep(0.05)


def claims(server):
    return {uuid: entry["claim"] for uuid, entry in client.status(server).items()}


def all_free(server):
    return all(c["state"] == "free" for c in claims(server).values())


def held_for(server, pid):
    """The claims held for process `pid`."""
    return [c for c in claims(server).values() if c.get("held_for_pid") == pid]


def group_members(pgid):
    """Live processes of process group `pgid`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(name))
    return found


def table_rows(text):
    """{first cell: the row's cells} of a status table (cells two or more spaces apart), as a
    pipe gets it: every column."""
    lines = text.splitlines()
    assert lines[0].split() == list(status.HEADERS)
    return {
        re.split(r"\s{2,}", line)[0]: re.split(r"\s{2,}", line)
        for line in lines[1:]
        if re.match(r"\d+\s", line)
    }


def process_lines(text, number):
    """The process lines under GPU `number`'s row, each split: pid, user, memory, command."""
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if re.match(rf"{number}\s", line))
    found = []
    for line in lines[row + 1 :]:
        if not line.lstrip().startswith(status.PROCESS_MARK):
            break
        found.append(re.split(r"\s{2,}", line.lstrip()[len(status.PROCESS_MARK) :]))
    return found


# --- formatting, on bodies from a live test-mode daemon ------------------------------------


@pytest.fixture(scope="module")
def testmode():
    process = ServerProcess("--test", "--lease", "300").start()
    yield process
    assert process.stop() == 0


@pytest.fixture
def test_server(testmode):
    yield testmode.server
    for user in ("alice@example.org", "bob", "carol"):
        call(testmode.server, f"/release?user={user}")
    client.release_all(testmode.server)


def test_the_status_table_from_live_bodies(test_server):
    assert call(test_server, "/request?gpu=2&user=alice@example.org")[0] == 200
    assert call(test_server, "/request?gpu=1&user=bob")[0] == 200
    mine = client.reserve(1, test_server)  # hold=process: bound to this very process
    assert mine[0]["info"]["number"] == 3
    claims, devices = client.status(test_server), client.devices(test_server)

    plain = status.format_status(claims, devices, [], colour=False)
    assert "\x1b" not in plain
    rows = table_rows(plain)
    assert sorted(rows) == [str(n) for n in range(8)]
    assert rows["0"][1:4] == ["A100-SXM4-80GB", "reserved", "alice@example.org"]
    assert rows["1"][2:4] == ["reserved", "alice@example.org"]
    assert rows["2"][2:4] == ["reserved", "bob"]
    assert rows["0"][-1].startswith("expires in ")
    assert rows["3"][2] == "reserved" and rows["3"][-1] == f"while pid {os.getpid()} lives"
    assert rows["4"][2:4] == ["free", "-"] and rows["4"][-1].startswith("for ")
    total = devices[mine[0]["uuid"]]["total_mem"].split()[0]
    held = claims[mine[0]["uuid"]]
    assert rows["3"][4:8] == [
        f"{held['sm']}%",
        f"{held['fb']}/{total} MiB",
        f"{held['gtemp']}C",
        f"{held['power']}W",
    ]

    coloured = status.format_status(claims, devices, [], colour=True)
    assert "\x1b[33mreserved\x1b[0m" in coloured and "\x1b[32mfree\x1b[0m" in coloured
    assert ANSI.sub("", coloured) == plain  # colours never move a column


def test_waiting_requests_and_the_progress_line_from_live_bodies(test_server):
    assert call(test_server, "/request?gpu=6&user=alice@example.org")[0] == 200
    assert call(test_server, "/request?gpu=1&user=bob")[0] == 200
    waiter = threading.Thread(target=call, args=(test_server, "/wait?gpu=2&user=carol&timeout=20"))
    waiter.start()
    try:
        queued = eventually(lambda: client.queue(test_server), what="a waiter")
        claims, devices = client.status(test_server), client.devices(test_server)
        text = status.format_status(claims, devices, queued)
        assert re.search(r"^waiting 1: carol wants 2 GPUs \(for \d+(\.\d)?s\)$", text, re.M), text
        assert (
            render.queue_line(
                {"position": 2, "user": "dan", "wants": {"gpu": 1, "fpga": 2}, "waited": 3}
            )
            == "waiting 2: dan wants 1 GPU, 2 fpga (for 3s)"
        )
        # the line `patroller run --wait` shows, for a waiter bound to this pid and another
        mine = [dict(queued[0], pid=os.getpid())]
        line = render.progress_message(2, "gpu", os.getpid(), mine, claims, devices, 75)
        assert line == (
            "patroller: waiting for 2 GPUs (1m15s): 1st of 1 in the queue; held by "
            "alice@example.org (0,1,2,3,4,5), bob (6); 1 free"
        )
        line = render.progress_message(2, "gpu", os.getpid(), queued, claims, devices, None)
        assert line.startswith("patroller: waiting for 2 GPUs: 1 in the queue; held by ")
    finally:
        call(test_server, "/release?user=alice@example.org")  # carol is served, the wait ends
        waiter.join()


def test_small_formatters():
    assert [render.duration(s) for s in (0, 0.5, 8, 192, 7500, 273600)] == [
        "0s",
        "0.5s",
        "8s",
        "3m12s",
        "2h05m",
        "3d04h",
    ]
    assert render.short_name("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert render.short_name("Tesla P100-PCIE-16GB") == "P100-PCIE-16GB"
    assert status.memory_cell(295, status.total_mib("81920 MiB")) == "295/81920 MiB"
    assert status.memory_cell(None, 81920) == "-/81920 MiB"
    assert status.memory_cell(None, None) == "-"
    assert table.cut("abcdef", 4) == "abc…" and table.cut("abc", 4) == "abc"
    assert [render.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
    ]
    drawn = table.format_table(["A", "B"], [["x" * 50, "y"], ["z", ""]])
    assert drawn.splitlines()[1] == "x" * 50 + "  y"  # piped: nothing is cut
    assert drawn.splitlines()[2] == "z"  # no trailing blanks
    narrow = table.format_table(["A", "B"], [["x" * 50, "y"]], width=20, plan=[table.Rest("A")])
    assert narrow.splitlines()[1] == "x" * 16 + "…  y"  # cut to what B leaves it


# --- release and wait, on a test-mode daemon ---------------------------------------------


def test_wait_prints_the_numbers_and_holds_a_lease(test_server):
    done = patroller("wait", "-n", "2", "--timeout", "5", "--server", test_server)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "0,1\n"
    assert re.fullmatch(
        r"patroller: GPUs 0,1 reserved; start the job within \d+m?\d*s?, or the "
        r"reservation lapses \(it then lasts while your processes run on them\)\n",
        done.stderr,
    ), done.stderr
    held = [c for c in claims(test_server).values() if c["state"] == "reserved"]
    assert len(held) == 2 and all(c["held_for_pid"] is None and c["expires"] > 0 for c in held)


def test_wait_times_out_with_75(test_server):
    assert call(test_server, "/request?gpu=8&user=bob")[0] == 200
    done = patroller("wait", "-n", "1", "--timeout", "0.3", "--server", test_server)
    assert done.returncode == 75 and done.stdout == ""
    assert done.stderr == "patroller: 1 GPU not free within 0.3s\n"


def test_release_says_what_it_released(test_server):
    assert patroller("wait", "-n", "3", "--server", test_server).stdout == "0,1,2\n"
    done = patroller("release", "1", "--server", test_server)
    assert (done.returncode, done.stdout) == (0, "released GPU 1\n"), done.stderr
    uuid = [u for u, info in client.devices(test_server).items() if info["number"] == 2][0]
    done = patroller("release", uuid, "--server", test_server)
    assert (done.returncode, done.stdout) == (0, "released GPU 2\n")
    assert patroller("release", "--server", test_server).stdout == "released GPU 0\n"
    assert (
        patroller("release", "--server", test_server).stdout
        == "nothing to release: you hold no reservation\n"
    )
    assert (
        patroller("release", "5", "--server", test_server).stdout
        == "nothing released: GPU 5 is not reserved by you\n"
    )


def test_release_refused_exits_77_with_the_servers_words(test_server):
    assert call(test_server, "/request?gpu=1&user=bob")[0] == 200
    done = patroller("release", "0", "--server", test_server)
    assert done.returncode == 77
    assert (
        done.stderr.startswith("patroller: cannot release 0: ") and "another user" in done.stderr
    )
    done = patroller("release", "9", "GPU-nothing", "--server", test_server)
    assert done.returncode == 77
    assert done.stderr.splitlines() == [
        "patroller: cannot release 9: no GPU number 9 on this host",
        "patroller: cannot release GPU-nothing: "
        + call(test_server, "/release?uuid=GPU-nothing")[1]["error"],
    ]


def test_usage_and_unreachable_exit_codes(test_server):
    assert patroller().returncode == 2
    assert patroller("run", "--server", test_server).returncode == 2  # no command
    assert patroller("wait", "-n", "0", "--server", test_server).returncode == 2
    assert patroller("status", "--server", "ftp://x").returncode == 2
    done = patroller("status", "--server", "127.0.0.1:1")
    assert done.returncode == 69 and "cannot reach the server" in done.stderr
    done = patroller("run", "-n", "9", "--server", test_server, "--", "true")
    assert done.returncode == 77 and "only 8 exist" in done.stderr


# --- GPU host mode on the simulator --------------------------------------------------------


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}, {}])


@pytest.fixture
def gpuhost(scenario):
    process = ServerProcess("--nvidia-smi", scenario.command, "--lease", "300").start()
    yield process
    try:
        client.release_all(process.server)
    finally:
        assert process.stop() == 0


def on_gpu(*pids_and_gpus):
    return [
        {"pid": pid, "gpu": gpu, "type": "C", "name": "sleep", "used_mib": 100}
        for pid, gpu in pids_and_gpus
    ]


def test_status_shows_a_reserved_a_claimed_and_a_shared_gpu(gpuhost, scenario, sleeper):
    server = gpuhost.server
    scenario.write(processes=on_gpu((sleeper.pid, 1)))
    eventually(lambda: claimed_known(claims(server)[uuid_of(server, 1)]), what="claimed")
    granted = client.reserve(2, server)  # held for this process: GPUs 0 and 2
    assert [g["info"]["number"] for g in granted] == [0, 2]
    stranger = subprocess.Popen(["sleep", "120"], preexec_fn=lambda: os.setuid(65534))
    try:
        scenario.write(processes=on_gpu((sleeper.pid, 1), (stranger.pid, 2)))
        eventually(lambda: claims(server)[uuid_of(server, 2)]["state"] == "shared", what="shared")
        me = client.status(server)[uuid_of(server, 1)]["claim"]["user"]["account"]

        done = patroller("status", "--server", server)  # piped: no colours
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout
        rows = table_rows(done.stdout)
        assert rows["0"][2:4] == ["reserved", me] and not process_lines(done.stdout, 0)
        assert rows["0"][-1] == f"while pid {os.getpid()} lives"
        assert rows["1"][2:4] == ["claimed", me]
        assert process_lines(done.stdout, 1) in (
            [[str(sleeper.pid), me, "-", "sleep"]],
            [[str(sleeper.pid), me, "100 MiB", "sleep"]],
        )
        assert rows["1"][-1].startswith("for ")
        assert rows["2"][2:4] == ["shared", f"{me}, nobody"]
        assert process_lines(done.stdout, 2) in (  # on root's GPU: trespassing
            [[str(stranger.pid), "nobody (trespassing)", "-", "sleep"]],
            [[str(stranger.pid), "nobody (trespassing)", "100 MiB", "sleep"]],
        )
        assert rows["3"][2:4] == ["free", "-"]

        done = patroller("status", "--json", "--server", server)
        raw = json.loads(done.stdout)
        now = client.status(server)
        assert set(raw) == set(now)
        for uuid, entry in raw.items():
            for field in ("state", "user", "users", "processes", "held_for_pid", "process_detail"):
                assert entry["claim"][field] == now[uuid]["claim"][field], (uuid, field)
    finally:
        stranger.kill()
        stranger.wait()


def uuid_of(server, number):
    return [u for u, info in client.devices(server).items() if info["number"] == number][0]


def test_status_watch_redraws_until_ctrl_c(gpuhost):
    with tempfile.TemporaryFile("w+") as out:
        watching = start("status", "--watch", "0.5", "--server", gpuhost.server, stdout=out)
        try:

            def tables():
                out.seek(0)
                return out.read().count("GPU  NAME") >= 2  # piped: every column

            eventually(tables, what="two tables")
            os.killpg(watching.pid, signal.SIGINT)
            assert watching.wait(20) == 0
        finally:
            kill_group(watching)


@pytest.mark.parametrize("every", ["0", "0.1", "0s"])
def test_status_watch_too_often_is_refused(every):
    # As found: --watch 0 redrew with no pause, at 47% of a core, 119 MB in 10 minutes.
    done = patroller("status", "--watch", every, "--server", "127.0.0.1:9")
    assert done.returncode == 2 and "too often: at least 0.5s" in done.stderr, done.stderr
    assert done.stdout == ""


def test_run_gives_the_command_the_gpus_and_its_exit_status(gpuhost):
    server = gpuhost.server
    running = start(
        "run",
        "-n",
        "2",
        "--server",
        server,
        "--",
        "sh",
        "-c",
        'echo "$CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER $$"; exit 7',
    )
    out, err = running.communicate(timeout=60)
    assert running.returncode == 7, err
    assert out == f"0,1 PCI_BUS_ID {running.pid}\n"  # the same process, the command in place
    assert (
        err == f"patroller: GPUs 0,1 reserved while pid {running.pid} runs: sh -c '"
        f'echo "$CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER $$"; exit 7\'\n'
    )
    eventually(lambda: all_free(server), what="the GPUs freed after the command")


def test_run_holds_the_gpus_for_the_commands_pid_and_ctrl_c_ends_it(gpuhost):
    server = gpuhost.server
    running = start("run", "-n", "1", "-q", "--server", server, "--", "sleep", "60")
    try:
        held = eventually(lambda: held_for(server, running.pid), what="held for the run")
        assert [c["state"] for c in held] == ["reserved"] and held[0]["expires"] is None
        eventually(
            lambda: Path(f"/proc/{running.pid}/cmdline").read_text() == "sleep\x0060\x00",
            what="the command in place of patroller",
        )
        os.killpg(running.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        assert running.wait(20) == -signal.SIGINT  # the command's own answer to it
    finally:
        kill_group(running)
    assert group_members(running.pid) == []
    eventually(lambda: all_free(server), what="the GPUs freed after Ctrl-C")


def test_run_when_busy_exits_75_and_leaves_nothing(gpuhost):
    server = gpuhost.server
    client.reserve(4, server)
    done = patroller("run", "-n", "1", "--server", server, "--", "true")
    assert done.returncode == 75
    assert done.stderr.startswith("patroller: busy: 1 GPU not free now; held by ")
    assert done.stderr.endswith("; 0 free; add --wait SECONDS or --wait forever to queue\n")


def test_run_refuses_a_missing_command_before_reserving(gpuhost, tmp_path):
    server = gpuhost.server
    done = patroller("run", "--server", server, "--", "no-such-command-here")
    assert (done.returncode, done.stderr) == (
        127,
        "patroller: no-such-command-here: command not found\n",
    )
    plain = tmp_path / "plain"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    done = patroller("run", "--server", server, "--", str(plain))
    assert (done.returncode, done.stderr) == (126, f"patroller: {plain}: not executable\n")
    assert all_free(server)


@pytest.mark.parametrize(
    "content,code,why",
    [
        (b"\x7fELF not really", 126, "Exec format error"),  # no program the kernel runs: 126
        (
            b"#!/nonexistent/python\n",
            127,
            "No such file or directory",
        ),  # its interpreter is missing
    ],
    ids=["not executable", "interpreter not found"],
)
def test_run_releases_what_it_reserved_when_exec_fails(gpuhost, tmp_path, content, code, why):
    server = gpuhost.server
    garbage = tmp_path / "garbage"
    garbage.write_bytes(content)  # executable bits: it passes the check made before reserving
    garbage.chmod(0o755)
    # main() in a process that lives on after it: what is held then was not released by main,
    # since the process that holds it has not ended
    script = (
        "import json, os, sys\nfrom patroller import cli, client\n"
        f"code = cli.main(['run', '-n', '2', '--server', {server!r}, '--', "
        f"{str(garbage)!r}])\n"
        f"held = [c['claim']['state'] for c in client.status({server!r}).values()\n"
        "        if c['claim']['held_for_pid'] == os.getpid()]\n"
        "print(json.dumps([code, held]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert json.loads(done.stdout) == [code, []], done.stderr
    assert done.stderr.splitlines()[-1] == f"patroller: cannot run {garbage}: {why}"
    assert all_free(server)


def test_run_waits_in_the_queue_and_starts_when_a_gpu_frees(gpuhost):
    server = gpuhost.server
    mine = client.reserve(4, server)
    with tempfile.TemporaryFile("w+") as err:
        waiting = start(
            "run",
            "-n",
            "1",
            "--wait",
            "60",
            "--server",
            server,
            "--",
            "sh",
            "-c",
            'echo "started on $CUDA_VISIBLE_DEVICES"',
            stderr=err,
        )
        try:
            queued = eventually(
                lambda: [w for w in client.queue(server) if w["pid"] == waiting.pid], what="queued"
            )
            assert queued[0]["hold"] == "process" and queued[0]["wants"] == {"gpu": 1}

            def progress():
                err.seek(0)
                return err.read()

            first = eventually(lambda: "in the queue" in progress() and progress())
            assert re.match(
                r"patroller: waiting for 1 GPU \(\d+(\.\d)?s\): 1st of 1 in the queue; "
                "held by ",
                first,
            ), first
            assert "\r" not in first and "\x1b" not in first  # not a terminal: plain lines
            client.release(server, mine[2]["uuid"])
            out, _ = waiting.communicate(timeout=60)
        finally:
            if waiting.poll() is None:
                waiting.kill()
        assert waiting.returncode == 0, progress()
        assert out == "started on 2\n"


def test_ctrl_c_while_waiting_exits_130_and_leaves_nothing(gpuhost):
    server = gpuhost.server
    client.reserve(4, server)
    waiting = start("run", "-n", "1", "--wait", "forever", "--server", server, "--", "sleep", "60")
    try:
        eventually(
            lambda: any(w["pid"] == waiting.pid for w in client.queue(server)), what="queued"
        )
        os.killpg(waiting.pid, signal.SIGINT)
        _, err = waiting.communicate(timeout=20)
    finally:
        kill_group(waiting)
    assert waiting.returncode == 130
    assert err.splitlines()[-1] == "patroller: interrupted"
    assert group_members(waiting.pid) == [] and not alive(waiting.pid)
    eventually(lambda: client.queue(server) == [], what="the queue empty")
    client.release_all(server)
    assert all_free(server)


def test_release_of_a_gpu_in_use_says_it_frees_after_the_processes(gpuhost, scenario, sleeper):
    server = gpuhost.server
    client.reserve(1, server, hold="lease")
    scenario.write(processes=on_gpu((sleeper.pid, 0)))
    eventually(lambda: claimed_known(claims(server)[uuid_of(server, 0)]), what="claimed")
    done = patroller("release", "--server", server)
    assert done.stdout == "GPU 0 will be free when your processes on it end\n", done.stderr


# --- a caller in a container, on the unix socket -----------------------------------------


@pytest.fixture
def socket_dir():
    path = f"/tmp/ptcli{os.getpid()}"  # short: far below the 107-byte limit of a socket path
    os.makedirs(path, exist_ok=True)
    yield path
    subprocess.run(["rm", "-rf", path])


def test_run_from_a_container_on_the_unix_socket(engine, scenario, socket_dir):
    alice = engine.run(labels={"user.email": "alice@example.org"}, command="sleep 600")
    path = os.path.join(socket_dir, "api.sock")
    server = ServerProcess(
        "--nvidia-smi", scenario.command, "--docker-host", engine.url, "--socket", path
    ).start()
    socket = f"unix://{path}"
    script = (
        "import os, sys\n"
        f"sys.path[:0] = [{ROOT!r}, {TESTS!r}]\n"
        "from dockerd import Container\n"
        f"Container.adopt_pid({alice.pid}, os.getpid())\n"
        "from patroller.cli import main\n"
        f"sys.exit(main(['run', '-n', '1', '--server', {socket!r}, '--', 'sh', '-c', "
        "'echo \"$CUDA_VISIBLE_DEVICES\"; cat >/dev/null']))\n"
    )
    running = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert running.stdout.readline() == "0\n", running.stderr.read()
        held = held_for(socket, running.pid)
        assert len(held) == 1 and held[0]["state"] == "reserved"
        assert held[0]["user"]["user"] == "alice@example.org"
        assert held[0]["user"]["container"]["id"] == alice.short
        running.stdin.close()  # cat reads to the end of its input and the command ends
        assert running.wait(30) == 0
        eventually(lambda: all_free(socket), what="the GPU freed after the container's command")
    finally:
        if running.poll() is None:
            running.kill()
        assert server.stop() == 0


def client_files():
    """The files docs/command-line.md says the command line needs (after `<!-- client files
    -->`)."""
    with open(os.path.join(ROOT, "docs", "command-line.md"), encoding="utf-8") as f:
        text = f.read()
    said = text.split("<!-- client files -->", 1)[1].split("\n\n", 1)[0]
    files = []
    for path in re.findall(r"`(patroller/[^`]*)`", said):
        if path.endswith("/"):
            files += [
                os.path.join(path, n)
                for n in os.listdir(os.path.join(ROOT, path))
                if n.endswith(".py")
            ]
        else:
            files.append(path)
    return files


def test_the_command_line_needs_only_the_files_the_docs_list(test_server, tmp_path):
    """Exactly the files docs/command-line.md lists, in a bare virtual environment (no
    Tornado, no Docker SDK, nothing installed): every client command's --help, and a status."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
        check=True,
        timeout=120,
    )
    python = str(tmp_path / "venv" / "bin" / "python")
    files = client_files()
    assert "patroller/client.py" in files and any(f.startswith("patroller/cli/") for f in files)
    for name in files:
        os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
        (tmp_path / name).write_text(Path(os.path.join(ROOT, name)).read_text())
    for command in ("run", "status", "release", "wait", "reserve"):
        helped = subprocess.run(
            [python, "-m", "patroller.cli", command, "--help"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert helped.returncode == 0, (command, helped.stderr)
    done = subprocess.run(
        [python, "-m", "patroller.cli", "status", "--server", test_server],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert len(table_rows(done.stdout)) == 8


def test_status_is_coloured_on_a_terminal_unless_told_not_to(test_server):
    import pty

    def on_a_terminal(*args, **env):
        leader, follower = pty.openpty()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "patroller.cli", "status", "--server", test_server, *args],
                env={**ENV, "TERM": "xterm", **env},
                cwd=ROOT,
                stdout=follower,
                stderr=subprocess.PIPE,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            os.close(follower)
            follower = None
            output = b""
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the terminal's other end is closed and drained
                    break
                if not chunk:
                    break
                output += chunk
            return output.decode()
        finally:
            os.close(leader)
            if follower is not None:
                os.close(follower)

    assert "\x1b[32mfree\x1b[0m" in on_a_terminal()
    assert "\x1b" not in on_a_terminal("--no-color")
    assert "\x1b" not in on_a_terminal(NO_COLOR="1")
    assert len(table_rows(on_a_terminal(NO_COLOR="1").replace("\r\n", "\n"))) == 8


def test_status_shows_limits_idle_gpus_and_use_without_asking(scenario, sleeper):
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--lease",
        "300",
        "--max-per-user",
        "3",
        "--idle-after",
        "0.5",
    ).start()
    try:
        host = server.server
        assert call(host, "/request?gpu=1")[0] == 200  # gpu 0: reserved, nothing on it: idle
        scenario.write(
            processes=[
                {
                    "pid": sleeper.pid,
                    "gpu": 2,
                    "type": "C",
                    "name": "sleep",
                    "used_mib": 8000,
                    "sm": 90,
                }
            ]
        )  # taken by computing on it
        eventually(
            lambda: claimed_known(
                claims(host)[client.devices(host) and list(client.devices(host))[2]]
            )
        )
        eventually(lambda: list(claims(host).values())[0]["idle_for"] is not None)
        done = patroller("status", "--server", host)
        assert done.returncode == 0, done.stderr
        me = done.stdout.splitlines()
        mine = [line for line in me if line.startswith("user ")]
        assert len(mine) == 1, done.stdout
        assert mine[0].endswith(": 2 held (limit 3), 1 unused, 1 idle, 1 used without asking")
        assert any(line.startswith("GPU 0: idle for ") for line in me), done.stdout
    finally:
        server.stop()


def test_a_server_that_cannot_serve_the_request_gives_69():
    server = ServerProcess("--test", "--lease", "300").start()
    try:
        assert call(server.server, "/request?gpu=8&user=alice")[0] == 200
        waiting = start("wait", "-n", "1", "--server", server.server)
        eventually(lambda: len(client.queue(server.server)) == 1, what="queued")
        assert server.stop() == 0  # a daemon that stops answers its waiters 503
        _, err = waiting.communicate(timeout=30)
    finally:
        if server.process.poll() is None:
            server.stop()
    assert waiting.returncode == 69, err
    assert err.splitlines()[-1] == "patroller: the server refused: the server is shutting down"


def test_a_users_line_says_what_was_taken_beyond_the_limit():
    line = render.user_line(
        "container:3f2a9c1b7d4e", {"held": 2, "limit": 1, "unreserved": 2, "over_limit": 1}
    )
    assert line == (
        "user container:3f2a9c1b7d4e: 2 held (limit 1), 2 used without asking, "
        "1 taken beyond the limit"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["serve", "--help"],
        ["run", "--help"],
        ["status", "--help"],
        ["release", "--help"],
        ["wait", "--help"],
        ["--version"],
    ],
)
def test_every_commands_help_is_printed(args):
    # As found: `patroller --help` crashed on a bare % in --idle-sm's help.
    done = subprocess.run(
        [sys.executable, "-m", "patroller", *args],
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("usage: patroller" if args != ["--version"] else "patroller ")
    if args[-1] == "--help" and args[0] in ("--help", "serve"):
        assert "at most this % of SM" in done.stdout and "\ncommands:\n" in done.stdout
        assert "    history " in done.stdout  # every command (tests/test_manual.py)


def test_reserve_holds_gpus_for_a_duration(test_server):
    # canhazgpu's habit: `reserve -n 2 --hold 2h`, kept whatever runs on the GPUs.
    done = patroller("reserve", "-n", "2", "--hold", "2h", "--server", test_server)
    assert (done.returncode, done.stdout) == (0, "0,1\n"), done.stderr
    assert "GPUs 0,1 reserved for 2h, whatever runs on them" in done.stderr
    assert "`patroller release 0 1` gives them back" in done.stderr
    held = [c["claim"] for c in client.status(test_server).values()][:2]
    assert [c["hold"] for c in held] == ["duration", "duration"]
    assert all(7100 < c["expires"] <= 7200 for c in held)
    lease = patroller("reserve", "--server", test_server)  # the default: the short lease
    assert lease.stdout == "2\n" and "for the lease: start the job within" in lease.stderr
    assert "`patroller release 2` gives it back" in lease.stderr  # one GPU: it
    assert patroller("reserve", "-n", "6", "--server", test_server).returncode == 75  # busy
    refused = patroller("reserve", "--hold", "13h", "--server", test_server)
    assert refused.returncode == 77, refused.stderr
    assert "hold: 13h is longer than the 12h one may ask for" in refused.stderr, refused.stderr
    for bad in ("process", "0", "soon"):
        usage = patroller("reserve", "--hold", bad, "--server", test_server)
        assert usage.returncode == 2 and usage.stdout == "", usage.stderr
    assert "patroller run" in patroller("reserve", "--hold", "process").stderr


def test_claim_and_reserve_take_a_duration_hold(test_server):
    granted = client.reserve(1, server=test_server, hold="90m")
    assert granted[0]["hold"] == "duration" and 5300 < granted[0]["expires"] <= 5400
    with pytest.raises(ValueError):
        client.reserve(1, server=test_server, hold="for ever")
    assert client.release(test_server)["released"][0]["uuid"] == granted[0]["uuid"]


NOBODY_REQUEST = """
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/request?gpu=1&hold=1h", timeout=30) as answer:
    print(json.loads(answer.read())[0]["info"]["number"])
"""


def test_root_releases_another_users_gpu_with_a_reason_and_is_told_whose(gpuhost):
    need_root("root releases uid 65534's GPU")
    taken = subprocess.run(
        ["/usr/bin/python3", "-c", NOBODY_REQUEST, f"http://{gpuhost.server}"],
        user=65534,
        group=65534,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert taken.returncode == 0, taken.stderr
    number = taken.stdout.strip()
    done = patroller(
        "release", number, "--reason", "left over since Friday", "--server", gpuhost.server
    )
    assert done.returncode == 0, done.stderr
    whose = pwd.getpwuid(65534).pw_name
    assert done.stdout == f"released GPU {number}, {whose}'s reservation\n"
    assert all(c["claim"]["state"] == "free" for c in client.status(gpuhost.server).values())
    [event] = [
        e
        for e in json.loads(
            urllib.request.urlopen(f"http://{gpuhost.server}/history", timeout=30).read()
        )
        if e["event"] == "admin_release"
    ]
    assert event["reason"] == "left over since Friday" and event["by"] == "root"


def test_a_holder_is_named_by_its_user_and_a_jobs_process_by_its_job_too():
    unlabelled = {
        "user": "container:3f2a9c1b7d4e",
        "source": "container",
        "email": None,
        "account": "root",
        "uid": 0,
        "container": {"id": "3f2a9c1b7d4e", "name": "train-7"},
        "job": None,
    }
    assert render.user_name(unlabelled) == "train-7"  # not the account it runs as
    claimed = {
        **unlabelled,
        "user": "alice",
        "account": "alice",
        "uid": 1001,
        "email": "bob@example.org",
        "claimed": True,
    }  # a rootless container's label
    assert render.user_name(claimed) == "alice (claims bob@example.org)"
    job = {
        "user": "alice",
        "source": "slurm",
        "email": None,
        "account": "alice",
        "uid": 1001,
        "container": None,
        "job": {"id": "4242", "step": "0"},
    }
    assert render.user_name(job) == "alice (job 4242)"
    in_pod = {
        "user": "carol@example.org",
        "source": "pod",
        "email": "carol@example.org",
        "container": None,
        "job": None,
        "pod": {"namespace": "ml", "name": "train-0", "container": "trainer"},
    }
    assert render.user_name(in_pod) == "carol@example.org (pod ml/train-0)"
    hidden = {**in_pod, "user": "user-0123456789ab", "email": None, "pod": None}
    assert render.user_name(hidden) == "user-0123456789ab"
    pod = {
        "user": "alice@example.org",
        "source": "pod",
        "email": "alice@example.org",
        "container": {"id": "3f2a9c1b7d4e", "name": "trainer"},
        "pod": {"namespace": "research", "name": "train-7", "uid": "u", "container": "trainer"},
    }
    assert render.user_name(pod) == "alice@example.org (pod research/train-7)"
    nobody = {**pod, "user": "namespace:research", "email": None}
    assert render.user_name(nobody) == "pod research/train-7"
