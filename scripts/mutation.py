"""The mutation run: mutmut on the scope of pyproject.toml's [tool.mutmut], then the score.

    scripts/mutation.sh [--fresh | --missed | --resume | --sample N [--seed S] [--again]]
                        [--jobs N] [SCOPE ...]
    .venv/bin/python scripts/mutation.py score [--modules] [SCOPE ...]  (the last runs' score)

SCOPE is a package or a module of the scope, as a path under patroller/ (`core`, `state`,
`core/leases`, `observe/jobmap.py`, `http/hiding.py`); none means the whole scope. Every mutant
in it is tested again; mutmut keeps in mutants/ which tests ran which function, and runs only
those for a mutant (tests new since the last run are found and added); `--fresh` removes
mutants/ first; `--missed` tests again only the mutants the last run tested and did not catch
(a test added can only catch more; mutmut tests a function whose code changed afresh all the
same); `--resume` tests those and the ones the last run did not reach (a run stopped early goes
on where it stood). `--sample N [--seed S]` draws N mutants uniformly at random from every
mutant of SCOPE (less the equivalent ones), whatever the runs before did with them, and tests
those of them not yet tested; the draw and each drawn mutant's result are kept in
scripts/mutation-sample.json, in git: the same command again goes on with those left, and the
score estimates the whole SCOPE's by the drawn mutants tested, with its 95% interval (Wilson's).
`--again` with the recorded `--sample N --seed S` tests again the drawn mutants it missed, at
the code and tests of now (the draw kept as it was): the estimate of tests added since that
were not written against that draw's survivors, at the cost of that draw's misses alone.
A whole run takes hours here (the mutants mutmut reaches last are those that many tests run,
tens of seconds each), and a run stopped early has tested only the quickest: only the sample's
figure speaks for the whole scope.
The tests are the engine-free suite less the end-to-end files: PATROLLER_TESTS_WITHOUT_ENGINES=1,
which the fixtures of tests/conftest.py honour, and [tool.mutmut] leaves out the test files that
start an engine and the end-to-end ones.

The score of a package: caught (killed, or a timeout) / (caught + missed), over the mutants
tested, less the equivalent ones: the table under "Equivalent mutants" in docs/development.md,
each with why no test can tell it from the code. A mutant no test of the suite runs is missed;
one the run did not reach (stopped early) is untested, and counted apart: every score is
printed beside the counts of the mutants tested and untested, by package (or module) and for
the whole of SCOPE.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs", "development.md")
MUTANTS = os.path.join(ROOT, "mutants")
# the sample's record (--sample): its seed, what it was drawn from, and each drawn mutant's result
# once tested; kept in git, so that a sample run stopped early goes on from it
SAMPLE = os.path.join(ROOT, "scripts", "mutation-sample.json")
# the packages the score is told by: each folder (a module of observe/ and http/ counts in its
# package, a subpackage on its own line)
PACKAGES = (
    "",
    "config",
    "core",
    "core/leases",
    "identify",
    "observe",
    "state",
    "state/usage",
    "http",
    "doctor",
)
# mutmut's exit codes, by what they mean for the score
CAUGHT = {
    1: "killed",
    3: "killed",
    -24: "timeout",
    24: "timeout",
    36: "timeout",
    152: "timeout",
    255: "timeout",
    -9: "killed by a signal",
    -11: "killed by a signal",
    37: "killed",
}
MISSED = {0: "survived", 5: "no tests", 33: "no tests", 35: "suspicious"}
# not tested: not reached yet (None), or stopped by the user (2)
UNTESTED = {None, 2}


def config() -> dict:
    """pyproject.toml's [tool.mutmut]."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["mutmut"]


def scope_files(settings: dict) -> list[str]:
    """The files of the scope (paths from the root), each matched by one of only_mutate."""
    found = []
    for pattern in settings["only_mutate"]:
        matched = sorted(
            path
            for path in glob.glob(os.path.join(ROOT, "patroller", "**", "*.py"), recursive=True)
            if fnmatch.fnmatch(os.path.relpath(path, ROOT), pattern)
        )
        if not matched:
            raise SystemExit(
                f"pyproject.toml [tool.mutmut] only_mutate: {pattern} matches no file"
            )
        found += [os.path.relpath(path, ROOT) for path in matched]
    return found


def module_of(path: str) -> str:
    """patroller/core/leases/holds.py -> patroller.core.leases.holds"""
    return path[: -len(".py")].replace(os.sep, ".").removesuffix(".__init__")


def patterns_for(scopes: Sequence[str], settings: dict) -> list[str]:
    """mutmut's mutant-name patterns for `scopes` (paths under patroller/), refusing one that
    is not in the scope."""
    files = scope_files(settings)
    patterns = []
    for scope in scopes:
        path = os.path.normpath(os.path.join("patroller", scope))
        inside = [f for f in files if f == path or f.startswith(path + os.sep)]
        if not inside:
            raise SystemExit(
                f"{scope}: not in the mutation scope (pyproject.toml [tool.mutmut] "
                f"only_mutate: {', '.join(settings['only_mutate'])})"
            )
        patterns += [module_of(f) + ".*" for f in inside if not f.endswith("__init__.py")]
    return patterns


def equivalents(path: str = DOCS) -> dict[str, str]:
    """The equivalent mutants docs/development.md sets aside: name -> why."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    section = text.split("### Equivalent mutants", 1)
    if len(section) < 2:
        return {}
    body = section[1].split("\n#", 1)[0]
    return dict(re.findall(r"^\| `([^`]+__mutmut_\d+)` \| (.+?) \|$", body, re.M))


def results() -> dict[str, tuple[str, object]]:
    """Every mutant of the last run: name -> (its file, mutmut's exit code for it)."""
    found = {}
    for meta in glob.glob(os.path.join(MUTANTS, "patroller", "**", "*.py.meta"), recursive=True):
        with open(meta, encoding="utf-8") as f:
            data = json.load(f)
        source = os.path.relpath(meta, MUTANTS)[: -len(".meta")]
        for name, code in data["exit_code_by_key"].items():
            found[name] = (source, code)
    return found


def package_of(path: str) -> str:
    """patroller/core/leases/holds.py -> core/leases; patroller/answers.py -> "" (the package's
    own modules)"""
    return os.path.dirname(path).partition(os.sep)[2]


def in_scopes(scopes: Sequence[str], settings: dict) -> list[str]:
    """The files of the scope under `scopes` (paths under patroller/; none: all of them)."""
    files = scope_files(settings)
    if not scopes:
        return files
    prefixes = [os.path.normpath(os.path.join("patroller", s)) for s in scopes]
    return [f for f in files if any(f == p or f.startswith(p + os.sep) for p in prefixes)]


def score(scopes: Sequence[str], settings: dict, by_module: bool = False) -> int:
    """Print, for each package (each module with `by_module`) and for the whole of `scopes`,
    the mutants tested and not, and the score of those tested; then the mutants not caught, and
    the sample's estimate of the whole scope."""
    wanted = set(in_scopes(scopes, settings))
    set_aside = equivalents()
    rows: dict[str, dict[str, int]] = {}
    missed: list[tuple[str, str]] = []
    found = results()
    columns = ("mutants", "tested", "untested", "equivalent", "caught", "missed")
    total = dict.fromkeys(columns, 0)
    for name, (path, code) in sorted(found.items()):
        if path not in wanted:
            continue
        key = os.path.relpath(path, "patroller") if by_module else package_of(path)
        row = rows.setdefault(key, dict.fromkeys(columns, 0))
        for counts in (row, total):
            counts["mutants"] += 1
            if name in set_aside:
                counts["equivalent"] += 1
            elif code in UNTESTED:
                counts["untested"] += 1
            else:
                counts["tested"] += 1
                counts["caught" if code in CAUGHT else "missed"] += 1
        if code not in UNTESTED and code not in CAUGHT and name not in set_aside:
            missed.append((name, MISSED.get(code, f"exit {code}")))
    width = max([len(shown(key, by_module)) for key in rows] + [12])
    print(
        f"{'package' if not by_module else 'module':<{width}} {'mutants':>8} {'tested':>7} "
        f"{'untested':>9} {'equivalent':>11} {'caught':>7} {'missed':>7}  score of the tested"
    )
    order = (lambda key: key) if by_module else (lambda key: ((PACKAGES + (key,)).index(key), key))
    for key in sorted(rows, key=order):
        print(line(shown(key, by_module), rows[key], width))
    print(line("all of it", total, width))
    for name, why in missed:
        print(f"  {why}: {name}")
    for name in sorted(set(set_aside) - set(found)):
        print(f"  listed as equivalent, but no such mutant: {name}")
    record = read_sample()
    if record is not None:
        record = merge_sample(record, found)
        for text in estimate(record, set_aside):
            print(text)
    return 0


def shown(key: str, by_module: bool) -> str:
    """A row's name: `core/leases/`, `patroller/` (the package's own modules), `config/flags.py`"""
    return key if by_module else (key or "patroller") + "/"


def line(name: str, row: dict[str, int], width: int) -> str:
    """One row of the score: the counts, and the score of the mutants tested, never without
    the count of those that were not."""
    judged = row["caught"] + row["missed"]
    percent = f"{100.0 * row['caught'] / judged:.1f}%" if judged else "-"
    return (
        f"{name:<{width}} {row['mutants']:>8} {row['tested']:>7} {row['untested']:>9} "
        f"{row['equivalent']:>11} {row['caught']:>7} {row['missed']:>7}  {percent:>6} "
        f"({row['untested']} untested)"
    )


def read_sample(path: str | None = None) -> dict[str, object] | None:
    """The sample's record (None: no sample drawn)."""
    try:
        with open(path or SAMPLE, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def write_sample(record: dict[str, object], path: str | None = None) -> None:
    with open(path or SAMPLE, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")


def population(
    scopes: Sequence[str],
    settings: dict,
    found: dict[str, tuple[str, object]],
    aside: Sequence[str],
) -> list[str]:
    """Every mutant of `scopes` (all of the scope when none), whatever the runs did with it,
    less the equivalent ones `aside`: what a sample is drawn from."""
    wanted = set(in_scopes(scopes, settings))
    left_out = set(aside)
    return sorted(
        name for name, (path, code) in found.items() if path in wanted and name not in left_out
    )


def fingerprint(names: Sequence[str]) -> str:
    """Which mutants a sample was drawn from: a draw holds while they are the same."""
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def draw(scopes: Sequence[str], settings: dict, size: int, seed: int) -> dict[str, object]:
    """The first `size` of a seeded random order of every mutant of `scopes` (less the
    equivalent ones): drawn uniformly, without replacement, and any first part of the draw is
    itself a uniform sample (a sample run stopped early is judged by the part of the draw it
    tested from the start; a larger size extends the same draw). The record of an earlier draw
    with the same seed, scope and mutants is kept with its results, and extended when `size`
    is larger (a mutant set aside as equivalent since changes neither); any other is replaced.
    Written to SAMPLE, with the results mutants/ holds of
    the drawn mutants."""
    found = results()
    record = read_sample()
    # the equivalent ones left out of the draw are those listed when it was made: one set
    # aside since keeps the draw (the estimate leaves it out), and a stopped run goes on
    aside = sorted(set(equivalents()) & set(found))
    if record is not None and "aside" in record:
        aside = record["aside"]  # type: ignore[assignment]
    drawn_from = population(scopes, settings, found, aside)
    wanted = {
        "seed": seed,
        "scope": sorted(scopes),
        "population": len(drawn_from),
        "fingerprint": fingerprint(drawn_from),
    }
    if record is None or any(record.get(key) != value for key, value in wanted.items()):
        aside = sorted(set(equivalents()) & set(found))
        drawn_from = population(scopes, settings, found, aside)
        wanted = {
            "seed": seed,
            "scope": sorted(scopes),
            "population": len(drawn_from),
            "fingerprint": fingerprint(drawn_from),
        }
        record = {**wanted, "commit": git_head(), "names": [], "results": {}}
    record = {**record, "aside": aside}
    names: list[str] = record["names"]  # type: ignore[assignment]
    if len(names) < size:
        order = random.Random(seed).sample(drawn_from, len(drawn_from))
        names = order[:size]
        assert names[: len(record["names"])] == record["names"]  # type: ignore[arg-type]
        kept: dict[str, object] = record["results"]  # type: ignore[assignment]
        record = {**record, "names": names, "results": {name: kept.get(name) for name in names}}
    write_sample(record)
    return merge_sample(record, found)


def merge_sample(
    record: dict[str, object], found: dict[str, tuple[str, object]]
) -> dict[str, object]:
    """The sample's record with the results mutants/ holds for its mutants not yet tested
    (a mutant stopped by the user, exit 2, is not tested); written back when it changed."""
    drawn: dict[str, object] = record["results"]  # type: ignore[assignment]
    new = {
        name: found[name][1]
        for name, code in drawn.items()
        if code in UNTESTED and name in found and found[name][1] not in UNTESTED
    }
    if new:
        record = {**record, "results": {**drawn, **new}}
        write_sample(record)
    return record


def again(seed: int, found: dict[str, tuple[str, object]]) -> list[str]:
    """`--sample N --seed S --again`: the drawn mutants the record says were missed, marked
    untested so that the run tests them again at the code and tests as they are now; what each
    was is kept in the record (`again`: where, and the result before), the draw is not made
    anew (the population moves with the code: its fingerprint would replace the record). A
    drawn name mutants/ no longer holds keeps its result; the ones caught stay caught (tests
    are added, not taken away; a function changed since has its mutants numbered anew, so its
    names may stand for other faults of it). Tests written after the draw against its own
    survivors make the estimate biased: use it only where they were not."""
    record: dict[str, Any] | None = read_sample()
    if record is None or record.get("seed") != seed:
        raise SystemExit(f"--again: no sample of seed {seed} recorded in {SAMPLE}")
    drawn: dict[str, object] = record["results"]
    aside = set(record.get("aside", [])) | set(equivalents())
    before = {
        name: code
        for name, code in drawn.items()
        if code not in CAUGHT and code not in UNTESTED and name not in aside and name in found
    }
    if before:
        earlier: dict[str, object] = record.get("again", {}).get("before", {})
        record = {
            **record,
            "results": {**drawn, **dict.fromkeys(before)},
            "again": {"at": git_head(), "before": {**before, **earlier}},
        }
        write_sample(record)
    names: list[str] = record["names"]
    return [name for name in names if record["results"][name] in UNTESTED and name in found]


def git_head() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "?"


def wilson(caught: int, judged: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% interval of a fraction caught out of `judged` drawn at random (Wilson's)."""
    if not judged:
        return 0.0, 1.0
    p = caught / judged
    centre = (p + z * z / (2 * judged)) / (1 + z * z / judged)
    half = (
        z * math.sqrt(p * (1 - p) / judged + z * z / (4 * judged * judged)) / (1 + z * z / judged)
    )
    return max(0.0, centre - half), min(1.0, centre + half)


def estimate(record: dict[str, object], set_aside: dict[str, str]) -> list[str]:
    """The sample's lines of the score: how many of the drawn mutants are tested; the whole
    scope's score estimated by the longest first part of the draw that is all tested (a run
    tests the quickest mutants first: the tested ones of a run stopped early are no uniform
    sample, the first part of the draw is), with its 95% interval; then the sampled mutants
    not caught."""
    names: list[str] = record["names"]  # type: ignore[assignment]
    drawn: dict[str, object] = record["results"]  # type: ignore[assignment]
    tested = [name for name in names if drawn[name] not in UNTESTED]
    lines = [
        f"sample (seed {record['seed']}, drawn at {record['commit']}): {len(names)} of the "
        f"{record['population']} mutants of {', '.join(record['scope']) or 'the scope'} "
        f"(less the equivalent ones), drawn uniformly: {len(tested)} tested, "
        f"{len(names) - len(tested)} untested"
    ]
    first = 0
    while first < len(names) and drawn[names[first]] not in UNTESTED:
        first += 1
    judged = [drawn[name] for name in names[:first] if name not in set_aside]
    caught = sum(code in CAUGHT for code in judged)
    if judged:
        low, high = wilson(caught, len(judged))
        aside = first - len(judged)
        lines.append(
            f"  the first {first} of the draw, all tested"
            f"{f' ({aside} set aside since as equivalent)' if aside else ''}: caught "
            f"{caught} of {len(judged)}: {100.0 * caught / len(judged):.1f}%, 95% "
            f"interval {100 * low:.1f}-{100 * high:.1f}% (Wilson)"
        )
    if first < len(names):  # a floor that needs no first part: every untested one missed
        counted = [name for name in names if name not in set_aside]
        floor = sum(drawn[name] in CAUGHT for name in counted)
        low, high = wilson(floor, len(counted))
        lines.append(
            f"  all {len(counted)} of the draw, the {len(names) - len(tested)} untested "
            f"counted as missed (a floor): caught {floor}: "
            f"{100.0 * floor / len(counted):.1f}%, 95% interval "
            f"{100 * low:.1f}-{100 * high:.1f}% (Wilson)"
        )
    if "again" in record:
        retested: dict[str, Any] = record["again"]  # type: ignore[assignment]
        now = sum(drawn[name] in CAUGHT for name in retested["before"])
        lines.append(
            f"  {len(retested['before'])} of them missed at {record['commit']} tested again at "
            f"{retested['at']}: {now} caught now (those caught at the draw counted as caught "
            f"still)"
        )
    by_package: dict[str, list[int]] = {}
    for name in tested:
        if name not in set_aside:
            counts = by_package.setdefault(package_named(name), [0, 0])
            counts[0] += drawn[name] in CAUGHT
            counts[1] += 1
    if by_package:
        lines.append(
            "  every one tested, by package: "
            + ", ".join(
                f"{package} {caught} of {judged}"
                for package, (caught, judged) in sorted(
                    by_package.items(), key=lambda item: -item[1][1]
                )
            )
        )
    lines += [
        f"  sampled, {MISSED.get(drawn[name], f'exit {drawn[name]}')}: {name}"
        for name in sorted(tested)
        if drawn[name] not in CAUGHT and name not in set_aside
    ]
    return lines


def package_named(mutant: str) -> str:
    """patroller.core.leases.queue.xǁWaiterǁ__init____mutmut_7 -> core/leases/"""
    parts = mutant.split(".")[1:-2]
    return "/".join(parts) + "/" if parts else "patroller/"


def missed(scopes: Sequence[str], settings: dict) -> list[str]:
    """The mutants in `scopes` that the last run tested and did not catch, less the equivalent
    ones (those it did not reach are left to a plain run)."""
    wanted = set(in_scopes(scopes, settings))
    set_aside = equivalents()
    return sorted(
        name
        for name, (path, code) in results().items()
        if path in wanted and code is not None and code not in CAUGHT and name not in set_aside
    )


def unfinished(scopes: Sequence[str], settings: dict) -> list[str]:
    """The mutants in `scopes` that the last run did not reach (stopped early) or did not
    catch, less the equivalent ones: what --resume tests."""
    wanted = set(in_scopes(scopes, settings))
    set_aside = equivalents()
    return sorted(
        name
        for name, (path, code) in results().items()
        if path in wanted and code not in CAUGHT and name not in set_aside
    )


def run(args: argparse.Namespace, settings: dict) -> int:
    """mutmut run on the scope, then the score."""
    patterns = patterns_for(args.scope or [""], settings)
    if args.fresh and os.path.isdir(MUTANTS):
        shutil.rmtree(MUTANTS)
    if args.missed or args.resume or args.sample:
        flag = "--missed" if args.missed else "--resume" if args.resume else "--sample"
        if not results():
            raise SystemExit(
                f"{flag}: no earlier run in mutants/ (a plain run makes the "
                f"mutants: scripts/mutation.sh --fresh doctor/results.py)"
            )
        if args.sample and args.again:
            patterns = again(args.seed, results())
        elif args.sample:
            record = draw(args.scope, settings, args.sample, args.seed)
            patterns = [
                name
                for name in record["names"][: args.sample]  # type: ignore[index]
                if record["results"][name] in UNTESTED
            ]  # type: ignore[index]
        else:
            patterns = (missed if args.missed else unfinished)(args.scope, settings)
        if not patterns:
            return score(args.scope, settings)
    env = {**os.environ, "PATROLLER_TESTS_WITHOUT_ENGINES": "1"}
    # the mutated modules are megabytes (config/flags.py's `load` alone has a thousand mutants,
    # 8 MB): compiled once and cached, not again in every daemon or CLI a test starts, where
    # on a busy machine it took longer than the tests wait for a daemon to start
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    mutmut = os.path.join(os.path.dirname(sys.executable), "mutmut")
    try:
        done = subprocess.run(
            [mutmut, "run", "--max-children", str(args.jobs), *patterns],
            cwd=ROOT,
            env=env,
            check=False,
        )
    except KeyboardInterrupt:  # mutmut has it too, and saves what it tested
        print("stopped: scripts/mutation.py score records what was tested", file=sys.stderr)
        return 130
    if done.returncode != 0:
        print(f"mutmut run failed ({done.returncode})", file=sys.stderr)
        score(args.scope, settings)  # a sample keeps what its run tested before the failure
        return done.returncode
    return score(args.scope, settings)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("command", choices=("run", "score"))
    parser.add_argument("scope", nargs="*", help="packages or modules under patroller/")
    parser.add_argument("--fresh", action="store_true", help="remove mutants/ first")
    parser.add_argument(
        "--missed",
        action="store_true",
        help="test again only the mutants the last run did not catch",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="test the mutants the last run did not reach or did not catch",
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=0,
        metavar="N",
        help="test a sample of N mutants drawn uniformly from all of the scope "
        "(those of a stopped run with the same seed left)",
    )
    parser.add_argument("--seed", type=int, default=1, help="of the --sample draw (default 1)")
    parser.add_argument(
        "--again",
        action="store_true",
        help="with --sample: test again the drawn mutants the record says were missed",
    )
    parser.add_argument(
        "--modules", action="store_true", help="score: a line for each module, not each package"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=int(os.environ.get("MUTATION_JOBS", "2")),
        help="mutants tested at once (default 2, or MUTATION_JOBS)",
    )
    args = parser.parse_intermixed_args(argv)
    if sum((args.fresh, args.missed, args.resume, bool(args.sample))) > 1:
        parser.error("--fresh, --missed, --resume and --sample go alone")
    if args.again and not args.sample:
        parser.error("--again goes with --sample N --seed S")
    if args.command == "run" and os.environ.get("CI") == "true":
        # the engine-free suite skips tests, which CI must never do (tests/conftest.py)
        raise SystemExit("a mutation run leaves the engines' tests out: not under CI=true")
    settings = config()
    patterns_for(args.scope or [""], settings)  # a scope outside it is refused before anything
    if args.command == "score":
        return score(args.scope, settings, args.modules)
    return run(args, settings)


if __name__ == "__main__":
    sys.exit(main())
