"""containerd's containers, through its gRPC API on its unix socket: cached, shared, and off
the event loop; and, for a container of a Kubernetes pod (containerd's CRI), its pod's sandbox.

A container is looked for in each of the configured namespaces in turn (`k8s.io`, the CRI's,
then `default`; never `moby`, whose containers are Docker's and asked of the Docker Engine):
`Containers/Get` with the namespace in the `containerd-namespace` metadata. For a pod's
container, the pod's sandbox (its pause container, whose labels are the pod's labels) is the
container of that namespace labelled `io.cri-containerd.kind=sandbox` with the same pod uid:
`Containers/List` with a filter. The OCI spec that comes with each container gives its
annotations. Messages are encoded and read by field number (observe/protowire.py), as
containerd's api/services/containers/v1/containers.proto gives them:

  GetContainerRequest {id = 1}             GetContainerResponse {container = 1}
  ListContainersRequest {filters = 1 (repeated)}   ListContainersResponse {containers = 1}
  Container {id = 1, labels = 2 (map), image = 3, spec = 5 (google.protobuf.Any: type_url = 1,
             value = 2, the OCI runtime spec as JSON), ...}

As with the Docker Engine (containers.py, through lookups.py): one call per container (concurrent
lookups share
it), cached for `container_ttl` seconds; when containerd cannot be reached, or answers what is
not a container (or more than Config.grpc_max_message bytes), lookups fail fast with
ContainerdUnavailable for `containerd_retry_after` seconds, then it is asked again. The calls
block, and they and the decoding of their answers run in this directory's own threads; a
shutdown ends a call in flight at once.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from patroller.config import Config
from patroller.identify.lookups import SharedLookups
from patroller.observe import protowire
from patroller.observe.grpcunix import GrpcUnavailable, UnixCaller
from patroller.observe.protowire import WireError

log = logging.getLogger(__name__)

GET = "/containerd.services.containers.v1.Containers/Get"
LIST = "/containerd.services.containers.v1.Containers/List"
NAMESPACE_HEADER = "containerd-namespace"
KIND = "io.cri-containerd.kind"  # "sandbox" (a pod's pause container) or "container"
POD_UID = "io.kubernetes.pod.uid"
# A pod uid that may go into a filter: a UUID, or a static pod's hash (never quotes or commas).
_SAFE_UID = re.compile(r"^[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}$|^[0-9a-f]{32}$")


class ContainerdUnavailable(Exception):
    """containerd cannot be reached, or answered with an error or garbage, just now."""


@dataclass(frozen=True)
class CtrContainer:
    """What is read of one containerd container."""

    id: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)  # its OCI spec's
    image: str = ""

    @property
    def short(self) -> str:
        return self.id[:12]


@dataclass(frozen=True)
class Found:
    """A container as containerd knows it: its namespace, and its pod's sandbox if it has one."""

    namespace: str
    container: CtrContainer
    sandbox: CtrContainer | None = None


# -- the messages ------------------------------------------------------------------------------


def get_request(container_id: str) -> bytes:
    """GetContainerRequest."""
    return protowire.string(1, container_id)


def list_request(filters: list[str]) -> bytes:
    """ListContainersRequest: those matching any of the filters."""
    return protowire.strings(1, filters)


def sandbox_filter(pod_uid: str) -> str:
    """The filter for the sandbox of the pod with this uid (which must be a safe one)."""
    if not _SAFE_UID.match(pod_uid):
        raise ValueError(f"not a pod uid: {pod_uid!r}")
    return f'labels."{KIND}"==sandbox,labels."{POD_UID}"=="{pod_uid}"'


def read_container(message: protowire.Message) -> CtrContainer:
    """A Container message. Raises WireError if it is not one."""
    cid = message.text(1)
    if not cid:
        raise WireError("a container without an id")
    spec = message.message(5)
    return CtrContainer(cid, message.string_map(2), _annotations(spec.raw(2)), message.text(3))


def read_get(data: bytes) -> CtrContainer:
    """GetContainerResponse. Raises WireError if it holds no container."""
    response = protowire.Message(data)
    if not response.has(1):
        raise WireError("an answer without a container")
    return read_container(response.message(1))


def read_list(data: bytes) -> list[CtrContainer]:
    """ListContainersResponse. Raises WireError if it is not one."""
    return [read_container(entry) for entry in protowire.Message(data).messages(1)]


def _annotations(spec: bytes) -> dict[str, str]:
    """The `annotations` of an OCI spec in JSON; none when it is not one (the spec is not
    needed for anything else, so a bad one costs only its annotations)."""
    if not spec:
        return {}
    try:
        found = json.loads(spec).get("annotations")
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        return {}  # RecursionError: nested deeper than the interpreter's stack allows
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


# -- the directory -----------------------------------------------------------------------------


class _NotFound(Exception):
    """Not in this namespace."""


class ContainerdDirectory:
    """containerd's containers by id, with their pods' sandboxes, cached."""

    def __init__(self, config: Config, address: str) -> None:
        self.path = address[len("unix://") :] if address.startswith("unix://") else address
        self.namespaces = config.containerd_namespaces
        self.timeout = config.containerd_timeout
        self.retry_after = config.containerd_retry_after
        self.calls = 0  # gRPC calls made: the tests and the benchmark watch it
        self._caller = UnixCaller(self.path, self.timeout, config.grpc_max_message)
        self._lock = threading.Lock()
        # Its own threads: a hung containerd must not hold up the /proc reads.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="containerd")
        self._lookups: SharedLookups[Found] = SharedLookups(
            self._pool,
            self._fetch,
            config.container_cache,
            config.container_ttl,
            ContainerdUnavailable,
        )

    async def get(self, container_id: str) -> Found | None:
        """The container, or None if no namespace has it. Raises ContainerdUnavailable."""
        return await self._lookups.get(container_id)

    def shutdown(self) -> None:
        """Stop for good: drop the lookups that wait for a thread, then close the channel
        (which ends the calls in flight at once), and let the threads go."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._caller.close()

    # -- in the executor ----------------------------------------------------------------------

    def _fetch(self, container_id: str) -> Found | None:
        try:
            found = self._find(container_id)
        except WireError as exc:
            self._went_down(
                f"containerd at {self.path} answered something that is not a container ({exc})"
            )
            raise ContainerdUnavailable(self._lookups.reason) from None
        if self._lookups.came_up():
            log.info("containerd at %s is reachable again", self.path)
        return found

    def _find(self, container_id: str) -> Found | None:
        for namespace in self.namespaces:
            try:
                container = read_get(self._call(GET, get_request(container_id), namespace))
            except _NotFound:
                continue
            if container.labels.get(KIND) == "sandbox":
                return Found(namespace, container, container)  # a pod's own pause process
            uid = container.labels.get(POD_UID, "")
            sandbox = None
            if _SAFE_UID.match(uid):
                try:
                    listed = read_list(
                        self._call(LIST, list_request([sandbox_filter(uid)]), namespace)
                    )
                except _NotFound:
                    listed = []
                sandbox = next(
                    (
                        c
                        for c in listed
                        if c.labels.get(KIND) == "sandbox" and c.labels.get(POD_UID) == uid
                    ),
                    None,
                )
            return Found(namespace, container, sandbox)
        return None

    def _call(self, method: str, request: bytes, namespace: str) -> bytes:
        with self._lock:
            self.calls += 1
        try:
            return self._caller.call(method, request, ((NAMESPACE_HEADER, namespace),))
        except GrpcUnavailable as exc:
            if exc.code == "NOT_FOUND":
                raise _NotFound() from None
            if self._caller.closed:  # shut down: nothing went down
                raise ContainerdUnavailable(str(exc)) from None
            self._went_down(f"containerd at {self.path}: {exc}")
            raise ContainerdUnavailable(self._lookups.reason) from None

    def _went_down(self, reason: str) -> None:
        if self._lookups.went_down(reason, self.retry_after):
            log.warning(
                "cannot read containerd's containers: %s; their identities degrade to "
                "the container id until it is back",
                reason,
            )
