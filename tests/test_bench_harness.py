"""The benchmark never loses work: a step whose dependency is missing is skipped with why, one
that fails is recorded as failed (and the run exits 1), and the results are written after
every step, so that what ran before a failure is kept. The steps here are stand-ins; the real
ones run in CI (`python -m bench --quick`)."""
import json

import pytest

import bench.__main__ as bench
from bench import measures


@pytest.fixture
def steps(monkeypatch, tmp_path):
    """footprint measures, parsers fails, page finds selenium missing; nothing is started."""
    out = tmp_path / "results.json"
    seen_by_page = {}
    monkeypatch.setattr(measures.Context, "start", lambda self, processes=500: None)
    monkeypatch.setattr(measures, "footprint", lambda ctx: {"idle": {"cpu_percent": 0.5,
                                                                     "rss_mib": 40}})

    def parsers(ctx):
        raise RuntimeError("the simulator is gone")

    def page(ctx):
        seen_by_page.update(json.loads(out.read_text())["results"])  # saved before this step
        raise ImportError("No module named 'selenium'", name="selenium")
    monkeypatch.setattr(measures, "parsers", parsers)
    monkeypatch.setattr(measures, "page", page)
    return out, seen_by_page


def test_a_failed_and_a_skipped_step_lose_no_other_steps_rows(steps, capsys):
    out, seen_by_page = steps
    code = bench.main(["--quick", "--only", "footprint,parsers,page", "--out", str(out)])
    assert code == 1  # a step failed
    saved = json.loads(out.read_text())
    results = saved["results"]
    assert results["footprint"] == {"idle": {"cpu_percent": 0.5, "rss_mib": 40}}
    assert results["parsers"] == {"failed": "RuntimeError: the simulator is gone"}
    assert results["page"] == {"skipped": "selenium is not installed"}
    assert set(seen_by_page) == {"footprint", "parsers"}  # written as each step ended
    printed = capsys.readouterr().out
    assert "| idle RSS MiB | 40 | < 60 | yes |" in printed
    assert "| step page | skipped: selenium is not installed |" in printed
    assert "| step parsers | failed: RuntimeError: the simulator is gone |" in printed
    checks = {c["what"]: c for c in saved["checks"]}
    assert checks["dmon parser lines/s"]["met"] is None  # not measured, not a crash


def test_only_skipped_steps_exit_zero(steps):
    out, _ = steps
    assert bench.main(["--quick", "--only", "footprint,page", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["results"]["page"] == {
        "skipped": "selenium is not installed"}
