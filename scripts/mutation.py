"""The mutation run: mutmut on the scope of pyproject.toml's [tool.mutmut], then the score.

    scripts/mutation.sh [--fresh | --missed | --resume | --sample N] [--jobs N] [SCOPE ...]
    .venv/bin/python scripts/mutation.py score [SCOPE ...]  (the score of the last run again)

SCOPE is a package or a module of the scope, as a path under patroller/ (`core`, `state`,
`core/leases`, `observe/jobmap.py`, `http/hiding.py`); none means the whole scope. Every mutant
in it is tested again; mutmut keeps in mutants/ which tests ran which function, and runs only
those for a mutant (tests new since the last run are found and added); `--fresh` removes
mutants/ first; `--missed` tests again only the mutants the last run tested and did not catch
(a test added can only catch more; mutmut tests a function whose code changed afresh all the
same); `--resume` tests those and the ones the last run did not reach (a run stopped early goes
on where it stood); `--sample N [--seed S]` tests N of the mutants the last run did not reach,
drawn at random, and the score then estimates, from them, how many of the rest would be caught
(the mutants mutmut reaches last are those that many tests run, tens of seconds each: a whole
run takes hours here, and a run stopped early has tested only the quickest).
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
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tomllib
from typing import Dict, List, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs", "development.md")
MUTANTS = os.path.join(ROOT, "mutants")
SAMPLE = "sample.json"  # in MUTANTS: the mutants --sample drew, and the untested they came from
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
    found = results()
    for name, (path, code) in sorted(found.items()):
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
    stale = sorted(set(set_aside) - set(found))
    for name in stale:
        print(f"  listed as equivalent, but no such mutant: {name}")
    drawn = read_sample()
    if drawn is not None:
        for line in estimate(drawn, {name: result for name, result in found.items()
                                     if result[0] in wanted}, set_aside):
            print(line)
    return 0


def read_sample() -> Dict[str, object] | None:
    """What the last --sample drew (None: no sample since the last --fresh)."""
    try:
        with open(os.path.join(MUTANTS, SAMPLE), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def wilson(caught: int, judged: int, z: float = 1.96) -> Tuple[float, float]:
    """The 95% interval of a fraction caught out of `judged` drawn at random (Wilson's)."""
    if not judged:
        return 0.0, 1.0
    p = caught / judged
    centre = (p + z * z / (2 * judged)) / (1 + z * z / judged)
    half = z * math.sqrt(p * (1 - p) / judged + z * z / (4 * judged * judged)) / (1 + z * z / judged)
    return max(0.0, centre - half), min(1.0, centre + half)


def estimate(drawn: Dict[str, object], found: Dict[str, Tuple[str, object]],
             set_aside: Dict[str, str]) -> List[str]:
    """The sample's lines of the score, from the results in scope (`found`): what it caught,
    and the whole scope's score with the mutants not reached counted as the sample says (each
    drawn one stands for untested/drawn)."""
    names = set(drawn["names"])  # type: ignore[arg-type]
    sampled = [found[name][1] for name in names if name in found and name not in set_aside]
    caught = sum(code in CAUGHT for code in sampled if code is not None)
    judged = sum(code is not None for code in sampled)
    if not judged:
        return [f"  sample (seed {drawn['seed']}): none of its {len(names)} mutants tested yet"]
    known_caught = known_judged = 0
    for name, (path, code) in found.items():
        if name in names or name in set_aside or code is None:
            continue
        known_judged += 1
        known_caught += code in CAUGHT
    untested = int(drawn["untested"])  # type: ignore[arg-type]
    low, high = wilson(caught, judged)
    share = untested / len(names)  # how many untested mutants each drawn one stands for
    whole = (known_caught + share * caught) / (known_judged + share * judged)
    return [f"  sample (seed {drawn['seed']}): {len(names)} of {untested} mutants not reached, "
            f"{judged} tested: {caught} caught, {100.0 * caught / judged:.1f}% (95% interval "
            f"{100 * low:.1f}-{100 * high:.1f}%)",
            f"  the whole scope, its untested mutants counted as the sample says: "
            f"{100.0 * whole:.1f}%"]


def draw(scopes: Sequence[str], settings: dict, size: int, seed: int) -> List[str]:
    """`size` mutants drawn at random (seeded) from those in `scopes` the last run did not
    reach, less the equivalent ones; written to mutants/sample.json for the score."""
    wanted = set(in_scopes(scopes, settings))
    set_aside = equivalents()
    untested = sorted(name for name, (path, code) in results().items()
                      if path in wanted and code is None and name not in set_aside)
    names = sorted(random.Random(seed).sample(untested, min(size, len(untested))))
    with open(os.path.join(MUTANTS, SAMPLE), "w", encoding="utf-8") as f:
        json.dump({"seed": seed, "untested": len(untested), "names": names}, f, indent=1)
    return names


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
    if args.missed or args.resume or args.sample:
        flag = "--missed" if args.missed else "--resume" if args.resume else "--sample"
        if not os.path.isdir(MUTANTS):
            raise SystemExit(f"{flag}: no earlier run in mutants/")
        if args.sample:
            patterns = draw(args.scope, settings, args.sample, args.seed)
        else:
            if args.resume and os.path.exists(os.path.join(MUTANTS, SAMPLE)):
                os.remove(os.path.join(MUTANTS, SAMPLE))  # what it stood for is tested now
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
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="test N mutants drawn from those the last run did not reach")
    parser.add_argument("--seed", type=int, default=1, help="of the --sample draw (default 1)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "2")),
                        help="mutants tested at once (default 2, or MUTATION_JOBS)")
    args = parser.parse_intermixed_args(argv)
    if sum((args.fresh, args.missed, args.resume, bool(args.sample))) > 1:
        parser.error("--fresh, --missed, --resume and --sample go alone")
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
