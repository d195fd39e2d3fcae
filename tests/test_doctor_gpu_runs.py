"""One run of an nvidia-smi command as the doctor keeps it: whether it worked, what it printed,
why it gave no answer in a few words; and runs of real programs through the supervisor (a
shell script in nvidia-smi's place), their environment and their timeout the ones given."""

import asyncio
import errno
import os
from dataclasses import replace

import pytest

from patroller.config import Config
from patroller.core.devices import Device
from patroller.doctor.gpu import Ran, sample, timed
from patroller.observe.supervisor import Answer


def ran(**answer):
    return Ran("nvidia-smi -q -x", 0.5, Answer(**answer), 5.0)


@pytest.mark.parametrize(
    "answer, trouble",
    [
        (
            {"error": OSError(errno.ENOENT, "No such file or directory")},
            "cannot be started: No such file or directory",
        ),
        ({"error": OSError("no reason given")}, "cannot be started: no reason given"),
        ({"status": -9, "timed_out": True}, "no answer in 5s: killed"),
        ({"status": -15, "stopped": True}, "stopped before it answered"),
        (
            {"status": -11, "said": "Segmentation fault\n"},
            "failed with signal 11: Segmentation fault",
        ),
        (
            {"status": 9, "output": "NVIDIA-SMI has failed\n"},
            "failed with status 9: NVIDIA-SMI has failed",
        ),
        ({"status": 3}, "failed with status 3: nothing"),
    ],
)
def test_why_a_run_gave_no_answer_is_said_in_a_few_words(answer, trouble):
    assert not ran(**answer).worked
    assert ran(**answer).trouble() == trouble


def test_a_run_worked_when_it_ended_by_itself_with_status_0_and_its_text_is_both_streams():
    assert ran(status=0, output="<xml/>\n").worked
    assert not ran(status=0, timed_out=True).worked
    assert not ran(status=0, stopped=True).worked
    assert not ran(status=0, error=OSError("gone")).worked
    assert ran(status=1, output="out", said="err").text == "out\nerr"
    assert ran(status=1, output="", said="err").text == "err"
    assert ran(status=1, output="out").text == "out"
    assert ran(status=1).text == ""


def script(folder, body):
    path = folder / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.mark.timeout(30)
def test_a_timed_run_is_given_its_environment_and_said_as_its_command_line(tmp_path):
    program = script(tmp_path, 'echo "$DOCTOR_SAYS" "$@"\n')
    env = {"DOCTOR_SAYS": "hello", "PATH": os.environ["PATH"]}
    done = asyncio.run(timed([program, "-q", "-x"], env, 10.0, Config()))
    assert done.shown == f"{program} -q -x"
    assert done.worked and done.answer.output == "hello -q -x\n"
    assert done.timeout == 10.0 and 0 <= done.seconds < 10.0


@pytest.mark.timeout(30)
def test_a_sample_that_never_comes_is_killed_at_the_monitors_startup_and_two_intervals(
    tmp_path,
):
    program = script(tmp_path, "exec sleep 30\n")
    config = replace(Config(), stream_startup=0.3, sample_interval=0.1)
    devices = [Device("GPU-0", 0), Device("GPU-1", 1)]
    env = {"PATH": os.environ["PATH"]}
    stream = asyncio.run(sample([program], "dmon", ["u", ""], devices, env, config))
    assert stream.select is None and len(stream.runs) == 1
    (only,) = stream.runs
    assert only.shown == f"{program} dmon -s u -i 0,1 -c 1"
    assert only.timeout == pytest.approx(0.5)
    assert only.trouble() == "no answer in 0.5s: killed"
