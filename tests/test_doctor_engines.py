"""The doctor's knocks on the container engines and the kubelet, in the test process, over real
servers: the Docker API as captured engines answered it (on a unix socket and on loopback TCP;
one that drops the request, one that answers a byte at a time, one whose backlog is full), the
kubelet's pod-resources service over gRPC (answering, and restarting); and the engines still
out at the doctor's bound. What each says, word for word (tests/test_doctor_checks.py has the
others)."""

import errno
import os
import socket

from fake_engine import FakeEngine, recorded
from helpers import engines_in
from kubelet import Kubelet, gpu_pod

from patroller.config import Config
from patroller.doctor.results import Result
from patroller.doctor.runtimes import (
    EngineFacts,
    EngineProbes,
    Knock,
    check_engine,
    engine_results,
    probe_docker_api,
    probe_kubelet,
)
from patroller.durations import describe


def test_an_engine_on_tcp_is_asked_on_its_port():
    engine = FakeEngine.on_tcp().start()
    try:
        knock = probe_docker_api(engine.url, 5)
    finally:
        engine.stop()
    ours = recorded("docker")["version"]
    assert knock == Knock(
        engine.url, "answered", version=f"Docker {ours['Version']} (API {ours['ApiVersion']})"
    )


def test_an_engine_that_drops_the_request_or_never_ends_its_answer_is_silent(engine_sockets):
    engine = FakeEngine(f"{engine_sockets}/docker.sock").start()
    try:
        engine.dropping = True
        dropped = probe_docker_api(engine.url, 5)
        engine.dropping, engine.dribbling = False, 0.05
        dribbled = probe_docker_api(engine.url, 1)
    finally:
        engine.stop()
    why = "Remote end closed connection without response"
    assert dropped == Knock(engine.url, "silent", why)
    assert check_engine("Docker Engine", dropped, "docker", "--docker-host") == Result(
        "Docker Engine",
        "degraded",
        f"{engine.url}: no answer in time ({why})",
        "check the engine: it may be hung",
    )
    assert (dribbled.address, dribbled.state) == (engine.url, "silent"), dribbled
    assert dribbled.why.startswith("no whole answer within 1s ("), dribbled


def test_an_engine_that_no_longer_accepts_is_silent_at_once(engine_sockets):
    """A hung engine's socket whose backlog is full: connecting would wait for ever."""
    path = f"{engine_sockets}/docker.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(0)
    waiting = socket.socket(socket.AF_UNIX)
    waiting.connect(path)  # the one the backlog holds
    try:
        knock = probe_docker_api(f"unix://{path}", 1)
    finally:
        waiting.close()
        listener.close()
    assert knock == Knock(f"unix://{path}", "silent", os.strerror(errno.EAGAIN))


def test_the_kubelet_is_named_with_its_pods_or_what_is_wrong(engine_sockets):
    path = f"{engine_sockets}/kubelet.sock"
    kubelet = Kubelet(path).start()
    try:
        kubelet.pods = [gpu_pod("default", "train", "GPU-0")]
        answered = probe_kubelet(path, Config())
        kubelet.broken = True
        restarting = probe_kubelet(path, Config())
    finally:
        kubelet.stop()
    assert answered == Knock(path, "answered", version="1 pod(s) with GPUs")
    facts = kubelet_alone(answered)
    assert engine_results(facts, Config())[-1] == Result(
        "kubelet pod-resources", "ok", f"{path}: 1 pod(s) with GPUs"
    )
    assert (restarting.address, restarting.state) == (path, "bad"), restarting
    assert engine_results(kubelet_alone(restarting), Config())[-1] == Result(
        "kubelet pod-resources",
        "degraded",
        f"{path}: answered, but not as expected ({restarting.why})",
        "check what serves on that socket",
    )


def kubelet_alone(knock):
    """The engines' facts of a host with no engine but this kubelet."""
    return EngineFacts(Knock("unix:///run/e/docker.sock", "absent"), None, None, None, None, knock)


def test_the_engines_still_out_at_the_bound_are_said_so():
    """Asked, and no answer yet when the bound came: every engine overdue, the users' sockets
    still being listed."""
    folder = "/run/e"
    config = Config(**engines_in(folder))
    probes = EngineProbes(config)
    assert probes.probes()  # made, not run: still out
    bound = describe(config.doctor_deadline)
    overdue = f"no answer within the doctor's bound (waited {bound} for its answer)"
    hung = "check the engine: it may be hung, or answer a little at a time"
    listing = (
        "its users' sockets ({}) were still being listed when the doctor's bound came",
        "check the file system they are on: it may be hung",
    )
    assert engine_results(probes.facts(), config)[:5] == [
        Result("Docker Engine", "degraded", f"unix://{folder}/docker.sock: {overdue}", hung),
        Result(
            "rootless Docker",
            "degraded",
            listing[0].format(f"{folder}/{{uid}}/docker.sock"),
            listing[1],
        ),
        Result("Podman", "degraded", f"unix://{folder}/podman.sock: {overdue}", hung),
        Result(
            "rootless Podman",
            "degraded",
            listing[0].format(f"{folder}/{{uid}}/podman/podman.sock"),
            listing[1],
        ),
        Result("containerd", "degraded", f"unix://{folder}/containerd.sock: {overdue}", hung),
    ]
