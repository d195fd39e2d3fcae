"""`patroller status` as a person reads it: fitted to the terminal's width, a line per process
under its GPU, figures coloured by how high they are, `--mine`, `--free` on this host, and a
dead host on a line of its own. docs/command-line.md's examples are the output itself: drawn
here from bodies live daemons answered (tests/fixtures/status/, taken by
scripts/status_examples.py), and compared with the docs' text character for character."""

import glob
import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from helpers import ROOT, ServerProcess

from patroller import answers, client
from patroller.cli import fleet
from patroller.cli.exits import Failure
from patroller.cli.status import TEMP_LEVELS, format_status, level
from patroller.cli.table import Cell, Cut, Drop, Shorten, fit, width_of

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "status")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
COLUMNS = 80  # the docs' examples: a terminal of 80 columns
ENV = {
    name: value
    for name, value in os.environ.items()
    if name not in ("PATROLLER_SERVER", "NO_COLOR", "COLUMNS", "PATROLLER_HOSTS")
}
ENV["PYTHONPATH"] = ROOT


def scenes() -> dict[str, dict[str, Any]]:
    """Every fixture, by its file's name."""
    found = {}
    for path in sorted(glob.glob(os.path.join(FIXTURES, "*.json"))):
        with open(path, encoding="utf-8") as f:
            found[os.path.basename(path)] = json.load(f)
    return found


def answers_of(scene: dict[str, Any]) -> list[fleet.HostAnswer]:
    return [
        fleet.HostAnswer(
            h["host"],
            h["status"],
            h["devices"],
            h["error"],
            state=None if h["error"] is None else h["state"],
        )
        for h in scene["hosts"]
    ]


def drawn(scene: dict[str, Any], colour: bool = False) -> list[tuple[str, str]]:
    """(command, what it prints in 80 columns) for each example a scene gives the docs."""
    command = scene["command"]
    if "hosts" in scene:
        answers = answers_of(scene)
        return [
            (command, fleet.fleet_table(answers, colour, COLUMNS)),
            (command + " --free 1", fleet.free_lines(answers, 1)),
        ]
    status, devices = scene["status"], scene["devices"]
    shown = [
        (command, format_status(status, devices, scene["queue"], colour, scene["users"], COLUMNS))
    ]
    if "whoami" in scene:
        shown.append(
            (
                command + " --mine",
                format_status(
                    status,
                    devices,
                    scene["queue"],
                    colour,
                    scene["users"],
                    COLUMNS,
                    mine=scene["whoami"]["user"],
                ),
            )
        )
    return shown


def doc_blocks() -> list[str]:
    with open(os.path.join(ROOT, "docs", "command-line.md"), encoding="utf-8") as f:
        return re.findall(r"^```(?:sh|console)?\n(.*?)^```$", f.read(), re.S | re.M)


def test_the_docs_examples_are_what_the_command_line_prints():
    blocks = doc_blocks()
    expected = [
        f"$ {command}\n{text}" for scene in scenes().values() for command, text in drawn(scene)
    ]
    assert len(expected) == 5
    for block in expected:
        assert block in blocks, "docs/command-line.md does not show, exactly:\n" + block
    status_blocks = [
        b for b in blocks if b.startswith("$ patroller status") and "--server localhost:1" not in b
    ]  # that one says an error
    assert sorted(status_blocks) == sorted(expected), (
        "an example of `patroller status` in the docs that no fixture draws"
    )


def test_the_fixtures_have_the_fields_a_daemon_answers_today():
    """The bodies drawn for the docs are of today's schema: every field a live daemon's
    /status, /devices, /queue and /users carries, and no other."""
    daemon = ServerProcess("--test", "--lease", "300").start()
    try:
        server = daemon.server
        client.reserve(1, server, hold="lease")
        live_status, live_devices = client.status(server), client.devices(server)
    finally:
        daemon.stop()
    entry = next(iter(live_status.values()))
    info = next(iter(live_devices.values()))
    for name, scene in scenes().items():
        hosts = scene.get("hosts") or [scene]
        for host in hosts:
            if host.get("status") is None:
                continue
            answers.check(host["status"], host["devices"], fleet.HOST_MAX_GPUS)
            for uuid, got in host["status"].items():
                assert set(got) == set(entry), (name, uuid)
                assert set(got["claim"]) == set(entry["claim"]), (name, uuid)
                assert set(host["devices"][uuid]) == set(info), (name, uuid)


def test_each_example_fits_80_columns_and_colours_move_no_column():
    for name, scene in scenes().items():
        for (command, plain), (_, coloured) in zip(
            drawn(scene), drawn(scene, colour=True), strict=True
        ):
            assert ANSI.sub("", coloured) == plain, (name, command)
            table = [line for line in plain.splitlines() if "not answering" not in line]
            assert max(map(len, table)) <= COLUMNS, (name, command, plain)


def test_a_line_per_process_under_its_gpu():
    scene = scenes()["gpuhost.json"]
    text = format_status(scene["status"], scene["devices"], [], False, {}, COLUMNS)
    lines = text.splitlines()
    for uuid, entry in scene["status"].items():
        number = str(scene["devices"][uuid]["number"])
        row = next(i for i, line in enumerate(lines) if line.split()[:1] == [number])
        for n, process in enumerate(entry["claim"]["process_detail"]):
            below = lines[row + 1 + n]
            assert below.lstrip().startswith("└ ") and below.split()[1] == str(process["pid"])
            assert below.split()[-1] == process["command"]
            assert f"{int(process['fb'])} MiB" in below
    shared = next(line for line in lines if "python3" in line)
    assert shared.split()[2] == "nobody"  # the process's own user, not the holder


def test_the_table_gives_way_step_by_step_to_a_narrow_terminal():
    scene = scenes()["gpuhost.json"]
    args = (scene["status"], scene["devices"], scene["queue"], False, scene["users"])
    wide = format_status(*args, None)  # a pipe: every column, nothing cut
    assert wide.splitlines()[0].split() == [
        "GPU",
        "NAME",
        "STATE",
        "USER",
        "UTIL",
        "MEMORY",
        "TEMP",
        "POWER",
        "TIME",
    ]
    assert "while pid " in wide and "expires in " in wide
    for width in (100, 80, 60, 52):
        text = format_status(*args, width)
        table = [
            line
            for line in text.splitlines()  # the notes are sentences: they wrap
            if not re.match(r"(GPU \d+|waiting \d+): |user ", line)
        ]
        assert max(map(len, table)) <= width, (width, text)
    narrow = format_status(*args, 52).splitlines()
    assert narrow[0] == "4 x A100-SXM4-80GB"  # the model said once, its column left out
    assert narrow[1].split() == ["GPU", "STATE", "USER", "UTIL", "MEMORY", "TIME"]
    assert any(line.endswith(" left") for line in narrow)  # `4m53s left`, not `expires in`


def test_fit_follows_its_plan_only_as_far_as_it_must():
    rows = [{"A": "x" * 10, "B": Cell("long words here", short="short"), "C": "yyyy"}]
    plan = [Drop("C"), Shorten("B"), Cut("A", 4)]
    assert fit("ABC", rows, None, plan).headers == ["A", "B", "C"]
    assert fit("ABC", rows, 33, plan).total() == 33  # fits as it is
    assert fit("ABC", rows, 32, plan).headers == ["A", "B"]
    layout = fit("ABC", rows, 20, plan)
    assert layout.short == {"B"} and layout.total() == 17
    layout = fit("ABC", rows, 12, plan)
    assert layout.line(rows[0]) == "xxx…  short"


def test_figures_are_coloured_by_how_high_they_are():
    assert [level(v, TEMP_LEVELS) for v in (30, 59, 60, 79, 80, "N/A", None)] == [
        "32",
        "32",
        "33",
        "33",
        "31",
        None,
        None,
    ]
    scene = scenes()["gpuhost.json"]
    text = format_status(scene["status"], scene["devices"], [], True, {}, None)
    busy = next(line for line in text.splitlines() if "\x1b[36mclaimed" in line)
    entry = next(e for e in scene["status"].values() if e["claim"]["state"] == "claimed")
    assert f"\x1b[31m{entry['sm']}%\x1b[0m" in busy  # 93 %: red
    assert f"\x1b[32m{entry['gtemp']}C\x1b[0m" in busy or entry["gtemp"] >= 60


def test_a_dead_host_is_a_line_of_its_own_and_widens_no_row():
    scene = scenes()["fleet.json"]
    answers = answers_of(scene)
    long = "x" * 190
    answers[1].error, answers[1].state = f"Patroller at gpu2:8080: {long}", fleet.DOWN
    text = fleet.fleet_table(answers, False, COLUMNS)
    lines = text.splitlines()
    assert f"gpu2:8080  not answering: Patroller at gpu2:8080: {long}" in lines  # in full
    rows = [line for line in lines if "not answering" not in line]
    assert max(map(len, rows)) <= COLUMNS
    assert max(map(len, rows)) == max(
        map(
            len,
            fleet.fleet_table(
                [a for a in answers if a.status is not None], False, COLUMNS
            ).splitlines()[:-1],
        )
    )
    assert lines[-1] == "4 hosts, 2 not answering; 3 GPUs: 2 free, 1 reserved"
    with pytest.raises(Failure):
        fleet.free_lines(answers, 2)


def test_the_width_is_the_terminals_or_columns_and_a_pipe_is_not_cut(monkeypatch, tmp_path):
    monkeypatch.delenv("COLUMNS", raising=False)
    with open(tmp_path / "out", "w") as piped:
        assert width_of(piped) is None
        monkeypatch.setenv("COLUMNS", "72")
        assert width_of(piped) == 72
        monkeypatch.setenv("COLUMNS", "wide")
        assert width_of(piped) is None
    import pty

    leader, follower = pty.openpty()
    try:
        monkeypatch.delenv("COLUMNS")
        with os.fdopen(os.dup(follower), "w") as terminal:
            assert width_of(terminal) is None  # a terminal that says no size (0): not cut
        import fcntl
        import struct
        import termios

        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 64, 0, 0))
        with os.fdopen(os.dup(follower), "w") as terminal:
            assert width_of(terminal) == 64
    finally:
        os.close(leader)
        os.close(follower)


def patroller(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "patroller.cli", *args],
        cwd=ROOT,
        env={**ENV, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def testmode():
    daemon = ServerProcess("--test", "--lease", "300").start()
    yield daemon.server
    daemon.stop()


def test_mine_keeps_the_gpus_of_whom_the_server_takes_the_caller_for(testmode):
    """In test mode the command line is `test-user` (what /request would hold devices for)."""
    assert client.get_json(testmode, "/whoami")["user"] == "test-user"
    client.get_json(testmode, "/request?gpu=2&user=alice@example.org")
    try:
        [mine] = client.reserve(1, testmode, hold="lease")
        # wide enough that no column is dropped, whatever widths the synthetic figures take
        # (at 80 columns the model may move to a "1 x A100-SXM4-80GB" line of its own)
        done = patroller("status", "--mine", "--server", testmode, COLUMNS="200")
        assert done.returncode == 0, done.stderr
        rows = [line for line in done.stdout.splitlines() if re.match(r"\d+\s", line)]
        assert [row.split()[:4] for row in rows] == [
            [str(mine["info"]["number"]), "A100-SXM4-80GB", "reserved", "test-user"]
        ]
        assert "alice" not in done.stdout
        assert done.stdout.splitlines()[-1] == "user test-user: 1 held, 1 unused"
        everyone = patroller("status", "--server", testmode, COLUMNS="80")
        assert "alice@example.org" in everyone.stdout
    finally:
        client.release_all(testmode)
        client.get_json(testmode, "/release?user=alice@example.org")
    done = patroller("status", "--mine", "--server", testmode)
    assert done.stdout.startswith("no GPU here is held or used by test-user\n"), done.stdout


def test_free_on_this_host_without_hosts(testmode):
    client.get_json(testmode, "/request?gpu=3&user=alice@example.org")
    try:
        done = patroller("status", "--free", "5", "--server", testmode)
        assert (done.returncode, done.stdout) == (0, f"{testmode}  5 free\n"), done.stderr
        done = patroller("status", "--free", "6", "--server", testmode)
        assert done.returncode == 75 and "no host has 6 GPUs free now" in done.stderr
        done = patroller("status", "--free", "1", PATROLLER_SERVER=testmode)
        assert done.stdout == f"{testmode}  5 free\n"
        assert patroller("status", "--free", "1", "--server", "127.0.0.1:1").returncode == 69
    finally:
        client.get_json(testmode, "/release?user=alice@example.org")


def test_mine_on_many_hosts_asks_each_who_the_caller_is(testmode):
    client.get_json(testmode, "/request?gpu=1&user=alice@example.org")
    client.reserve(1, testmode, hold="lease")
    try:
        done = patroller(
            "status", "--mine", "--hosts", f"{testmode},127.0.0.1:1", "--host-timeout", "5"
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[1] == f"{testmode}  8 GPUs: 6 free, 2 reserved"
        rows = [line for line in lines if re.match(r"\d+\s\s", line)]
        assert [row.split()[2:4] for row in rows] == [["reserved", "test-user"]]
        assert lines[-2] == "127.0.0.1:1  refused: connection refused"
    finally:
        client.release_all(testmode)
        client.get_json(testmode, "/release?user=alice@example.org")


def test_control_characters_from_an_answer_never_reach_the_terminal():
    """A container's label, a host's error or a model name may hold an escape sequence (one that
    retitles or rewrites the terminal): every one is drawn as "?", and the columns hold."""
    scene = scenes()["gpuhost.json"]
    status = json.loads(json.dumps(scene["status"]))
    devices = json.loads(json.dumps(scene["devices"]))
    evil = "\x1b]0;pwned\x07\x1b[2J\x9b31m"
    entry = next(e for e in status.values() if e["claim"]["process_detail"])
    entry["claim"]["user"]["email"] = "mallory" + evil
    entry["claim"]["users"][0]["email"] = "mallory" + evil
    entry["claim"]["process_detail"][0]["command"] = "python" + evil
    entry["claim"]["idle_for"] = 60.0
    for info in devices.values():
        info["name"] = "NVIDIA A100" + evil
    queue = [{"position": 1, "user": "eve" + evil, "wants": {"gpu": 1}, "waited": 3}]
    for width in (None, 80):
        for colour in (False, True):
            text = format_status(
                status, devices, queue, colour, {"eve" + evil: {"waiting": 1}}, width
            )
            plain = ANSI.sub("", text)  # our own colours, and nothing else
            assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", plain), repr(plain)
            assert "mallory?]0;pwned??[2J?31m" in plain.replace("…", "") or width == 80
    answers = answers_of(scenes()["fleet.json"])
    answers[1].error = "refused" + evil
    text = fleet.fleet_table(answers, True, COLUMNS)
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", ANSI.sub("", text)), repr(text)


def test_the_fleet_examples_dead_hosts_are_what_real_ones_answer_today():
    """The --hosts example's refused and lying hosts, asked again: a daemon stopped now, and
    answers.check on the live host's own /status made to lie as the fixture's does. As found:
    the docs said `not answering: ... [Errno 111] Connection refused` and '2 not answering',
    where the command line says `refused: connection refused` and '1 refused'."""
    scene = scenes()["fleet.json"]
    by_name = {h["host"]: h for h in scene["hosts"]}
    stopped = ServerProcess("--test").start()
    stopped.stop()
    (real,) = fleet.ask_all([stopped.server], 10)
    refused = by_name["gpu2:8080"]
    assert (refused["state"], refused["error"]) == (
        real.shown_state(),
        real.error.replace(stopped.server, "gpu2:8080"),
    )
    lying = json.loads(json.dumps(by_name["gpu3:8080"]["status"]))
    next(iter(lying.values()))["claim"]["users"] = "alice"
    with pytest.raises(answers.BadAnswer) as bad:
        answers.check(lying, by_name["gpu3:8080"]["devices"], fleet.HOST_MAX_GPUS)
    liar = by_name["gpu4:8080"]
    assert (liar["state"], liar["error"]) == (fleet.DOWN, fleet.said(f"bad answer: {bad.value}"))
