"""The daemon runs on the C library's allocator (Config.system_allocator): started as a program
without PYTHONMALLOC, it starts itself again once with PYTHONMALLOC=malloc, as the same process;
an allocator the environment names is kept. Read from the kernel: /proc/<pid>/environ is the
environment the process was last started with."""

import json
import urllib.request

import pytest
from helpers import ServerProcess


def environment(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(
            entry.decode().split("=", 1) for entry in f.read().split(b"\0") if b"=" in entry
        )


@pytest.mark.parametrize(("given", "runs_on"), [(None, "malloc"), ("pymalloc", "pymalloc")])
def test_the_daemon_starts_itself_on_the_c_allocator_unless_one_is_named(given, runs_on):
    server = ServerProcess("--test")
    server.env.pop("PYTHONMALLOC", None)
    if given is not None:
        server.env["PYTHONMALLOC"] = given
    server.start()
    try:
        # the process the test started, started again in place: the same pid serves
        assert environment(server.process.pid).get("PYTHONMALLOC") == runs_on
        with urllib.request.urlopen(server.url + "/status", timeout=20) as response:
            assert len(json.loads(response.read())) == 8  # a GPU by uuid
        assert server.log.count("serving") <= 1  # started once, not once a start
    finally:
        assert server.stop() == 0
