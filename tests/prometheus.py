"""A real Prometheus server (Debian's `prometheus` package) and promtool, for the monitoring tests.

`tool(name)` finds a binary: under CI=true a missing one fails the test, elsewhere the test is
skipped with the reason (tests/setup.sh installs them as root on Debian or Ubuntu).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
# A sample line of the text exposition: its metric name, then labels or the value.
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]")
PATROLLER_NAME = re.compile(r"patroller_[a-z0-9_]+")


def tool(name: str) -> str:
    """The path of `name`; under CI=true its absence fails the test, else skips it."""
    found = shutil.which(name)
    if found:
        return found
    reason = f"{name} is not installed (tests/setup.sh installs Debian's prometheus package)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the Prometheus tests, but {reason}")
    pytest.skip(reason)
    raise AssertionError("unreachable")


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 60) -> T:
    """Poll probe() until it returns something other than None (or False); fail after
    `timeout` seconds with `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (OSError, ValueError) as exc:  # not up yet, or a half-written answer
            last = exc
        else:
            if last is not None and last is not False:
                return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not reached in {timeout}s; last: {last!r}")


def settles(probe: Callable[[], T], expected: T, what: str, timeout: float = 60) -> None:
    """Poll probe() until it returns `expected`; fail after `timeout` seconds with the last
    value seen."""
    last: list[Any] = [None]

    def equal() -> bool:
        last[0] = probe()
        return last[0] == expected

    try:
        eventually(equal, what, timeout)
    except AssertionError:
        raise AssertionError(
            f"{what}: wanted {expected!r} for {timeout}s, last {last[0]!r}"
        ) from None


def get(url: str, accept: str | None = None, timeout: float = 20) -> tuple[int, str, bytes]:
    """(status, Content-Type, body) of a GET."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


def exposition(url: str) -> str:
    """The body of GET <url>/metrics, which must be the Prometheus text format."""
    status, kind, body = get(url + "/metrics")
    assert status == 200, (status, body[:500])
    assert kind.startswith("text/plain; version=0.0.4"), kind
    return body.decode("utf-8")


def sample_names(text: str) -> set[str]:
    """The metric names of every sample line of a text exposition (a counter's as exposed:
    `_total`, and `_created` where there is one; a histogram's `_bucket`, `_sum`, `_count`)."""
    return {found.group(1) for found in map(SAMPLE.match, text.splitlines()) if found}


def family_names(text: str) -> set[str]:
    """The names in `# HELP` and `# TYPE` lines (families, even those with no sample now)."""
    return {
        line.split()[2]
        for line in text.splitlines()
        if line.startswith(("# HELP ", "# TYPE ")) and len(line.split()) > 2
    }


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus server of the test's own: a loopback port, storage and configuration in a
    temporary directory, scraping the given jobs ({job name: ["host:port", ...]}) and
    evaluating the given rule files (absolute paths) every `interval`."""

    def __init__(
        self, jobs: dict[str, list[str]], interval: str = "1s", rules: list[str] | None = None
    ) -> None:
        self.binary = tool("prometheus")
        self.jobs = jobs
        self.interval = interval
        self.rules = list(rules or [])
        self.directory = tempfile.TemporaryDirectory(prefix="patroller-prometheus-")
        self.process: subprocess.Popen | None = None
        self.url = ""
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed when the child is stopped)

    def config(self) -> dict[str, Any]:
        """prometheus.yml (JSON is YAML)."""
        return {
            "global": {
                "scrape_interval": self.interval,
                "scrape_timeout": self.interval,
                "evaluation_interval": self.interval,
            },
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in self.jobs.items()
            ],
            "rule_files": self.rules,
        }

    def start(self, timeout: float = 60) -> Prometheus:
        """Start it and wait until /-/ready answers 200 (another port if the first was
        taken in the meantime)."""
        path = os.path.join(self.directory.name, "prometheus.yml")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.config(), f, indent=1)
        for _ in range(5):
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            self._log.seek(0)
            self._log.truncate()
            self.process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={path}",
                    f"--storage.tsdb.path={os.path.join(self.directory.name, 'data')}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                cwd=self.directory.name,
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.process.poll() is None:
                try:
                    if get(self.url + "/-/ready", timeout=2)[0] == 200:
                        return self
                except OSError:
                    pass
                time.sleep(0.1)
            if self.process.poll() is None:
                self.stop()
                raise AssertionError("prometheus not ready in time: " + self.log)
            if "address already in use" not in self.log:
                raise AssertionError("prometheus exited at start: " + self.log)
        raise AssertionError("prometheus found no free port: " + self.log)

    @property
    def log(self) -> str:
        self._log.seek(0)
        return self._log.read()

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a successful answer of the HTTP API."""
        query = urllib.parse.urlencode(params)
        status, _, body = get(f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""))
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", (path, params, status, answer)
        return answer["data"]

    def query(self, expr: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query (now, or at `at`, epoch seconds): (labels, value) of every sample of
        the vector it returns."""
        data = self.api("query", query=expr, **({} if at is None else {"time": f"{at:.3f}"}))
        assert data["resultType"] == "vector", data
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def targets_up(self) -> dict[str, str] | None:
        """{scrape URL: health} when every configured target is up after a scrape, else None."""
        active = self.api("targets", state="active")["activeTargets"]
        health = {t["scrapeUrl"]: t["health"] for t in active}
        wanted = sum(len(targets) for targets in self.jobs.values())
        if len(health) == wanted and all(h == "up" for h in health.values()):
            return health
        return None

    def stop(self) -> None:
        """Terminate it and wait; kill it if it lingers."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.directory.cleanup()


def promtool_check_metrics(text: str) -> tuple[int, str]:
    """(exit status, everything it printed) of `promtool check metrics` on an exposition."""
    done = subprocess.run(
        [tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout + done.stderr
