"""The mutation run: mutmut on the scope of pyproject.toml's [tool.mutmut], then the score.

    scripts/mutation.sh [--fresh | --missed | --resume] [--jobs N] [SCOPE ...]  (the one command)
    .venv/bin/python scripts/mutation.py score [SCOPE ...]  (the score of the last run again)

SCOPE is a package or a module of the scope, as a path under patroller/ (`core`, `state`,
`core/leases`, `observe/jobmap.py`, `http/hiding.py`); none means the whole scope. Every mutant
in it is tested again; mutmut keeps in mutants/ which tests ran which function, and runs only
those for a mutant (tests new since the last run are found and added); `--fresh` removes
mutants/ first; `--missed` tests again only the mutants the last run tested and did not catch
(a test added can only catch more; mutmut tests a function whose code changed afresh all the
same); `--resume` tests those and the ones the last run did not reach (a run stopped early goes
on where it stood).
The tests are the engine-free suite less the end-to-end files: PATROLLER_TESTS_WITHOUT_ENGINES=1,
which the fixtures of tests/conftest.py honour, and [tool.mutmut] leaves out the test files that
start an engine and the end-to-end ones.

The score of a package: caught (killed, or a timeout) / (caught + missed), over the mutants
tested, less the equivalent ones: the table under "Equivalent mutants" in docs/development.md,
each with why no test can tell it from the code. A mutant no test of the suite runs is missed;
one the run did not reach (stopped early) is untested, and counted apart.
"""
from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from typing import Dict, List, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs", "development.md")
MUTANTS = os.path.join(ROOT, "mutants")
# the packages the score is told by: each folder (a module of observe/ and http/ counts in its
# package, a subpackage on its own line)
PACKAGES = ("core", "core/leases", "identify", "observe", "state", "state/usage", "http")
# mutmut's exit codes, by what they mean for the score
CAUGHT = {1: "killed", 3: "killed", -24: "timeout", 24: "timeout", 36: "timeout",
          152: "timeout", 255: "timeout", -9: "killed by a signal", -11: "killed by a signal",
          37: "killed"}
MISSED = {0: "survived", 5: "no tests", 33: "no tests", 35: "suspicious"}


def config() -> dict:
    """pyproject.toml's [tool.mutmut]."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["mutmut"]


def scope_files(settings: dict) -> List[str]:
    """The files of the scope (paths from the root), each matched by one of only_mutate."""
    found = []
    for pattern in settings["only_mutate"]:
        matched = sorted(path for path in glob.glob(os.path.join(ROOT, "patroller", "**", "*.py"),
                                                    recursive=True)
                         if fnmatch.fnmatch(os.path.relpath(path, ROOT), pattern))
        if not matched:
            raise SystemExit(f"pyproject.toml [tool.mutmut] only_mutate: {pattern} matches no file")
        found += [os.path.relpath(path, ROOT) for path in matched]
    return found


def module_of(path: str) -> str:
    """patroller/core/leases/holds.py -> patroller.core.leases.holds"""
    return path[:-len(".py")].replace(os.sep, ".").removesuffix(".__init__")


def patterns_for(scopes: Sequence[str], settings: dict) -> List[str]:
    """mutmut's mutant-name patterns for `scopes` (paths under patroller/), refusing one that
    is not in the scope."""
    files = scope_files(settings)
    patterns = []
    for scope in scopes:
        path = os.path.normpath(os.path.join("patroller", scope))
        inside = [f for f in files if f == path or f.startswith(path + os.sep)]
        if not inside:
            raise SystemExit(f"{scope}: not in the mutation scope (pyproject.toml [tool.mutmut] "
                             f"only_mutate: {', '.join(settings['only_mutate'])})")
        patterns += [module_of(f) + ".*" for f in inside if not f.endswith("__init__.py")]
    return patterns


def equivalents(path: str = DOCS) -> Dict[str, str]:
    """The equivalent mutants docs/development.md sets aside: name -> why."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    section = text.split("### Equivalent mutants", 1)
    if len(section) < 2:
        return {}
    body = section[1].split("\n#", 1)[0]
    return dict(re.findall(r"^\| `([^`]+__mutmut_\d+)` \| (.+?) \|$", body, re.M))


def results() -> Dict[str, Tuple[str, object]]:
    """Every mutant of the last run: name -> (its file, mutmut's exit code for it)."""
    found = {}
    for meta in glob.glob(os.path.join(MUTANTS, "patroller", "**", "*.py.meta"), recursive=True):
        with open(meta, encoding="utf-8") as f:
            data = json.load(f)
        source = os.path.relpath(meta, MUTANTS)[:-len(".meta")]
        for name, code in data["exit_code_by_key"].items():
            found[name] = (source, code)
    return found


def package_of(path: str) -> str:
    """patroller/core/leases/holds.py -> core/leases"""
    return os.path.dirname(path).split(os.sep, 1)[1]


def in_scopes(scopes: Sequence[str], settings: dict) -> List[str]:
    """The files of the scope under `scopes` (paths under patroller/; none: all of them)."""
    files = scope_files(settings)
    if not scopes:
        return files
    prefixes = [os.path.normpath(os.path.join("patroller", s)) for s in scopes]
    return [f for f in files if any(f == p or f.startswith(p + os.sep) for p in prefixes)]


def score(scopes: Sequence[str], settings: dict) -> int:
    """Print the score of each package and the mutants not caught; 0 when every mutant in
    `scopes` was tested."""
    wanted = set(in_scopes(scopes, settings))
    set_aside = equivalents()
    rows: Dict[str, Dict[str, int]] = {}
    missed: List[Tuple[str, str]] = []
    for name, (path, code) in sorted(results().items()):
        if path not in wanted:
            continue
        row = rows.setdefault(package_of(path), dict.fromkeys(
            ("mutants", "untested", "equivalent", "caught", "missed"), 0))
        row["mutants"] += 1
        if code is None:
            row["untested"] += 1
        elif name in set_aside:
            row["equivalent"] += 1
        elif code in CAUGHT:
            row["caught"] += 1
        else:
            row["missed"] += 1
            missed.append((name, MISSED.get(code, f"exit {code}")))
    print(f"{'package':<12} {'mutants':>8} {'untested':>9} {'equivalent':>11} {'caught':>7} "
          f"{'missed':>7} {'score':>7}")
    for package in sorted(rows, key=lambda p: (PACKAGES + (p,)).index(p)):
        row = rows[package]
        judged = row["caught"] + row["missed"]
        percent = 100.0 * row["caught"] / judged if judged else 100.0
        print(f"{package + '/':<12} {row['mutants']:>8} {row['untested']:>9} "
              f"{row['equivalent']:>11} {row['caught']:>7} {row['missed']:>7} {percent:>6.1f}%")
    for name, why in missed:
        print(f"  {why}: {name}")
    stale = sorted(set(set_aside) - set(results()))
    for name in stale:
        print(f"  listed as equivalent, but no such mutant: {name}")
    return 0


def missed(scopes: Sequence[str], settings: dict) -> List[str]:
    """The mutants in `scopes` that the last run tested and did not catch, less the equivalent
    ones (those it did not reach are left to a plain run)."""
    wanted = set(in_scopes(scopes, settings))
    set_aside = equivalents()
    return sorted(name for name, (path, code) in results().items()
                  if path in wanted and code is not None and code not in CAUGHT
                  and name not in set_aside)


def unfinished(scopes: Sequence[str], settings: dict) -> List[str]:
    """The mutants in `scopes` that the last run did not reach (stopped early) or did not
    catch, less the equivalent ones: what --resume tests."""
    wanted = set(in_scopes(scopes, settings))
    set_aside = equivalents()
    return sorted(name for name, (path, code) in results().items()
                  if path in wanted and code not in CAUGHT and name not in set_aside)


def run(args: argparse.Namespace, settings: dict) -> int:
    """mutmut run on the scope, then the score."""
    patterns = patterns_for(args.scope or [""], settings)
    if args.fresh and os.path.isdir(MUTANTS):
        shutil.rmtree(MUTANTS)
    if args.missed or args.resume:
        flag = "--missed" if args.missed else "--resume"
        if not os.path.isdir(MUTANTS):
            raise SystemExit(f"{flag}: no earlier run in mutants/")
        patterns = (missed if args.missed else unfinished)(args.scope, settings)
        if not patterns:
            return score(args.scope, settings)
    env = {**os.environ, "PATROLLER_TESTS_WITHOUT_ENGINES": "1"}
    mutmut = os.path.join(os.path.dirname(sys.executable), "mutmut")
    done = subprocess.run([mutmut, "run", "--max-children", str(args.jobs), *patterns],
                          cwd=ROOT, env=env, check=False)
    if done.returncode != 0:
        print(f"mutmut run failed ({done.returncode})", file=sys.stderr)
        return done.returncode
    return score(args.scope, settings)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("command", choices=("run", "score"))
    parser.add_argument("scope", nargs="*", help="packages or modules under patroller/")
    parser.add_argument("--fresh", action="store_true", help="remove mutants/ first")
    parser.add_argument("--missed", action="store_true",
                        help="test again only the mutants the last run did not catch")
    parser.add_argument("--resume", action="store_true",
                        help="test the mutants the last run did not reach or did not catch")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "2")),
                        help="mutants tested at once (default 2, or MUTATION_JOBS)")
    args = parser.parse_intermixed_args(argv)
    if sum((args.fresh, args.missed, args.resume)) > 1:
        parser.error("--fresh, --missed and --resume go alone")
    if args.command == "run" and os.environ.get("CI") == "true":
        # the engine-free suite skips tests, which CI must never do (tests/conftest.py)
        raise SystemExit("a mutation run leaves the engines' tests out: not under CI=true")
    settings = config()
    patterns_for(args.scope or [""], settings)  # a scope outside it is refused before anything
    if args.command == "score":
        return score(args.scope, settings)
    return run(args, settings)


if __name__ == "__main__":
    sys.exit(main())
