"""The doctor's words for each container engine, pure over what a knock found: every state's
meaning and fix, the users' engines counted and the first three that answered named, and what
the engine probes say of the ones still out (the Docker Engine not yet asked; a user's engine
waited for and the ones after it) while a real probe waits on a socket that never answers.
tests/test_doctor_checks.py and tests/test_doctor_engines.py have the rest."""

import os
import socket
import threading

from helpers import engines_in

from patroller.config import Config
from patroller.doctor.results import Result
from patroller.doctor.runtimes import (
    DOCKER_DEFAULT,
    EngineFacts,
    EngineProbes,
    Knock,
    check_engine,
    check_users_engines,
    probe_docker_api,
)
from patroller.durations import describe
from patroller.observe.grpcunix import INSTALL

AT = "unix:///run/e.sock"


def test_each_state_of_an_engine_is_said_with_what_to_do():
    for state, words, fix in (
        ("denied", "not ours to connect to", "run Patroller as root (or in the socket's group)"),
        ("silent", "no answer in time", "check the engine: it may be hung"),
        ("unasked", "not asked", "check the engines asked before it: they were slow"),
        ("bad", "answered, but not as expected", "check what serves on that socket"),
        ("ungrpc", "cannot be asked: grpcio is not installed", INSTALL),
    ):
        assert check_engine("E", Knock(AT, state, "why"), "e.service", "--e") == Result(
            "E", "degraded", f"{AT}: {words} (why)", fix
        )
    assert check_engine("E", Knock(AT, "absent"), "e.service", "--e") == Result(
        "E", "ok", f"not there ({AT}): none runs here"
    )
    assert check_engine("E", None, "e.service", "--e") == Result("E", "ok", "not asked (--e none)")
    assert check_engine("E", Knock(AT, "answered", version="Docker 27"), "e", "--e") == Result(
        "E", "ok", f"{AT}: Docker 27"
    )
    assert check_engine("E", Knock(AT, "refused", "Connection refused"), "e.service", "--e") == (
        Result(
            "E",
            "degraded",
            f"{AT}: its socket is there but nobody answers: stopped (Connection refused)",
            "start it (systemctl start e.service); meanwhile its containers' processes are "
            "shown by their host account and container id",
        )
    )


def test_the_users_engines_are_counted_and_the_first_three_answering_named():
    template = "unix:///run/user/{uid}/docker.sock"
    knocks = [
        (1000 + n, Knock(f"unix:///u{n}", "answered", version=f"Docker {n}")) for n in range(4)
    ]
    knocks.append((1009, Knock("unix:///u9", "absent")))  # gone since it was listed
    said = "5 found; uid 1000: Docker 0; uid 1001: Docker 1; uid 1002: Docker 2"
    assert check_users_engines("R", knocks, template, "--r", "u") == Result("R", "ok", said)
    wrong = [(1010, Knock("unix:///u10", "denied", "Permission denied"))]
    wrong.append((1011, Knock("unix:///u11", "silent", "timed out")))
    assert check_users_engines("R", knocks + wrong, template, "--r", "u") == Result(
        "R",
        "degraded",
        "7 found; uid 1000: Docker 0; uid 1001: Docker 1; uid 1002: Docker 2; 2 not answering, "
        "uid 1010's at unix:///u10: not ours to connect to (Permission denied)",
        "run Patroller as root (or in the socket's group)",
    )
    assert check_users_engines("R", None, template, "--r", "u") == Result(
        "R", "ok", "not asked (--r none)"
    )
    assert check_users_engines("R", [], template, "--r", "u") == Result(
        "R", "ok", "none running (none at /run/user/{uid}/docker.sock)"
    )
    assert check_users_engines("R", wrong[1:], template, "--r", "u") == Result(
        "R",
        "degraded",
        "1 found; 1 not answering, uid 1011's at unix:///u11: no answer in time (timed out)",
        "check the engine: it may be hung",
    )
    assert check_users_engines("R", [], "tcp://x/{uid}", "--r", "u", unlisted=True) == Result(
        "R",
        "degraded",
        "its users' sockets (tcp://x/{uid}) were still being listed when the doctor's bound came",
        "check the file system they are on: it may be hung",
    )


def test_an_engine_is_named_as_its_flag_gives_it(tmp_path):
    for address in (str(tmp_path / "docker.sock"), f"unix://{tmp_path}/docker.sock"):
        assert probe_docker_api(address, 1.0) == Knock(address, "absent", os.strerror(2))


def test_every_engine_asked_is_said_by_its_own_knock(tmp_path):
    """Every probe run to its end (no engine here: each socket is absent), then the facts: each
    engine's own knock, in its own place, and the users' engines listed (none)."""
    kubelet = str(tmp_path / "kubelet.sock")
    config = Config(**engines_in(str(tmp_path)), kubelet_socket=kubelet)
    probes = EngineProbes(config)
    for probe in probes.probes():
        probe()
    gone = os.strerror(2)
    assert probes.facts() == EngineFacts(
        docker=Knock(f"unix://{tmp_path}/docker.sock", "absent", gone),
        podman=Knock(f"unix://{tmp_path}/podman.sock", "absent", gone),
        rootless_docker=[],
        rootless_podman=[],
        containerd=Knock(f"unix://{tmp_path}/containerd.sock", "absent", gone),
        kubelet=Knock(kubelet, "absent", gone),
    )


def test_a_stopped_users_engine_names_the_unit_to_start():
    stopped = [(1001, Knock("unix:///u", "refused", "Connection refused"))]
    assert check_users_engines("R", stopped, "unix:///{uid}", "--r", "--user e.socket").fix == (
        "start it (systemctl start --user e.socket); meanwhile its containers' processes are "
        "shown by their host account and container id"
    )


def test_engines_not_yet_asked_when_the_bound_comes():
    probes = EngineProbes(Config(podman_socket="unix:///run/podman.sock"))
    assert probes.facts() == EngineFacts(
        Knock(DOCKER_DEFAULT, "unasked"), None, None, None, None, None
    )


def test_a_users_engine_waited_for_is_overdue_and_those_after_it_unasked(tmp_path):
    """A real probe of the users' sockets, the first of which accepts and never answers: while
    it waits, the facts say which one it waits for and that the next was not asked."""
    for uid in ("1000", "1001"):
        (tmp_path / uid).mkdir()
    first = socket.socket(socket.AF_UNIX)
    first.bind(str(tmp_path / "1000" / "docker.sock"))
    first.listen(4)
    second = socket.socket(socket.AF_UNIX)
    second.bind(str(tmp_path / "1001" / "docker.sock"))
    config = Config(**engines_in(str(tmp_path)), docker_timeout=1.0, doctor_deadline=12.0)
    probes = EngineProbes(config)
    each_user = probes.probes()[-2]  # the Docker users', then Podman's
    asking = threading.Thread(target=each_user)
    asking.start()
    held = []
    try:
        first.settimeout(10)
        held.append(first.accept()[0])  # the probe's knock on it: it is being asked
        found = probes.facts()
    finally:
        asking.join(10)
        for sock in (*held, first, second):
            sock.close()
    assert not asking.is_alive()
    waited = f"waited {describe(12.0)} for its answer"
    assert found.rootless_docker == [
        (1000, Knock(f"unix://{tmp_path}/1000/docker.sock", "overdue", waited)),
        (
            1001,
            Knock(
                f"unix://{tmp_path}/1001/docker.sock",
                "unasked",
                "the doctor's 12s went on those asked before it",
            ),
        ),
    ]
    assert found.unlisted == ("podman",)  # not listed yet: its probe was not run
    assert os.path.exists(tmp_path / "1001" / "docker.sock")
