"""The configuration's sources read in the test process: a file that opens but fails to read,
the limits file nested too deeply, the line a key is named on past multi-line strings, and the
command line's usage and refusals (config/regular.py, policy.py, file.py, flags.py)."""

import contextlib
import io

import pytest
from test_config_file import written

from patroller.config import ConfigError, load, load_limits

FAILS_TO_READ = "/proc/self/mem"  # a regular file whose read at offset 0 fails with EIO


def test_a_file_that_opens_but_cannot_be_read_is_refused_with_the_kernels_words():
    with pytest.raises(ValueError) as refused:
        load_limits(FAILS_TO_READ)
    assert str(refused.value) == f"cannot read {FAILS_TO_READ}: Input/output error"
    with pytest.raises(ConfigError) as refused:
        load(["--config", FAILS_TO_READ], {})
    assert str(refused.value) == (
        f"{FAILS_TO_READ}: cannot read the configuration file: Input/output error"
    )


def test_a_limits_file_nested_too_deeply_is_refused_by_name(tmp_path):
    path = written(tmp_path, "[" * 100000, "limits.json")
    with pytest.raises(ValueError) as refused:
        load_limits(path)
    assert str(refused.value) == f"{path} is nested too deeply: it holds one object of user: limit"


def test_a_key_is_named_on_its_line_past_a_multi_line_string(tmp_path):
    """A line inside a multi-line string that holds two triple quotes of the other kind leaves
    the string open: a `port = 1` inside it is text, not the key."""
    path = written(
        tmp_path,
        'nvidia-smi = """/opt/nvidia-smi\n'
        "a ''' b '''\n"
        "port = 1\n"
        '"""\n'
        "address = '''\n"
        'port = 2 """ """\n'
        "'''\n"
        "port = 'x'\n",
    )
    with pytest.raises(ConfigError) as refused:
        load(["--config", path], {})
    assert str(refused.value).startswith(f"{path}:8: port: 'x'")


def argparse_says(argv):
    said = io.StringIO()
    with contextlib.redirect_stderr(said), pytest.raises(SystemExit) as stopped:
        load(argv, {})
    return stopped.value.code, said.getvalue()


def test_an_unknown_flag_is_refused_under_the_programs_name():
    code, said = argparse_says(["--bogus"])
    assert code == 2 and said.startswith("usage: patroller [-h] [--config VALUE] [--test]")
    assert said.endswith("\npatroller: error: unrecognized arguments: --bogus\n"), said


def test_test_processes_without_test_is_refused_word_for_word():
    with pytest.raises(ConfigError) as refused:
        load(["--test-processes"], {})
    assert str(refused.value) == (
        "--test-processes: only with --test: a GPU host's processes are its own"
    )
