"""containerd's directory of containers (identify/containerd.py) against a real gRPC server at
its socket that answers as a real containerd did (tests/fake_containerd.py, its answers captured
in tests/fixtures/containerd/answers.json): where it looks for a container and in which order,
a pod's sandbox, what it caches, and containerd down, answering garbage, hanging, and back
again. No container engine runs here; tests/test_containerd.py runs the real one."""

import asyncio
import logging
import os
import threading
import time
from dataclasses import replace

import grpc
import pytest
from fake_containerd import FakeContainerd, recorded
from grpc_server import Hang
from helpers import async_test, until

from patroller.config import Config
from patroller.identify import containerd as ctrd
from patroller.identify.containerd import ContainerdDirectory, ContainerdUnavailable
from patroller.observe import protowire as pw


@pytest.fixture
def fake(engine_sockets):
    """The captured containers, served at a containerd socket."""
    server = FakeContainerd(os.path.join(engine_sockets, "containerd.sock"))
    server.add_captured()
    yield server.start()
    server.stop()


@pytest.fixture
def ids():
    return recorded()["ids"]


def directory(fake, address=None, **settings):
    config = replace(Config(), **{"containerd_retry_after": 60.0, **settings})
    return ContainerdDirectory(config, address or f"unix://{fake.path}")


def asked(fake):
    """(method, namespace) of each call the server saw."""
    return [(method, namespace) for method, namespace, _ in fake.asked]


def said(caplog, level=logging.WARNING):
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == level and r.name == "patroller.identify.containerd"
    ]


def test_the_fake_answers_as_the_captured_containerd_did(fake):
    """Every captured call, asked again of the fake: the same status, words and containers
    (a Get's bytes the same; a List's map entries in Go's map order, which varies)."""
    channel = grpc.insecure_channel(f"unix:{fake.path}")
    try:
        for call in recorded()["calls"].values():
            namespace = call["namespace"]
            metadata = ((ctrd.NAMESPACE_HEADER, namespace),) if namespace else None
            try:
                answer = channel.unary_unary(call["method"])(
                    call["request"], timeout=10, metadata=metadata
                )
                code, details = "OK", ""
            except grpc.RpcError as exc:
                answer, code, details = b"", exc.code().name, exc.details()
            assert (code, details) == (call["code"], call["details"]), call["name"]
            if call["method"] == ctrd.GET:
                assert answer == call["answer"], call["name"]
            else:
                assert ctrd.read_list(answer) == ctrd.read_list(call["answer"]), call["name"]
    finally:
        channel.close()


@async_test
async def test_a_plain_container_is_looked_for_in_k8s_io_then_in_default(fake, ids):
    found_in = directory(fake)
    try:
        found = await found_in.get(ids["plain"])
        assert found.namespace == "default" and found.sandbox is None
        assert found.container.id == ids["plain"]
        assert found.container.labels["nerdctl/name"] == "notebook"
        assert found.container.image == "docker.io/library/patroller-test-busybox:latest"
        assert asked(fake) == [(ctrd.GET, "k8s.io"), (ctrd.GET, "default")]
        assert pw.Message(fake.asked[1][2]).text(1) == ids["plain"]
        assert found_in.calls == 2
        assert await found_in.get(ids["plain"]) == found  # cached: not asked again
        assert found_in.calls == 2 and len(fake.asked) == 2
    finally:
        found_in.shutdown()


@async_test
async def test_a_pods_container_comes_with_its_pods_sandbox(fake, ids):
    found_in = directory(fake)
    try:
        found = await found_in.get(ids["container"])
        assert found.namespace == "k8s.io" and found.container.id == ids["container"]
        assert found.sandbox is not None and found.sandbox.id == ids["sandbox"]
        assert found.sandbox.annotations["lab.example.org/owner"] == "carol"  # its OCI spec's
        assert asked(fake) == [(ctrd.GET, "k8s.io"), (ctrd.LIST, "k8s.io")]
        assert pw.Message(fake.asked[1][2]).texts(1) == [ctrd.sandbox_filter(ids["pod_uid"])]
        assert found_in.calls == 2
    finally:
        found_in.shutdown()


@async_test
async def test_a_pods_sandbox_is_its_own_pod(fake, ids):
    """The pause process's container: its own sandbox, nothing listed."""
    found_in = directory(fake)
    try:
        found = await found_in.get(ids["sandbox"])
        assert found.container.id == ids["sandbox"] and found.sandbox == found.container
        assert found.namespace == "k8s.io" and asked(fake) == [(ctrd.GET, "k8s.io")]
    finally:
        found_in.shutdown()


@async_test
async def test_a_container_no_namespace_holds_is_none_and_that_is_cached(fake, ids):
    found_in = directory(fake)
    try:
        assert await found_in.get("f" * 64) is None
        assert asked(fake) == [(ctrd.GET, "k8s.io"), (ctrd.GET, "default")]
        assert await found_in.get("f" * 64) is None and found_in.calls == 2
    finally:
        found_in.shutdown()
    only_default = directory(fake, containerd_namespaces=("default",))
    try:  # the pod's container is in k8s.io, which is not asked
        assert await only_default.get(ids["container"]) is None
        assert asked(fake)[2:] == [(ctrd.GET, "default")]
    finally:
        only_default.shutdown()


@async_test
async def test_a_pods_container_whose_sandbox_is_gone_has_none(fake, ids):
    del fake.containers[("k8s.io", ids["sandbox"])]
    found_in = directory(fake)
    try:
        found = await found_in.get(ids["container"])
        assert found.container.id == ids["container"] and found.sandbox is None
        assert asked(fake) == [(ctrd.GET, "k8s.io"), (ctrd.LIST, "k8s.io")]
    finally:
        found_in.shutdown()


@async_test
async def test_a_list_refused_as_not_found_leaves_the_container_without_its_sandbox(
    fake, ids, caplog
):
    fake.fail(grpc.StatusCode.NOT_FOUND, "namespace gone: not found", (ctrd.LIST,))
    found_in = directory(fake)
    try:
        found = await found_in.get(ids["container"])
        assert found.container.id == ids["container"] and found.sandbox is None
        assert said(caplog) == []  # nothing is down
    finally:
        found_in.shutdown()


@async_test
async def test_only_the_pods_own_sandbox_is_taken_from_a_listing(fake, ids):
    """A listing that holds more than the filter asked for (every container of the namespace):
    neither the container itself, nor another pod's sandbox, nor a container labelled with the
    pod's uid that is not a sandbox, is taken for its sandbox."""
    fake.filtering = False
    pod = fake_labels(fake, ids["sandbox"])
    del fake.containers[("k8s.io", ids["sandbox"])]
    other = "0d1e2f30-4a5b-4c6d-8e7f-901a2b3c4d5e"
    fake.add("k8s.io", "a" * 64, {**pod, "io.kubernetes.pod.uid": other}, like="sandbox")
    fake.add("k8s.io", "b" * 64, {**pod, "io.cri-containerd.kind": "container"}, like="sandbox")
    found_in = directory(fake)
    try:
        found = await found_in.get(ids["container"])
        assert found.container.id == ids["container"] and found.sandbox is None
        assert len(ctrd.read_list(fake.list(fake.asked[-1][2], "k8s.io"))) == 3  # all listed
    finally:
        found_in.shutdown()
    fake.add("k8s.io", ids["sandbox"], pod, like="sandbox")  # and now the pod's own
    found_in = directory(fake)
    try:
        assert (await found_in.get(ids["container"])).sandbox.id == ids["sandbox"]
    finally:
        found_in.shutdown()


def fake_labels(fake, cid, namespace="k8s.io"):
    return pw.Message(fake.containers[(namespace, cid)]).string_map(2)


@async_test
async def test_a_pod_uid_label_that_is_no_uid_is_not_put_in_a_filter(fake, ids):
    labels = {**fake_labels(fake, ids["container"]), "io.kubernetes.pod.uid": 'x",labels.a==b'}
    fake.add("k8s.io", "c" * 64, labels)
    found_in = directory(fake)
    try:
        found = await found_in.get("c" * 64)
        assert found.container.id == "c" * 64 and found.sandbox is None
        assert asked(fake) == [(ctrd.GET, "k8s.io")]  # no List
    finally:
        found_in.shutdown()


@pytest.mark.parametrize("address", ["unix://{}", "{}"], ids=["url", "path"])
@async_test
async def test_the_socket_is_named_by_a_unix_url_or_by_its_path(fake, ids, address):
    found_in = directory(fake, address.format(fake.path))
    try:
        assert found_in.path == fake.path
        assert (await found_in.get(ids["plain"])).namespace == "default"
    finally:
        found_in.shutdown()


@async_test
async def test_containerd_down_fails_fast_is_said_once_and_recovers(fake, ids, caplog):
    """Killed (its socket stays, nobody answers): the lookup fails, saying why, and is said
    once in the log; lookups fail without a call for `containerd_retry_after`; once containerd
    answers again, the container is found and that is said once; down again, said again."""
    fake.crash()
    found_in = directory(fake, containerd_retry_after=0.3)
    try:
        with caplog.at_level(logging.INFO):
            with pytest.raises(ContainerdUnavailable) as down:
                await found_in.get(ids["plain"])
            assert str(down.value).startswith(
                f"containerd at {fake.path}: {ctrd.GET} on {fake.path}: UNAVAILABLE: "
            )
            calls = found_in.calls
            assert calls == 1  # the first namespace: no other is asked once it is down
            with pytest.raises(ContainerdUnavailable) as again:
                await found_in.get(ids["container"])
            assert str(again.value) == str(down.value) and found_in.calls == calls
            assert said(caplog) == [
                f"cannot read containerd's containers: {down.value}; their "
                "identities degrade to the container id until it is back"
            ]
            fake.start()
            began = time.monotonic()
            found = None
            while found is None:
                try:
                    found = await found_in.get(ids["plain"])
                except ContainerdUnavailable:
                    assert time.monotonic() - began < 10
                    await asyncio.sleep(0.02)
            assert found.namespace == "default" and len(said(caplog)) == 1
            assert said(caplog, logging.INFO) == [f"containerd at {fake.path} is reachable again"]
            await found_in.get(ids["container"])
            assert said(caplog, logging.INFO) == [  # said when it was back, not at every call
                f"containerd at {fake.path} is reachable again"
            ]
            fake.crash()
            with pytest.raises(ContainerdUnavailable):
                await found_in.get(ids["sandbox"])
            assert len(said(caplog)) == 2
    finally:
        found_in.shutdown()


@pytest.mark.parametrize(
    "answer, why",
    [
        (b"\xff\xff", "a varint runs past the end"),
        (pw.delimited(1, pw.integer(1, 7)), "field 1 is not of the type its .proto gives"),
        (b"", "an answer without a container"),
        (pw.delimited(1, pw.string(3, "example/image:1")), "a container without an id"),
    ],
)
@async_test
async def test_an_answer_that_is_no_container_degrades_and_says_what(
    fake, ids, answer, why, caplog
):
    fake.answer = answer
    found_in = directory(fake)
    try:
        with pytest.raises(ContainerdUnavailable) as down:
            await found_in.get(ids["plain"])
        assert str(down.value) == (
            f"containerd at {fake.path} answered something that is not a container ({why})"
        )
        assert said(caplog) == [
            f"cannot read containerd's containers: {down.value}; their "
            "identities degrade to the container id until it is back"
        ]
        assert found_in.calls == 1
    finally:
        found_in.shutdown()


@async_test
async def test_annotations_that_are_not_text_are_left_out(fake, ids):
    labels = fake_labels(fake, ids["sandbox"])
    fake.add(
        "k8s.io",
        ids["sandbox"],
        labels,
        {"ok": "v", "n": 7, "list": ["x"], "no": None},
        like="sandbox",
    )
    found_in = directory(fake)
    try:
        assert (await found_in.get(ids["container"])).sandbox.annotations == {"ok": "v"}
    finally:
        found_in.shutdown()


def test_a_sandbox_filter_is_made_of_a_pod_uid_alone(ids):
    assert ctrd.sandbox_filter(ids["pod_uid"]) == (
        f'labels."io.cri-containerd.kind"==sandbox,labels."io.kubernetes.pod.uid"=='
        f'"{ids["pod_uid"]}"'
    )
    for bad in ('x",labels.a==b', "", ids["pod_uid"].upper()):
        with pytest.raises(ValueError, match=f"not a pod uid: {bad!r}"):
            ctrd.sandbox_filter(bad)


@async_test
async def test_an_error_is_said_with_its_status_and_words(fake, ids, caplog):
    fake.fail(grpc.StatusCode.INTERNAL, "boom")
    found_in = directory(fake)
    try:
        with pytest.raises(ContainerdUnavailable) as down:
            await found_in.get(ids["plain"])
        assert (
            str(down.value) == f"containerd at {fake.path}: {ctrd.GET} on {fake.path}: "
            "INTERNAL: boom"
        )
        assert len(said(caplog)) == 1
    finally:
        found_in.shutdown()


@async_test
async def test_an_answer_over_the_limit_degrades(fake, ids, caplog):
    found_in = directory(fake, grpc_max_message=1000)  # a captured container is some 4 kB
    try:
        with pytest.raises(ContainerdUnavailable) as down:
            await found_in.get(ids["plain"])
        assert "RESOURCE_EXHAUSTED: an answer larger than 1000 bytes" in str(down.value)
    finally:
        found_in.shutdown()


@async_test
async def test_a_hung_call_ends_at_the_timeout(fake, ids):
    fake.hang = Hang()
    found_in = directory(fake, containerd_timeout=0.3)
    try:
        with pytest.raises(ContainerdUnavailable) as down:
            await found_in.get(ids["plain"])
        assert "DEADLINE_EXCEEDED" in str(down.value)
    finally:
        fake.hang.release.set()
        found_in.shutdown()


@async_test
async def test_a_shutdown_ends_the_call_in_flight_and_nothing_is_said(fake, ids, caplog):
    fake.hang = Hang()
    found_in = directory(fake, containerd_timeout=60)
    try:
        lookup = asyncio.ensure_future(found_in.get(ids["plain"]))
        await until(fake.hang.started.is_set)
        found_in.shutdown()
        with pytest.raises(ContainerdUnavailable) as ended:
            await asyncio.wait_for(lookup, 10)
        assert "CANCELLED" in str(ended.value)
        await until(lambda: fake.hang.ended)
        assert fake.hang.ended[0] > 30  # ended by the shutdown, not by its deadline
        assert said(caplog) == []  # containerd did not go down
    finally:
        fake.hang.release.set()


@async_test
async def test_a_hung_containerd_holds_two_threads_and_a_shutdown_drops_what_waits(fake):
    """The lookups run in two threads of the directory's own (`containerd_N` in a dump),
    whatever containerd does: five lookups of a hung containerd hold two threads, the three
    others wait their turn. A shutdown ends the two calls and drops the three, never sent."""
    fake.hang = Hang()
    found_in = directory(fake, containerd_timeout=60)
    before = {t.ident for t in threading.enumerate()}
    try:
        lookups = [asyncio.ensure_future(found_in.get(c * 64)) for c in "12345"]
        await until(lambda: fake.hang.in_flight == 2)
        assert sorted(
            t.name
            for t in threading.enumerate()
            if t.ident not in before and t.name.startswith("containerd")
        ) == ["containerd_0", "containerd_1"]
        found_in.shutdown()
        ended = await asyncio.wait_for(asyncio.gather(*lookups, return_exceptions=True), 10)
        assert [type(e) for e in ended] == [ContainerdUnavailable] * 2 + [
            asyncio.CancelledError
        ] * 3
        assert all("CANCELLED" in str(e) for e in ended[:2])
        assert found_in.calls == 2 and len(fake.asked) == 2
    finally:
        fake.hang.release.set()


@async_test
async def test_a_container_is_asked_again_once_its_cache_time_is_over(fake, ids):
    found_in = directory(fake, container_ttl=0.2)
    try:
        await found_in.get(ids["sandbox"])
        assert found_in.calls == 1
        began = time.monotonic()
        while found_in.calls == 1:
            assert time.monotonic() - began < 10
            await found_in.get(ids["sandbox"])
            await asyncio.sleep(0.02)
        assert found_in.calls == 2
    finally:
        found_in.shutdown()
