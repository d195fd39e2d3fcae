"""answers.check, the fleet views' check of another host's /status and /devices, without I/O:
what Patroller answers passes; each attack seen on the fleet view, and every other type the
schema does not allow, is refused saying where and why; and its tables are the published
schema's (openapi.json). Also the daemon's pure pieces around it: the decoding and the GPUs it
keeps (http/fleet.read) and why a cut answer was cut (http/fleet.cut)."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

from patroller import answers
from patroller.cli import fleet as cli_fleet
from patroller.cli import render
from patroller.config import Config
from patroller.http.fleet import NotPatroller, cut, read

UUID = "GPU-efe90ac4-c955-59ab-9d2b-ebf83adbea11"
IDENTITY = {
    "user": "alice@example.org",
    "source": "container",
    "email": "alice@example.org",
    "account": "alice",
    "uid": 1000,
    "container": {"id": "4f2a", "name": "train"},
    "info": {},
    "degraded": False,
    "job": {"id": "4242", "step": "0"},
    "pod": {"namespace": "research", "name": "train-7"},
}
DEVICES = {
    UUID: {
        "name": "NVIDIA A100-SXM4-80GB",
        "brand": "NVIDIA",
        "arch": "Ampere",
        "number": 0,
        "pci_address": "00000000:07:00.0",
        "total_mem": "81920 MiB",
        "group": "gpu",
        "minor_number": 0,
        "mig_mode": "Disabled",
        "mig_instances": [],
        "lost": False,
    }
}
STATUS = {
    UUID: {
        "power": 61.0,
        "gtemp": 34,
        "mtemp": None,
        "sm": 97,
        "mem": 12,
        "enc": 0,
        "dec": 0,
        "jpg": None,
        "ofa": None,
        "mclk": 1593,
        "pclk": 1410,
        "fb": 4096,
        "fb_total": 81920,
        "bar1": 2,
        "ccpm": 0,
        "pviol": 0,
        "tviol": 0,
        "rxpci": None,
        "txpci": None,
        "updated": "2025-01-01T10:00:00+00:00",
        "stale": False,
        "claim": {
            "state": "reserved",
            "user": IDENTITY,
            "users": [IDENTITY],
            "processes": [4242],
            "process_detail": [
                {
                    "pid": 4242,
                    "user": "alice",
                    "command": "python",
                    "sm": 97.0,
                    "mem": 12.0,
                    "fb": 4096.0,
                }
            ],
            "age": 12.5,
            "expires": 7.5,
            "held_for_pid": None,
            "processes_stale": False,
            "hold": "lease",
            "asked": True,
            "withheld": None,
            "jobs": None,
            "pods": None,
            "set_aside_for": None,
            "ends_at": None,
            "idle_for": None,
        },
    }
}


def status_with(**claim: Any) -> dict[str, Any]:
    status = copy.deepcopy(STATUS)
    status[UUID]["claim"].update(claim)
    return status


def refused(status: Any, devices: Any = DEVICES, max_gpus: int = 256) -> str:
    with pytest.raises(answers.BadAnswer) as error:
        answers.check(status, devices, max_gpus)
    return str(error.value)


def test_what_patroller_answers_passes_and_so_does_an_older_daemons_answer():
    answers.check(STATUS, DEVICES, 256)
    answers.check(
        {UUID: {"claim": {"state": "free"}}}, {UUID: {"number": 0}}, 256
    )  # fields left out
    answers.check({}, {}, 256)  # a host without GPUs
    answers.check(status_with(state="free", user=None, users=[]), DEVICES, 1)


@pytest.mark.parametrize(
    "status, said",
    [
        (status_with(state={"free": True}), "claim.state is an object, not a string"),
        (status_with(state="stolen"), "claim.state is 'stolen', not one of free, reserved"),
        (status_with(users="alice@example.org"), "claim.users is a string, not an array"),
        (status_with(users=[None]), "claim.users[0] is null, not an object"),
        (status_with(user="alice"), "claim.user is a string, not an object or null"),
        (status_with(user=dict(IDENTITY, user=7)), "claim.user.user is an integer, not a string"),
        (
            status_with(users=[dict(IDENTITY, container="x")]),
            "claim.users[0].container is a string, not an object or null",
        ),
        (
            status_with(user=dict(IDENTITY, container={"name": 4242})),
            "claim.user.container.name is an integer, not a string or null",
        ),
        (status_with(user=dict(IDENTITY, job={"id": 4242})), "claim.user.job.id is an integer"),
        (status_with(user=dict(IDENTITY, pod={"name": None})), "claim.user.pod.name is null"),
        (status_with(processes=[1, "2"]), "claim.processes[1] is a string, not an integer"),
        (
            status_with(process_detail=[{"command": "python"}]),
            "claim.process_detail[0] has no pid",
        ),
        (
            status_with(process_detail=[{"pid": 1, "fb": "4 GiB"}]),
            "claim.process_detail[0].fb is a string, not a number or null",
        ),
        (status_with(expires=True), "claim.expires is a boolean, not a number or null"),
        (status_with(age=float("nan")), "claim.age is NaN or infinite, not a number"),
        (
            status_with(idle_for=float("inf")),
            "claim.idle_for is NaN or infinite, not a number or null",
        ),
        ({UUID: dict(STATUS[UUID], claim=[])}, "claim is an array, not an object"),
        ({UUID: dict(STATUS[UUID], sm=[97])}, ".sm is an array, not a number or a string or null"),
        ({UUID: dict(STATUS[UUID], stale="no")}, ".stale is a string, not a boolean"),
        ({UUID: None}, f"/status '{UUID}' is null, not an object"),
        ([STATUS], "/status is an array, not an object"),
    ],
)
def test_each_lie_is_refused_saying_where_and_why(status, said):
    assert said in refused(status)


@pytest.mark.parametrize(
    "devices, said",
    [
        ({UUID: dict(DEVICES[UUID], number="0")}, ".number is a string, not an integer"),
        ({UUID: dict(DEVICES[UUID], number=False)}, ".number is a boolean, not an integer"),
        ({UUID: dict(DEVICES[UUID], group=None)}, ".group is null, not a string"),
        ({UUID: dict(DEVICES[UUID], lost=0)}, ".lost is an integer, not a boolean"),
        ({UUID: "A100"}, "is a string, not an object"),
        ("A100", "/devices is a string, not an object"),
    ],
)
def test_a_lying_inventory_is_refused(devices, said):
    assert said in refused(STATUS, devices)


def test_a_host_may_claim_so_many_gpus_and_no_more():
    many = {f"GPU-{n}": dict(DEVICES[UUID], number=n) for n in range(257)}
    assert refused({}, many) == "/devices lists 257 GPUs, more than 256"
    assert (
        refused({f"GPU-{n}": {} for n in range(300)}, {})
        == "/status lists 300 GPUs, more than 256"
    )
    answers.check({}, dict(list(many.items())[:256]), 256)
    # The bound is the daemon's, and the command line's the same.
    assert Config().fleet_max_gpus == cli_fleet.HOST_MAX_GPUS == 256
    assert Config().fleet_max_bytes == cli_fleet.HOST_MAX_BYTES == 1 << 20


def test_a_hosts_own_words_are_quoted_short():
    long_uuid = "GPU-" + "x" * 100_000
    said = refused({long_uuid: {"claim": {"state": "y" * 100_000}}}, {})
    assert len(said) < 300 and said.startswith(f"/status '{long_uuid[:20]}"), said


def schema_types(node: dict[str, Any], schemas: dict[str, Any]) -> set[str]:
    """The JSON types a schema node allows: its type(s), its enum's, its oneOf's, its $ref's."""
    if "$ref" in node:
        return schema_types(schemas[node["$ref"].rsplit("/", 1)[1]], schemas)
    if "oneOf" in node:
        return set().union(*(schema_types(branch, schemas) for branch in node["oneOf"]))
    if "enum" in node:
        return {answers.kind(value).split()[-1] for value in node["enum"]}
    return {node["type"]} if isinstance(node["type"], str) else set(node["type"])


def component(schemas: dict[str, Any], path: str) -> dict[str, Any]:
    """A node of the schema: a component, then properties (`.name`), items (`[]`) or the object
    branch of a oneOf."""
    parts = path.replace("[]", ".[]").split(".")
    node = schemas[parts[0]]
    for part in parts[1:]:
        if "oneOf" in node:
            node = next(branch for branch in node["oneOf"] if branch.get("type") != "null")
        node = node["items"] if part == "[]" else node["properties"][part]
    if "oneOf" in node:
        node = next(branch for branch in node["oneOf"] if branch.get("type") != "null")
    return schemas[node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node


@pytest.mark.parametrize(
    "table, path",
    [
        (answers.DEVICE, "DeviceInfo"),
        (answers.STATISTICS, "DeviceStatus"),
        (answers.CLAIM, "Claim"),
        (answers.PROCESS, "Claim.process_detail[]"),
        (answers.IDENTITY, "Identity"),
        (answers.CONTAINER, "Identity.container"),
        (answers.JOB, "Identity.job"),
        (answers.POD, "Identity.pod"),
    ],
)
def test_the_checks_are_the_published_schema(table, path):
    with open(os.path.join(ROOT, "patroller", "http", "openapi.json"), encoding="utf-8") as f:
        schemas = json.load(f)["components"]["schemas"]
    node = component(schemas, path)
    for name, kinds in table.items():
        assert set(kinds) == schema_types(node["properties"][name], schemas), f"{path}.{name}"
        if name in answers.REQUIRED:
            assert name in node["required"], f"{path}.{name}"
    if path == "Claim":
        assert tuple(node["properties"]["state"]["enum"]) == answers.STATES


def test_the_daemon_decodes_checks_and_keeps_what_the_page_draws():
    bodies = [json.dumps(STATUS).encode(), json.dumps(DEVICES).encode()]
    [gpu] = read(bodies, 256)
    assert (gpu["uuid"], gpu["number"], gpu["state"], gpu["user"]["user"]) == (
        UUID,
        0,
        "reserved",
        "alice@example.org",
    )
    with pytest.raises(NotPatroller, match="^/devices did not answer JSON$"):
        read([bodies[0], b"<html>"], 256)
    with pytest.raises(answers.BadAnswer, match=r"claim\.users\[0\] is null"):
        read([json.dumps(status_with(users=[None])).encode(), bodies[1]], 256)
    with pytest.raises(NotPatroller):  # nested deeper than the decoder goes: not JSON to it
        read([b"[" * 100_000, bodies[1]], 256)


def test_why_an_answer_was_cut():
    head = ["HTTP/1.1 200 OK\r\n", "Content-Type: application/json\r\n"]
    assert (
        cut("/status", head + ["Content-Length: 7800001\r\n", "\r\n"], 1 << 20)
        == "/status is 7800001 bytes, more than 1048576"
    )
    assert cut("/status", head + ["Content-Length: 400\r\n", "\r\n"], 1 << 20) is None  # broke off
    assert (
        cut("/status", head + ["Content-Length: lots\r\n", "\r\n"], 1 << 20)
        == "/status has a Content-Length that is not a number"
    )
    assert cut("/status", head + ["\r\n"], 1 << 20) == "/status is more than 1048576 bytes"
    assert (
        cut("/status", head + ["Transfer-Encoding: chunked\r\n", "\r\n"], 1 << 20)
        == "/status broke off, or is more than 1048576 bytes"
    )
    assert cut("/status", head, 1 << 20) is None  # the head did not end: no answer yet
    assert cut("/status", [], 1 << 20) is None


FREE_CASES = [  # (what the host says of one device, free to reserve there now?)
    ({}, {"state": "free"}, True),
    ({}, {"state": "reserved"}, False),
    ({}, {"state": "free", "withheld": "it printed no statistics"}, False),  # silent
    ({"lost": True}, {"state": "free"}, False),
    ({"group": "fpga"}, {"state": "free"}, False),  # not a GPU
    ({}, {}, True),  # an older daemon's claim without a state: free, as the views draw it
]


@pytest.mark.parametrize("info, claim, free", FREE_CASES)
def test_every_view_of_another_host_counts_free_gpus_by_one_rule(info, claim, free):
    """/fleet.json (the page's counts), `patroller status --free` and the holders `patroller
    run --wait` names agree, device by device: they all ask answers.free."""
    devices = {UUID: {**DEVICES[UUID], **info}}
    status = {
        UUID: {
            **STATUS[UUID],
            "claim": {**STATUS[UUID]["claim"], "withheld": None, "state": "free", **claim},
        }
    }
    if "state" not in claim:
        del status[UUID]["claim"]["state"]
    assert answers.free(devices[UUID], status[UUID]) is free
    [gpu] = read([json.dumps(status).encode(), json.dumps(devices).encode()], 256)
    assert gpu["free"] is free
    assert cli_fleet.HostAnswer("gpu1:8080", status, devices).free() == int(free)
    said = render.holders_summary(status, devices, "gpu")
    assert said.endswith(f"{int(free)} free"), said


def test_the_free_rule_is_written_once():
    """No module but answers.py compares another host's state with "free" (core/ keeps the
    daemon's own lease rules, on its own objects): a second copy would drift."""
    rule = re.compile(r"""(==|!=)\s*["']free["']|["']free["']\s*(==|!=)""")
    copies = []
    for folder, _, names in os.walk(os.path.join(ROOT, "patroller")):
        for name in names:
            path = os.path.relpath(os.path.join(folder, name), ROOT)
            if not name.endswith((".py", ".js")) or path.startswith(
                ("patroller/core/", "patroller/simulator/")
            ):
                continue
            text = Path(os.path.join(ROOT, path)).read_text(encoding="utf-8")
            copies += [
                f"{path}:{text[: m.start()].count(chr(10)) + 1}"
                for m in rule.finditer(text)
                if path != "patroller/answers.py"
            ]
    assert not copies, f"the free rule again, outside patroller/answers.py: {copies}"
