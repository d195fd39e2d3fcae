"""The doctor's probes and checks called in the test process, over real things: engines' sockets
(the Docker API served as captured engines answered it, a gRPC server answering containerd's
Version), a stranger's HTTP server on a loopback port, files, folders and sockets at the
--socket path, a state directory whose files others may read. tests/test_doctor.py runs
`patroller doctor` as a command, as users do; these call the same functions where a mutation
run sees them (docs/development.md, "Mutation testing"), and say what each check words, word
for word, where the words are the check's answer."""

import asyncio
import errno
import fcntl
import os
import socket
import sys
import threading
import time
from dataclasses import replace

import pytest
from fake_containerd import encode
from fake_engine import FakeEngine, recorded
from grpc_server import Server
from helpers import ScenarioFile, engines_in

from patroller.config import Config
from patroller.doctor.deadline import bounded, deadline
from patroller.doctor.examine import Doctor, examine
from patroller.doctor.gpu import probe
from patroller.doctor.gpuchecks import apps as apps_check
from patroller.doctor.gpuchecks import gpu_results
from patroller.doctor.host import (
    ProcFacts,
    UnitFacts,
    check_cgroups,
    check_proc,
    exec_start,
    probe_proc,
    probe_unit,
)
from patroller.doctor.listening import (
    PortFacts,
    _who_answers,
    check_port,
    check_socket,
    probe_port,
    probe_socket,
)
from patroller.doctor.notifications import NotifyFacts, check_notifications
from patroller.doctor.places import (
    READ_ONLY,
    JobMapFacts,
    StateFacts,
    check_book,
    check_job_map,
    check_state,
    probe_job_map,
    probe_state,
)
from patroller.doctor.privacy import PrivacyFacts, check_privacy
from patroller.doctor.results import Result
from patroller.doctor.runtimes import (
    VERSION,
    EngineFacts,
    EngineProbes,
    Knock,
    engine_results,
    probe_containerd,
    probe_docker_api,
    probe_kubelet,
)
from patroller.durations import describe
from patroller.state import schema
from patroller.state.book import MAX_SIZE
from patroller.state.bookfiles import FILE
from patroller.state.directory import LOCK

# -- the engines ----------------------------------------------------------------------------


def test_each_engine_asked_is_named_with_its_version_and_each_not_there_so(engine_sockets):
    """A Docker Engine and a Podman service answer; containerd and the kubelet are not there.
    Each probe runs as the doctor runs it, and each engine's knock is found under its name."""
    docker = FakeEngine(f"{engine_sockets}/docker.sock").start()
    podman = FakeEngine(f"{engine_sockets}/podman.sock", kind="podman").start()
    try:
        config = Config(**engines_in(engine_sockets, kubelet_socket=f"{engine_sockets}/kubelet"))
        probes = EngineProbes(config)
        for run in probes.probes():
            run()
        facts = probes.facts()
    finally:
        docker.stop()
        podman.stop()
    ours = recorded("docker")["version"]
    theirs = recorded("podman")["version"]
    assert facts.docker == Knock(
        f"unix://{engine_sockets}/docker.sock",
        "answered",
        version=f"Docker {ours['Version']} (API {ours['ApiVersion']})",
    )
    assert facts.podman == Knock(
        f"unix://{engine_sockets}/podman.sock",
        "answered",
        version=f"Podman {theirs['Version']} (API {theirs['ApiVersion']})",
    )
    assert facts.containerd is not None and facts.containerd.state == "absent"
    assert facts.containerd.address == f"unix://{engine_sockets}/containerd.sock"
    assert facts.kubelet is not None and facts.kubelet.state == "absent"
    assert facts.kubelet.address == f"{engine_sockets}/kubelet"
    assert facts.rootless_docker == [] and facts.rootless_podman == []
    assert facts.unlisted == ()


def test_an_engine_that_answers_what_is_no_json_is_bad(engine_sockets):
    engine = FakeEngine(f"{engine_sockets}/docker.sock").start()
    engine.answering = (200, "not json")
    try:
        knock = probe_docker_api(engine.url, 5)
    finally:
        engine.stop()
    assert knock == Knock(engine.url, "bad", "/version is not a Docker Engine's answer")


@pytest.fixture
def containerd_version(engine_sockets):
    """A gRPC server answering containerd's Version with what `answer` holds."""
    answer = {"bytes": b""}
    server = Server(
        f"{engine_sockets}/containerd.sock", {VERSION: lambda request: answer["bytes"]}
    ).start()
    yield answer
    server.stop()


def test_containerd_is_named_with_its_version(engine_sockets, containerd_version):
    address = f"unix://{engine_sockets}/containerd.sock"
    containerd_version["bytes"] = encode([(1, b"1.6.20"), (2, b"1e1c6e8")])
    assert probe_containerd(address, 5) == Knock(address, "answered", version="containerd 1.6.20")
    containerd_version["bytes"] = b""  # a Version with no version in it
    assert probe_containerd(address, 5) == Knock(address, "answered", version="containerd ?")
    containerd_version["bytes"] = b"\x0a\x05ab"  # a field longer than the message
    knock = probe_containerd(address, 5)
    assert knock.address == address and knock.state == "bad", knock
    assert knock.why.startswith("its Version is not containerd's: "), knock


def test_without_grpcio_the_kubelet_and_containerd_say_so(tmp_path, monkeypatch):
    """grpcio made unimportable (None in sys.modules: what Python's import says for a package
    not installed); something listens at both sockets."""
    monkeypatch.setitem(sys.modules, "grpc", None)
    listeners = []
    for name in ("kubelet.sock", "containerd.sock"):
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(tmp_path / name))
        listener.listen()
        listeners.append(listener)
    try:
        knocks = [
            probe_kubelet(str(tmp_path / "kubelet.sock"), Config()),
            probe_containerd(f"unix://{tmp_path}/containerd.sock", 5),
        ]
    finally:
        for listener in listeners:
            listener.close()
    for knock in knocks:
        assert knock.state == "ungrpc" and "grpcio is not installed" in knock.why, knock
    # each named as its flag gives it
    assert [knock.address for knock in knocks] == [
        str(tmp_path / "kubelet.sock"),
        f"unix://{tmp_path}/containerd.sock",
    ]


def test_the_users_engines_not_asked_name_their_flags():
    facts = EngineFacts(Knock("unix:///run/e/docker.sock", "absent"), None, None, None, None, None)
    results = {r.check: r for r in engine_results(facts, Config())}
    assert results["rootless Docker"] == Result(
        "rootless Docker", "ok", "not asked (--rootless-docker-socket none)"
    )
    assert results["rootless Podman"] == Result(
        "rootless Podman", "ok", "not asked (--rootless-podman-socket none)"
    )
    assert results["Podman"] == Result("Podman", "ok", "not asked (--podman-socket none)")


def test_each_engines_result_names_it_its_unit_and_its_flag():
    """Every engine's result, word for word: a stopped one's fix names the unit to start."""
    folder = "/run/e"
    stopped = "Connection refused"
    facts = EngineFacts(
        docker=Knock(
            f"unix://{folder}/docker.sock", "answered", version="Docker 27.1.1 (API 1.46)"
        ),
        podman=Knock(f"unix://{folder}/podman.sock", "refused", stopped),
        rootless_docker=[
            (
                1000,
                Knock(
                    f"unix://{folder}/1000/docker.sock",
                    "answered",
                    version="Docker 26.0.0 (API 1.45)",
                ),
            )
        ],
        rootless_podman=[(1001, Knock(f"unix://{folder}/1001/podman.sock", "refused", stopped))],
        containerd=None,
        kubelet=Knock(f"{folder}/kubelet.sock", "absent"),
    )
    config = Config(**engines_in(folder))
    start = (
        "start it (systemctl start {}); meanwhile its containers' processes are shown by "
        "their host account and container id"
    )
    assert engine_results(facts, config) == [
        Result("Docker Engine", "ok", f"unix://{folder}/docker.sock: Docker 27.1.1 (API 1.46)"),
        Result("rootless Docker", "ok", "1 found; uid 1000: Docker 26.0.0 (API 1.45)"),
        Result(
            "Podman",
            "degraded",
            f"unix://{folder}/podman.sock: its socket is there but nobody answers: stopped "
            f"({stopped})",
            start.format("podman.socket"),
        ),
        Result(
            "rootless Podman",
            "degraded",
            f"1 found; 1 not answering, uid 1001's at unix://{folder}/1001/podman.sock: its "
            f"socket is there but nobody answers: stopped ({stopped})",
            start.format("--user podman.socket"),
        ),
        Result("containerd", "ok", "not asked (--containerd-socket none)"),
        Result(
            "kubelet pod-resources",
            "ok",
            f"not there ({folder}/kubelet.sock): no kubelet here; asked whenever it appears",
        ),
    ]


# -- the port and the socket ----------------------------------------------------------------


class Stranger:
    """Something on a loopback port that answers the first request it reads with `answer`,
    and keeps what it was asked."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.asked = b""
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with connection:
            while b"\r\n\r\n" not in self.asked:
                chunk = connection.recv(4096)
                if not chunk:
                    return
                self.asked += chunk
            connection.sendall(self.answer)

    def close(self) -> None:
        self.thread.join(10)
        self.listener.close()


@pytest.mark.parametrize(
    "answer, who",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nServer: patroller\r\n\r\n", "patroller"),
        (b"HTTP/1.0 404 Not Found\r\nserver :  nginx/1.24 \r\n\r\n", "nginx/1.24"),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", ""),  # HTTP, naming no server
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", None),  # no HTTP
    ],
)
def test_what_holds_the_port_is_asked_who_it_is(answer, who):
    stranger = Stranger(answer)
    try:
        found = _who_answers("127.0.0.1", stranger.port, 5)
    finally:
        stranger.close()
    assert stranger.asked == b"GET /openapi.json HTTP/1.0\r\nHost: doctor\r\n\r\n"
    assert found == who


def test_a_taken_port_is_fine_only_where_a_patroller_answers():
    where = "port 8000 on every interface"
    taken = PortFacts(8000, "", errno.EADDRINUSE, "Address already in use", "patroller")
    assert check_port(taken) == Result(
        "address and port",
        "ok",
        f"{where}: a Patroller serves there (this one, or the one this doctor is checking for)",
    )
    for answers, who in (
        ("nginx", "`nginx` answers there"),
        ("", "something that does not answer as Patroller does holds it"),
        (None, "something that does not answer as Patroller does holds it"),
    ):
        assert check_port(
            PortFacts(8000, "", errno.EADDRINUSE, "Address already in use", answers)
        ) == Result(
            "address and port",
            "failed",
            f"{where} is taken: {who}",
            "stop it, or choose another --port or --address",
        )


def test_an_address_this_host_does_not_have_is_named_with_what_to_do():
    facts = probe_port(0, "192.0.2.1", 1)  # TEST-NET-1: no host's own address
    assert (facts.error, facts.answers) == (errno.EADDRNOTAVAIL, None), facts
    assert check_port(facts) == Result(
        "address and port",
        "failed",
        f"port 0 on 192.0.2.1: {os.strerror(errno.EADDRNOTAVAIL)}: no interface of this host "
        "has that address",
        "choose an --address this host has (ip addr), or none for every one",
    )


def test_what_is_at_the_socket_path_is_told_apart(tmp_path):
    os.chmod(tmp_path, 0o755)
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "live.sock"))
    os.chmod(tmp_path / "live.sock", 0o666)
    listening.listen()
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("")
    try:
        found = {
            name: probe_socket(str(tmp_path / name), 1)
            for name in ("live.sock", "a-folder", "a-file")
        }
    finally:
        listening.close()
    assert [(f.path, f.kind, f.live) for f in found.values()] == [
        (str(tmp_path / "live.sock"), "socket", True),
        (str(tmp_path / "a-folder"), "directory", False),
        (str(tmp_path / "a-file"), "file", False),
    ]
    closed = found["live.sock"].closed_by  # a folder above tmp_path may be closed to others
    if closed is None:
        assert check_socket(found["live.sock"]) == Result(
            "unix socket", "ok", f"{tmp_path}/live.sock: a server answers there (mode 666)"
        )
    for name, kind in (("a-folder", "directory"), ("a-file", "file")):
        assert check_socket(found[name]) == Result(
            "unix socket",
            "failed",
            f"{tmp_path}/{name} is a {kind}, not a socket",
            "remove it, or choose another --socket",
        )


# -- privacy --------------------------------------------------------------------------------


def test_more_open_files_than_are_named_are_counted_and_the_fix_says_so():
    files = tuple((f"/var/lib/patroller/f{n}", 0o644) for n in range(5))
    result = check_privacy(
        PrivacyFacts("/var/lib/patroller", None, (("/var/lib/patroller", 0o755),), files, 5)
    )
    assert result == Result(
        "private files",
        "failed",
        "/var/lib/patroller is mode 755; /var/lib/patroller/f0 is mode 644; "
        "/var/lib/patroller/f1 is mode 644; /var/lib/patroller/f2 is mode 644 and 2 more: "
        "other local users may read the usage history, the audit record or the lease book, "
        "whoever --hide-users hides",
        "chmod 700 /var/lib/patroller; chmod 600 /var/lib/patroller/f0 "
        "/var/lib/patroller/f1 /var/lib/patroller/f2 /var/lib/patroller/f3 ... (the daemon "
        "makes the state directory private at start); under systemd: "
        "StateDirectoryMode=0700, LogsDirectoryMode=0750 and UMask=0077, as `patroller "
        "systemd-unit` prints them",
    )


# -- nvidia-smi -----------------------------------------------------------------------------


def probed(scenario, **settings):
    """What the doctor's probe of nvidia-smi finds on the simulator, run in this process."""
    config = Config(nvidia_smi=scenario.command, **settings)
    return asyncio.run(probe(config)), config


@pytest.fixture
def two_gpus(tmp_path, sleeper):
    """Two GPUs, a process of ours holding 4 GiB on the first."""
    return ScenarioFile(
        str(tmp_path / "scenario.json"),
        devices=[{"name": "NVIDIA A100-SXM4-80GB"}, {"name": "NVIDIA H100 80GB HBM3"}],
        processes=[
            {"pid": sleeper.pid, "gpu": 0, "type": "C", "name": "python", "used_mib": 4096}
        ],
    )


def test_a_healthy_host_is_said_command_by_command(two_gpus):
    facts, config = probed(two_gpus)
    took = {
        name: describe(ran.seconds)
        for name, ran in (
            ("-q", facts.inventory),
            ("dmon", facts.dmon.runs[-1]),
            ("pmon", facts.pmon.runs[-1]),
            ("apps", facts.apps),
        )
    }
    results = gpu_results(facts, config)
    assert results[:6] == [
        Result(
            "nvidia-smi",
            "ok",
            f"{two_gpus.command}: driver 550.54.15 (R550 branch, document "
            "nvsmi_device_v12.dtd), CUDA 12.4",
        ),
        Result(
            "nvidia-smi -q -x",
            "ok",
            f"answered in {took['-q']}: 2 GPU(s): 0 NVIDIA A100-SXM4-80GB, 1 NVIDIA H100 80GB "
            "HBM3",
        ),
        Result(
            "nvidia-smi dmon",
            "ok",
            f"one sample in {took['dmon']}, columns -s pucvmt, a row from every GPU",
        ),
        Result(
            "nvidia-smi pmon",
            "ok",
            f"one sample in {took['pmon']}, columns -s um, 1 process row(s), a row from every GPU",
        ),
        Result(
            "nvidia-smi --query-compute-apps",
            "ok",
            f"answered in {took['apps']}: 1 compute process(es)",
        ),
        Result("MIG", "ok", "off on every GPU: pmon attributes every process"),
    ]
    assert [r.check for r in results[6:]] == ["GPU topology", "GPU 0 health", "GPU 1 health"]
    # the same answers, over the time it may take
    slow = gpu_results(facts, replace(config, doctor_slow=0.0))
    persist = (
        "start nvidia-persistenced (persistence mode), so that NVML need not start afresh at "
        "each command"
    )
    assert slow[1] == Result(
        "nvidia-smi -q -x",
        "degraded",
        f"{results[1].detail}: slow (over 0s)",
        persist,
    )
    assert slow[4] == Result(
        "nvidia-smi --query-compute-apps",
        "degraded",
        f"{results[4].detail}: slow (over 0s)",
        persist,
    )
    # a GPU that printed no dmon row
    quiet = replace(facts, dmon=replace(facts.dmon, gpus=(0,)))
    assert gpu_results(quiet, config)[2] == Result(
        "nvidia-smi dmon",
        "degraded",
        f"one sample in {took['dmon']}, columns -s pucvmt; GPU 1 printed no row",
        "a GPU that prints nothing is granted to nobody: check it with `nvidia-smi -i N -q`",
    )
    # -q -x with warnings
    warned = replace(facts, discovery=replace(facts.discovery, warnings=["odd", "odder"]))
    assert gpu_results(warned, config)[1] == Result(
        "nvidia-smi -q -x",
        "degraded",
        f"{results[1].detail}; 2 warning(s), the first: odd",
        "run the command by hand to see what it says",
    )
    # in test mode nothing of it is asked
    assert gpu_results(facts, replace(config, test=True)) == [
        Result("nvidia-smi", "ok", "not used: --test serves synthetic devices")
    ]


def test_an_old_driver_and_refused_columns_are_said_word_for_word(tmp_path):
    old = ScenarioFile(
        str(tmp_path / "s.json"),
        era="r384",
        driver_version="375.26",
        devices=[{"name": "Tesla P100-PCIE-16GB"}],
        faults={"pmon": {"fail": "not_supported"}},
    )
    # a driver that refuses dmon's fullest column groups, as some GPUs do
    refusing = tmp_path / "nvidia-smi"
    refusing.write_text(
        '#!/bin/sh\ncase " $* " in *" -s pucvmt "*)\n'
        "  echo 'Failed to process command line'; exit 3;;\nesac\n"
        f'exec {old.command} "$@"\n'
    )
    refusing.chmod(0o755)
    config = Config(nvidia_smi=str(refusing))
    facts = asyncio.run(probe(config))
    results = {r.check: r for r in gpu_results(facts, config)}
    assert results["nvidia-smi"] == Result(
        "nvidia-smi",
        "degraded",
        f"{refusing}: driver 375.26 (R375 branch, document nvsmi_device_v9.dtd): older than any "
        "driver "
        "Patroller was checked against (R384)",
        "update the NVIDIA driver",
    )
    dmon = facts.dmon.runs[-1]
    assert results["nvidia-smi dmon"] == Result(
        "nvidia-smi dmon",
        "degraded",
        f"one sample in {describe(dmon.seconds)}, columns -s pucm (pucvmt refused), a row "
        "from every GPU",
        "nothing to do: the daemon asks for fewer columns, as here",
    )
    pmon = results["nvidia-smi pmon"]
    assert pmon.status == "failed" and pmon.detail.endswith(
        ": no process is attributed to its user"
    ), pmon
    # one that refuses both groups before the default: each refused one named
    both = tmp_path / "nvidia-smi-both"
    both.write_text(
        '#!/bin/sh\ncase " $* " in *" -s pucvmt "*|*" -s pucm "*)\n'
        "  echo 'Failed to process command line'; exit 3;;\nesac\n"
        f'exec {old.command} "$@"\n'
    )
    both.chmod(0o755)
    config = Config(nvidia_smi=str(both))
    facts = asyncio.run(probe(config))
    dmon = facts.dmon.runs[-1]
    assert {r.check: r for r in gpu_results(facts, config)}["nvidia-smi dmon"] == Result(
        "nvidia-smi dmon",
        "degraded",
        f"one sample in {describe(dmon.seconds)}, columns the default (pucvmt and pucm "
        "refused), a row from every GPU",
        "nothing to do: the daemon asks for fewer columns, as here",
    )


def test_mig_a_blind_gpu_and_a_failing_query_of_compute_apps(tmp_path, sleeper):
    mig = ScenarioFile(
        str(tmp_path / "s.json"),
        devices=[
            {
                "name": "NVIDIA A100-SXM4-80GB",
                "mig": "Enabled",
                "mig_devices": [
                    {"gpu_instance_id": 1, "compute_instance_id": 0, "memory_mib": 9856}
                ],
            },
            {"name": "NVIDIA A100-SXM4-80GB", "pmon_blind": True},
        ],
        processes=[
            {"pid": sleeper.pid, "gpu": 1, "type": "C", "name": "python", "used_mib": 2048}
        ],
        faults={"--query-compute-apps": {"fail": "gpu_lost"}},
    )
    facts, config = probed(mig)
    results = {r.check: r for r in gpu_results(facts, config)}
    pmon = facts.pmon.runs[-1]
    assert results["nvidia-smi pmon"] == Result(
        "nvidia-smi pmon",
        "degraded",
        f"one sample in {describe(pmon.seconds)}, columns -s um, 0 process row(s), a row from "
        "every GPU; GPU 1 has compute processes (-q -x) that pmon does not list: the "
        "cross-check (--query-compute-apps, every "
        f"{describe(config.cross_check_every)}) attributes them, later and without utilisation",
        "nothing to do if the cross-check works (below); a newer driver may list them",
    )
    apps = facts.apps
    assert results["nvidia-smi --query-compute-apps"] == Result(
        "nvidia-smi --query-compute-apps",
        "failed",
        f"`{apps.shown}` {apps.trouble()}: processes on MIG GPUs cannot be attributed",
        "a GPU fell off the bus: reboot the host (dmesg says which, Xid 79)",
    )
    assert results["MIG"] == Result(
        "MIG",
        "ok",
        "on for GPU 0 (1 instance(s)): a MIG GPU is reserved whole; its processes are "
        "attributed by --query-compute-apps; -L names 1 MIG device(s)",
    )
    # without MIG, a failing query only loses what pmon does not list
    whole = replace(facts, devices=tuple(replace(d, mig_mode="Disabled") for d in facts.devices))
    assert apps_check(whole, config) == Result(
        "nvidia-smi --query-compute-apps",
        "degraded",
        f"`{apps.shown}` {apps.trouble()}: processes that pmon does not list cannot be attributed",
        "a GPU fell off the bus: reboot the host (dmesg says which, Xid 79)",
    )


# -- the examination ------------------------------------------------------------------------


def test_a_host_examined_in_this_process_says_each_check_once(two_gpus, tmp_path):
    """Not in test mode: nvidia-smi (the simulator) and the kernel log are examined too."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    config = Config(
        nvidia_smi=two_gpus.command,
        kernel_log=str(kmsg),
        port=0,
        address="127.0.0.1",
        **engines_in(str(tmp_path)),
    )
    results = asyncio.run(examine(config, unit_dirs=[str(tmp_path)]))
    checks = [r.check for r in results]
    assert len(checks) == len(set(checks)), checks
    found = {r.check: r for r in results}
    assert found["kernel log"] == Result(
        "kernel log", "ok", f"{kmsg} is readable: Xid errors are followed"
    )
    assert found["nvidia-smi"].status == "ok" and found["nvidia-smi dmon"].status == "ok"


def test_the_checks_of_probes_still_out_at_the_bound_are_each_named(tmp_path):
    """The lease book a FIFO nobody writes (its read never returns) and the port held by
    something that takes the connection and never answers: both still out at the bound."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.mkfifo(state / "leases.json", 0o600)
    units = tmp_path / "units"
    units.mkdir()
    os.mkfifo(units / "patroller.service")  # the unit's read never returns either
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    config = replace(
        Config(port=port, address="127.0.0.1", test=True, state_dir=str(state)),
        doctor_deadline=1.0,
        doctor_timeout=60.0,
        **engines_in(str(tmp_path)),
    )
    try:
        found = {r.check: r for r in asyncio.run(examine(config, unit_dirs=[str(units)]))}
    finally:
        silent.close()  # the port's probe ends
        for fifo in (state / "leases.json", units / "patroller.service"):  # the reads end
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    late = "find what is slow there: the daemon would wait on it too"
    for check in ("state directory", "lease book"):
        assert found[check] == Result(
            check,
            "degraded",
            f"no answer within the doctor's 1s: waited for the state directory {state}",
            late,
        )
    assert found["address and port"] == Result(
        "address and port",
        "degraded",
        f"no answer within the doctor's 1s: waited for port {port}: to bind it, or what "
        "holds it to answer",
        late,
    )
    assert found["systemd unit"] == Result(
        "systemd unit",
        "degraded",
        "no answer within the doctor's 1s: waited for the systemd unit's files and systemctl",
        late,
    )


def test_callers_who_ask_meanwhile_share_one_examination(tmp_path):
    doctor = Doctor(Config(test=True, port=0, address="127.0.0.1", **engines_in(str(tmp_path))))

    async def ask_twice():
        return await asyncio.gather(doctor.results(), doctor.results())

    first, second = asyncio.run(ask_twice())
    assert first == second and {r.check for r in first} >= {"state directory", "unix socket"}
    assert doctor.examinations == 1


# -- the places on disk ---------------------------------------------------------------------


def test_a_lease_book_of_the_largest_size_is_read_and_its_holder_named(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    book = schema.encode({}, time.time(), None)
    assert book.rstrip().endswith(b"}")
    # a book of exactly the size the daemon reads, the room filled with JSON's own blanks
    (state / FILE).write_bytes(book.rstrip()[:-1] + b" " * (MAX_SIZE - len(book.rstrip())) + b"}")
    assert (state / FILE).stat().st_size == MAX_SIZE
    lock = os.open(state / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        facts = probe_state(str(state))
    finally:
        os.close(lock)
    assert (facts.exists, facts.unwritable, facts.bad_book) == (True, None, None), facts
    assert facts.book is not None and facts.book.startswith("0 device(s) held, saved "), facts
    assert facts.holder == os.getpid()
    assert check_book(facts) == Result(
        "lease book", "ok", f"{facts.book}; this daemon holds its directory"
    )


def test_a_read_only_state_directory_is_said_unwritable(read_only):
    facts = probe_state(str(read_only / "state"))
    assert facts.unwritable == READ_ONLY, facts


def test_a_state_directory_that_cannot_be_written_fails_saying_how_to_make_it_right():
    facts = StateFacts("/srv/state", exists=True, unwritable="Permission denied")
    assert check_state(facts, Config()) == Result(
        "state directory",
        "failed",
        "/srv/state is not writable: Permission denied",
        "choose another --state-dir, or make it writable (read-only mount? under systemd: "
        "StateDirectory=patroller)",
    )


def test_a_job_map_not_given_or_read_whole_is_fine():
    assert check_job_map(JobMapFacts(None)) == Result(
        "Slurm job map", "ok", "not given (--slurm-job-map): no GPU is a Slurm job's"
    )
    whole = JobMapFacts("/run/slurm-gpus", exists=True, files=2, jobs=3)
    assert check_job_map(whole) == Result(
        "Slurm job map", "ok", "/run/slurm-gpus: 2 file(s), 3 job(s)"
    )


def test_the_job_map_is_counted_job_by_job(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o755)
    (jobs / "0").write_text("101 uid=0\n102 uid=0\n")
    (jobs / "1").write_text("103\n")
    os.symlink("/etc/hostname", jobs / "2")  # a link: never followed, told of
    facts = probe_job_map(str(jobs), 4096)
    assert (facts.files, facts.jobs, facts.problems) == (2, 3, 1), facts
    assert facts.first_problem.startswith("2 "), facts
    assert check_job_map(facts) == Result(
        "Slurm job map",
        "degraded",
        f"{jobs}: 2 file(s), 3 job(s); 1 file(s) not read as a map: {facts.first_problem}",
        "see docs/slurm.md for the files' format",
    )


# -- the host -------------------------------------------------------------------------------


def test_the_processes_here_are_read_with_their_user_namespaces():
    facts = probe_proc()
    assert facts.processes > 1 and os.getpid() not in facts.userns_unreadable, facts
    # a sandbox's own init may be closed even to root: the rest are read
    assert len(facts.userns_unreadable) < facts.processes / 2, facts


def test_what_the_cgroups_and_proc_say_word_for_word():
    facts = ProcFacts(0, None, 10, hierarchy="v2", systemd=False, jobs=2)
    assert check_cgroups(facts) == Result(
        "cgroups", "ok", "v2, cgroupfs driver; no process in a container; 2 in Slurm jobs"
    )
    assert check_proc(ProcFacts(1000, "invisible", 10)) == Result(
        "/proc",
        "failed",
        "/proc is mounted with hidepid=invisible: other users' processes are hidden, so "
        "their GPU processes have no owner",
        "run Patroller as root (or mount /proc with gid= naming its group)",
    )


def test_a_unit_file_that_cannot_be_read_and_what_a_unit_starts(tmp_path):
    (tmp_path / "patroller.service").mkdir()  # read as a file: EISDIR
    facts = probe_unit([str(tmp_path)])
    assert facts == UnitFacts(str(tmp_path / "patroller.service"), unreadable="Is a directory")
    assert exec_start("[Service]\nExecStart=/usr/bin/patroller --port=8080\n") == (
        "/usr/bin/patroller"
    )
    assert exec_start("ExecStart=-/usr/bin/true\nExecStart = @/opt/p/bin/patroller x\n") == (
        "/opt/p/bin/patroller"
    )


def test_a_notification_url_that_cannot_be_used_fails():
    facts = NotifyFacts(1, bad="bogus://x: no service of that name")
    assert check_notifications(facts, Config()) == Result(
        "notifications",
        "failed",
        "bogus://x: no service of that name: the daemon would not start",
        "correct the URL, or leave it out",
    )


def test_a_driver_that_does_not_answer_or_sees_no_gpu_is_named_as_given(tmp_path):
    """nvidia-smi is named as it was given when -q -x fails (no driver, or no GPU seen)."""
    for name, scenario in (
        ("none.json", {"devices": []}),
        ("failing.json", {"faults": {"-q": {"fail": "no_driver"}}}),
    ):
        given = ScenarioFile(str(tmp_path / name), **scenario)
        facts, config = probed(given)
        assert facts.argv == tuple(given.command.split()), facts
        assert gpu_results(facts, config)[0] == Result(
            "nvidia-smi",
            "degraded",
            f"{given.command}: driver version unknown (-q -x gave no answer)",
            "see nvidia-smi -q -x below",
        )


def test_a_bounded_socket_reads_no_more_than_asked():
    ours, theirs = socket.socketpair()
    with bounded(ours, deadline(10), 10) as sock, theirs:
        theirs.sendall(b"0123456789")
        buffer = bytearray(10)
        assert sock.recv_into(buffer, 4) == 4
        assert bytes(buffer[:4]) == b"0123"
