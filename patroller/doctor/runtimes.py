"""The container engines and the kubelet, knocked on as the resolver and the pod watch would
reach them: the Docker Engine, each user's rootless Docker, Podman (rootful and each user's),
containerd, and the kubelet's pod-resources socket. For each: not there, there but not
answering (stopped, or not ours to connect to), or answering, with its version.

`probe_*` functions connect (blocking: the doctor runs them in the executor); `check_*`
functions are pure, over what they found."""

from __future__ import annotations

import errno
import functools
import glob
import http.client
import json
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from patroller.config import Config
from patroller.doctor.deadline import bounded, deadline, left
from patroller.doctor.results import Result, degraded, ok
from patroller.durations import describe
from patroller.observe.grpcunix import INSTALL, GrpcUnavailable, UnixCaller
from patroller.observe.podresources import ask, parse_list
from patroller.observe.protowire import Message, WireError

DOCKER_DEFAULT = "unix:///var/run/docker.sock"  # the Docker SDK's, when no --docker-host
VERSION = "/containerd.services.version.v1.Version/Version"
MAX_ANSWER = 1 << 20  # bytes of an engine's /version read at most
SHOWN = 3


@dataclass(frozen=True)
class Knock:
    """What one engine's (or the kubelet's) socket said."""

    address: str
    state: str  # absent, refused, denied, silent (no whole answer in time), answered, bad
    # (answered but not as it should), ungrpc (grpcio is not installed), overdue (still asked
    # when the doctor's bound came), unasked (the bound came before it was asked)
    why: str = ""
    version: str = ""  # "Docker 27.1.1 (API 1.46)", "containerd 1.6.20", "3 pod(s) with GPUs"


def _path(address: str) -> str | None:
    return (
        address[len("unix://") :]
        if address.startswith("unix://")
        else address
        if address.startswith("/")
        else None
    )


def _connect(path: str, timeout: float, address: str | None = None) -> Knock | None:
    """None if a unix socket accepts at `path`; else a Knock saying why not (of `address`,
    as the flag gave it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            state = {
                errno.ENOENT: "absent",
                errno.ENOTDIR: "absent",
                errno.ECONNREFUSED: "refused",
                errno.EACCES: "denied",
                errno.EPERM: "denied",
            }.get(exc.errno or 0, "silent")
            return Knock(address or f"unix://{path}", state, exc.strerror or str(exc))
    return None


class _BoundedHTTP(http.client.HTTPConnection):
    """HTTP to an engine (over a unix socket when `path` is given: the Docker Engine's API,
    which Podman serves too) whose whole exchange ends `timeout` seconds after it was made: a
    timeout on each read would let an engine that answers a byte at a time hold it for ever."""

    def __init__(self, host: str, port: int | None, path: str | None, timeout: float) -> None:
        self.until = deadline(timeout)
        super().__init__(host, port, timeout=timeout)
        self.socket_path = path
        self.seconds = timeout

    def connect(self) -> None:
        self.timeout = left(self.until)
        if self.socket_path is None:
            super().connect()
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect(self.socket_path)
        self.sock = bounded(self.sock, self.until, self.seconds)


def probe_docker_api(address: str, timeout: float) -> Knock:
    """GET /version of a Docker-API engine (the Docker Engine, Podman), all of it within
    `timeout` seconds."""
    path = _path(address)
    if path is None:
        found = re.match(r"(?:tcp|http)://([^/:]+):?(\d+)?", address)
        if found is None:
            return Knock(address, "bad", "only unix://, tcp:// and http:// engines are asked")
        connection = _BoundedHTTP(found.group(1), int(found.group(2) or 2375), None, timeout)
    else:
        refused = _connect(path, timeout, address)
        if refused is not None:
            return refused
        connection = _BoundedHTTP("localhost", None, path, timeout)
    try:
        connection.request("GET", "/version", headers={"Host": "docker"})
        response = connection.getresponse()
        body = response.read(MAX_ANSWER)
    except (OSError, http.client.HTTPException) as exc:
        return Knock(address, "silent", str(exc) or type(exc).__name__)
    finally:
        connection.close()
    if response.status != 200:
        return Knock(address, "bad", f"/version answered {response.status}")
    try:
        answer = json.loads(body)
        names = [c.get("Name", "") for c in answer.get("Components") or []]
        product = "Podman" if any("Podman" in n for n in names) else "Docker"
        return Knock(
            address,
            "answered",
            version=f"{product} {answer['Version']} (API {answer.get('ApiVersion', '?')})",
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return Knock(address, "bad", "/version is not a Docker Engine's answer")


def probe_containerd(address: str, timeout: float) -> Knock:
    """containerd's Version over gRPC."""
    path = _path(address) or address
    refused = _connect(path, timeout, address)
    if refused is not None:
        return refused
    caller = UnixCaller(path, timeout)
    try:
        message = Message(caller.call(VERSION, b""))
        return Knock(address, "answered", version=f"containerd {message.text(1) or '?'}")
    except GrpcUnavailable as exc:
        return Knock(address, "ungrpc" if "not installed" in str(exc) else "bad", str(exc))
    except WireError as exc:
        return Knock(address, "bad", f"its Version is not containerd's: {exc}")
    finally:
        caller.close()


def probe_kubelet(path: str, config: Config) -> Knock:
    """The kubelet's pod-resources List, as the pod watch calls it."""
    refused = _connect(path, config.doctor_timeout, path)
    if refused is not None:
        return refused
    caller = UnixCaller(path, config.kubelet_timeout)
    try:
        data = ask(caller)
        if data is None:
            return Knock(path, "absent")
        pods = parse_list(data, config.kubelet_resources)
        return Knock(path, "answered", version=f"{len(pods)} pod(s) with GPUs")
    except GrpcUnavailable as exc:
        return Knock(path, "ungrpc" if "not installed" in str(exc) else "bad", str(exc))
    except WireError as exc:
        return Knock(path, "bad", f"its List is not the kubelet's: {exc}")
    finally:
        caller.close()


def users_sockets(template: str) -> list[tuple[int, str]]:
    """(uid, address) of every user's socket the template finds there now."""
    path = _path(template)
    if path is None:
        return []
    pattern = re.compile(re.escape(path).replace(re.escape("{uid}"), r"([0-9]+)") + "$")
    found = []
    for match in sorted(glob.glob(path.replace("{uid}", "[0-9]*"))):
        named = pattern.match(match)
        if named is not None:
            found.append((int(named.group(1)), f"unix://{match}"))
    return found


@dataclass(frozen=True)
class EngineFacts:
    docker: Knock
    podman: Knock | None  # None: not asked
    rootless_docker: list[tuple[int, Knock]] | None  # None: not asked
    rootless_podman: list[tuple[int, Knock]] | None
    containerd: Knock | None
    kubelet: Knock | None
    unlisted: tuple[str, ...] = ()  # "docker", "podman": users' sockets still being listed


class EngineProbes:
    """The engines knocked on side by side, one blocking probe each (one slow engine holds up
    no other), and what they found by any moment: when the doctor's bound comes, one still
    waiting is said `overdue`, with the socket it waited for, and one not yet asked `unasked`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._asked: dict[str, str] = {}  # engine -> its address, for those asked at all
        self._knocks: dict[str, Knock] = {}  # engine -> what it said, once it said it
        self._templates: dict[str, str] = {}  # "docker"/"podman" -> the users' socket template
        self._users: dict[str, list[tuple[int, str, Knock | None]]] = {}  # once listed
        self._asking: dict[str, str] = {}  # "docker"/"podman" -> the user's socket asked now

    def probes(self) -> list[Callable[[], None]]:
        """The blocking calls to make, each in a thread of its own."""
        config, timeout = self.config, self.config.docker_timeout
        made: list[Callable[[], None]] = []

        def one(engine: str, address: str | None, knock: Callable[[str], Knock]) -> None:
            if address:
                self._asked[engine] = address
                made.append(lambda: self._knocks.__setitem__(engine, knock(address)))

        one("docker", config.docker_host or DOCKER_DEFAULT, lambda a: probe_docker_api(a, timeout))
        one("podman", config.podman_socket, lambda a: probe_docker_api(a, timeout))
        one(
            "containerd",
            config.containerd_socket,
            lambda a: probe_containerd(a, config.containerd_timeout),
        )
        one("kubelet", config.kubelet_socket, lambda a: probe_kubelet(a, config))
        for runtime, template in (
            ("docker", config.rootless_docker_socket),
            ("podman", config.rootless_podman_socket),
        ):
            if template is not None:
                self._templates[runtime] = template
                made.append(functools.partial(self._each_user, runtime))
        return made

    def _each_user(self, runtime: str) -> None:
        listed: list[tuple[int, str, Knock | None]] = [
            (uid, address, None) for uid, address in users_sockets(self._templates[runtime])
        ]
        self._users[runtime] = listed
        for index, (uid, address, _) in enumerate(listed):
            self._asking[runtime] = address
            listed[index] = (uid, address, probe_docker_api(address, self.config.docker_timeout))

    def facts(self) -> EngineFacts:
        """What was found so far; what is still out, as overdue or unasked."""
        bound = describe(self.config.doctor_deadline)
        waited = f"waited {bound} for its answer"

        def engine(name: str) -> Knock | None:
            if name not in self._asked:
                return None
            return self._knocks.get(name) or Knock(self._asked[name], "overdue", waited)

        def users(runtime: str) -> list[tuple[int, Knock]] | None:
            if runtime not in self._templates:
                return None
            asking = self._asking.get(runtime)
            return [
                (
                    uid,
                    knock
                    or (
                        Knock(address, "overdue", waited)
                        if address == asking
                        else Knock(
                            address,
                            "unasked",
                            f"the doctor's {bound} went on those asked before it",
                        )
                    ),
                )
                for uid, address, knock in list(self._users.get(runtime, []))
            ]

        docker = engine("docker")  # always asked: --docker-host, or the SDK's default
        return EngineFacts(
            docker or Knock(DOCKER_DEFAULT, "unasked"),
            engine("podman"),
            users("docker"),
            users("podman"),
            engine("containerd"),
            engine("kubelet"),
            tuple(r for r in self._templates if r not in self._users),
        )


# What each state means, and what to do: (status, words, fix).
MEANING = {
    "refused": (
        "degraded",
        "its socket is there but nobody answers: stopped",
        "start it (systemctl start {unit}); meanwhile its containers' processes are "
        "shown by their host account and container id",
    ),
    "denied": (
        "degraded",
        "not ours to connect to",
        "run Patroller as root (or in the socket's group)",
    ),
    "silent": ("degraded", "no answer in time", "check the engine: it may be hung"),
    "overdue": (
        "degraded",
        "no answer within the doctor's bound",
        "check the engine: it may be hung, or answer a little at a time",
    ),
    "unasked": ("degraded", "not asked", "check the engines asked before it: they were slow"),
    "bad": ("degraded", "answered, but not as expected", "check what serves on that socket"),
    "ungrpc": ("degraded", "cannot be asked: grpcio is not installed", INSTALL),
}


def check_engine(name: str, knock: Knock | None, unit: str, flag: str) -> Result:
    if knock is None:
        return ok(name, f"not asked ({flag} none)")
    if knock.state == "absent":
        return ok(name, f"not there ({knock.address}): none runs here")
    if knock.state == "answered":
        return ok(name, f"{knock.address}: {knock.version}")
    status, words, fix = MEANING[knock.state]
    return degraded(name, f"{knock.address}: {words} ({knock.why})", fix.format(unit=unit))


def check_users_engines(
    name: str,
    found: list[tuple[int, Knock]] | None,
    template: str,
    flag: str,
    unit: str,
    unlisted: bool = False,
) -> Result:
    if found is None:
        return ok(name, f"not asked ({flag} none)")
    if unlisted:
        return degraded(
            name,
            f"its users' sockets ({_path(template) or template}) were still "
            "being listed when the doctor's bound came",
            "check the file system they are on: it may be hung",
        )
    if not found:
        return ok(name, f"none running (none at {_path(template) or template})")
    answered = [f"uid {uid}: {k.version}" for uid, k in found if k.state == "answered"]
    wrong = [(uid, k) for uid, k in found if k.state not in ("answered", "absent")]
    said = f"{len(found)} found" + (f"; {'; '.join(answered[:SHOWN])}" if answered else "")
    if not wrong:
        return ok(name, said)
    uid, knock = wrong[0]
    status, words, fix = MEANING[knock.state]
    return degraded(
        name,
        f"{said}; {len(wrong)} not answering, uid {uid}'s at "
        f"{knock.address}: {words} ({knock.why})",
        fix.format(unit=unit),
    )


def engine_results(facts: EngineFacts, config: Config) -> Sequence[Result]:
    kubelet = facts.kubelet
    if kubelet is not None and kubelet.state == "absent":
        kubelet_result = ok(
            "kubelet pod-resources",
            f"not there ({kubelet.address}): no kubelet here; asked whenever it appears",
        )
    else:
        kubelet_result = check_engine(
            "kubelet pod-resources", kubelet, "kubelet", "--kubelet-socket"
        )
    return [
        check_engine("Docker Engine", facts.docker, "docker", "--docker-host"),
        check_users_engines(
            "rootless Docker",
            facts.rootless_docker,
            config.rootless_docker_socket or "",
            "--rootless-docker-socket",
            "--user docker",
            "docker" in facts.unlisted,
        ),
        check_engine("Podman", facts.podman, "podman.socket", "--podman-socket"),
        check_users_engines(
            "rootless Podman",
            facts.rootless_podman,
            config.rootless_podman_socket or "",
            "--rootless-podman-socket",
            "--user podman.socket",
            "podman" in facts.unlisted,
        ),
        check_engine("containerd", facts.containerd, "containerd", "--containerd-socket"),
        kubelet_result,
    ]
