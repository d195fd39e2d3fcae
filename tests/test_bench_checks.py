"""The bench's table reads a run that nothing answered as a goal missed, not as 0 ms met."""

from bench import fleetload


def _fleet_row(run):
    what, measured, target, met = fleetload.checks(
        {"fleet_json_burning": run, "status_hosts_burning": {"max_s": 1.0}}
    )[0]
    assert what.startswith("/fleet.json p99 ms, 1,010 hosts at load")
    return measured, met(measured)


def test_a_fleet_run_at_load_that_nothing_answered_is_a_goal_missed():
    run = {"p99_ms": 0.0, "requests_per_s": 0, "runnable_mean": 26.7}
    assert _fleet_row(run) == (fleetload.NO_ANSWER, False)


def test_a_fleet_run_at_load_that_was_answered_is_judged_by_its_p99():
    assert _fleet_row({"p99_ms": 35.3, "requests_per_s": 963, "runnable_mean": 2.3}) == (
        35.3,
        True,
    )
    assert _fleet_row({"p99_ms": 1760.0, "requests_per_s": 1, "runnable_mean": 24.8}) == (
        1760.0,
        False,
    )
