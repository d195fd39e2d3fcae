"""The API fuzzed against its own OpenAPI document, on live daemons (test mode, GPU host mode).

schemathesis generates requests from /openapi.json, valid and invalid, and checks each answer:
no 5xx, a documented status, the documented content type and body schema, and a JSON body
whenever there is a body. Afterwards every device must be free once the short leases expire.
The run is derandomized, so a failure repeats.
"""

import json
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis 4 needs Python 3.11")

from helpers import ScenarioFile, ServerProcess
from hypothesis import HealthCheck, given, settings
from hypothesis.strategies import SearchStrategy
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

LEASE = "0.5"  # seconds: a /wait for busy devices is answered within a lease
EXAMPLES = 15  # per operation and generation phase: the whole file stays well under a minute
# Seconds a single answer may take: no request legitimately waits more than a lease, and the
# room is for a busy machine (an answer timed out once and in time on Hypothesis's replay was a
# "Flaky" failure, not a finding).
TIMEOUT = 60
DEVICES = [{"minor": 1}, {"minor": 0}, {}]


class Daemon:
    """A daemon as a real process, and what the fuzzing did to it."""

    def __init__(self, server: ServerProcess, mode: str) -> None:
        self.server = server
        self.mode = mode  # "test" or "gpu"
        self.url = server.url
        self.granted = 0  # 200s from /request and /wait: the reservations the fuzzing made
        self.answers: Counter = Counter()  # (operation, status) -> how many

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=TIMEOUT) as response:
            return json.loads(response.read())

    def states(self) -> dict[str, str]:
        """Each device's claim state."""
        return {uuid: entry["claim"]["state"] for uuid, entry in self.get("/status").items()}

    def wait_until_free(self) -> None:
        """Until every device is free: the last reservation ends one lease after it was made
        (the bound leaves room for busy cores)."""
        deadline = time.monotonic() + float(LEASE) + 10
        while set(self.states().values()) != {"free"}:
            assert time.monotonic() < deadline, self.states()
            time.sleep(0.05)


@pytest.fixture(scope="module", params=["test", "gpu"])
def daemon(request, tmp_path_factory):
    # --fleet, so that /fleet and /fleet.json answer as documented with a fleet too: one host,
    # port 1 on loopback, where nothing listens (a refused host).
    fleet = ("--fleet", "127.0.0.1:1")
    # A state directory, so that /usage has a usage store to report from.
    state = (
        "--state-dir",
        str(tmp_path_factory.mktemp("state") / "state"),
        "--usage-interval",
        "0.5",
    )
    if request.param == "test":
        server = ServerProcess("--test", "--lease", LEASE, *fleet, *state)
    else:
        scenario = ScenarioFile(
            str(tmp_path_factory.mktemp("fuzz") / "scenario.json"), devices=DEVICES
        )
        server = ServerProcess("--lease", LEASE, "--nvidia-smi", scenario.command, *fleet, *state)
    server.start()
    try:
        yield Daemon(server, request.param)
    finally:
        server.stop()
    errors = [line for line in server.log.splitlines() if " ERROR " in line or "Traceback" in line]
    assert not errors, "the daemon logged errors:\n" + server.log


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def answers_as_documented(case: Case, daemon: Daemon) -> None:
    """One request: the documented checks, and JSON whenever there is a body."""
    response = case.call(base_url=daemon.url, timeout=TIMEOUT)
    daemon.answers[case.operation.label, response.status_code] += 1
    case.validate_response(response, checks=CHECKS)
    content_type = response.headers.get("content-type", [""])[0]
    # Not JSON, and documented so (validate_response checked the type): Prometheus's text, the
    # page and its files. Everything else, errors included, is JSON.
    other = response.status_code == 200 and (
        case.path == "/metrics"
        or case.path.startswith("/web/")
        or content_type.startswith("text/html")
    )
    if not other:
        assert content_type.startswith("application/json"), content_type  # HEAD included
    if case.method.upper() == "HEAD":
        assert response.content == b"", f"HEAD {case.path} answered with a body"
    elif case.path == "/metrics" and response.status_code == 200:
        assert content_type.startswith("text/plain; version=0.0.4"), content_type
        assert response.content.startswith(b"# HELP patroller_"), response.content[:80]
    elif not other:
        body = json.loads(response.content)  # never HTML, text or nothing
        assert response.status_code < 400 or isinstance(body.get("error"), str), body
    if case.path in ("/request", "/wait") and response.status_code == 200:
        daemon.granted += 1


def strategies(operation: APIOperation) -> Iterator[tuple[str, SearchStrategy]]:
    """The document's own examples, then valid input, then invalid input where there is any."""
    for strategy in operation.get_strategies_from_examples():
        yield "example", strategy
    yield "valid", operation.as_strategy(generation_mode=GenerationMode.POSITIVE)
    raw = operation.definition.raw
    if raw.get("parameters") or raw.get("requestBody"):
        yield "invalid", operation.as_strategy(generation_mode=GenerationMode.NEGATIVE)


def leases_only(document: dict) -> dict:
    """The document with hold=lease alone: a hold=process grant would last as long as the
    process that asked, which is this test's own (test_hold_process.py covers those)."""
    lease = {"const": "lease"}
    document["components"]["parameters"]["hold"]["schema"] = lease
    for path in ("/request", "/wait"):
        form = document["paths"][path]["post"]["requestBody"]["content"]
        form["application/x-www-form-urlencoded"]["schema"]["properties"]["hold"] = lease
    return document


def test_every_answer_matches_the_document(daemon):
    # from_dict, not from_url: schemathesis would leave out GET /openapi.json, where it came from
    api = schemathesis.openapi.from_dict(leases_only(daemon.get("/openapi.json")))
    failures, labels = [], set()
    for result in api.get_all_operations():
        operation = result.ok()
        if operation.path == "/events":  # a stream that never ends by itself: test_live.py
            continue
        labels.add(operation.label)
        for kind, strategy in strategies(operation):
            if kind == "example":
                daemon.wait_until_free()  # the examples ask for devices that exist: they get them

            @given(case=strategy)
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def fuzz(case: Case) -> None:
                answers_as_documented(case, daemon)

            try:
                fuzz()
            # every operation is tried, all reported (3.11's BaseExceptionGroup: schemathesis,
            # imported above, needs 3.11)
            except (Exception, BaseExceptionGroup) as exc:  # noqa: F821 (3.11, above)
                failures.append(f"{operation.label} ({kind} input): {exc}")
    assert not failures, "\n\n".join(failures)
    succeeded = {label for (label, status) in daemon.answers if status == 200}
    if daemon.mode == "test":  # callers are who they say there: nobody is the kernel's root
        succeeded.add("GET /doctor")
    assert labels - succeeded == set(), f"never answered 200: {sorted(daemon.answers.items())}"


def test_every_device_is_free_once_leases_expire(daemon):
    assert daemon.granted > 0, "run with the fuzzing above: it made no reservation to expire"
    daemon.wait_until_free()
    assert daemon.get("/metrics.json")["waiting"] == 0
    devices = sorted(daemon.states())  # and each of them can be reserved again, all at once
    granted = daemon.get(f"/request?gpu={len(devices)}")
    assert sorted(grant["uuid"] for grant in granted) == devices
