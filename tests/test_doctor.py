"""`patroller doctor` and GET /doctor against real things: the simulator standing in for
nvidia-smi (healthy, failing, hung, old, MIG, blind), engines' sockets in an empty folder, a
stale one (a stopped engine), a real Docker Engine, a directory another user cannot read, a
read-only mount, a port already taken (by a stranger, and by a Patroller), a running daemon's
lease book, a container's cgroup named as no runtime names it, a systemd unit."""

import asyncio
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import replace

import pytest
from helpers import (
    NOBODY,
    ROOT,
    ScenarioFile,
    ServerProcess,
    async_test,
    children_of,
    engines_in,
    gpu_running,
    need_root,
    process_in_cgroup,
    python_for,
)

from patroller.config import Config
from patroller.doctor import examine
from patroller.doctor.host import check_cgroups, check_unit, probe_proc, probe_unit

EX_CONFIG = 78  # cli/exits.py: a check failed


# The doctor as another user: its interpreter may lie where that user may not go (under root's
# home), so it starts as root, imports all it will use, then becomes that user for good.
AS_USER = """
import concurrent.futures.thread, encodings.ascii, encodings.idna, encodings.latin_1, json, os, sys
from patroller.main import main
import patroller.doctor.command, patroller.cli.exits
uid = int(sys.argv[1])
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
sys.exit(main(sys.argv[2:]))
"""


def doctor(*flags, user=None, timeout=120):
    """(exit status, results by check, the results as listed) of `patroller doctor --json`,
    as `user` (default: ours)."""
    env = {**os.environ, "PYTHONPATH": ROOT, "PATROLLER_STATE_DIR": ""}
    start = ["-m", "patroller"] if user is None else ["-c", AS_USER, str(user)]
    done = subprocess.run(
        [sys.executable, *start, "doctor", "--json", *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode in (0, EX_CONFIG), done.stderr
    listed = json.loads(done.stdout)
    for result in listed:
        assert set(result) == {"check", "status", "detail", "fix"}, result
        assert result["status"] in ("ok", "degraded", "failed"), result
        assert (result["fix"] == "") == (result["status"] == "ok"), result
    return done.returncode, {r["check"]: r for r in listed}, listed


def isolated(folder, *more):
    """Flags that keep the doctor to what a test made: every engine's socket and the
    kubelet's in `folder`, loopback, a port the kernel picks."""
    engines = engines_in(folder, kubelet_socket=f"{folder}/kubelet.sock")
    flags = ["--port", "0", "--address", "127.0.0.1"]
    for name, value in engines.items():
        flags += [f"--{name.replace('_', '-')}", value]
    return [*flags, *more]


@pytest.fixture
def scenario(tmp_path, sleeper):
    """Two GPUs, a process of ours holding 4 GiB on the first."""
    return ScenarioFile(
        str(tmp_path / "scenario.json"),
        devices=[{"name": "NVIDIA A100-SXM4-80GB"}, {"name": "NVIDIA H100 80GB HBM3"}],
        processes=[
            {
                "pid": sleeper.pid,
                "gpu": 0,
                "type": "C",
                "name": "python",
                "used_mib": 4096,
                "sm": 40,
            }
        ],
    )


GPU_CHECKS = (
    "nvidia-smi",
    "nvidia-smi -q -x",
    "nvidia-smi dmon",
    "nvidia-smi pmon",
    "nvidia-smi --query-compute-apps",
    "MIG",
)


def test_a_simulated_gpu_host_passes_every_check_and_exits_0(scenario, engine_sockets, tmp_path):
    code, found, listed = doctor(
        *isolated(
            engine_sockets,
            "--nvidia-smi",
            scenario.command,
            "--state-dir",
            str(tmp_path / "state"),
        )
    )
    assert code == 0, listed
    assert [r["check"] for r in listed][:6] == list(GPU_CHECKS)
    for name in GPU_CHECKS + ("GPU 0 health", "GPU 1 health"):
        assert found[name]["status"] == "ok", found[name]
    assert "driver 550.54.15 (R550 branch" in found["nvidia-smi"]["detail"]
    assert (
        "2 GPU(s): 0 NVIDIA A100-SXM4-80GB, 1 NVIDIA H100 80GB HBM3"
        in found["nvidia-smi -q -x"]["detail"]
    )
    assert "1 process row(s), a row from every GPU" in found["nvidia-smi pmon"]["detail"]
    assert "1 compute process(es)" in found["nvidia-smi --query-compute-apps"]["detail"]
    for engine in ("Docker Engine", "Podman", "containerd", "kubelet pod-resources"):
        assert found[engine]["status"] == "ok" and "not there" in found[engine]["detail"]
    assert "is not there yet: it is made (private) at start" in found["state directory"]["detail"]
    assert not os.path.exists(tmp_path / "state"), "the doctor makes nothing"
    assert found["address and port"]["detail"].startswith("port 0")


def test_the_human_output_is_one_line_a_check_and_a_count(scenario, engine_sockets):
    env = {**os.environ, "PYTHONPATH": ROOT, "PATROLLER_STATE_DIR": ""}
    flags = isolated(engine_sockets, "--nvidia-smi", scenario.command)
    done = subprocess.run(
        [sys.executable, "-m", "patroller", "doctor", *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    _, _, listed = doctor(*flags)  # the same checks, in the same order (times differ)
    shown = done.stdout.splitlines()
    assert len(shown) == len(listed) + 1, done.stdout
    for line, result in zip(shown[:-1], listed, strict=True):
        assert line.split()[0] == result["status"]
        assert line.split(None, 1)[1].startswith(f"{result['check']}: "), line
        assert ("; fix: " in line) == (result["status"] != "ok")
    counts = {s: sum(r["status"] == s for r in listed) for s in ("ok", "degraded", "failed")}
    assert (
        shown[-1] == f"{counts['ok']} ok, {counts['degraded']} degraded, {counts['failed']} failed"
    )


def test_a_missing_or_failing_nvidia_smi_fails_with_what_to_do(tmp_path, engine_sockets):
    code, found, _ = doctor(*isolated(engine_sockets, "--nvidia-smi", "/nonexistent/nvidia-smi"))
    assert code == EX_CONFIG
    assert found["nvidia-smi"]["status"] == "failed"
    assert "was not found" in found["nvidia-smi"]["detail"]
    assert "--nvidia-smi" in found["nvidia-smi"]["fix"]
    assert "nvidia-smi dmon" not in found, "nothing more is asked of a command not there"
    broken = ScenarioFile(str(tmp_path / "s.json"), faults={"-q": {"fail": "no_driver"}})
    code, found, _ = doctor(*isolated(engine_sockets, "--nvidia-smi", broken.command))
    assert code == EX_CONFIG
    assert found["nvidia-smi -q -x"]["status"] == "failed"
    assert "couldn't communicate with the NVIDIA driver" in found["nvidia-smi -q -x"]["detail"]
    assert "modprobe nvidia" in found["nvidia-smi -q -x"]["fix"]
    assert found["nvidia-smi"]["status"] == "degraded"  # found, its driver unknown


def test_every_failure_nvidia_smi_is_known_to_print_has_a_fix_of_its_own():
    from patroller.doctor.gpuchecks import RUN_BY_HAND, fix_for
    from patroller.simulator.program import FAILURES

    fixes = {
        name: fix_for(text.format(sp="", pci="00000000:01:00.0"))
        for name, (text, _) in FAILURES.items()
    }
    assert RUN_BY_HAND not in fixes.values(), fixes
    assert len(set(fixes.values())) == len(fixes), "each failure its own fix"
    assert fix_for("something never seen") == RUN_BY_HAND


def test_an_old_driver_and_refused_columns_are_degraded_and_a_refused_pmon_fails(
    tmp_path, engine_sockets
):
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
        f'#!/bin/sh\ncase " $* " in *" -s pucvmt "*)\n'
        "  echo 'Failed to process command line'; exit 3;;\nesac\n"
        f'exec {old.command} "$@"\n'
    )
    refusing.chmod(0o755)
    code, found, listed = doctor(*isolated(engine_sockets, "--nvidia-smi", str(refusing)))
    assert code == EX_CONFIG, listed
    assert found["nvidia-smi"]["status"] == "degraded"
    assert "375.26" in found["nvidia-smi"]["detail"]
    assert "older than any driver" in found["nvidia-smi"]["detail"]
    dmon = found["nvidia-smi dmon"]
    assert dmon["status"] == "degraded", dmon
    assert "columns -s pucm (pucvmt refused), a row from every GPU" in dmon["detail"]
    pmon = found["nvidia-smi pmon"]
    assert pmon["status"] == "failed" and "no process is attributed" in pmon["detail"], pmon
    assert "Not supported on the device" in pmon["detail"]
    assert "refuses the command with every column group" in pmon["fix"]


def test_mig_and_a_gpu_pmon_is_blind_to(tmp_path, engine_sockets, sleeper):
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
    )
    code, found, listed = doctor(*isolated(engine_sockets, "--nvidia-smi", mig.command))
    assert code == 0, listed
    assert found["MIG"]["status"] == "ok"
    assert "on for GPU 0 (1 instance(s))" in found["MIG"]["detail"]
    assert "-L names 1 MIG device(s)" in found["MIG"]["detail"]
    pmon = found["nvidia-smi pmon"]
    assert pmon["status"] == "degraded" and "GPU 1 has compute processes" in pmon["detail"]


def test_each_gpus_health_is_reported_with_what_to_do(tmp_path, engine_sockets):
    sick = ScenarioFile(
        str(tmp_path / "s.json"),
        devices=[
            {"health": {"slowdowns": ["hw_power_brake_slowdown"]}},
            {"health": {"remap_pending": True, "ecc_uncorrectable": 2}},
            {},
        ],
    )
    code, found, listed = doctor(*isolated(engine_sockets, "--nvidia-smi", sick.command))
    assert code == 0, listed  # the daemon works on: it withholds the GPU
    assert found["GPU 0 health"] == {
        "check": "GPU 0 health",
        "status": "degraded",
        "detail": "clocks slowed (hw_power_brake_slowdown)",
        "fix": "check its cooling and power",
    }
    sick_one = found["GPU 1 health"]
    assert sick_one["status"] == "degraded"
    assert (
        sick_one["detail"] == "row remap pending; 2 uncorrectable ECC error(s) since the "
        "last reset: the daemon grants it to nobody"
    )
    assert sick_one["fix"].startswith("reset the GPU (`nvidia-smi -r -i 1`) when nothing runs")
    assert found["GPU 2 health"]["status"] == "ok"
    assert found["kernel log"]["status"] == (
        "ok" if os.access("/dev/kmsg", os.R_OK) else "degraded"
    )


def test_a_kernel_log_that_cannot_be_read_is_degraded(tmp_path):
    from patroller.doctor.host import check_kernel_log, probe_kernel_log

    missing = str(tmp_path / "kmsg")
    result = check_kernel_log(missing, probe_kernel_log(missing))
    assert (result.status, result.detail) == (
        "degraded",
        f"{missing} cannot be read (No such file or directory): Xid errors are "
        "not seen, the GPUs' health comes from nvidia-smi -q -x alone",
    )
    (tmp_path / "kmsg").write_text("")
    assert check_kernel_log(missing, probe_kernel_log(missing)).status == "ok"
    assert check_kernel_log(None, probe_kernel_log(None)).detail.startswith("not followed")


@async_test
async def test_a_hung_query_is_killed_at_its_timeout_and_leaves_no_child(tmp_path):
    hung = ScenarioFile(str(tmp_path / "s.json"), faults={"-q": {"hang": True}})
    config = replace(
        Config(port=0, address="127.0.0.1", nvidia_smi=hung.command),
        discovery_timeout=1.0,
        **engines_in(str(tmp_path)),
    )
    results = {r.check: r for r in await examine(config)}
    query = results["nvidia-smi -q -x"]
    assert query.status == "failed" and "no answer in 1s: killed" in query.detail, query
    assert "hangs" in query.fix
    assert [pid for pid in children_of(os.getpid()) if hung.path in command_of(pid)] == []


def command_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stale_socket(path):
    """A socket file nobody listens on: what an engine that stopped leaves."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(path)


def test_a_stopped_engine_is_degraded_and_one_not_there_is_fine(engine_sockets):
    stale_socket(f"{engine_sockets}/docker.sock")
    stale_socket(f"{engine_sockets}/containerd.sock")
    os.makedirs(f"{engine_sockets}/1000")
    stale_socket(f"{engine_sockets}/1000/docker.sock")
    code, found, listed = doctor(*isolated(engine_sockets, "--test"))
    assert code == 0, listed
    docker = found["Docker Engine"]
    assert docker["status"] == "degraded", docker
    assert "nobody answers: stopped" in docker["detail"]
    assert "systemctl start docker" in docker["fix"]
    assert found["containerd"]["status"] == "degraded"
    rootless = found["rootless Docker"]
    assert rootless["status"] == "degraded" and "uid 1000's" in rootless["detail"], rootless
    assert found["Podman"]["status"] == "ok" and "not there" in found["Podman"]["detail"]
    assert found["nvidia-smi"]["detail"].startswith("not used")


def test_a_running_docker_engine_is_named_with_its_version(engine, engine_sockets):
    code, found, _ = doctor(*isolated(engine_sockets, "--test"), "--docker-host", engine.url)
    docker = found["Docker Engine"]
    assert docker["status"] == "ok", docker
    import docker as sdk

    client = sdk.DockerClient(base_url=engine.url)
    try:
        version = client.version()
    finally:
        client.close()
    assert (
        docker["detail"] == f"{engine.url}: Docker {version['Version']} "
        f"(API {version['ApiVersion']})"
    )


def test_as_another_user_what_it_cannot_read_fails_and_says_why(tmp_path, engine_sockets):
    need_root("the doctor runs as nobody")
    closed = tempfile.mkdtemp(prefix="doctor-closed-", dir="/tmp")  # root's, mode 700
    try:
        os.makedirs(f"{closed}/jobs")
        code, found, listed = doctor(
            *isolated(
                engine_sockets,
                "--test",
                "--state-dir",
                f"{closed}/state",
                "--slurm-job-map",
                f"{closed}/jobs",
            ),
            user=NOBODY,
        )
    finally:
        shutil.rmtree(closed)
    assert code == EX_CONFIG, listed
    state = found["state directory"]
    assert state["status"] == "failed" and "Permission denied" in state["detail"], state
    assert "--state-dir" in state["fix"]
    jobs = found["Slurm job map"]
    assert jobs["status"] == "failed" and "Permission denied" in jobs["detail"], jobs
    proc = found["/proc"]
    assert proc["status"] == "degraded" and "user namespaces" in proc["detail"], proc
    assert proc["fix"] == "run Patroller as root"


def test_a_read_only_state_directory_is_degraded(read_only, engine_sockets):
    # the daemon starts there, without keeping anything (test_read_only_state.py)
    code, found, _ = doctor(
        *isolated(engine_sockets, "--test", "--state-dir", str(read_only / "state"))
    )
    state = found["state directory"]
    assert state["status"] == "degraded", state
    assert state["detail"].startswith(
        f"{read_only}/state is not writable: Read-only file "
        "system: the daemon reads the lease book at start"
    )
    assert "do not survive a restart" in state["detail"] and "read-write" in state["fix"]
    code, found, _ = doctor(
        *isolated(engine_sockets, "--test", "--state-dir", str(read_only / "new"))
    )
    state = found["state directory"]
    assert state["status"] == "degraded", state
    assert "cannot be made in" in state["detail"] and "Read-only" in state["detail"]


def test_a_port_taken_by_a_stranger_fails_and_one_a_patroller_serves_is_fine(
    tmp_path, engine_sockets
):
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        code, found, _ = doctor(*isolated(engine_sockets, "--test"), "--port", str(port))
    taken = found["address and port"]
    assert code == EX_CONFIG and taken["status"] == "failed", taken
    assert f"port {port} on 127.0.0.1 is taken" in taken["detail"]
    assert "--port" in taken["fix"]
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    serving = threading.Thread(target=web.serve_forever, daemon=True)
    serving.start()
    try:
        code, found, _ = doctor(
            *isolated(engine_sockets, "--test"), "--port", str(web.server_address[1])
        )
    finally:
        web.shutdown()
        web.server_close()
    taken = found["address and port"]
    assert code == EX_CONFIG and taken["status"] == "failed", taken
    handler = http.server.SimpleHTTPRequestHandler
    assert (
        f"is taken: `{handler.server_version} {handler.sys_version}` answers there"
        in taken["detail"]
    ), taken
    state = tmp_path / "state"
    server = ServerProcess("--test", "--state-dir", str(state)).start()
    try:
        port = server.url.rsplit(":", 1)[1]
        code, found, listed = doctor(
            *isolated(engine_sockets, "--test", "--state-dir", str(state)), "--port", port
        )
    finally:
        server.stop()
    assert code == 0, listed
    assert "a Patroller serves there" in found["address and port"]["detail"]
    book = found["lease book"]
    assert book["status"] == "ok", book
    assert f"patroller pid {server.process.pid} holds its directory" in book["detail"]


def test_an_engine_not_asked_names_the_flag_that_would_ask_it():
    """Pure: each engine left unasked says which flag asks it, as the docs spell it."""
    from patroller.doctor.runtimes import EngineFacts, Knock, engine_results

    facts = EngineFacts(
        Knock("unix:///run/docker.sock", "absent", ""), None, None, None, None, None
    )
    found = {r.check: r for r in engine_results(facts, Config())}
    for check, flag in (
        ("rootless Docker", "--rootless-docker-socket"),
        ("Podman", "--podman-socket"),
        ("rootless Podman", "--rootless-podman-socket"),
        ("containerd", "--containerd-socket"),
        ("kubelet pod-resources", "--kubelet-socket"),
    ):
        assert found[check].status == "ok" and found[check].detail == f"not asked ({flag} none)"


def test_a_lease_book_that_cannot_be_read_is_degraded(tmp_path, engine_sockets):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "leases.json").write_text("{not json")
    os.chmod(state / "leases.json", 0o600)  # as the daemon writes it: private files are ok
    code, found, _ = doctor(*isolated(engine_sockets, "--test", "--state-dir", str(state)))
    book = found["lease book"]
    assert code == 0 and book["status"] == "degraded", book
    assert "is not a lease book" in book["detail"] and "set aside at start" in book["detail"]
    assert found["state directory"]["status"] == "ok"
    assert os.listdir(state) == ["leases.json"], "the doctor leaves nothing behind"


def test_what_is_at_the_socket_path_decides(tmp_path, engine_sockets):
    (tmp_path / "file").write_text("")
    code, found, _ = doctor(
        *isolated(engine_sockets, "--test", "--socket", str(tmp_path / "file"))
    )
    assert code == EX_CONFIG
    assert found["unix socket"]["detail"].endswith("is a file, not a socket")
    # a value the daemon would refuse: a failed check of its own, the rest examined without it
    code, found, _ = doctor(
        *isolated(engine_sockets, "--test", "--socket", str(tmp_path / "gone" / "api.sock"))
    )
    assert code == EX_CONFIG and found["--socket"]["status"] == "failed"
    assert "is in a directory that does not exist" in found["--socket"]["detail"]
    assert found["unix socket"]["status"] == "ok"  # none, as without the flag
    closed = f"{engine_sockets}/closed"  # in a folder others may pass through (not tmp_path's)
    os.mkdir(closed, 0o700)
    code, found, _ = doctor(*isolated(engine_sockets, "--test", "--socket", f"{closed}/api.sock"))
    shut = found["unix socket"]
    assert code == 0 and shut["status"] == "degraded", shut
    assert f"{closed} (mode 700) lets no other user through" in shut["detail"]


def test_a_container_cgroup_no_runtime_is_known_to_name_so_is_degraded():
    odd = f"pt{os.getpid()}doctor/ctr-{'ab' * 32}.scope"
    with process_in_cgroup(odd):
        facts = probe_proc()
        result = check_cgroups(facts)
    assert result.status == "degraded", result
    assert f"/{odd}" in result.detail
    assert "not recognised" in result.detail


def test_the_systemd_unit_is_found_and_what_it_starts_checked(tmp_path):
    assert check_unit(probe_unit([str(tmp_path)])).detail.startswith("not installed")
    unit = tmp_path / "patroller.service"
    unit.write_text("[Service]\nExecStart=/nonexistent/bin/patroller --port 8080\n")
    broken = check_unit(probe_unit([str(tmp_path)]))
    assert broken.status == "degraded" and "/nonexistent/bin/patroller" in broken.detail
    unit.write_text(f"[Service]\nExecStart=-{sys.executable} -m patroller --port 8080\n")
    fine = check_unit(probe_unit([str(tmp_path)]))
    assert fine.status == "ok" and f"starting {sys.executable}" in fine.detail, fine


ASK = """
import http.client, json, socket, sys
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(sys.argv[1])
answers = []
for path in sys.argv[2:]:
    connection = Unix("localhost", timeout=60)
    connection.request("GET", path)
    response = connection.getresponse()
    answers.append([response.status, json.loads(response.read())])
print(json.dumps(answers))
"""


def ask_over_socket(path, *paths, uid):
    """[status, body] of each request, as `uid`, over the unix socket at `path`."""
    done = subprocess.run(
        [python_for(uid), "-c", ASK, path, *paths],
        user=uid,
        group=uid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@async_test
async def test_get_doctor_answers_the_hosts_root_and_refuses_everyone_else(
    scenario, tmp_path, engine_sockets
):
    need_root("the callers are root and nobody, as the kernel says")
    path = f"{engine_sockets}/api.sock"
    async with gpu_running(
        scenario,
        socket=path,
        state_dir=str(tmp_path / "state"),
        kubelet_socket=None,
        **engines_in(engine_sockets),
    ) as h:
        loop = asyncio.get_running_loop()
        refused = await loop.run_in_executor(
            None, lambda: ask_over_socket(path, "/doctor", "/doctor?user=root", uid=NOBODY)
        )
        for status, body in refused:
            assert status == 403, body
            assert "the host's root only" in body["error"] and body["needs"] == "root"
        assert h.api.doctor.examinations == 0, "nothing is run for a refused caller"
        (s1, first), (s2, second) = await asyncio.gather(h.call("/doctor"), h.call("/doctor"))
        assert s1 == s2 == 200, (first, second)
        assert first == second and h.api.doctor.examinations == 1, "one examination, shared"
        found = {r["check"]: r for r in first}
        for name in GPU_CHECKS:
            assert found[name]["status"] == "ok", found[name]
        assert found["lease book"]["detail"].endswith("this daemon holds its directory")
        assert "a server answers there (mode 666)" in found["unix socket"]["detail"]
        assert (await h.call("/status"))[0] == 200, "the daemon serves on"
        assert h.api.doctor.examinations == 1
        status, again = await h.call("/doctor")
        assert status == 200 and h.api.doctor.examinations == 2


@async_test
async def test_in_test_mode_nobody_may_ask_get_doctor():
    from helpers import running

    async with running() as h:
        for path in ("/doctor", "/doctor?user=root"):
            status, body = await h.call(path)
            assert status == 403 and body["needs"] == "root", body
        assert h.api.doctor.examinations == 0


def test_the_room_left_counts_what_a_user_may_write_not_the_blocks_kept_for_root():
    from patroller.doctor.places import _free

    mib = 1 << 20
    # 4 KiB fragments; 1,000 MiB free of which only 10 MiB are not kept for root
    kept_for_root = os.statvfs_result(
        (4096, 4096, 1 << 20, 1000 * mib // 4096, 10 * mib // 4096, 1000, 900, 900, 0, 255)
    )
    assert _free("/var/lib/patroller", lambda folder: kept_for_root) == 10

    def gone(folder):
        raise FileNotFoundError(folder)

    assert _free("/nope", gone) is None


def test_a_usage_store_with_nowhere_to_live_is_degraded(engine_sockets, tmp_path):
    # As found: --usage sqlite without --state-dir kept nothing, and nobody said so.
    _, found, _ = doctor(*isolated(engine_sockets, "--test", "--usage", "sqlite"))
    usage = found["usage history"]
    assert usage["status"] == "degraded", usage
    assert "no usage history is kept" in usage["detail"] and "--state-dir" in usage["fix"]
    _, found, _ = doctor(*isolated(engine_sockets, "--test", "--usage", "none"))
    assert found["usage history"]["status"] == "ok"
    state = tmp_path / "state"
    _, found, _ = doctor(*isolated(engine_sockets, "--test", "--state-dir", str(state)))
    assert found["usage history"] == {
        "check": "usage history",
        "status": "ok",
        "fix": "",
        "detail": f"{state}/usage.sqlite3: a sample of every GPU every 1m, kept 400 days",
    }


def proc_tree(root, cap_eff="000001ffffffffff", nspid="4242", label=None, scope=None):
    """A /proc with what tells apart why other processes are closed: our status, our security
    label, Yama's scope, and pid 1 named."""
    (root / "self" / "attr").mkdir(parents=True)
    (root / "self" / "status").write_text(
        f"Name:\tpatroller\nCapEff:\t{cap_eff}\nNSpid:\t{nspid}\n"
    )
    if label is not None:
        (root / "self" / "attr" / "current").write_text(label + "\n")
    if scope is not None:
        (root / "sys" / "kernel" / "yama").mkdir(parents=True)
        (root / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(f"{scope}\n")
    (root / "1").mkdir()
    (root / "1" / "comm").write_text("init\n")
    return str(root)


@pytest.mark.parametrize(
    "tree,fix",
    [
        ({"cap_eff": "000001fffff7ffff"}, "give Patroller CAP_SYS_PTRACE (it is root without it"),
        ({"scope": 3}, "kernel.yama.ptrace_scope is 3"),
        ({"nspid": "4242\t17"}, "run Patroller in the host's PID namespace"),
        (
            {"label": "/usr/bin/patroller (enforce)"},
            "the security module confines Patroller (/usr/bin/patroller (enforce))",
        ),
        (
            {"scope": 1, "label": "unconfined"},
            "none to give: Patroller is root with CAP_SYS_PTRACE",
        ),
    ],
    ids=["no CAP_SYS_PTRACE", "Yama 3", "a PID namespace", "AppArmor", "none to tell"],
)
def test_proc_advice_names_the_cause_it_can_tell_apart(tmp_path, tree, fix):
    # As found: root with CAP_SYS_PTRACE, refused pid 1 (a VM's init), was told to get
    # CAP_SYS_PTRACE.
    from patroller.doctor.host import ProcFacts, _named, _why_refused, check_proc

    proc = proc_tree(tmp_path, **tree)
    facts = ProcFacts(
        0,
        None,
        10,
        (),
        (1,),
        None,
        {},
        0,
        (),
        0,
        "v2",
        True,
        *_why_refused(proc),
        (_named(1, proc),),
    )
    result = check_proc(facts)
    assert result.status == "degraded" and result.fix.startswith(fix), result
    assert ("CAP_SYS_PTRACE" in result.fix) == (fix.startswith(("give", "none"))), result
    if fix.startswith("none"):
        assert "(pid 1 (init))" in result.fix
    as_user = check_proc(replace(facts, euid=65534))
    assert as_user.fix == "run Patroller as root"


def test_a_value_the_daemon_would_refuse_is_a_failed_check_and_json_is_always_json(
    engine_sockets, tmp_path
):
    # As found: --state-dir naming a regular file exited 2 with an argument error, no JSON.
    plain = tmp_path / "plain"
    plain.write_text("")
    code, found, listed = doctor(
        *isolated(engine_sockets, "--test", "--state-dir", str(plain), "--lease", "soon")
    )
    assert code == EX_CONFIG
    state = found["--state-dir"]
    assert state["status"] == "failed" and state["detail"].startswith(
        f"'{plain}' is not a directory: the daemon would refuse to start"
    ), state
    assert "directory" in state["fix"]
    lease = found["--lease"]
    assert lease["status"] == "failed" and "--lease" in lease["fix"], lease
    assert {"nvidia-smi", "/proc", "address and port", "usage history"} <= set(found)  # the rest
    env = {**os.environ, "PYTHONPATH": ROOT, "PATROLLER_STATE_DIR": "", "PATROLLER_LEASE": "zz"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "patroller",
            "doctor",
            "--json",
            *isolated(engine_sockets, "--test"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EX_CONFIG, done.stderr
    (variable,) = [r for r in json.loads(done.stdout) if r["check"] == "PATROLLER_LEASE"]
    assert variable["status"] == "failed" and "unset it" in variable["fix"]
    for flags in (["--no-such-flag"], ["--port"]):  # not to be read at all: still JSON
        done = subprocess.run(
            [sys.executable, "-m", "patroller", "doctor", "--json", *flags],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2
        (line,) = json.loads(done.stdout)
        assert line["check"] == "command line" and line["status"] == "failed", line


def test_a_state_directory_the_daemon_refuses_the_doctor_fails_for_the_same_reason(engine_sockets):
    # As found: --state-dir /proc/nope was "degraded ... free some room"; the daemon refuses it.
    code, found, _ = doctor(*isolated(engine_sockets, "--test", "--state-dir", "/proc/nope"))
    state = found["state directory"]
    assert code == EX_CONFIG and state["status"] == "failed", state
    daemon = subprocess.run(
        [
            sys.executable,
            "-m",
            "patroller",
            "--test",
            "--port",
            "0",
            "--address",
            "127.0.0.1",
            "--state-dir",
            "/proc/nope",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert daemon.returncode == 1
    why = daemon.stderr.split("cannot use the state directory /proc/nope: ")[1].split(";")[0]
    assert state["detail"] == f"/proc/nope cannot be made in /proc: {why}", (state, daemon.stderr)
    assert "choose another --state-dir" in state["fix"]
    assert not os.path.exists("/proc/nope")


def test_the_doctors_help_shows_every_flag_of_the_daemon_it_takes():
    # As found: `patroller doctor --help` showed only [-h] [--json].
    from patroller.config import settings_table

    done = subprocess.run(
        [sys.executable, "-m", "patroller", "doctor", "--help"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    for flag, variable, _ in settings_table():
        assert flag in done.stdout and variable in done.stdout.replace("\n", " "), flag
    assert "--json" in done.stdout
