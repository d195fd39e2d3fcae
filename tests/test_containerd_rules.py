"""Who a containerd container's process is for (identify/pods.py, through resolver.py and
containerd.py): a Kubernetes pod's user from its labels and annotations, a plain container's
from the label rules, a pod's labels not taken where the cgroup names another pod, containerd
down and back. The containers are as a real containerd gave them (tests/fake_containerd.py
serves its captured answers at containerd's socket; the rules below read containers made from
them); no container engine runs here (tests/test_containerd.py runs the real one)."""

import asyncio
import logging
import os
import time
from dataclasses import replace

import pytest
from fake_containerd import FakeContainerd, captured_container, made_like, recorded
from helpers import async_test, engines_in

from patroller.config import Config
from patroller.identify import containerd as ctrd
from patroller.identify.cgroups import ContainerRef
from patroller.identify.containers import ContainerDirectory
from patroller.identify.pods import containerd_identity, is_pods, mismatch
from patroller.identify.resolver import ProcessIdentifier
from patroller.observe import protowire as pw

OTHER_UID = "1b5e9d23-8c4a-4f70-9e16-3a7d2c8b0f59"


@pytest.fixture
def ids():
    return recorded()["ids"]


@pytest.fixture
def fake(engine_sockets):
    server = FakeContainerd(os.path.join(engine_sockets, "containerd.sock"))
    server.add_captured()
    yield server.start()
    server.stop()


class Identifier:
    """A ProcessIdentifier with containerd at the fake's socket, and no other engine there;
    this test's own process taken to be in the container a test names."""

    def __init__(self, engine_sockets, **settings):
        config = replace(
            Config(), **engines_in(engine_sockets, user_info_labels=("team",), **settings)
        )
        self.identifier = ProcessIdentifier(config, ContainerDirectory(config))
        self.asked = 0

    async def of(self, cid, pod=None, runtime="containerd"):
        self.asked += 1  # another start time each time: not the identity cached for the last
        facts = await self.identifier.facts(os.getpid())
        facts = replace(
            facts, start=facts.start + self.asked, container=ContainerRef(runtime, cid, pod=pod)
        )
        return await self.identifier.identify(facts)

    def close(self):
        self.identifier.close()


@pytest.fixture
def identifier(engine_sockets):
    made = []

    def make(**settings):
        made.append(Identifier(engine_sockets, **settings))
        return made[-1]

    yield make
    for one in made:
        one.close()


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- through containerd's socket -------------------------------------------------------------


@async_test
async def test_a_pods_process_is_its_pod_and_its_user_from_the_pods_label(
    fake, ids, identifier, caplog
):
    """The pod's label `patroller/user` (on its sandbox), before the container's own
    `maintainer` (a user label); the pod's `team` label copied; the uid the cgroup's."""
    identity = await identifier().of(ids["container"], pod=ids["pod_uid"])
    assert identity.source == "pod" and not identity.degraded
    assert identity.user == "alice@example.org" and identity.email == "alice@example.org"
    assert identity.pod == (
        ("namespace", "research"),
        ("name", "train-7"),
        ("uid", ids["pod_uid"]),
        ("container", "trainer"),
    )
    assert identity.container == (ids["container"][:12], "trainer")
    assert identity.info == (("team", "vision"),)
    assert identity.uid == os.getuid()  # runs_as: the kernel's word
    assert warnings(caplog) == []


@async_test
async def test_the_configured_pod_user_key_is_read_in_the_pods_annotations(fake, ids, identifier):
    identity = await identifier(pod_user_keys=("lab.example.org/owner",)).of(
        ids["container"], pod=ids["pod_uid"]
    )
    assert identity.user == "carol" and identity.email is None and identity.source == "pod"


@async_test
async def test_a_pods_sandbox_process_is_its_pod(fake, ids, identifier):
    identity = await identifier().of(ids["sandbox"], pod=ids["pod_uid"])
    assert identity.source == "pod" and identity.user == "alice@example.org"
    assert identity.pod == (
        ("namespace", "research"),
        ("name", "train-7"),
        ("uid", ids["pod_uid"]),
    )  # no container name: the pause process
    assert identity.container == (ids["sandbox"][:12], None)


@async_test
async def test_an_annotation_that_is_not_text_is_skipped(fake, ids, identifier):
    """A pod annotation holding a number (the OCI spec is JSON): not taken, the next key is."""
    labels = pw.Message(fake.containers[("k8s.io", ids["sandbox"])]).string_map(2)
    fake.add("k8s.io", ids["sandbox"], labels, {"lab.example.org/owner": 7}, like="sandbox")
    identity = await identifier(pod_user_keys=("lab.example.org/owner", "patroller/user")).of(
        ids["container"], pod=ids["pod_uid"]
    )
    assert identity.user == "alice@example.org" and identity.source == "pod"


@async_test
async def test_a_plain_container_follows_the_label_rules(fake, ids, identifier):
    identity = await identifier().of(ids["plain"])
    assert identity.source == "container" and identity.user == "erin@example.org"
    assert identity.email == "erin@example.org" and identity.pod is None
    assert identity.container == (ids["plain"][:12], "notebook")  # nerdctl's name
    assert identity.info == (("team", "nlp"),)


@async_test
async def test_a_plain_container_without_a_name_or_a_user(fake, identifier):
    fake.add("default", "d" * 64, {"team": "nlp"}, like="plain")
    identity = await identifier().of("d" * 64)
    assert identity.user == "container:dddddddddddd" and identity.source == "container"
    assert identity.container == ("dddddddddddd", None)


@async_test
async def test_a_pod_labelled_as_another_pod_is_named_by_its_id_and_said(
    fake, ids, identifier, caplog
):
    """The cgroup (the kernel's word) names pod OTHER; the labels, whoever made the container,
    name the captured pod: they are not taken, and the log says so."""
    identity = await identifier().of(ids["container"], pod=OTHER_UID)
    short = ids["container"][:12]
    assert identity.user == f"container:{short}" and identity.source == "container"
    assert identity.pod is None and not identity.degraded
    assert warnings(caplog) == [
        f"container {short} is labelled as pod {ids['pod_uid']}, but "
        f"its cgroup is pod {OTHER_UID}'s: its labels are not taken"
    ]


@async_test
async def test_a_container_containerd_does_not_know_is_named_by_its_id(fake, identifier):
    identity = await identifier().of("e" * 64)
    assert identity.user == "container:eeeeeeeeeeee" and not identity.degraded
    assert not identity.pending  # containerd was asked: nothing to wait for


@async_test
async def test_containerd_down_degrades_the_owner_and_it_recovers(fake, ids, identifier, caplog):
    fake.crash()
    me = identifier(containerd_retry_after=0.2)
    identity = await me.of(ids["container"], pod=ids["pod_uid"])
    assert identity.degraded and identity.user == "unknown"
    assert identity.container == (ids["container"][:12], None) and identity.pod is None
    [down] = warnings(caplog)
    assert down.startswith(f"cannot read containerd's containers: containerd at {fake.path}: ")
    fake.start()
    began = time.monotonic()
    while identity.degraded:
        assert time.monotonic() - began < 10
        await asyncio.sleep(0.02)
        identity = await me.of(ids["container"], pod=ids["pod_uid"])
    assert identity.user == "alice@example.org" and identity.source == "pod"


# -- the rules, on containers made from containerd's answers ----------------------------------


def container(labels, annotations=None, like="container", cid="c" * 64):
    return ctrd.read_container(
        pw.Message(made_like(captured_container(like), cid, labels, annotations))
    )


def pod(namespace="ns", name="p", uid="0f2c1e3a-1111-2222-3333-444455556666", **more):
    labels = {
        "io.kubernetes.pod.namespace": namespace,
        "io.kubernetes.pod.name": name,
        "io.kubernetes.pod.uid": uid,
    }
    return {**labels, **more}


UID = "0f2c1e3a-1111-2222-3333-444455556666"
KEYS = ("patroller/user",)


def identity_of(
    labels,
    sandbox=None,
    sandbox_annotations=None,
    annotations=None,
    cgroup=UID,
    keys=KEYS,
    user_labels=Config.user_labels,
    info=(),
):
    found = ctrd.Found(
        "k8s.io",
        container(labels, annotations),
        None if sandbox is None else container(sandbox, sandbox_annotations, "sandbox", "s" * 64),
    )
    return containerd_identity(
        found, ContainerRef("containerd", "c" * 64, pod=cgroup), keys, user_labels, info
    )


def test_a_pod_is_a_container_labelled_with_a_pods_namespace_and_name():
    assert is_pods(container(pod()))
    for missing in ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name"):
        labels = {k: v for k, v in pod(**{"user.email": "u@example.org"}).items() if k != missing}
        assert not is_pods(container(labels))
        assert not is_pods(container({**labels, missing: ""}))
        assert identity_of(labels).source == "container"  # the label rules
        assert identity_of(labels).user == "u@example.org"


def test_each_key_is_looked_for_everywhere_before_the_next():
    """The pod keys, then the user labels; each in the container's labels, the pod's labels,
    the pod's annotations, the container's annotations."""
    value = {"patroller/user": "erin@example.org"}
    for labels, sandbox, sandbox_annotations, annotations in [
        (pod(**value), pod(), None, None),
        (pod(), pod(**value), None, None),
        (pod(), pod(), value, None),
        (pod(), pod(), None, value),
    ]:
        got = identity_of(labels, sandbox, sandbox_annotations, annotations)
        assert got.user == "erin@example.org" and got.email == "erin@example.org"
    assert (
        identity_of(pod(maintainer="m@example.org"), pod(**{"patroller/user": "alice"})).user
        == "alice"
    )  # a pod key anywhere before a user label
    assert (
        identity_of(
            pod(), pod(), {"patroller/user": "x@example.org"}, {"patroller/user": "y@example.org"}
        ).user
        == "x@example.org"
    )
    assert (
        identity_of(pod(**{"patroller/user": "bob"}), pod(**{"patroller/user": "carol"})).user
        == "bob"
    )  # the container's labels first
    assert (
        identity_of(pod(), pod(**{"patroller/user": "carol"}), {"patroller/user": "dave"}).user
        == "carol"
    )  # the pod's labels before its annotations


def test_a_pod_key_may_hold_a_name_a_user_label_only_an_address():
    assert identity_of(pod(**{"patroller/user": " dave "})).user == "dave"
    assert (
        identity_of(pod(**{"patroller/user": "Alice <Alice@Example.org>"})).user
        == "alice@example.org"
    )
    for not_a_name in ("not a name!", "-dash", "a" * 64, ""):
        got = identity_of(pod(**{"patroller/user": not_a_name}, **{"user.email": "u@example.org"}))
        assert got.user == "u@example.org", not_a_name  # the next key
    assert identity_of(pod(**{"patroller/user": "a" * 63})).user == "a" * 63
    assert identity_of(pod(email="plain-name")).user == "namespace:ns"  # not a pod key
    assert identity_of(pod(email="plain-name"), keys=("email",)).user == "plain-name"
    assert (
        identity_of(
            pod(**{"team": "x@example.org"}), keys=(), user_labels=("team", "patroller/user")
        ).user
        == "x@example.org"
    )


def test_a_pod_nobody_is_named_for_is_its_namespaces():
    got = identity_of(pod(namespace="team-b", **{"io.kubernetes.container.name": "worker"}))
    assert got.user == "namespace:team-b" and got.email is None and got.source == "pod"
    assert got.pod == (
        ("namespace", "team-b"),
        ("name", "p"),
        ("uid", UID),
        ("container", "worker"),
    )
    assert got.container == ("cccccccccccc", "worker")


def test_another_pods_sandbox_is_not_taken():
    """A sandbox whose namespace, name or uid is not the container's pod's: none of its labels
    or annotations is taken."""
    user = {"patroller/user": "mallory@example.org", "team": "red"}
    for other in (pod(namespace="ns2", **user), pod(name="q", **user), pod(uid=OTHER_UID, **user)):
        got = identity_of(pod(), other, user, info=("team",))
        assert got.user == "namespace:ns" and got.info == ()
    assert identity_of(pod(), pod(**user), info=("team",)).info == (("team", "red"),)


def test_the_pods_uid_is_the_cgroups_else_its_labels():
    assert dict(identity_of(pod()).pod)["uid"] == UID
    unlabelled = {k: v for k, v in pod().items() if k != "io.kubernetes.pod.uid"}
    assert dict(identity_of(unlabelled, cgroup=OTHER_UID).pod)["uid"] == OTHER_UID
    assert dict(identity_of(pod(), cgroup=None).pod)["uid"] == UID
    assert "uid" not in dict(identity_of(unlabelled, cgroup=None).pod)
    # the uid the sandbox must have is the cgroup's, where the labels say none
    sandbox = pod(**{"patroller/user": "alice"})
    assert identity_of(unlabelled, sandbox, cgroup=UID).user == "alice"
    assert identity_of(unlabelled, sandbox, cgroup=OTHER_UID).user == "namespace:ns"
    assert (
        identity_of(
            unlabelled,
            {k: v for k, v in sandbox.items() if k != "io.kubernetes.pod.uid"},
            cgroup=None,
        ).user
        == "alice"
    )


def test_labels_naming_another_pod_than_the_cgroup_are_not_taken():
    got = identity_of(pod(**{"patroller/user": "alice"}), cgroup=OTHER_UID)
    assert got.pod is None and got.user == "container:cccccccccccc"
    item = ctrd.Found("k8s.io", container(pod()), None)
    assert mismatch(item, ContainerRef("containerd", "c" * 64, pod=OTHER_UID)) == (
        f"container cccccccccccc is labelled as pod {UID}, but its cgroup is pod "
        f"{OTHER_UID}'s: its labels are not taken"
    )
    for agreeing in (UID, None):  # the same pod, or a cgroup that names none
        assert mismatch(item, ContainerRef("containerd", "c" * 64, pod=agreeing)) is None
    unlabelled = {k: v for k, v in pod().items() if k != "io.kubernetes.pod.uid"}
    assert (
        mismatch(
            ctrd.Found("k8s.io", container(unlabelled)),
            ContainerRef("containerd", "c" * 64, pod=OTHER_UID),
        )
        is None
    )
    plain = {"io.kubernetes.pod.uid": UID, "user.email": "u@example.org"}  # not a pod's
    assert (
        mismatch(
            ctrd.Found("default", container(plain)),
            ContainerRef("containerd", "c" * 64, pod=OTHER_UID),
        )
        is None
    )
    assert identity_of(plain, cgroup=OTHER_UID).user == "u@example.org"
    forged = pod(uid="other\nFORGED line")
    assert "as pod other\\nFORGED line, but" in mismatch(
        ctrd.Found("k8s.io", container(forged)), ContainerRef("containerd", "c" * 64, pod=UID)
    )


def test_info_labels_are_the_containers_then_the_pods_in_their_order():
    got = identity_of(
        pod(team="c-team", site="c-site"),
        pod(team="p-team", zone="p-zone"),
        info=("zone", "team", "absent", "site"),
    )
    assert got.info == (("zone", "p-zone"), ("team", "c-team"), ("site", "c-site"))
    assert identity_of(pod(), pod(zone="x", uid=OTHER_UID), info=("zone",)).info == ()


def test_a_pods_namespace_and_name_are_taken_printable():
    got = identity_of(pod(namespace="ml\nFORGED", name="n" * 300))
    namespace, name = dict(got.pod)["namespace"], dict(got.pod)["name"]
    assert namespace == "ml\\nFORGED" and got.user == "namespace:ml\\nFORGED"
    assert name == "n" * 253 + "..."
