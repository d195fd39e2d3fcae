"""Devices the kubelet has assigned to Kubernetes pods: whose they are, and which processes
belong there.

A pod allocation is what the kubelet's pod-resources (observe/podresources.py) says of one GPU:
the pods it is assigned to, each with the containers the kubelet lists it in. It is held as a
Slurm allocation is (core/jobs.py, core/leases/allocations.py): never granted, no lease runs,
and a process on it that is not in one of its pods trespasses, whoever runs it (another pod, a
host process, a container outside Kubernetes).

A process is in a pod when its identity's `pod` (the container runtime's word, from the
container's labels) names the same namespace and name. The kubelet does not say who a pod's
user is: the holder is the identity of a process of the pod once one is seen, and until then
`namespace:<namespace>`.

Both kinds of allocation answer the same small protocol (core/scheduled.py,
SchedulerAllocation), which the lease rules use without asking which one they hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from patroller.core.identity import Identity

# Characters of a pod's namespace, name or container name taken at most (the most Kubernetes
# allows): the kubelet's and containerd's are read printable and so cut (core/text.py).
NAME_CHARS = 253
DESCRIBED = 10  # pods named at most in a log line about one GPU; the rest are counted


@dataclass(frozen=True)
class Pod:
    """One pod, as the kubelet lists it: the containers the GPU is assigned to."""

    namespace: str
    name: str
    containers: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """`namespace/name`: what the audit record and /status call it."""
        return f"{self.namespace}/{self.name}"

    def fields(self) -> tuple[tuple[str, str], ...]:
        """The pod as an identity's `pod` shows it."""
        return (("namespace", self.namespace), ("name", self.name))


def pod_id(owner: Identity | None) -> str | None:
    """`namespace/name` of the pod `owner`'s process is in, or None (in none)."""
    found = dict(owner.pod) if owner is not None and owner.pod else {}
    if "namespace" not in found or "name" not in found:
        return None
    return f"{found['namespace']}/{found['name']}"


@dataclass(frozen=True)
class PodAllocation:
    """The pods one GPU is assigned to, in the kubelet's order (one, or several with
    time-slicing replicas or MIG devices of one GPU)."""

    pods: tuple[Pod, ...]

    how: ClassVar[str] = "kubernetes"
    key: ClassVar[str] = "pods"
    member_key: ClassVar[str] = "pod"
    why: ClassVar[str] = "outside_pod"
    word: ClassVar[str] = "pod"
    scheduler: ClassVar[str] = "Kubernetes"
    release_hint: ClassVar[str] = "it is released when the pod ends (kubectl delete pod)"

    def ids(self) -> tuple[str, ...]:
        return tuple(pod.id for pod in self.pods)

    def own(self, owner: Identity | None) -> str | None:
        return pod_id(owner)

    def member_of(self, owner: Identity | None) -> Pod | None:
        """The pod of ours that `owner`'s process is in, or None."""
        name = pod_id(owner)
        return next((pod for pod in self.pods if pod.id == name), None) if name else None

    def holder(self, seen: Identity | None = None) -> Identity:
        """Who holds the GPU: `seen`, a process of one of the pods (its user came from the
        pod's labels), or else the first pod's namespace."""
        if seen is not None and self.member_of(seen) is not None:
            return seen
        pod = self.pods[0]
        return Identity(user=f"namespace:{pod.namespace}", source="pod", pod=pod.fields())

    def named(self) -> bool:
        """Never: the kubelet names no user; the pod's processes do."""
        return False

    def describe(self) -> str:
        """The pods in words, for a log line or a message: `pod ml/train-0`, `pods ml/a, ml/b`,
        `pods ml/a, ..., and 990 more`."""
        ids = self.ids()
        shown = ", ".join(ids[:DESCRIBED])
        if len(ids) > DESCRIBED:
            shown += f", and {len(ids) - DESCRIBED} more"
        return ("pod " if len(ids) == 1 else "pods ") + shown
