"""containerd's containers and Kubernetes pods, through a real containerd (tests/containerd.py):
containers run with ctr as containerd's CRI would make a pod's (the kubelet's labels, a sandbox
labelled io.cri-containerd.kind=sandbox, the pod's cgroupfs path), their real processes resolved
by the ProcessIdentifier and by the daemon. The CRI plugin itself does not run here (it would
want a kubelet and CNI): the containers are made as it makes them. The messages are also read
from bytes built here with observe/protowire.py, from containerd's .proto field numbers."""

import asyncio
import json
import logging
import os
import secrets
import time
import uuid
from dataclasses import replace

import pytest
from helpers import ScenarioFile, async_test, engines_in, gpu_running, known_claim, until

from patroller.config import Config
from patroller.http.views import claims
from patroller.identify import containerd as ctrd
from patroller.identify.cgroups import ContainerRef
from patroller.identify.containers import ContainerDirectory
from patroller.identify.pods import containerd_identity
from patroller.identify.resolver import ProcessIdentifier
from patroller.observe import protowire as pw
from patroller.observe.protowire import WireError

CRI = {"io.cri-containerd.kind": "container"}


def pod_labels(namespace, name, uid, container=None):
    labels = {
        "io.kubernetes.pod.namespace": namespace,
        "io.kubernetes.pod.name": name,
        "io.kubernetes.pod.uid": uid,
    }
    if container is not None:
        labels["io.kubernetes.container.name"] = container
    return labels


class Pod:
    """A pod as containerd's CRI makes it: a sandbox, and containers in the pod's cgroup."""

    def __init__(
        self,
        containerd,
        namespace="research",
        name=None,
        labels=None,
        annotations=None,
        systemd=False,
    ):
        self.containerd = containerd
        self.namespace, self.name = namespace, name or f"train-{secrets.token_hex(3)}"
        self.uid = str(uuid.uuid4())
        self.systemd = systemd
        sandbox = secrets.token_hex(32)
        containerd.run(
            sandbox,
            {
                **pod_labels(namespace, self.name, self.uid),
                **(labels or {}),
                "io.cri-containerd.kind": "sandbox",
            },
            annotations,
            cgroup=self.cgroup(sandbox),
        )

    def cgroup(self, cid, pod=None):
        """Where the CRI puts a container of the pod (of pod `pod`): the cgroupfs driver's
        path, a bare id; or the systemd driver's, a cri-containerd scope."""
        pod = pod or self.uid
        if self.systemd:
            return (
                f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                f"{pod.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
            )
        return f"/kubepods/besteffort/pod{pod}/{cid}"

    def run(self, container="main", labels=None, annotations=None, cgroup_pod=None):
        """A container of the pod (labelled as the kubelet does; `labels` may say otherwise),
        in the pod's cgroup (or in that of pod `cgroup_pod`): (id, host pid)."""
        cid = secrets.token_hex(32)
        pid = self.containerd.run(
            cid,
            {
                **CRI,
                **pod_labels(self.namespace, self.name, self.uid, container),
                **(labels or {}),
            },
            annotations,
            cgroup=self.cgroup(cid, cgroup_pod),
        )
        return cid, pid


@pytest.fixture
def config(containerd, engine_sockets):
    """containerd at its test socket; every other engine at a socket that is not there."""
    return replace(
        Config(),
        **engines_in(
            engine_sockets,
            containerd_socket=containerd.address,
            containerd_retry_after=0.05,
            docker_retry_after=0.05,
            user_info_labels=("team",),
        ),
    )


def identifier_for(config):
    return ProcessIdentifier(config, ContainerDirectory(config))


# -- through a real containerd --------------------------------------------------------------


@pytest.mark.parametrize("systemd", [False, True], ids=["cgroupfs", "systemd"])
@async_test
async def test_a_pods_process_is_its_pod_and_its_user_from_the_pods_label(
    containerd, config, systemd
):
    pod = Pod(
        containerd,
        labels={"patroller/user": "Alice@Example.org", "team": "vision"},
        systemd=systemd,
    )
    cid, pid = pod.run("trainer", labels={"maintainer": "image-author@example.org"})
    identifier = identifier_for(config)
    first, second = await asyncio.gather(identifier.resolve(pid), identifier.resolve(pid))
    for identity in (first, second):
        assert identity.source == "pod" and not identity.degraded
        assert identity.user == "alice@example.org" and identity.email == "alice@example.org"
        assert dict(identity.pod) == {
            "namespace": "research",
            "name": pod.name,
            "uid": pod.uid,
            "container": "trainer",
        }
        assert identity.container == (cid[:12], "trainer")
        assert identity.info == (("team", "vision"),)  # the pod's label
        assert identity.uid == 0 and identity.account == "root"  # runs_as: the kernel's word
    assert identifier.containerd_calls == 2  # one Get, one List of the sandbox, shared
    assert identifier.docker_calls == 0
    assert identity.to_json()["pod"]["name"] == pod.name


@async_test
async def test_a_pods_user_from_the_pods_annotation_as_a_name(containerd, config):
    pod = Pod(containerd, annotations={"patroller/user": "bob"})
    _, pid = pod.run()
    identity = await identifier_for(config).resolve(pid)
    assert identity.source == "pod" and identity.user == "bob" and identity.email is None


@async_test
async def test_the_configured_pod_user_key_comes_before_the_user_labels(containerd, config):
    pod = Pod(containerd, labels={"lab.example.org/owner": "carol"})
    _, pid = pod.run(labels={"user.email": "dave@example.org"})
    identity = await identifier_for(
        replace(config, pod_user_keys=("lab.example.org/owner",))
    ).resolve(pid)
    assert identity.user == "carol"
    identity = await identifier_for(config).resolve(pid)  # the default key: not there
    assert identity.user == "dave@example.org"  # as Docker's label rules say


@async_test
async def test_a_pod_nobody_is_named_for_is_its_namespaces(containerd, config, caplog):
    pod = Pod(containerd, namespace="team-b")
    cid, pid = pod.run("worker")
    identity = await identifier_for(config).resolve(pid)
    assert identity.user == "namespace:team-b" and identity.email is None
    assert identity.source == "pod" and dict(identity.pod)["container"] == "worker"
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


@async_test
async def test_a_container_labelled_as_another_pod_than_its_cgroups_is_not_trusted(
    containerd, config, caplog
):
    """Its labels claim alice's pod, its cgroup is another pod's: nothing of the labels."""
    alice = Pod(containerd, labels={"patroller/user": "alice@example.org"}, systemd=True)
    cid, pid = alice.run(cgroup_pod=str(uuid.uuid4()))
    identity = await identifier_for(config).resolve(pid)
    assert identity.user == f"container:{cid[:12]}" and identity.source == "container"
    assert identity.pod is None and identity.email is None and not identity.degraded
    assert any(
        "not taken" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    )


@async_test
async def test_a_plain_containerd_container_follows_the_label_rules(containerd, config):
    cid = secrets.token_hex(32)
    pid = containerd.run(
        cid,
        {"user.email": "Erin <erin@example.org>", "team": "nlp", "nerdctl/name": "notebook"},
        namespace="default",
        cgroup=f"/system.slice/ctrd-{os.getpid()}/cri-containerd-{cid}.scope",
    )
    identity = await identifier_for(config).resolve(pid)
    assert identity.source == "container" and identity.user == "erin@example.org"
    assert identity.container == (cid[:12], "notebook") and identity.pod is None
    assert identity.info == (("team", "nlp"),)


@async_test
async def test_a_bare_id_in_a_pods_path_that_containerd_does_not_know_is_dockers(
    containerd, config
):
    """cri-dockerd's pods: containerd is asked first, then the Docker Engine (not there here:
    degraded, which shows it was asked)."""
    cid = secrets.token_hex(32)
    pid = containerd.run(
        cid, namespace="default", cgroup=f"/kubepods/burstable/pod{uuid.uuid4()}/{cid}"
    )
    identifier = identifier_for(replace(config, containerd_namespaces=("k8s.io",)))
    identity = await identifier.resolve(pid)
    assert identity.degraded and identity.container == (cid[:12], None)
    assert identifier.containerd_calls == 1


@async_test
async def test_containerd_without_its_socket_costs_nothing(
    containerd, config, engine_sockets, caplog
):
    """A cri-containerd scope: no other engine to ask, named by its id, nothing said."""
    pod = Pod(containerd, labels={"patroller/user": "alice@example.org"}, systemd=True)
    cid, pid = pod.run()
    absent = replace(config, containerd_socket=f"unix://{engine_sockets}/containerd.sock")
    identifier = identifier_for(absent)
    identity = await identifier.resolve(pid)
    assert identity.user == f"container:{cid[:12]}" and not identity.degraded
    assert identifier.containerd_calls == 0 and identifier.docker_calls == 0
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    off = identifier_for(replace(config, containerd_socket=None))
    assert (await off.resolve(pid)).user == f"container:{cid[:12]}"


@async_test
async def test_containerd_down_degrades_the_pods_owner_and_it_recovers(containerd, engine_sockets):
    """The daemon: containerd crashes (its socket stays, nobody answers): the GPU's owner is
    degraded, its container known; once containerd is back, the pod's user is learned. A
    cri-containerd scope: no other engine is asked, the degradation is containerd's alone."""
    pod = Pod(containerd, labels={"patroller/user": "alice@example.org"}, systemd=True)
    cid, pid = pod.run("trainer")
    scenario = ScenarioFile(os.path.join(engine_sockets, "scenario.json"), devices=[{}, {}])
    settings = engines_in(
        engine_sockets,
        containerd_socket=containerd.address,
        containerd_retry_after=0.2,
        owner_retry=0.2,
    )
    containerd.kill()
    try:
        async with gpu_running(scenario, **settings) as h:
            scenario.write(processes=[{"pid": pid, "gpu": 1, "name": "python"}])
            gpu = h.uuids()[1]
            await until(lambda: known_claim(h.services.leases, gpu))
            owner = (await h.ok("/status"))[gpu]["claim"]["user"]
            assert owner["degraded"] is True and owner["user"] == "unknown"
            assert owner["container"]["id"] == cid[:12] and owner["pod"] is None
            containerd.run_daemon()
            await until(
                lambda: (
                    (claims(h.services.leases)[gpu]["user"] or {}).get("user")
                    == "alice@example.org"
                )
            )
            owner = (await h.ok("/status"))[gpu]["claim"]["user"]
            assert owner["source"] == "pod" and owner["degraded"] is False
            assert owner["pod"] == {
                "namespace": "research",
                "name": pod.name,
                "uid": pod.uid,
                "container": "trainer",
            }
    finally:
        if containerd.process.poll() is not None:
            containerd.run_daemon()


@async_test
async def test_containerd_stopped_in_order_is_asked_again_once_it_is_back(
    containerd, engine_sockets
):
    """containerd stopped in order removes its socket: a pod's process that appears meanwhile
    is named by its container's id (pending, not degraded), and gets its pod and user once
    containerd is back."""
    pod = Pod(containerd, labels={"patroller/user": "alice@example.org"}, systemd=True)
    cid, pid = pod.run("trainer")
    scenario = ScenarioFile(os.path.join(engine_sockets, "scenario.json"), devices=[{}, {}])
    settings = engines_in(
        engine_sockets,
        containerd_socket=containerd.address,
        engine_socket_ttl=0.2,
        engine_recheck=0.2,
    )
    containerd.terminate()
    try:
        assert not os.path.exists(containerd.socket)
        async with gpu_running(scenario, **settings) as h:
            scenario.write(processes=[{"pid": pid, "gpu": 1, "name": "python"}])
            gpu = h.uuids()[1]
            await until(lambda: known_claim(h.services.leases, gpu))
            owner = (await h.ok("/status"))[gpu]["claim"]["user"]
            assert owner["user"] == f"container:{cid[:12]}" and owner["degraded"] is False
            containerd.run_daemon()
            await until(
                lambda: (
                    (claims(h.services.leases)[gpu]["user"] or {}).get("user")
                    == "alice@example.org"
                )
            )
            owner = (await h.ok("/status"))[gpu]["claim"]["user"]
            assert owner["source"] == "pod" and owner["pod"]["name"] == pod.name
    finally:
        if containerd.process.poll() is not None:
            containerd.run_daemon()


@pytest.mark.parametrize(
    "answer",
    [
        b"\xff\xff",
        pw.delimited(1, pw.integer(1, 7)),
        pw.delimited(1, pw.string(1, "c") + pw.delimited(2, b"\x08")),
    ],
)
@async_test
async def test_garbage_from_containerd_degrades_and_crashes_nothing(
    engine_sockets, answer, caplog
):
    """A server at containerd's socket answering what is no container (the tests' gRPC server,
    as containerd's own cannot be made to): degraded, said once, and nothing raised."""
    from grpc_server import Server

    path = os.path.join(engine_sockets, "containerd.sock")
    server = Server(path, {ctrd.GET: lambda request: answer}).start()
    try:
        config = replace(Config(), **engines_in(engine_sockets, containerd_retry_after=60))
        identifier = identifier_for(config)
        cid = secrets.token_hex(32)
        facts = replace(
            await identifier.facts(os.getpid()), container=ContainerRef("containerd", cid)
        )
        for _ in range(2):
            identity = await identifier.identify(facts)
            assert identity.degraded and identity.container == (cid[:12], None)
        assert server.calls == {ctrd.GET: 1}  # then it is not asked for a while
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(said) == 1 and "not a container" in said[0]
        identifier.close()
    finally:
        server.stop()


def test_the_pod_is_shown_by_status_the_command_line_and_the_web_page(containerd, engine_sockets):
    """A daemon on the simulator with containerd at its socket, a pod's process on GPU 2: the
    pod in /status, in `patroller status`, and on the card of the web page."""
    import subprocess
    import sys
    import urllib.request

    from browser import browser
    from helpers import ROOT, ServerProcess

    pod = Pod(
        containerd, namespace="ml", name="p7", labels={"patroller/user": "alice@example.org"}
    )
    cid, pid = pod.run("trainer")
    scenario = ScenarioFile(os.path.join(engine_sockets, "scenario.json"), devices=[{}] * 4)
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--lease",
        "300",
        "--containerd-socket",
        containerd.address,
        "--docker-host",
        f"unix://{engine_sockets}/docker.sock",
        "--podman-socket",
        "none",
    ).start()
    page = None
    try:
        scenario.write(processes=[{"pid": pid, "gpu": 2, "name": "python", "used_mib": 1024}])

        def owner():
            with urllib.request.urlopen(server.url + "/status", timeout=30) as answer:
                status = json.loads(answer.read())
            held = [e["claim"] for e in status.values() if pid in e["claim"]["processes"]]
            return (held[0].get("user") or {}) if held else {}

        deadline = time.monotonic() + 20
        while owner().get("source") != "pod":
            assert time.monotonic() < deadline, owner()
            time.sleep(0.1)
        assert owner()["pod"] == {
            "namespace": "ml",
            "name": "p7",
            "uid": pod.uid,
            "container": "trainer",
        }
        env = {k: v for k, v in os.environ.items() if k not in ("PATROLLER_SERVER", "NO_COLOR")}
        shown = subprocess.run(
            [
                sys.executable,
                "-m",
                "patroller.cli",
                "status",
                "--server",
                server.url.split("//", 1)[1],
            ],
            env={**env, "PYTHONPATH": ROOT},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "alice@example.org (pod ml/p7)" in shown.stdout, shown.stdout
        page = browser()
        page.open(server.url + "/")
        page.until(
            lambda: (page.card(2) or {}).get("text", "").count("pod ml/p7 · trainer") == 1,
            "the pod on GPU 2's card",
            20,
        )
    finally:
        if page is not None:
            page.quit()
        server.stop()


# -- the messages, from the .proto's field numbers ------------------------------------------


def container_message(cid, labels=(), spec=None, image="example/image:1"):
    """A Container: id 1, labels 2, image 3, runtime 4, spec 5 (an Any), created_at 8."""
    body = pw.string(1, cid) + pw.string_map(2, dict(labels)) + pw.string(3, image)
    body += pw.delimited(4, pw.string(1, "io.containerd.runc.v2"))
    if spec is not None:
        raw = spec if isinstance(spec, bytes) else json.dumps(spec).encode()
        body += pw.delimited(
            5,
            pw.string(1, "types.containerd.io/opencontainers/runtime-spec/1/Spec")
            + pw.delimited(2, raw),
        )
    body += pw.delimited(8, pw.integer(1, 1700000000) + pw.integer(2, 5))
    return body


def test_the_requests_are_the_protos():
    assert pw.Message(ctrd.get_request("abc")).text(1) == "abc"
    uid = str(uuid.uuid4())
    assert pw.Message(ctrd.list_request([ctrd.sandbox_filter(uid)])).texts(1) == [
        f'labels."io.cri-containerd.kind"==sandbox,labels."io.kubernetes.pod.uid"=="{uid}"'
    ]
    for bad in ('x",labels.a==b', "", "ABC"):
        with pytest.raises(ValueError):
            ctrd.sandbox_filter(bad)


def test_a_container_is_read_with_its_spec_annotations():
    data = pw.delimited(
        1,
        container_message(
            "c" * 64, {"a": "1", "b": "2"}, {"ociVersion": "1.0.2", "annotations": {"x": "y"}}
        ),
    )
    found = ctrd.read_get(data)
    assert found == ctrd.CtrContainer(
        "c" * 64, {"a": "1", "b": "2"}, {"x": "y"}, "example/image:1"
    )
    listed = ctrd.read_list(
        pw.delimited(1, container_message("a" * 64)) + pw.delimited(1, container_message("b" * 64))
    )
    assert [c.id for c in listed] == ["a" * 64, "b" * 64]
    assert ctrd.read_list(b"") == []


@pytest.mark.parametrize(
    "spec",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        {"annotations": ["x"]},
        {"annotations": {"k": 1, "ok": "v"}},
    ],
)
def test_a_bad_spec_costs_only_its_annotations(spec):
    found = ctrd.read_get(pw.delimited(1, container_message("c" * 64, {"a": "1"}, spec)))
    assert found.labels == {"a": "1"}
    assert found.annotations == (
        {"ok": "v"} if isinstance(spec, dict) and isinstance(spec["annotations"], dict) else {}
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        pw.string(1, "x"),
        pw.delimited(1, b""),
        pw.delimited(1, pw.integer(1, 5)),
        b"\x0a\x05ab",
        pw.delimited(1, pw.string(1, "c") + b"\x12\x03\x0a"),
    ],
)
def test_what_is_not_a_container_is_a_wire_error(data):
    with pytest.raises(WireError):
        ctrd.read_get(data)


# -- the rules, on containers as containerd gives them --------------------------------------


def ref(pod=None):
    return ContainerRef("containerd", "c" * 64, pod=pod)


def found(labels, sandbox_labels=None, sandbox_annotations=None, annotations=None):
    container = ctrd.CtrContainer("c" * 64, labels, annotations or {})
    sandbox = None
    if sandbox_labels is not None:
        sandbox = ctrd.CtrContainer("s" * 64, sandbox_labels, sandbox_annotations or {})
    return ctrd.Found("k8s.io", container, sandbox)


UID = "0f2c1e3a-1111-2222-3333-444455556666"
POD = pod_labels("ns", "p", UID, "main")


def user_of(item, pod=UID, keys=("patroller/user",)):
    return containerd_identity(item, ref(pod), keys, Config.user_labels, ())


def test_each_key_is_looked_for_everywhere_before_the_next():
    assert (
        user_of(
            found({**POD, "maintainer": "m@example.org"}, {**POD, "patroller/user": "alice"})
        ).user
        == "alice"
    )
    assert (
        user_of(
            found(
                POD, POD, {"patroller/user": "x@example.org"}, {"patroller/user": "y@example.org"}
            )
        ).user
        == "x@example.org"
    )
    assert (
        user_of(
            found(
                {**POD, "patroller/user": "not a name!"},
                POD,
                annotations={"user.email": "u@example.org"},
            )
        ).user
        == "u@example.org"
    )
    assert user_of(found({**POD, "email": "plain-name"}, POD)).user == "namespace:ns"


def test_another_pods_sandbox_is_not_taken():
    other = {**pod_labels("ns", "q", UID), "patroller/user": "mallory"}
    assert user_of(found(POD, other)).user == "namespace:ns"


def test_a_pods_uid_is_the_cgroups_and_must_agree_with_the_labels():
    assert dict(user_of(found(POD, POD)).pod)["uid"] == UID
    unlabelled = {k: v for k, v in POD.items() if k != "io.kubernetes.pod.uid"}
    other = str(uuid.uuid4())
    assert dict(user_of(found(unlabelled), pod=other).pod)["uid"] == other
    assert dict(user_of(found(POD), pod=None).pod)["uid"] == UID
    untrusted = user_of(found({**POD, "patroller/user": "alice"}), pod=other)
    assert untrusted.pod is None and untrusted.user == "container:cccccccccccc"
