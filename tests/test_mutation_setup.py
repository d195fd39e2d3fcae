"""The mutation run's configuration stays valid (CI does not run it; docs/development.md,
"Mutation testing"): scripts/mutation.sh parses, pyproject.toml's [tool.mutmut] names files and
tests that exist, the scope is what the docs say, the equivalent mutants the docs set aside
belong to it, and the engines are left out only outside CI."""
import fnmatch
import importlib.util
import json
import os
import subprocess
import tomllib

import pytest

from helpers import ROOT, WITHOUT_ENGINES, engines_left_out

_spec = importlib.util.spec_from_file_location("mutation",
                                              os.path.join(ROOT, "scripts", "mutation.py"))
mutation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutation)

# tests that start a container engine or Slurm: never in a mutation run
ENGINE_TESTS = {"tests/test_identity_docker.py", "tests/test_engines_docker.py",
                "tests/test_podman.py", "tests/test_containerd.py",
                "tests/test_slurm_daemon.py", "tests/test_slurm_node.py"}


def test_the_one_command_parses_and_runs_the_driver():
    script = os.path.join(ROOT, "scripts", "mutation.sh")
    assert os.access(script, os.X_OK)
    subprocess.run(["sh", "-n", script], check=True)
    assert "scripts/mutation.py run" in open(script, encoding="utf-8").read()


def test_mutmut_is_a_development_extra_only():
    setup = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
    assert '"mutation": ["mutmut>=3' in setup
    requirements = open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8").read()
    assert "mutmut" not in requirements


def test_the_scope_is_the_one_the_docs_name_and_every_file_of_it_exists():
    settings = mutation.config()
    assert settings["source_paths"] == ["patroller/"]
    assert settings["only_mutate"] == [
        "patroller/core/*", "patroller/identify/*", "patroller/observe/jobmap.py",
        "patroller/observe/podresources.py", "patroller/observe/silence.py",
        "patroller/state/*", "patroller/http/hiding.py"]
    files = mutation.scope_files(settings)  # refuses a pattern that matches nothing
    assert "patroller/core/leases/manager.py" in files and "patroller/http/hiding.py" in files
    assert not any(f.startswith("patroller/http/") and f != "patroller/http/hiding.py"
                   for f in files)
    docs = open(mutation.DOCS, encoding="utf-8").read()
    for pattern in settings["only_mutate"]:
        assert f"`{pattern.removeprefix('patroller/').removesuffix('*')}`" in docs, pattern


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
    for kept in ("test_leases", "test_allocations", "test_cgroups", "test_runtimes", "test_book",
                 "test_hide_users", "test_job_map", "test_pod_resources", "test_api"):
        assert f"tests/{kept}.py" not in ignored


def test_a_scope_is_a_package_or_a_module_of_it():
    settings = mutation.config()
    assert mutation.patterns_for(["http/hiding.py"], settings) == ["patroller.http.hiding.*"]
    core = mutation.patterns_for(["core"], settings)
    assert "patroller.core.leases.manager.*" in core and "patroller.core.throttle.*" in core
    assert not any(p.endswith("__init__.*") for p in core)
    everything = mutation.patterns_for([""], settings)
    assert set(core) < set(everything)
    for outside in ("http/fleet.py", "observe/child.py", "nowhere"):
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
    known = {"source_paths", "only_mutate", "also_copy", "pytest_add_cli_args_test_selection",
             "pytest_add_cli_args"}
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
    meta.write_text(json.dumps({"exit_code_by_key": {
        name + "1": 1, name + "2": 0, name + "3": None, name + "4": -24, name + "5": 33}}))
    monkeypatch.setattr(mutation, "MUTANTS", str(tmp_path))
    settings = mutation.config()
    assert mutation.missed(["http/hiding.py"], settings) == [name + "2", name + "5"]
    assert mutation.unfinished(["http/hiding.py"], settings) == [name + "2", name + "3",
                                                               name + "5"]
    assert mutation.unfinished(["core"], settings) == []
    with pytest.raises(SystemExit) as refused:  # the arguments, before anything runs
        mutation.main(["run", "--missed", "--resume"])
    assert refused.value.code == 2


def test_a_sample_draws_from_the_mutants_not_reached_and_estimates_the_rest(tmp_path,
                                                                            monkeypatch, capsys):
    # 40 mutants: 10 tested (8 caught, 2 missed), 30 not reached; a sample of 10 of those is
    # drawn (seeded: the same draw again), and once tested (9 caught, 1 missed) the score
    # counts each of them for 3 of the 30: (8 + 3 * 9) / (10 + 3 * 10) = 87.5%.
    meta = tmp_path / "patroller" / "http" / "hiding.py.meta"
    meta.parent.mkdir(parents=True)
    name = "patroller.http.hiding.x_status__mutmut_"
    codes = {name + str(n): (1 if n < 8 else 0 if n < 10 else None) for n in range(40)}
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    monkeypatch.setattr(mutation, "MUTANTS", str(tmp_path))
    settings = mutation.config()
    other = mutation.draw(["http/hiding.py"], settings, 10, seed=8)
    drawn = mutation.draw(["http/hiding.py"], settings, 10, seed=7)
    assert len(drawn) == 10 and all(codes[n] is None for n in drawn) and drawn != other
    assert mutation.draw(["http/hiding.py"], settings, 10, seed=7) == drawn
    saved = json.loads((tmp_path / mutation.SAMPLE).read_text())
    assert (saved["untested"], saved["names"]) == (30, drawn)
    for n, sampled in enumerate(drawn):
        codes[sampled] = 0 if n == 0 else 1
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    mutation.score(["http/hiding.py"], settings)
    out = capsys.readouterr().out
    assert "10 of 30 mutants not reached, 10 tested: 9 caught, 90.0%" in out
    assert "counted as the sample says: 87.5%" in out
    low, high = mutation.wilson(9, 10)
    assert 0.59 < low < 0.6 and 0.98 < high < 0.99  # Wilson's interval for 9 of 10
