"""The supervised child process: lines, exit, restart with backoff, stop without leftovers."""

import asyncio
import logging
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from itertools import pairwise

import pytest
from helpers import alive, async_test, until

from patroller.config import Config
from patroller.observe.child import parent_death_kill
from patroller.observe.supervisor import Backoff, OneShotChild, RestartingChild


def settings(first=1.0, limit=30.0, **changes):
    """The daemon's settings, with restart delays of `first` doubling up to `limit`."""
    return replace(Config(), restart_first=first, restart_limit=limit, **changes)


def test_backoff_grows_to_the_limit_and_resets_after_a_healthy_run():
    backoff = Backoff(first=1, limit=30, healthy=60)
    assert [backoff.delay(ran=0.1) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay(ran=61) == 1
    assert backoff.delay(ran=1) == 2


@pytest.mark.errors_expected
@async_test
async def test_lines_are_delivered_and_the_exit_is_logged_and_restarted(caplog):
    lines = []
    child = RestartingChild(
        "demo",
        ["sh", "-c", "echo one; printf 'two\\nthree'; echo oops >&2; exit 3"],
        lines.append,
        settings(0.05, 0.05),
    )
    with caplog.at_level(logging.INFO, logger="patroller.observe.supervisor"):
        child.start()
        await until(lambda: child.starts >= 2)
        # Read before stop: a second start comes only after the first exit was recorded, and
        # stop may end a run still going (-15), which is that run's true status, not this one.
        assert child.last_exit == 3
        await child.stop(0.5)
    assert lines[:3] == ["one", "two", "three"]  # the last line had no newline
    assert "demo: exited with status 3" in caplog.text and "oops" in caplog.text


@pytest.mark.errors_expected
@async_test
async def test_a_missing_command_is_retried_with_backoff_not_in_a_loop(caplog):
    child = RestartingChild(
        "ghost", ["/nonexistent/nvidia-smi", "dmon"], lambda line: None, settings(0.2, 0.2)
    )

    def attempts():
        return [
            r.created
            for r in caplog.records
            if "cannot start /nonexistent/nvidia-smi" in r.getMessage()
        ]

    child.start()
    await until(lambda: len(attempts()) >= 3)
    await child.stop(0.5)
    assert child.starts == 0
    times = attempts()
    gaps = [later - earlier for earlier, later in pairwise(times)]
    assert min(gaps) >= 0.19, gaps  # each retry waited its 0.2 s: a slow host only adds to it


@async_test
async def test_stop_terminates_the_whole_group_and_leaves_no_zombie():
    pids = []
    script = "sleep 100 & echo $!; trap '' TERM; while :; do sleep 0.05; done"
    child = RestartingChild(
        "stubborn", ["sh", "-c", script], lambda line: pids.append(int(line)), settings()
    )
    child.start()
    await until(lambda: pids)
    shell = child.child.pid
    await child.stop(grace=0.3)  # the shell ignores SIGTERM: it is killed
    assert child.child.process.returncode is not None  # reaped
    assert not alive(shell)
    await until(lambda: not alive(pids[0]), timeout=5)  # its own child went with the group


@async_test
async def test_an_overlong_line_is_dropped_not_buffered():
    lines = []
    child = RestartingChild(
        "long",
        ["sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x; echo; echo ok; sleep 5"],
        lines.append,
        settings(),
    )
    child.start()
    await until(lambda: "ok" in lines)
    await child.stop(0.5)
    assert lines[-1] == "ok" and all(len(line) <= 64 * 1024 for line in lines)
    assert "x" not in "".join(lines)  # no piece of the long line got through


@pytest.mark.errors_expected
@async_test
async def test_a_line_handler_failure_loses_one_line_not_the_stream(caplog):
    seen = []

    def handler(line):
        seen.append(line)
        if line == "bad":
            raise ValueError("bug")

    child = RestartingChild(
        "fragile", ["sh", "-c", "echo bad; echo good; sleep 5"], handler, settings(0.05, 0.05)
    )
    child.start()
    await until(lambda: "good" in seen)
    await child.stop(0.5)
    assert child.starts == 1  # not restarted
    assert "handling a line failed" in caplog.text


@pytest.mark.errors_expected
@async_test
async def test_a_handler_failing_on_every_line_is_logged_once_a_window(caplog):
    seen = []

    def handler(line):
        seen.append(line)
        raise ValueError("bug")

    script = "for n in 1 2 3 4 5; do echo bad; done; sleep 0.5; echo worse; sleep 5"
    child = RestartingChild("buggy", ["sh", "-c", script], handler, settings(repeat_log_every=0.3))
    child.start()
    await until(lambda: "worse" in seen)
    await child.stop(0.5)
    failed = [r.getMessage() for r in caplog.records if "handling a line failed" in r.getMessage()]
    # The first of a window, then the first of the next, which counts the four held back.
    assert failed == [
        "buggy: handling a line failed: 'bad'",
        "buggy: handling a line failed (4 more since the last report): 'worse'",
    ]


@async_test
async def test_a_child_that_falls_silent_is_killed_once_and_restarted(caplog):
    pids = []
    # Slow to speak (within `startup`), then alive, silent and deaf to SIGTERM.
    script = "sleep 0.6; echo $$; echo tick; trap '' TERM; sleep 100"
    child = RestartingChild(
        "mute",
        ["sh", "-c", script],
        lambda line: line.isdigit() and pids.append(int(line)),
        settings(0.05, 0.05, stream_silence=0.3, stream_startup=30),
    )
    child.start()
    await until(lambda: child.starts >= 2)
    await child.stop(0.5)
    assert child.hangs >= 1 and not alive(pids[0])
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    hung = [w for w in warnings if "hung" in w]
    said = re.fullmatch(r"mute: printed nothing more for ([0-9.]+)s: hung, killing it", hung[0])
    assert said and float(said.group(1)) >= 0.3
    assert len(hung) == child.hangs  # one warning a hang; its exit is not a second one
    assert not [w for w in warnings if "exited with" in w]


@async_test
async def test_a_child_that_prints_nothing_at_all_is_hung_after_the_startup_allowance(caplog):
    child = RestartingChild(
        "dumb",
        ["sleep", "100"],
        lambda line: None,
        settings(5, 5, stream_silence=0.1, stream_startup=0.6),
    )
    child.start()
    await until(lambda: child.hangs == 1)
    await child.stop(0.5)
    said = re.search(r"dumb: printed nothing since it started for ([0-9.]+)s", caplog.text)
    assert said and float(said.group(1)) >= 0.6  # `startup`, not `silence`, before any output


@async_test
async def test_a_steady_child_is_never_taken_as_hung():
    lines = []
    child = RestartingChild(
        "steady",
        ["sh", "-c", "while :; do echo x; sleep 0.05; done"],
        lines.append,
        settings(stream_silence=1.0),
    )
    child.start()
    await until(lambda: len(lines) >= 60)  # three seconds: three times `silence`
    await child.stop(0.5)
    assert child.hangs == 0 and child.starts == 1


def test_the_parent_death_signal_is_armed_in_the_child_and_survives_exec():
    ask = (
        "import ctypes; s = ctypes.c_int(); "
        "ctypes.CDLL(None).prctl(2, ctypes.byref(s), 0, 0, 0); print(s.value)"
    )  # GET
    out = subprocess.run(
        [sys.executable, "-c", ask],
        check=True,
        capture_output=True,
        text=True,
        preexec_fn=parent_death_kill(),
    ).stdout
    assert int(out) == signal.SIGKILL


# Prints the parent-death signal armed in it, and whether it leads a process group of its own.
ASK_CHILD = [
    sys.executable,
    "-c",
    "import ctypes, os; s = ctypes.c_int(); "
    "ctypes.CDLL(None).prctl(2, ctypes.byref(s), 0, 0, 0); "
    "print(s.value, os.getpgid(0) == os.getpid())",
]


@async_test
async def test_both_kinds_of_child_have_the_parent_death_signal_and_their_own_group():
    answer = await OneShotChild(ASK_CHILD, None, 30, Config()).run()
    assert answer.status == 0 and answer.output.split() == [str(int(signal.SIGKILL)), "True"]
    lines = []
    child = RestartingChild("asked", ASK_CHILD, lines.append, settings(5, 5))
    child.start()
    await until(lambda: lines)
    await child.stop(0.5)
    assert lines[0].split() == [str(int(signal.SIGKILL)), "True"]


async def lines_between_turns(line: str, total: int, cost: float, **changes) -> list[int]:
    """A child prints `total` times `line`; each costs the handler `cost` seconds (busy): how
    many lines were handled between two turns of the event loop, turn after turn."""
    handled = 0
    runs, since_turn = [], [0]

    def slow_line(_: str) -> None:
        nonlocal handled
        handled += 1
        since_turn[0] += 1
        began = time.perf_counter()
        while time.perf_counter() - began < cost:
            pass

    def turn() -> None:  # runs every time the loop gets a turn
        runs.append(since_turn[0])
        since_turn[0] = 0
        if handled < total:
            loop.call_soon(turn)

    loop = asyncio.get_running_loop()
    script = f"import sys; sys.stdout.write({line + chr(10)!r} * {total}); sys.stdout.flush()"
    child = RestartingChild(
        "burst",
        [sys.executable, "-c", script],
        slow_line,
        settings(30, 30, loop_slice=0.001, **changes),
    )
    loop.call_soon(turn)
    child.start()
    await until(lambda: handled == total, timeout=30)
    await child.stop(0.5)
    return runs


@async_test
async def test_a_burst_of_lines_lets_the_event_loop_serve_between_slices():
    """5,000 pmon rows a second come in 64 KiB chunks: the lines of one chunk are handled a
    slice (Config.loop_slice) at a time, and what else waits on the loop runs in between."""
    runs = await lines_between_turns("x", 20000, 20e-6)  # some 20 µs, as a pmon row here
    # A 1 ms slice at 20 µs a line is some 50 lines, checked every 32: never hundreds at once.
    assert max(runs) < 200, f"the loop waited for {max(runs)} lines at once"


@async_test
async def test_the_slice_goes_on_across_chunks_of_a_burst():
    """A chunk the reader has buffered already is read without a turn of the loop, and a
    chunk may hold fewer than 32 lines (here: max_line 2 KiB, lines of 100 bytes; a pipe's
    64 KiB arrive at once): the clock is read every 32 lines of the burst, not of each chunk.
    At 50 µs a line, 32 lines are past the 1 ms slice every time."""
    runs = await lines_between_turns("x" * 99, 1500, 50e-6, max_line=2048)
    assert max(runs) <= 32, f"the loop waited for {max(runs)} lines at once"
