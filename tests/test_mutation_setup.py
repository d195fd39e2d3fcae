"""The mutation run's configuration stays valid (CI does not run it; docs/development.md,
"Mutation testing"): scripts/mutation.sh parses, pyproject.toml's [tool.mutmut] names files and
tests that exist, the scope is what the docs say, the equivalent mutants the docs set aside
belong to it, and the engines are left out only outside CI."""

import fnmatch
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import tomllib
from helpers import ROOT, WITHOUT_ENGINES, engines_left_out

_spec = importlib.util.spec_from_file_location(
    "mutation", os.path.join(ROOT, "scripts", "mutation.py")
)
mutation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutation)

# tests that start a container engine or Slurm: never in a mutation run
ENGINE_TESTS = {
    "tests/test_identity_docker.py",
    "tests/test_engines_docker.py",
    "tests/test_podman.py",
    "tests/test_containerd.py",
    "tests/test_slurm_daemon.py",
    "tests/test_slurm_node.py",
}


def test_the_one_command_parses_and_runs_the_driver():
    script = os.path.join(ROOT, "scripts", "mutation.sh")
    assert os.access(script, os.X_OK)
    subprocess.run(["sh", "-n", script], check=True)
    assert "scripts/mutation.py run" in Path(script).read_text(encoding="utf-8")


def test_mutmut_is_a_development_extra_only():
    setup = Path(os.path.join(ROOT, "setup.py")).read_text(encoding="utf-8")
    assert '"mutation": ["mutmut>=3' in setup
    requirements = Path(os.path.join(ROOT, "requirements.txt")).read_text(encoding="utf-8")
    assert "mutmut" not in requirements


def test_the_scope_is_the_one_the_docs_name_and_every_file_of_it_exists():
    settings = mutation.config()
    assert settings["source_paths"] == ["patroller/"]
    assert settings["only_mutate"] == [
        "patroller/core/*",
        "patroller/identify/*",
        "patroller/observe/jobmap.py",
        "patroller/observe/podresources.py",
        "patroller/observe/silence.py",
        "patroller/state/*",
        "patroller/http/hiding.py",
        "patroller/http/fastlane.py",
        "patroller/http/fleet.py",
        "patroller/http/fleetlink.py",
        "patroller/doctor/*",
        "patroller/answers.py",
        "patroller/config/*",
    ]
    files = mutation.scope_files(settings)  # refuses a pattern that matches nothing
    for path in (
        "core/leases/manager.py",
        "http/hiding.py",
        "http/fastlane.py",
        "http/fleet.py",
        "http/fleetlink.py",
        "doctor/places.py",
        "doctor/results.py",
        "answers.py",
        "config/settings.py",
        "config/flags.py",
    ):
        assert f"patroller/{path}" in files, path
    # every module of doctor/ and config/, and of http/ only the four named
    for package in ("doctor", "config"):
        for module in os.listdir(os.path.join(ROOT, "patroller", package)):
            if module.endswith(".py"):
                assert f"patroller/{package}/{module}" in files
    assert {f for f in files if f.startswith("patroller/http/")} == {
        "patroller/http/hiding.py",
        "patroller/http/fastlane.py",
        "patroller/http/fleet.py",
        "patroller/http/fleetlink.py",
    }
    docs = Path(mutation.DOCS).read_text(encoding="utf-8")
    for pattern in settings["only_mutate"]:
        assert f"`{pattern.removeprefix('patroller/').removesuffix('*')}`" in docs, pattern
    # the test files of the new scope's concerns stay in the mutation suite
    ignored = {
        arg.removeprefix("--ignore=") for arg in settings["pytest_add_cli_args_test_selection"][1:]
    }
    for kept in ("test_doctor_deadline", "test_fleet", "test_fleet_polling", "test_config"):
        assert f"tests/{kept}.py" not in ignored, kept


def test_what_mutmut_copies_and_the_tests_it_selects_exist():
    settings = mutation.config()
    for path in settings["also_copy"]:
        assert os.path.exists(os.path.join(ROOT, path)), path
    selection = settings["pytest_add_cli_args_test_selection"]
    assert selection[0] == "tests/"
    ignored = {arg.removeprefix("--ignore=") for arg in selection[1:]}
    assert all(arg.startswith("--ignore=") for arg in selection[1:])
    for path in ignored:
        assert os.path.isfile(os.path.join(ROOT, path)), path
    assert ENGINE_TESTS | {"tests/test_layout.py"} <= ignored
    # the lease rules', the identity's, the book's and the hiding's own tests stay in
    for kept in (
        "test_leases",
        "test_allocations",
        "test_cgroups",
        "test_runtimes",
        "test_book",
        "test_hide_users",
        "test_job_map",
        "test_pod_resources",
        "test_api",
    ):
        assert f"tests/{kept}.py" not in ignored


def test_a_scope_is_a_package_or_a_module_of_it():
    settings = mutation.config()
    assert mutation.patterns_for(["http/hiding.py"], settings) == ["patroller.http.hiding.*"]
    core = mutation.patterns_for(["core"], settings)
    assert "patroller.core.leases.manager.*" in core and "patroller.core.throttle.*" in core
    assert not any(p.endswith("__init__.*") for p in core)
    everything = mutation.patterns_for([""], settings)
    assert set(core) < set(everything)
    assert mutation.patterns_for(["answers.py"], settings) == ["patroller.answers.*"]
    assert "patroller.doctor.places.*" in mutation.patterns_for(["doctor"], settings)
    assert "patroller.config.settings.*" in everything
    for outside in ("http/handlers.py", "observe/child.py", "nowhere"):
        with pytest.raises(SystemExit, match="not in the mutation scope"):
            mutation.patterns_for([outside], settings)


def test_equivalent_mutants_in_the_docs_are_mutants_of_the_scope_with_a_reason():
    modules = {mutation.module_of(f) for f in mutation.scope_files(mutation.config())}
    set_aside = mutation.equivalents()
    for name, why in set_aside.items():
        module = name.rsplit(".", 1)[0]
        assert module in modules, name
        assert len(why.split()) >= 3, f"{name}: say why it is equivalent"
    assert mutation.equivalents(os.path.join(ROOT, "README.md")) == {}


def test_pyproject_has_no_mutmut_setting_it_does_not_know():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        settings = tomllib.load(f)["tool"]["mutmut"]
    known = {
        "source_paths",
        "only_mutate",
        "also_copy",
        "pytest_add_cli_args_test_selection",
        "pytest_add_cli_args",
    }
    assert set(settings) == known
    assert fnmatch.fnmatch("patroller/core/leases/holds.py", settings["only_mutate"][0])


@pytest.mark.parametrize("ci", ["true", ""])
def test_engines_are_left_out_only_where_asked_and_never_under_ci(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    monkeypatch.delenv(WITHOUT_ENGINES, raising=False)
    engines_left_out("a Docker Engine")  # not asked: the test goes on
    monkeypatch.setenv(WITHOUT_ENGINES, "0")
    engines_left_out("a Docker Engine")
    monkeypatch.setenv(WITHOUT_ENGINES, "1")
    outcome = pytest.fail.Exception if ci == "true" else pytest.skip.Exception
    with pytest.raises(outcome, match="Docker Engine"):
        engines_left_out("a Docker Engine")


def test_the_driver_refuses_to_run_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(SystemExit, match="not under CI=true"):
        mutation.main(["run", "core"])


def test_missed_and_resume_choose_from_the_last_runs_results(tmp_path, monkeypatch):
    meta = tmp_path / "patroller" / "http" / "hiding.py.meta"
    meta.parent.mkdir(parents=True)
    name = "patroller.http.hiding.x_status__mutmut_"
    meta.write_text(
        json.dumps(
            {
                "exit_code_by_key": {
                    name + "1": 1,
                    name + "2": 0,
                    name + "3": None,
                    name + "4": -24,
                    name + "5": 33,
                }
            }
        )
    )
    monkeypatch.setattr(mutation, "MUTANTS", str(tmp_path))
    settings = mutation.config()
    assert mutation.missed(["http/hiding.py"], settings) == [name + "2", name + "5"]
    assert mutation.unfinished(["http/hiding.py"], settings) == [
        name + "2",
        name + "3",
        name + "5",
    ]
    assert mutation.unfinished(["core"], settings) == []
    with pytest.raises(SystemExit) as refused:  # the arguments, before anything runs
        mutation.main(["run", "--missed", "--resume"])
    assert refused.value.code == 2


def test_a_sample_draws_uniformly_from_the_whole_scope_and_goes_on_where_it_stopped(
    tmp_path, monkeypatch, capsys
):
    # 200 mutants in two files of the scope and one outside the asked scope; the earlier runs
    # tested some (all of hiding.py's first 50, caught), left the rest. The draw takes from all
    # of the asked scope alike, whatever was tested: a draw from the untested alone would
    # leave out what the quick runs reach first.
    mutants = tmp_path / "mutants"
    hiding = mutants / "patroller" / "http" / "hiding.py.meta"
    fleet = mutants / "patroller" / "http" / "fleet.py.meta"
    places = mutants / "patroller" / "doctor" / "places.py.meta"
    hiding.parent.mkdir(parents=True)
    places.parent.mkdir(parents=True)
    h = "patroller.http.hiding.x_status__mutmut_"
    f = "patroller.http.fleet.x_poll__mutmut_"
    hiding_codes = {h + str(n): (1 if n < 50 else None) for n in range(100)}
    fleet_codes = {f + str(n): None for n in range(100)}
    hiding.write_text(json.dumps({"exit_code_by_key": hiding_codes}))
    fleet.write_text(json.dumps({"exit_code_by_key": fleet_codes}))
    places.write_text(
        json.dumps({"exit_code_by_key": {"patroller.doctor.places.x_free__mutmut_1": None}})
    )
    monkeypatch.setattr(mutation, "MUTANTS", str(mutants))
    monkeypatch.setattr(mutation, "SAMPLE", str(tmp_path / "sample.json"))
    settings = mutation.config()
    http = ["http/hiding.py", "http/fleet.py"]
    names = mutation.draw(http, settings, 60, seed=7)["names"]
    assert len(names) == len(set(names)) == 60
    assert all(n.startswith((h, f)) for n in names)  # only the asked scope
    # both files, and tested and untested mutants alike: about a quarter of the draw was
    # tested before (50 of 200); this far from it only by a fault of the draw (p < 1e-6)
    assert 5 <= sum(n.startswith(h) and hiding_codes[n] == 1 for n in names) <= 28
    assert 15 <= sum(n.startswith(f) for n in names) <= 45
    record = json.loads((tmp_path / "sample.json").read_text())
    assert (record["seed"], record["names"], record["population"]) == (7, names, 200)
    # the same seed draws the same mutants, another seed others; a larger sample of the same
    # seed is the same draw extended (its first part stays a uniform sample)
    (tmp_path / "sample.json").unlink()
    assert mutation.draw(http, settings, 20, seed=7)["names"] == names[:20]
    assert mutation.draw(http, settings, 60, seed=7)["names"] == names
    (tmp_path / "sample.json").unlink()  # a draw of 5 on its own, as Python draws few: a set
    assert mutation.draw(http, settings, 5, seed=7)["names"] == names[:5]
    (tmp_path / "sample.json").unlink()
    assert mutation.draw(http, settings, 60, seed=8)["names"] != names
    (tmp_path / "sample.json").unlink()
    # a sample run stopped early: its results are recorded (a run of the same command keeps
    # the draw and what was tested); the estimate counts the first part of the draw that is
    # all tested, not the quick mutants tested beyond it
    first = mutation.draw(http, settings, 60, seed=7)
    assert first["names"] == names

    def codes(n):
        return hiding_codes if n.startswith(h) else fleet_codes

    assert [n for n in names if first["results"][n] is None] == [
        n for n in names if codes(n)[n] is None
    ]
    # tested from the start of the draw up to the first untested one; then one stopped by the
    # user (exit 2), and quick ones tested beyond it: those are left out of the estimate
    untested = [n for n in names if codes(n)[n] is None]
    for n in untested[:10]:
        codes(n)[n] = 0 if n == untested[0] else 1
    codes(untested[10])[untested[10]] = 2
    for n in untested[12:]:
        codes(n)[n] = 0
    hiding.write_text(json.dumps({"exit_code_by_key": hiding_codes}))
    fleet.write_text(json.dumps({"exit_code_by_key": fleet_codes}))
    mutation.score(http, settings)
    out = capsys.readouterr().out
    tested = sum(codes(n)[n] not in (None, 2) for n in names)
    assert f"drawn uniformly: {tested} tested, 2 untested" in out
    first = names.index(untested[10])
    caught = sum(codes(n)[n] == 1 for n in names[:first])
    assert caught == first - 1
    assert f"the first {first} of the draw, all tested: caught {caught} of {first}: " in out
    low, high = mutation.wilson(caught, first)
    assert f"95% interval {100 * low:.1f}-{100 * high:.1f}% (Wilson)" in out
    floor = sum(codes(n)[n] == 1 for n in names)  # the 2 untested counted as missed
    low, high = mutation.wilson(floor, 60)
    assert (
        f"all 60 of the draw, the 2 untested counted as missed (a floor): caught {floor}: "
        f"{100 * floor / 60:.1f}%, 95% interval {100 * low:.1f}-{100 * high:.1f}%"
    ) in out
    assert f"every one tested, by package: http/ {floor} of {tested}" in out
    assert f"sampled, survived: {untested[0]}" in out
    assert f"sampled, survived: {untested[12]}" in out  # every survivor is listed
    kept = json.loads((tmp_path / "sample.json").read_text())["results"]
    assert sum(v is not None for v in kept.values()) == tested
    # mutants/ made afresh (every result gone from it): the record keeps the draw's results
    hiding.write_text(json.dumps({"exit_code_by_key": dict.fromkeys(hiding_codes)}))
    fleet.write_text(json.dumps({"exit_code_by_key": dict.fromkeys(fleet_codes)}))
    again = mutation.draw(http, settings, 60, seed=7)
    assert again["results"] == kept and again["names"] == names
    # a drawn mutant set aside as equivalent since: the same draw, that one left out of the
    # estimate
    monkeypatch.setattr(mutation, "equivalents", lambda path=None: {names[0]: "the same"})
    assert mutation.draw(http, settings, 60, seed=7)["names"] == names
    mutation.score(http, settings)
    assert "(1 set aside since as equivalent)" in capsys.readouterr().out
    low, high = mutation.wilson(9, 10)
    assert 0.59 < low < 0.6 and 0.98 < high < 0.99  # Wilson's interval for 9 of 10
    assert mutation.wilson(990, 1000)[0] > 0.98


def test_every_score_is_printed_beside_the_counts_tested_and_untested(
    tmp_path, monkeypatch, capsys
):
    meta = tmp_path / "patroller" / "answers.py.meta"
    meta.parent.mkdir(parents=True)
    other = tmp_path / "patroller" / "config" / "values.py.meta"
    other.parent.mkdir(parents=True)
    name = "patroller.answers.x_free__mutmut_"
    meta.write_text(
        json.dumps(
            {
                "exit_code_by_key": {
                    name + "1": 1,
                    name + "2": 0,
                    name + "3": None,
                    name + "4": None,
                    name + "5": 2,
                }
            }
        )
    )
    other.write_text(
        json.dumps({"exit_code_by_key": {"patroller.config.values.x_seconds__mutmut_1": 1}})
    )
    monkeypatch.setattr(mutation, "MUTANTS", str(tmp_path))
    monkeypatch.setattr(mutation, "SAMPLE", str(tmp_path / "none.json"))
    mutation.score(["answers.py", "config"], mutation.config())
    out = capsys.readouterr().out.splitlines()
    assert "tested" in out[0] and "untested" in out[0]
    assert out[1].split()[:7] == ["patroller/", "5", "2", "3", "0", "1", "1"]
    assert out[1].endswith("50.0% (3 untested)")
    assert out[2].split()[:7] == ["config/", "1", "1", "0", "0", "1", "0"]
    assert out[3].split()[:8] == ["all", "of", "it", "6", "3", "3", "0", "2"]
    assert out[3].endswith("(3 untested)")
    mutation.score(["answers.py"], mutation.config(), by_module=True)
    assert capsys.readouterr().out.splitlines()[1].startswith("answers.py ")


def test_again_tests_the_draws_misses_anew_and_keeps_the_draw(tmp_path, monkeypatch, capsys):
    # a draw of 20 from 40 mutants, all tested: some missed. The code moves (a mutant more: the
    # population's fingerprint changes, which would make a plain --sample draw anew); --again
    # keeps the draw, marks its misses untested (what they were kept), and the next results of
    # those alone count, a name mutants/ no longer holds keeping its own
    mutants = tmp_path / "mutants"
    hiding = mutants / "patroller" / "http" / "hiding.py.meta"
    hiding.parent.mkdir(parents=True)
    h = "patroller.http.hiding.x_status__mutmut_"
    codes = {h + str(n): (0 if n % 4 == 0 else 1) for n in range(40)}
    hiding.write_text(json.dumps({"exit_code_by_key": codes}))
    monkeypatch.setattr(mutation, "MUTANTS", str(mutants))
    monkeypatch.setattr(mutation, "SAMPLE", str(tmp_path / "sample.json"))
    settings = mutation.config()
    record = mutation.draw(["http/hiding.py"], settings, 20, seed=3)
    names = record["names"]
    missed = [n for n in names if codes[n] == 0]
    assert missed and all(record["results"][n] == 0 for n in missed)
    gone = missed[0]  # its function changed: mutants/ holds it no more
    now = {n: None for n in codes if n != gone} | {h + "40": None}
    hiding.write_text(json.dumps({"exit_code_by_key": now}))
    with pytest.raises(SystemExit):  # no record of that seed
        mutation.again(4, mutation.results())
    assert mutation.again(3, mutation.results()) == missed[1:]  # in the draw's order
    kept = json.loads((tmp_path / "sample.json").read_text())
    assert kept["names"] == names and kept["results"][gone] == 0
    assert kept["again"]["before"] == dict.fromkeys(missed[1:], 0)
    assert all(kept["results"][n] is None for n in missed[1:])
    # a second --again before the run ends: the same left, what they were at the draw kept
    assert mutation.again(3, mutation.results()) == missed[1:]
    assert json.loads((tmp_path / "sample.json").read_text())["again"] == kept["again"]
    # the run: the first of them caught now, the rest still missed
    now |= {n: 0 for n in missed[1:]} | {missed[1]: 1}
    hiding.write_text(json.dumps({"exit_code_by_key": now}))
    mutation.score(["http/hiding.py"], settings)
    out = capsys.readouterr().out
    caught = 20 - len(missed) + 1
    assert f"the first 20 of the draw, all tested: caught {caught} of 20: " in out
    assert f"  {len(missed) - 1} of them missed at " in out and ": 1 caught now (" in out
    assert f"sampled, survived: {gone}" in out and f"sampled, survived: {missed[1]}" not in out
    with pytest.raises(SystemExit) as refused:  # --again only with --sample
        mutation.main(["run", "--again"])
    assert refused.value.code == 2
