"""The promises of the README and docs/ that can be checked mechanically: the quick start, the
links and anchors between the pages, the headings, and every flag documented as it exists."""

import functools
import glob
import os
import re
import subprocess
import sys
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path

from helpers import ROOT

from patroller.cli import COMMANDS  # every client command, as the command line lists them


def read(path):
    return open(os.path.join(ROOT, path), encoding="utf-8").read()


def readme():
    return read("README.md")


def pages():
    """Every page of the documentation, by its path from the root: the README and docs/*.md."""
    paths = ["README.md"] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
    )
    return {path: read(path) for path in paths}


def quick_start_commands():
    section = readme().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", section)


def test_quick_start_has_two_set_up_commands():
    commands = quick_start_commands()
    assert "--test" in commands[0] and "pip install" in commands[0]
    assert "pytest" in commands[1] and "tests/setup.sh" in commands[1]
    setup = Path(os.path.join(ROOT, "tests", "setup.sh")).read_text(encoding="utf-8")
    assert "-e '.[test]'" in setup and "docker.io busybox-static" in setup


def test_the_quick_starts_daemon_keeps_a_usage_store_that_report_reads(tmp_path):
    """The quick start's daemon, as written (its `~` a home of the test's own, its port one the
    kernel picks): it keeps a usage store, so `patroller report` answers there. As found: test
    mode kept none, and `patroller report` said "no usage store here"."""
    line = quick_start_commands()[0]
    daemon = line.split(" && ")[-1]
    assert daemon.startswith(".venv/bin/patroller --test ") and " --state-dir ~/" in daemon
    words = daemon.replace(".venv/bin/patroller", 'exec "$PYTHON" -m patroller', 1)
    words = words.replace("--port 8080", "--port 0 --address 127.0.0.1")
    env = {**os.environ, "HOME": str(tmp_path), "PYTHON": sys.executable, "PYTHONPATH": ROOT}
    env.pop("PATROLLER_STATE_DIR", None)
    log = tmp_path / "daemon.log"
    with open(log, "w") as out:
        started = subprocess.Popen(
            ["sh", "-c", words], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while not re.search(r" on http://127\.0\.0\.1:(\d+)", log.read_text()):
            assert started.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        port = re.search(r" on http://127\.0\.0\.1:(\d+)", log.read_text()).group(1)
        assert "no usage history is kept" not in log.read_text()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "patroller",
                "report",
                "--since",
                "1h",
                "--server",
                f"127.0.0.1:{port}",
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert os.path.exists(tmp_path / ".local" / "state" / "patroller-test" / "usage.sqlite3")
    finally:
        started.terminate()
        started.wait(30)


def test_ci_runs_the_readme_test_command():
    ci = Path(os.path.join(ROOT, ".ci", "run")).read_text(encoding="utf-8").splitlines()
    assert quick_start_commands()[1] in ci


def test_the_readme_names_every_package_the_test_setup_installs():
    """The packages of tests/setup.sh's apt-get install, each named in the README's list."""
    setup = read("tests/setup.sh")
    command = setup.split("apt-get -o DPkg::Lock::Timeout=600 install", 1)[1].split(">/dev/null")[
        0
    ]
    packages = [
        w for w in command.replace("\\", " ").split() if not w.startswith(("-", "$")) and w != "\n"
    ]
    packages += re.findall(
        r"systemd=\"\"\n\s*command -v systemd-analyze \S+ 2>&1 \|\| (\w+)=", setup
    )
    assert {"docker.io", "wrk", "containerd"} <= set(packages), packages
    said = readme().split("`tests/setup.sh` makes the virtual environment", 1)[1].split("\n\n")[0]
    missing = [p for p in packages if f"`{p}`" not in said]
    assert not missing, f"the README does not say tests/setup.sh installs {missing}"


PAGE_FILES = (
    "patroller/http/web/base.html",
    "patroller/http/web/index.html",
    "patroller/http/web/app.js",
    "patroller/http/web/common.js",
    "patroller/http/web/style.css",
)


def test_the_screenshot_was_taken_after_the_page_last_changed():
    """docs/screenshot.png (the README's and web.md's picture) shows the page as it is: no
    commit since the one that last took it (scripts/screenshot.py) changed the page's files."""

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)

    shot = git("log", "-1", "--format=%H", "--", "docs/screenshot.png").stdout.strip()
    if not shot:
        import pytest

        if os.environ.get("CI") == "true":
            pytest.fail("CI must check the screenshot's age: no git history of it here")
        pytest.skip("no git history here to date the screenshot by")
    later = git("rev-list", f"{shot}..HEAD", "--", *PAGE_FILES).stdout.split()
    dirty = git("status", "--porcelain", "--", *PAGE_FILES).stdout.strip()
    assert not later and not dirty, (
        f"the page changed after docs/screenshot.png was taken ({len(later)} commit(s)"
        f"{', and uncommitted changes' if dirty else ''}): run scripts/screenshot.py"
    )


def test_console_script_runs():
    script = os.path.join(os.path.dirname(sys.executable), "patroller")
    result = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.startswith("patroller ")


def test_example_uses_the_client_without_copying_it():
    example = Path(os.path.join(ROOT, "example.py")).read_text(encoding="utf-8")
    assert "from patroller.client import" in example
    assert "def claim" not in example and "urllib" not in example and "http.client" not in example


def test_dockerfile_copies_files_that_exist_and_runs_the_console_script():
    lines = Path(os.path.join(ROOT, "Dockerfile")).read_text(encoding="utf-8").splitlines()
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert os.path.exists(os.path.join(ROOT, source)), source
    assert 'ENTRYPOINT ["patroller"]' in lines


def docker_run(text, prefix=""):
    """The GPU host `docker run` command in `text`, as one normalised line."""
    lines = [
        line[len(prefix) :].strip() if line.startswith(prefix) else None
        for line in text.splitlines()
    ]
    start = next(i for i, line in enumerate(lines) if line and line.startswith("docker run -d"))
    command = []
    for line in lines[start:]:
        command.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            return " ".join(command)


def test_the_dockerfile_recommends_the_docs_docker_run():
    dockerfile = Path(os.path.join(ROOT, "Dockerfile")).read_text(encoding="utf-8")
    gpu_host = read("docs/gpu-host.md")
    assert docker_run(dockerfile, "#") == docker_run(gpu_host)
    assert "--network host" in docker_run(gpu_host)


def ignored(patterns, path):
    """Whether .dockerignore `patterns` keep `path` out of the build context (last match wins)."""
    import fnmatch

    out = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, pattern[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes)
        if hit:
            out = not negate
    return out


def test_the_build_context_is_what_the_dockerfile_copies():
    patterns = [
        line.strip()
        for line in Path(os.path.join(ROOT, ".dockerignore"))
        .read_text(encoding="utf-8")
        .splitlines()
        if line.strip() and not line.startswith("#")
    ]
    lines = Path(os.path.join(ROOT, "Dockerfile")).read_text(encoding="utf-8").splitlines()
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert not ignored(patterns, source.rstrip("/")), source
    for path in (
        ".venv",
        ".git",
        "tests",
        "bench/results.json",
        "patroller.egg-info",
        "patroller/__pycache__",
        "patroller/nvsmi/__pycache__/child.cpython-311.pyc",
    ):
        assert ignored(patterns, path), path
    assert not ignored(patterns, "patroller/openapi.json")


# -- links, anchors and headings ---------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"(`+)((?:(?!\n\n).)+?)\1", re.S)  # inline code, within one paragraph


def prose(text):
    """`text` with its fenced code blocks blanked (line numbers kept)."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def headings(text):
    """(level, text) of every heading outside code blocks."""
    return [
        (len(m.group(1)), m.group(2).strip())
        for m in re.finditer(r"^(#{1,6})[ \t]+(.*)$", prose(text), re.M)
    ]


def anchor(heading):
    """GitHub's anchor for a heading: the text as shown (code spans' content, a link's text),
    lowercased, without characters other than letters, digits, spaces, hyphens and
    underscores, spaces turned to hyphens."""
    shown = CODE_SPAN.sub(lambda m: m.group(2), heading)
    shown = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", shown)
    return re.sub(r"[^\w\- ]", "", shown.lower()).replace(" ", "-")


def anchors(text):
    """Every anchor of a page, a repeated one numbered as GitHub does (-1, -2, ...)."""
    seen, out = Counter(), set()
    for _, heading in headings(text):
        slug = anchor(heading)
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


def links(text):
    """(line number, target) of every Markdown link and image outside code."""
    shown = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose(text))
    return [
        (shown.count("\n", 0, m.start()) + 1, m.group(1))
        for m in re.finditer(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", shown)
    ]


def broken_links(documents):
    """'page:line: target (why)' for every relative link of `documents` that does not resolve."""
    broken = []
    for page, text in documents.items():
        for line, target in links(text):
            if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # http:, https:, mailto: ...: not this repository's
            path, _, fragment = target.partition("#")
            where = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if where.startswith(".."):
                broken.append(f"{page}:{line}: {target} (outside the repository)")
            elif where not in documents and not os.path.exists(os.path.join(ROOT, where)):
                broken.append(f"{page}:{line}: {target} (no such file)")
            elif fragment and where.endswith(".md"):
                target_text = documents.get(where) or read(where)
                if fragment not in anchors(target_text):
                    broken.append(f"{page}:{line}: {target} (no such heading in {where})")
    return broken


def test_every_relative_link_and_anchor_resolves():
    documents = pages()
    assert len(documents) > 5 and sum(len(links(t)) for t in documents.values()) > 20
    assert broken_links(documents) == []


def test_a_broken_link_or_anchor_is_found():
    documents = {
        "docs/a.md": "# A\n\n## The `GET /x`: one\n\n[ok](#the-get-x-one) [ok](b.md#b)"
        " [ok](../README.md#quick-start) `[not a link](#nowhere)`\n\n"
        "```\n[in code](#nowhere)\n```\n[bad](#nowhere) [bad](c.md)\n"
        "[bad](b.md#b-1) [bad](../README.md#quick-star)\n",
        "docs/b.md": "# B\n",
    }
    assert broken_links(documents) == [
        "docs/a.md:10: #nowhere (no such heading in docs/a.md)",
        "docs/a.md:10: c.md (no such file)",
        "docs/a.md:11: b.md#b-1 (no such heading in docs/b.md)",
        "docs/a.md:11: ../README.md#quick-star (no such heading in README.md)",
    ]


def test_anchors_follow_githubs_rules():
    assert (
        anchor("`hold=process`: held for as long as the calling process lives")
        == "holdprocess-held-for-as-long-as-the-calling-process-lives"
    )
    assert anchor("Users in containers: the socket") == "users-in-containers-the-socket"
    assert (
        anchor("`GET /history[?since=T][&limit=N]`: the audit record")
        == "get-historysincetlimitn-the-audit-record"
    )
    assert anchors("# A\n## x\n## x\n```\n## x\n```\n## x\n") == {"a", "x", "x-1", "x-2"}


def malformed(text):
    """Why each heading of a page is malformed or repeated, in words."""
    problems = []
    for line in prose(text).split("\n"):
        if re.match(r"#{1,6}[^#\s]", line):
            problems.append(f"{line!r}: no space after the #")
    found = headings(text)
    for level, heading in found:
        plain = CODE_SPAN.sub("", heading)
        if not heading:
            problems.append(f"an empty level-{level} heading")
        if heading.count("`") % 2:
            problems.append(f"{heading!r}: unbalanced backticks")
        if plain.count('"') % 2:
            problems.append(f"{heading!r}: unbalanced quotes")
        if re.search(r"(^|\s)#{1,6}\s", plain) or heading.endswith("#"):
            problems.append(f"{heading!r}: a heading inside a heading")
        for opening, closing in ("()", "[]"):
            if heading.count(opening) != heading.count(closing):
                problems.append(f"{heading!r}: unbalanced {opening}{closing}")
    for heading, times in Counter(heading for _, heading in found).items():
        if times > 1:
            problems.append(f"{heading!r}: {times} times")
    levels = [level for level, _ in found]
    if levels[:1] != [1] or levels.count(1) != 1:
        problems.append("not one top-level (#) heading, first")
    for before, after in pairwise(levels):
        if after > before + 1:
            problems.append(f"a level-{after} heading under a level-{before} one")
    return problems


def test_no_heading_is_malformed_or_repeated():
    assert {page: malformed(text) for page, text in pages().items()} == {
        page: [] for page in pages()
    }


def test_a_malformed_or_repeated_heading_is_found():
    stray = '# P\n\n## The web page", after "## The command line" (before "## On a GPU host")\n'
    assert malformed(stray) and "unbalanced quotes" in malformed(stray)[0]
    assert malformed("# P\n## `GET /x\n")  # unbalanced backticks
    assert malformed("# P\n## Errors\n### x\n## Errors\n") == ["'Errors': 2 times"]
    assert malformed("# P\n#### x\n")  # a level skipped
    assert malformed("# P\n##Errors\n")  # no space: not a heading at all
    assert malformed('# P\n```\n# a comment\n# a comment\n```\n## `a "quoted" [x]`\n') == []


# -- flags ---------------------------------------------------------------------------------------

# Flags the documentation names that belong to other programs: never one of Patroller's.
FOREIGN = {
    "--gpus",
    "--pid",
    "--network",
    "--cap-add",
    "--restart",
    "--name",
    "--label",
    "--cgroup-parent",
    "--device",  # docker run (its --user is also `patroller history --user`)
    "--query-compute-apps",
    "--format",  # nvidia-smi
    "--no-deps",  # pip install
    "--scenario",  # python -m patroller.simulator
    "--now",
    "--full",  # systemctl enable --now, systemctl edit --full
    "--hpc-job-mapping-dir",  # dcgm-exporter
    "--check",
    "--fix",  # ruff format --check, ruff check --fix
    "--ignore-revs-file",  # git blame
    "--max-children",  # mutmut run
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def help_text(*args):
    done = subprocess.run(
        [sys.executable, *args, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def options(text):
    """The long flags an argparse --help lists as options (not those named in descriptions)."""
    return {
        flag
        for line in text.splitlines()
        if re.match(r"  -", line)
        for flag in FLAG.findall(re.split(r"\s{2,}", line.strip(), maxsplit=1)[0])
    }


@functools.lru_cache
def patroller_flags():
    """Every long flag of the daemon and of each client command, by where --help lists it."""
    flags = {"patroller": options(help_text("-m", "patroller"))}
    for command in COMMANDS:
        flags[f"patroller {command}"] = options(help_text("-m", "patroller.cli", command))
    flags["patroller doctor"] = options(help_text("-m", "patroller", "doctor"))
    flags["patroller config"] = options(help_text("-m", "patroller", "config"))
    return flags


@functools.lru_cache
def bench_flags():
    return (
        options(help_text("-m", "bench"))
        | options(help_text("-m", "bench.gpucheck"))
        | options(help_text("-m", "bench.reports"))
    )


def mutation_flags():
    """scripts/mutation.sh's (scripts/mutation.py's): the mutation run, docs/development.md."""
    return options(help_text("scripts/mutation.py"))


def all_flags():
    return set().union(*patroller_flags().values())


def test_every_flag_in_help_is_documented():
    flags = patroller_flags()
    assert {"--test", "--port", "--audit-log", "--version"} <= flags["patroller"]
    assert {"--server", "--wait", "--quiet", "--count"} <= flags["patroller run"]
    assert "--no-colour" in flags["patroller status"] and "--hold" in flags["patroller reserve"]
    text = "\n".join(pages().values())
    missing = {
        where: sorted(flag for flag in names if not re.search(rf"(?<![\w-]){flag}(?![\w-])", text))
        for where, names in flags.items()
    }
    assert missing == {where: [] for where in flags}


def commands_of(text):
    """The command lines of `text` that run Patroller (`patroller ...`, `$ patroller ...`,
    `.venv/bin/patroller ...`, in code blocks or inline code), continuation lines joined."""
    blocks = re.findall(r"^```\w*\n(.*?)^```", text, re.S | re.M)
    spans = [m.group(2) for m in CODE_SPAN.finditer(prose(text))]
    found = []
    for chunk in blocks + spans:
        chunk = re.sub(r"\"[^\"\n]*\"|'[^'\n]*'", "''", chunk)  # quoted: another program's words
        for line in re.sub(r"\\\n\s*", " ", chunk).split("\n"):
            line = re.sub(r"\s#\s.*", "", line)  # a comment
            for part in re.split(r"&&|\|\||\s\|\s|;", line):
                m = re.match(
                    r"\s*(?:[$#]\s+)?(?:\w+=\S*\s+)*(?:\S*/)?patroller(?:\s+(.*))?$", part
                )
                if m:
                    found.append((m.group(1) or "").split(" -- ")[0])
    return found


def flags_documented_as_patrollers(documents):
    """Every --flag the documentation gives as Patroller's, by where: the configuration table's
    first column, the synopses of the command line's headings, and command lines that run
    patroller."""
    places = []
    for page, text in documents.items():
        for line in prose(text).split("\n"):
            if page == "docs/configuration.md" and line.startswith("| `--"):
                places.append((f"{page} table", line.split("|")[1]))
        for _, heading in headings(text):
            if heading.startswith("`patroller "):
                places.append((f"{page} heading", heading))
        places.extend((f"{page} command", command) for command in commands_of(text))
    return [(where, flag) for where, text in places for flag in FLAG.findall(text)]


def test_every_flag_documented_as_patrollers_exists():
    documented = flags_documented_as_patrollers(pages())
    assert len({flag for _, flag in documented}) > 30  # the table, the synopses, the examples
    assert [(where, flag) for where, flag in documented if flag not in all_flags()] == []


def test_every_flag_the_docs_name_belongs_to_someone():
    assert not FOREIGN & all_flags() and not FOREIGN & bench_flags()
    known = all_flags() | bench_flags() | mutation_flags() | FOREIGN
    unknown = {page: sorted(set(FLAG.findall(text)) - known) for page, text in pages().items()}
    assert unknown == {page: [] for page in pages()}


def test_a_flag_that_does_not_exist_is_found():
    text = (
        "| flag |\n| --- |\n| `--no-such-flag` | x |\n\n## `patroller run --bogus`\n\n"
        "```sh\n$ patroller status \\\n    --watchh 2\n.venv/bin/patroller --tset -- cmd "
        "--x\n```\n"
        "`PATROLLER_SERVER=x patroller wait --nope`, `docker run --gpus all`\n"
        "`patroller --nvidia-smi 'sim --scenario s' --watch 2 # --ok`, `patroller --a|b`\n"
    )
    documented = flags_documented_as_patrollers({"docs/configuration.md": text})
    assert sorted({flag for _, flag in documented}) == [
        "--a",
        "--bogus",
        "--no-such-flag",
        "--nope",
        "--nvidia-smi",
        "--tset",
        "--watch",
        "--watchh",
    ]
