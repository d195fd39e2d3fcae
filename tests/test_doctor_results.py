"""What the doctor says of its checks, pure: a result's three states and nothing else, its JSON
for programs, its lines for people (the fix only where there is one, a count of each state at
the end, text others chose made printable) and whether any failed (the command's exit)."""

import pytest

from patroller.doctor.results import Result, any_failed, degraded, failed, lines, ok


def test_a_result_is_one_of_three_states():
    assert Result("cgroups", "ok", "v2").status == "ok"
    with pytest.raises(ValueError) as wrong:
        Result("cgroups", "fine", "v2")
    assert str(wrong.value) == "status 'fine' is none of ('ok', 'degraded', 'failed')"


def test_each_state_is_made_with_what_was_checked_found_and_to_do():
    assert ok("state directory", "/var/lib/patroller") == Result(
        "state directory", "ok", "/var/lib/patroller", ""
    )
    assert degraded("Docker Engine", "no socket", "start it") == Result(
        "Docker Engine", "degraded", "no socket", "start it"
    )
    assert failed("nvidia-smi", "not found", "install the driver") == Result(
        "nvidia-smi", "failed", "not found", "install the driver"
    )


def test_a_result_as_json_names_its_four_fields():
    assert degraded("Docker Engine", "no socket", "start it").json() == {
        "check": "Docker Engine",
        "status": "degraded",
        "detail": "no socket",
        "fix": "start it",
    }
    assert ok("cgroups", "v2").json() == {
        "check": "cgroups",
        "status": "ok",
        "detail": "v2",
        "fix": "",
    }


def test_the_examination_fails_only_when_a_check_failed():
    assert not any_failed([])
    assert not any_failed([ok("a", "fine"), degraded("b", "less", "more")])
    assert any_failed([ok("a", "fine"), failed("c", "broken", "mend it"), ok("d", "fine")])


def test_the_lines_say_each_result_its_fix_where_there_is_one_and_the_counts():
    results = [
        ok("cgroups", "v2"),
        degraded("Docker Engine", "no socket", "start it"),
        failed("nvidia-smi", "not found", "install the driver"),
        degraded("rootless Podman", "none", "start it"),
    ]
    assert lines(results) == [
        "ok        cgroups: v2",
        "degraded  Docker Engine: no socket; fix: start it",
        "failed    nvidia-smi: not found; fix: install the driver",
        "degraded  rootless Podman: none; fix: start it",
        "1 ok, 2 degraded, 1 failed",
    ]
    assert lines([]) == ["0 ok, 0 degraded, 0 failed"]


def test_what_others_chose_is_made_printable_in_the_lines():
    shown = lines([degraded("job map", "line 3 says \x1b[2Jhi", "fix\x07 it")])
    assert shown[0] == "degraded  job map: line 3 says ?[2Jhi; fix: fix? it"
    assert shown[1] == "0 ok, 1 degraded, 0 failed"
