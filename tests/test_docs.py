"""The README's promises that can be checked mechanically."""
import os
import re
import subprocess
import sys

from helpers import ROOT


def readme():
    return open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def quick_start_commands():
    section = readme().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", section)


def test_quick_start_has_two_set_up_commands():
    commands = quick_start_commands()
    assert "--test" in commands[0] and "pip install" in commands[0]
    assert "pytest" in commands[1] and "tests/setup.sh" in commands[1]
    setup = open(os.path.join(ROOT, "tests", "setup.sh"), encoding="utf-8").read()
    assert "-e '.[test]'" in setup and "docker.io busybox-static" in setup


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read().splitlines()
    assert quick_start_commands()[1] in ci


def test_console_script_runs():
    script = os.path.join(os.path.dirname(sys.executable), "patroller")
    result = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.startswith("patroller ")


def test_example_uses_the_client_without_copying_it():
    example = open(os.path.join(ROOT, "example.py"), encoding="utf-8").read()
    assert "from patroller.client import" in example
    assert "def claim" not in example and "urllib" not in example and "http.client" not in example


def test_dockerfile_copies_files_that_exist_and_runs_the_console_script():
    lines = open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8").read().splitlines()
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert os.path.exists(os.path.join(ROOT, source)), source
    assert 'ENTRYPOINT ["patroller"]' in lines


def docker_run(text, prefix=""):
    """The GPU host `docker run` command in `text`, as one normalised line."""
    lines = [line[len(prefix):].strip() if line.startswith(prefix) else None
             for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line and line.startswith("docker run -d"))
    command = []
    for line in lines[start:]:
        command.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            return " ".join(command)


def test_the_dockerfile_recommends_the_readmes_docker_run():
    dockerfile = open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8").read()
    assert docker_run(dockerfile, "#") == docker_run(readme())
    assert "--network host" in docker_run(readme())


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
    patterns = [line.strip() for line in
                open(os.path.join(ROOT, ".dockerignore"), encoding="utf-8").read().splitlines()
                if line.strip() and not line.startswith("#")]
    lines = open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8").read().splitlines()
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert not ignored(patterns, source.rstrip("/")), source
    for path in (".venv", ".git", "tests", "bench/results.json", "patroller.egg-info",
                 "patroller/__pycache__", "patroller/nvsmi/__pycache__/child.cpython-311.pyc"):
        assert ignored(patterns, path), path
    assert not ignored(patterns, "patroller/openapi.json")
