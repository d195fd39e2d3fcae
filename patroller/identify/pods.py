"""Who a containerd container is for: a Kubernetes pod's user, or a plain container's (pure).

A container labelled `io.kubernetes.pod.namespace` and `io.kubernetes.pod.name` (as the kubelet
labels every container of a pod, with `io.kubernetes.pod.uid` and
`io.kubernetes.container.name`) is a pod's: its identity is the pod's (`source` "pod"). Its
user is the first key, of the pod user keys (`--pod-user-key`) and then `--user-labels`, that
holds one, looked for in this order for each key: the container's labels, the pod's (its
sandbox's labels), the pod's annotations (its sandbox's OCI spec's) and the container's
annotations. An e-mail address gives that address (lower case); a pod user key may also hold a
name, as a Kubernetes label value may be one. With none, the user is `namespace:<namespace>`:
the pod is its namespace's, and never a default account's.

Labels are text their writer chose: a pod's namespace and name are taken printable (as the
kubelet's pod-resources are read, observe/podresources.py: the two agree), and what goes into
the log escaped.

The pod uid in the process's cgroup is the kernel's word; the labels are whoever created the
container's. When both name a pod and they differ, the labels are not taken: the container is
named by its id alone (`mismatch` says why, for the log).

A container with no such labels is a plain containerd container (`ctr`, nerdctl): the Docker
label rules, named by nerdctl's `nerdctl/name` where it has one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from patroller.core.identity import Identity
from patroller.core.pods import NAME_CHARS
from patroller.core.text import printable
from patroller.identify.cgroups import ContainerRef
from patroller.identify.containerd import POD_UID, CtrContainer, Found
from patroller.identify.containers import (
    ContainerInfo,
    container_identity,
    email_in,
    unlabelled_identity,
)

POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_NAME = "io.kubernetes.pod.name"
CONTAINER_NAME = "io.kubernetes.container.name"
NERDCTL_NAME = "nerdctl/name"
# A Kubernetes label value that is a name: 63 characters at most, alphanumeric at both ends.
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


def is_pods(container: CtrContainer) -> bool:
    """Whether the labels say that a pod's container it is."""
    return bool(container.labels.get(POD_NAMESPACE)) and bool(container.labels.get(POD_NAME))


def mismatch(found: Found, ref: ContainerRef) -> str | None:
    """Why the container's labels cannot be taken: they name a pod other than its cgroup's."""
    labelled = found.container.labels.get(POD_UID)
    if is_pods(found.container) and ref.pod is not None and labelled and labelled != ref.pod:
        return (
            f"container {printable(found.container.short)} is labelled as pod "
            f"{printable(labelled)}, but its cgroup is pod {ref.pod}'s: its labels are not "
            "taken"
        )
    return None


def containerd_identity(
    found: Found,
    ref: ContainerRef,
    pod_keys: Sequence[str],
    user_labels: Sequence[str],
    info_labels: Sequence[str],
) -> Identity:
    """The identity of a containerd container's process (before its host account is added)."""
    if mismatch(found, ref) is not None:
        return unlabelled_identity(found.container.id)
    if is_pods(found.container):
        return pod_identity(found, ref.pod, pod_keys, user_labels, info_labels)
    labels = found.container.labels
    name = labels.get(NERDCTL_NAME) or None
    identity = container_identity(
        ContainerInfo(found.container.id, name or "", labels), user_labels, info_labels
    )
    return replace(identity, container=(found.container.short, name))


def pod_identity(
    found: Found,
    cgroup_uid: str | None,
    pod_keys: Sequence[str],
    user_labels: Sequence[str],
    info_labels: Sequence[str],
) -> Identity:
    """A pod's container: its pod, its name, and its user as the module says."""
    container, labels = found.container, found.container.labels
    namespace, name = (printable(labels[k], NAME_CHARS) for k in (POD_NAMESPACE, POD_NAME))
    uid = cgroup_uid or labels.get(POD_UID) or None
    sandbox = found.sandbox
    if sandbox is not None and (
        sandbox.labels.get(POD_NAMESPACE) != labels[POD_NAMESPACE]
        or sandbox.labels.get(POD_NAME) != labels[POD_NAME]
        or (uid and sandbox.labels.get(POD_UID) != uid)
    ):
        sandbox = None  # another pod's: nothing of it is taken
    sources: list[Mapping[str, str]] = [labels]
    if sandbox is not None:
        sources += [sandbox.labels, sandbox.annotations]
    sources.append(container.annotations)
    user, email = _user(sources, pod_keys, user_labels)
    container_name = labels.get(CONTAINER_NAME) or None
    pod: list[tuple[str, str]] = [("namespace", namespace), ("name", name)]
    if uid:
        pod.append(("uid", uid))
    if container_name:
        pod.append(("container", container_name))
    pod_labels = sandbox.labels if sandbox is not None else {}
    info = tuple(
        (key, labels[key] if key in labels else pod_labels[key])
        for key in info_labels
        if key in labels or key in pod_labels
    )
    return Identity(
        user=user or f"namespace:{namespace}",
        source="pod",
        email=email,
        container=(container.short, container_name),
        info=info,
        pod=tuple(pod),
    )


def _user(
    sources: Sequence[Mapping[str, str]], pod_keys: Sequence[str], user_labels: Sequence[str]
) -> tuple[str | None, str | None]:
    """(user, e-mail) from the first key that holds one, each key looked for in every source."""
    for key in (*pod_keys, *[k for k in user_labels if k not in pod_keys]):
        for source in sources:
            value = source.get(key, "")
            email = email_in(value) if value else None
            if email:
                return email.lower(), email.lower()
            if key in pod_keys and _NAME.match(value.strip()):
                return value.strip(), None
    return None, None
