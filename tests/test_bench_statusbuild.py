"""The in-process steps that time /status's slices on the loop (bench/statusbuild.py,
bench/crowded.py) time them as the daemon runs: what a size set up is frozen out of the cycle
collector before anything is timed, as patroller/heap.py freezes what the daemon holds, and
thawed after, so that a full collection of the bench's own objects is never read as a slice; the
crowded GPU is measured in a process of its own, whose heap holds only what it made."""

import gc
from types import SimpleNamespace

import pytest

from bench import crowded, statusbuild


def _watch_freezing(monkeypatch, module):
    """`module`'s one_size, recording how many objects are frozen once a size is set up."""
    frozen_then = []
    real = statusbuild.one_size

    def one_size(gpus, processes, repeats, settled=lambda scene: None):
        def watched(scene):
            settled(scene)
            frozen_then.append(gc.get_freeze_count())

        return real(gpus, processes, repeats, watched)

    monkeypatch.setattr(module, "one_size", one_size)
    return frozen_then


def test_each_size_of_the_status_build_is_timed_with_what_it_set_up_frozen(monkeypatch):
    frozen_then = _watch_freezing(monkeypatch, statusbuild)
    monkeypatch.setattr(statusbuild, "SIZES", [(8, 50), (4, 0)])
    rows = statusbuild.status_build(SimpleNamespace(quick=True, log=lambda *args: None))
    assert [(row["gpus"], row["processes"]) for row in rows] == [(8, 50), (4, 0)]
    assert len(frozen_then) == 2
    assert all(count > 1000 for count in frozen_then)  # the interpreter's own and the scene's
    assert gc.get_freeze_count() == 0  # thawed once measured


def test_the_crowded_gpu_is_timed_with_its_processes_frozen(monkeypatch):
    frozen_then = _watch_freezing(monkeypatch, crowded)
    monkeypatch.setattr(crowded, "PROCESSES", 50)
    result = crowded.measure(quick=True)  # what the step's own process runs
    assert result["processes"] == 50
    assert len(frozen_then) == 1 and frozen_then[0] > 1000
    assert gc.get_freeze_count() == 0


def test_the_crowded_gpu_step_measures_in_a_process_of_its_own(monkeypatch):
    monkeypatch.setattr(crowded, "measure", lambda quick: pytest.fail("measured in the bench"))
    logged = []
    result = crowded.crowded(SimpleNamespace(quick=True, log=logged.append))
    assert result["processes"] == crowded.PROCESSES
    assert 0 < result["longest_slice_ms"] < 1000
    assert set(result) >= {f"{turn}_ms" for turn in crowded.TURNS}
    assert logged and "longest slice" in logged[0]
