"""The OpenAPI document (patroller/openapi.json) checked against the daemon, so the two cannot
drift.

Paths against the routes, operations against the methods each handler implements and answers,
error statuses against the API's table, and every field a live answer carries against the
fields the document names. tests/test_fuzz.py checks the shapes by fuzzing.
"""

import json
import pkgutil
import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import tornado.web
from helpers import ROOT, async_test, running, until
from tornado.httpclient import HTTPRequest

from patroller import __version__
from patroller.http import handlers as api

DOCUMENT: dict[str, Any] = json.loads(pkgutil.get_data("patroller.http", "openapi.json") or b"")
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
FAST_LANE = ("/status", "/devices")  # also answered at the connection's door (fastlane.py)


def documented(path: str) -> set[str]:
    """The methods the document gives `path`."""
    return {
        method.upper() for method in DOCUMENT["paths"].get(path, {}) if method.upper() in METHODS
    }


def routes(app: tornado.web.Application) -> dict[str, type]:
    """make_app's routes: path -> handler class."""
    found = {}
    for rule in app.wildcard_router.rules:
        matcher = rule.matcher
        if matcher.regex.groups:  # /web/([A-Za-z0-9_.-]{1,64})$ -> /web/{name}
            path = re.sub(r"\(.*\)", "{name}", matcher.regex.pattern.rstrip("$"))
        else:
            path = matcher.reverse()
        found[path] = rule.target
    return found


def implemented(handler: type) -> set[str]:
    """The methods a handler class defines (the base class answers the others 405)."""
    base = tornado.web.RequestHandler
    return {
        m
        for m in handler.SUPPORTED_METHODS
        if getattr(handler, m.lower()) is not getattr(base, m.lower())
    }


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema or response with its $ref followed."""
    while "$ref" in schema:
        node: Any = DOCUMENT
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def undocumented(value: Any, schema: dict[str, Any], where: str = "") -> Iterator[str]:
    """Fields of `value` that `schema` does not name. An object schema with properties and no
    additionalProperties names all its fields; additionalProperties true leaves them open."""
    schema = resolve(schema)
    if "oneOf" in schema:
        options = [resolve(s) for s in schema["oneOf"]]
        fitting = [s for s in options if (value is None) == (s.get("type") == "null")]
        for option in fitting[:1]:
            yield from undocumented(value, option, where)
        return
    properties: dict[str, Any] = dict(schema.get("properties", {}))
    for part in schema.get("allOf", []):
        properties.update(resolve(part).get("properties", {}))
    extra = schema.get("additionalProperties", not properties)
    if isinstance(value, dict):
        for key, item in value.items():
            if key in properties:
                yield from undocumented(item, properties[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                yield from undocumented(item, extra, f"{where}.{key}")
            elif extra is not True:
                yield f"{where}.{key}"
    elif isinstance(value, list) and "items" in schema:
        for n, item in enumerate(value):
            yield from undocumented(item, schema["items"], f"{where}[{n}]")


def answer_schema(path: str, method: str, status: int) -> dict[str, Any]:
    """The documented body of one answer."""
    responses = DOCUMENT["paths"].get(path, {}).get(method.lower(), {}).get("responses", {})
    assert str(status) in responses, f"{method.upper()} {path} does not document {status}"
    response = resolve(responses[str(status)])
    return response["content"]["application/json"]["schema"]


def test_the_document_is_valid_openapi_of_this_version():
    schemathesis = pytest.importorskip("schemathesis", reason="schemathesis 4 needs Python 3.11")
    schemathesis.openapi.from_dict(DOCUMENT).validate()
    assert DOCUMENT["openapi"].startswith("3.")
    assert DOCUMENT["info"]["version"] == __version__


@async_test
async def test_the_daemon_serves_the_document_kept_in_the_repository():
    with open(f"{ROOT}/patroller/http/openapi.json", encoding="utf-8") as f:
        kept = json.load(f)
    async with running() as h:
        assert await h.ok("/openapi.json") == kept == DOCUMENT


@async_test
async def test_every_route_is_documented_with_the_methods_its_handler_implements():
    async with running() as h:
        served = routes(h.api.app)
        assert set(served) == set(DOCUMENT["paths"]), "routes and document differ"
        assert set(FAST_LANE) <= set(served)
        for path, handler in served.items():
            assert implemented(handler) == documented(path), path


@async_test
async def test_every_path_answers_exactly_the_documented_methods():
    async with running() as h:
        for path in DOCUMENT["paths"]:
            answered, allow = set(), set()
            for method in METHODS:
                # gpu=0 is refused at once (400) where it is a request, so nothing waits
                request = HTTPRequest(
                    f"{h.url}{path.replace('{name}', 'x.js')}?gpu=0",
                    method=method,
                    body=b"" if method in ("POST", "PUT", "PATCH") else None,
                    allow_nonstandard_methods=True,
                )
                response = await h.http.fetch(request, raise_error=False)
                if response.code == 405:
                    allow = {m.strip() for m in response.headers["Allow"].split(",")}
                    if method != "HEAD":
                        body = json.loads(response.body)
                        assert body["allowed"] == sorted(allow, key=METHODS.index), body
                else:
                    answered.add(method)
            assert answered == documented(path), path
            assert allow == documented(path), f"Allow on {path}"


def test_every_error_the_api_maps_is_documented():
    statuses = {
        code
        for ops in DOCUMENT["paths"].values()
        for op in ops.values()
        for code in op["responses"]
    }
    for error, status in api.STATUS.items():
        assert str(status) in statuses, f"{error.__name__} ({status}) is in no operation"
    with open(f"{ROOT}/patroller/http/framing.py", encoding="utf-8") as f:
        framing = set(re.findall(r"FramingError\(\s*(\d{3}),", f.read()))
    assert framing == {"400", "408", "413"}  # Tornado answers the rest itself, without JSON
    for path, ops in DOCUMENT["paths"].items():
        for method, op in ops.items():
            # a request that cannot be read as HTTP can come to any endpoint
            assert framing <= set(op["responses"]), f"{method} {path}"
            # a 5xx is a fault, never part of the contract; 503 is the daemon saying no
            assert not any(code.startswith("5") and code != "503" for code in op["responses"])


def test_the_fields_the_docs_document_are_required():
    with open(f"{ROOT}/docs/api.md", encoding="utf-8") as f:
        page = f.read()
    schemas = DOCUMENT["components"]["schemas"]
    status = page.split("## `GET /status`", 1)[1].split("\n## ", 1)[0]
    statistics, claim = status.split("`claim`:", 1)
    first_cells = re.findall(r"^\| ([^|]+) \|", statistics, re.MULTILINE)
    stat_fields = {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}
    assert {"power", "fb", "fb_total", "updated", "stale"} <= stat_fields
    assert stat_fields <= set(schemas["DeviceStatus"]["required"])
    claim_fields = re.findall(r"^\| `(\w+)` \|", claim, re.MULTILINE)
    assert {"state", "expires", "held_for_pid", "process_detail"} <= set(claim_fields)
    assert set(claim_fields) <= set(schemas["Claim"]["required"])
    assert {"updated", "stale", "claim"} <= set(schemas["DeviceStatus"]["required"])
    metrics = page.split("## `GET /metrics`", 1)[1].split("\n## ", 1)[0]
    example = json.loads(
        re.search(r"\$ curl -s \S+/metrics\.json\n(.*?)\n```", metrics, re.S).group(1)
    )
    assert set(example) <= set(schemas["Metrics"]["required"])


@async_test
async def test_every_field_of_a_live_answer_is_named_in_the_document():
    async with running(lease=30) as h:
        uuid = h.uuids()[0]
        answers = [
            ("/", "get", 200),
            ("/devices", "get", 200),
            ("/metrics.json", "get", 200),
            ("/request?gpu=1&user=alice@example.org", "get", 200),
            ("/wait?gpu=1&timeout=5&user=bob@example.org", "post", 200),
            ("/status", "get", 200),
            ("/request?gpu=8", "get", 409),
            ("/request?gpu=9", "get", 422),
            ("/request?gpu=x", "get", 400),
            (f"/release?uuid={uuid}&user=bob@example.org", "get", 403),
            ("/release?user=alice@example.org", "post", 200),
        ]
        for target, method, status in answers:
            path, _, query = target.partition("?")
            if method == "post":
                code, body = await h.call(path, "POST", query.encode())
            else:
                code, body = await h.call(target)
            assert code == status, (target, body)
            assert list(undocumented(body, answer_schema(path, method, status))) == [], target
        index = await h.ok("/")
        named = {re.split(r"[?\[]", endpoint)[0] for endpoint in index["endpoints"]}
        assert named == set(DOCUMENT["paths"]) - {"/"}, "GET / names other endpoints"


@async_test
async def test_every_field_of_the_fleet_view_is_named_in_the_document():
    with socket.socket() as gone:  # a port nothing listens on any more
        gone.bind(("127.0.0.1", 0))
        refused = gone.getsockname()[1]
    async with running(lease=30) as host:
        await host.ok("/request?gpu=1&user=alice@example.org")
        hosts = (host.url[len("http://") :], f"127.0.0.1:{refused}")
        async with running(fleet=hosts, fleet_interval=0.5, fleet_timeout=2.0) as h:
            fleet = h.api.fleet
            await until(lambda: all(entry.state != "asking" for entry in fleet.hosts))
            body = await h.ok("/fleet.json")
            assert [entry["state"] for entry in body["hosts"]] == ["up", "refused"], body
            assert list(undocumented(body, answer_schema("/fleet.json", "get", 200))) == []
    async with running() as h:
        for path in ("/fleet", "/fleet.json"):
            code, body = await h.call(path)
            assert code == 404
            assert list(undocumented(body, answer_schema(path, "get", 404))) == [], path
