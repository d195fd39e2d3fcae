"""Capture what a real containerd answers to Patroller's calls, for the engine-free tests
(tests/fake_containerd.py): run as root, `.venv/bin/python tests/capture_containerd.py`, from the
repository's root. It starts the tests' private containerd (tests/containerd.py), makes a plain
container (as nerdctl labels one) in `default`, and a pod's sandbox and container in `k8s.io`
(labelled and annotated as containerd's CRI makes them for the kubelet), asks it with the
requests Patroller sends (patroller/identify/containerd.py), and writes every answer, its status
and its bytes, to tests/fixtures/containerd/answers.json."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from containerd import Containerd

from patroller.identify import containerd as ctrd

OUT = os.path.join(HERE, "fixtures", "containerd", "answers.json")
# Fixed, so that the tests can name them.
PLAIN = "6a1c0e5b9f4d2873" * 4
SANDBOX = "9e3b7c1d5a2f4068" * 4
CONTAINER = "2d8f6b0a4c9e1735" * 4
POD_UID = "7c0a2f64-3b1e-4d95-a8c7-5e2f9b1d6a40"
OTHER_UID = "1b5e9d23-8c4a-4f70-9e16-3a7d2c8b0f59"
POD = {
    "io.kubernetes.pod.namespace": "research",
    "io.kubernetes.pod.name": "train-7",
    "io.kubernetes.pod.uid": POD_UID,
}
SANDBOX_LABELS = {
    **POD,
    "io.cri-containerd.kind": "sandbox",
    "team": "vision",
    "patroller/user": "Alice@Example.org",
}  # the pod's own labels
SANDBOX_ANNOTATIONS = {  # containerd's CRI's, and the pod's own
    "io.kubernetes.cri.container-type": "sandbox",
    "io.kubernetes.cri.sandbox-id": SANDBOX,
    "io.kubernetes.cri.sandbox-name": "train-7",
    "io.kubernetes.cri.sandbox-namespace": "research",
    "io.kubernetes.cri.sandbox-uid": POD_UID,
    "lab.example.org/owner": "carol",
}
CONTAINER_LABELS = {
    **POD,
    "io.cri-containerd.kind": "container",
    "io.kubernetes.container.name": "trainer",
    "maintainer": "image-author@example.org",
}
CONTAINER_ANNOTATIONS = {
    "io.kubernetes.cri.container-type": "container",
    "io.kubernetes.cri.container-name": "trainer",
    "io.kubernetes.cri.sandbox-id": SANDBOX,
    "io.kubernetes.cri.sandbox-name": "train-7",
    "io.kubernetes.cri.sandbox-namespace": "research",
    "io.kubernetes.cri.sandbox-uid": POD_UID,
    "io.kubernetes.cri.image-name": "docker.io/library/patroller-test-busybox:latest",
}
PLAIN_LABELS = {"nerdctl/name": "notebook", "user.email": "Erin <erin@example.org>", "team": "nlp"}


def ask(channel, name, method, request, namespace):
    """One call, and what came back: its status, details and bytes."""
    stub = channel.unary_unary(method)
    metadata = ((ctrd.NAMESPACE_HEADER, namespace),) if namespace is not None else None
    try:
        answer, code, details = stub(request, timeout=10, metadata=metadata), "OK", ""
    except grpc.RpcError as exc:
        answer, code, details = b"", exc.code().name, exc.details()
    return {
        "name": name,
        "method": method,
        "namespace": namespace,
        "request": base64.b64encode(request).decode(),
        "code": code,
        "details": details,
        "answer": base64.b64encode(answer).decode(),
    }


def main() -> None:
    daemon = Containerd().start()
    try:
        cgroup = f"/system.slice/ctrd-capture-{os.getpid()}"
        daemon.run(
            PLAIN,
            PLAIN_LABELS,
            namespace="default",
            cgroup=f"{cgroup}/cri-containerd-{PLAIN}.scope",
        )
        pod = f"/kubepods/besteffort/pod{POD_UID}"
        daemon.run(SANDBOX, SANDBOX_LABELS, SANDBOX_ANNOTATIONS, cgroup=f"{pod}/{SANDBOX}")
        daemon.run(CONTAINER, CONTAINER_LABELS, CONTAINER_ANNOTATIONS, cgroup=f"{pod}/{CONTAINER}")
        version = subprocess.run(
            ["containerd", "--version"], capture_output=True, text=True
        ).stdout.strip()
        channel = grpc.insecure_channel(f"unix:{daemon.socket}")
        calls = [
            ask(channel, "plain", ctrd.GET, ctrd.get_request(PLAIN), "default"),
            ask(channel, "plain_not_in_k8s", ctrd.GET, ctrd.get_request(PLAIN), "k8s.io"),
            ask(channel, "sandbox", ctrd.GET, ctrd.get_request(SANDBOX), "k8s.io"),
            ask(channel, "container", ctrd.GET, ctrd.get_request(CONTAINER), "k8s.io"),
            ask(
                channel,
                "container_not_in_default",
                ctrd.GET,
                ctrd.get_request(CONTAINER),
                "default",
            ),
            ask(
                channel,
                "sandbox_listed",
                ctrd.LIST,
                ctrd.list_request([ctrd.sandbox_filter(POD_UID)]),
                "k8s.io",
            ),
            ask(
                channel,
                "no_sandbox_listed",
                ctrd.LIST,
                ctrd.list_request([ctrd.sandbox_filter(OTHER_UID)]),
                "k8s.io",
            ),
            ask(channel, "no_namespace", ctrd.GET, ctrd.get_request(CONTAINER), None),
        ]
        channel.close()
    finally:
        daemon.stop()
    fixture = {
        "origin": f"tests/capture_containerd.py against {version} (Debian's package), the "
        "tests' private containerd (tests/containerd.py), containers made with ctr",
        "ids": {
            "plain": PLAIN,
            "sandbox": SANDBOX,
            "container": CONTAINER,
            "pod_uid": POD_UID,
            "other_uid": OTHER_UID,
        },
        "calls": calls,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    for call in calls:
        print(call["name"], call["code"], call["details"], len(base64.b64decode(call["answer"])))


if __name__ == "__main__":
    main()
