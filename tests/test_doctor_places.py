"""The doctor's checks of the places on disk, over real folders in tmp_path (and a read-only
tmpfs): the state directory (trusted, writable, made where it is missing), the lease book in
it, the usage history, the Slurm job map; each check's words compared whole (the probes run as
the doctor runs them; tests/test_doctor_checks.py has the others)."""

import os
import time

import pytest

from patroller.config import Config
from patroller.doctor.places import (
    READ_ONLY,
    JobMapFacts,
    StateFacts,
    check_book,
    check_job_map,
    check_state,
    check_usage,
    probe_job_map,
    probe_state,
)
from patroller.doctor.results import Result
from patroller.state import schema
from patroller.state.bookfiles import FILE


def test_a_lease_book_holding_devices_is_counted(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    held = {
        "state": "reserved",
        "releasing": False,
        "asked": 1,
        "deadline": None,
        "holder": {"user": "alice"},
    }
    (state / FILE).write_bytes(
        schema.encode({"GPU-a": held, "GPU-b": held}, time.time() - 7200, None)
    )
    result = check_book(probe_state(str(state)))
    assert (result.check, result.status) == ("lease book", "ok"), result
    assert result.detail.startswith("2 device(s) held, saved ") and result.detail.endswith(
        " ago"
    ), result


@pytest.mark.parametrize("name", ["state", "lab; old"])  # a path may hold a `; ` too
def test_a_state_directory_others_may_write_to_fails_with_the_fix(tmp_path, name):
    state = tmp_path / name
    state.mkdir()
    state.chmod(0o777)
    assert check_state(probe_state(str(state)), Config()) == Result(
        "state directory",
        "failed",
        f"the state directory {state} is writable by others (mode 777, uid {os.geteuid()})",
        "choose another --state-dir, or make it ours and private (chmod 700)",
    )
    assert check_book(probe_state(str(state))) == Result(
        "lease book", "ok", "none (see the state directory)"
    )


def test_a_state_directory_that_cannot_be_made_on_a_read_only_mount(read_only):
    missing = read_only / "state" / "new"
    assert check_state(probe_state(str(missing)), Config()) == Result(
        "state directory",
        "degraded",
        f"{missing} cannot be made in {read_only / 'state'}: {READ_ONLY}: the daemon reads the "
        "lease book at start and writes nothing there: reservations do not survive a restart, "
        "and no usage history is kept",
        "mount it read-write, or choose another --state-dir",
    )


def test_a_writable_state_directory_with_room_is_fine():
    facts = StateFacts("/srv/state", exists=True, free_mib=1 << 20)
    assert check_state(facts, Config()) == Result(
        "state directory", "ok", "/srv/state is writable, 1048576 MiB free"
    )


def test_usage_without_a_state_directory_says_why_none_is_kept():
    for config, why in (
        (Config(state_dir=None), "--state-dir none"),
        (Config(state_dir=None, test=True), "test mode"),
    ):
        assert check_usage(config) == Result(
            "usage history",
            "degraded",
            f"--usage sqlite, but there is no state directory ({why}): no usage history is "
            "kept, and `patroller report` and GET /usage have nothing to report",
            "give --state-dir DIR (the lease book and the usage store), or --usage none to "
            "keep none",
        )


def test_a_job_map_not_there_yet_and_one_others_may_write_to(tmp_path):
    jobs = tmp_path / "jobs"
    assert check_job_map(probe_job_map(str(jobs), 4096)) == Result(
        "Slurm job map",
        "degraded",
        f"{jobs} is not there yet: no GPU is a job's until the prolog makes it",
        "check that slurm.conf runs contrib/slurm's prolog (docs/slurm.md)",
    )
    jobs.mkdir()
    jobs.chmod(0o777)
    # what to do holds a `; ` of its own: the refusal is cut at the first
    assert check_job_map(probe_job_map(str(jobs), 4096)) == Result(
        "Slurm job map",
        "failed",
        f"the Slurm job map {jobs} is writable by others (mode 777, uid {os.geteuid()})",
        "make it root's and writable by root alone (chown root; chmod 755), as "
        "contrib/slurm's prolog makes it",
    )
    assert check_job_map(JobMapFacts(str(jobs), untrusted=("said alone", ""))) == Result(
        "Slurm job map", "failed", "said alone", ""
    )
