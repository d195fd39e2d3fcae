"""One examination, in the test process, when every probe is held past the doctor's bound (a
hung file system, a hung nvidia-smi): each check is still said, in the order the daemon meets
them, degraded with what it waited for, and each held probe's thread is named for it. The
probes are the real ones' stand-ins only in that they never return; the engines, the usage
history's check and the bound are the real ones."""

import asyncio
import socket
import sys
import threading
from dataclasses import replace

import pytest
from helpers import engines_in

from patroller.config import Config
from patroller.doctor.examine import examine
from patroller.doctor.results import Result

BLOCKING = (
    "probe_proc",
    "probe_state",
    "probe_job_map",
    "probe_port",
    "probe_socket",
    "probe_unit",
    "probe_privacy",
    "probe_notifications",
    "probe_kernel_log",
)
LATE = "find what is slow there: the daemon would wait on it too"
ENGINES = {
    "Docker Engine",
    "rootless Docker",
    "Podman",
    "rootless Podman",
    "containerd",
    "kubelet pod-resources",
}


@pytest.fixture
def held(monkeypatch):
    """Every probe of the examination held until the test ends; the names of the threads the
    held ones run in."""
    release = threading.Event()
    threads: list[str] = []
    module = sys.modules["patroller.doctor.examine"]

    def holding(name):
        def hold(*args):
            threads.append(threading.current_thread().name)
            release.wait(30)

        hold.__name__ = name
        return hold

    for name in BLOCKING:
        monkeypatch.setattr(module, name, holding(name))

    async def gpu(config, environ):
        await asyncio.Event().wait()  # cancelled at the bound, as nvidia-smi's run is

    monkeypatch.setattr(module, "probe", gpu)
    yield threads
    release.set()


@pytest.mark.timeout(20)
def test_every_probe_still_out_at_the_bound_is_said_check_by_check_in_order(tmp_path, held):
    config = replace(
        Config(
            port=8123,
            address="127.0.0.1",
            state_dir=str(tmp_path / "state"),
            slurm_job_map=str(tmp_path / "jobs"),
            socket=str(tmp_path / "patroller.sock"),
            kernel_log=str(tmp_path / "kmsg"),
            notify_terminal=True,
            notify_utmp=str(tmp_path / "utmp"),
            proc_root="/proc",
            nvidia_smi="/opt/nvidia-smi",
            **engines_in(str(tmp_path)),
        ),
        doctor_deadline=0.5,
        shutdown_grace=1.0,
    )
    results = asyncio.run(examine(config, unit_dirs=[str(tmp_path)]))
    said = [r for r in results if r.check not in ENGINES and r.check != "usage history"]

    def late(check, what):
        return Result(
            check, "degraded", f"no answer within the doctor's 0.5s: waited for {what}", LATE
        )

    assert said == [
        late(
            "nvidia-smi",
            "/opt/nvidia-smi: -q -x, then one sample of dmon and pmon, and --query-compute-apps",
        ),
        late("kernel log", f"the kernel log {tmp_path}/kmsg"),
        late("/proc", "/proc's processes"),
        late("cgroups", "/proc's processes"),
        late("Slurm job map", f"the job map {tmp_path}/jobs"),
        late("state directory", f"the state directory {tmp_path}/state"),
        late("lease book", f"the state directory {tmp_path}/state"),
        late("private files", "the modes of the state directory's files and the audit record"),
        late("address and port", "port 8123: to bind it, or what holds it to answer"),
        late("unix socket", f"the socket path {tmp_path}/patroller.sock"),
        late("systemd unit", "the systemd unit's files and systemctl"),
        late(
            "notifications",
            f"Apprise, to load its services, and the login records {tmp_path}/utmp",
        ),
    ]
    checks = [r.check for r in results]
    assert checks.index("cgroups") < checks.index("Docker Engine") < checks.index("Slurm job map")
    assert (
        checks.index("lease book") < checks.index("usage history") < checks.index("private files")
    )
    assert sorted(held) == sorted(f"doctor-{name}" for name in BLOCKING)


@pytest.mark.timeout(20)
def test_in_test_mode_neither_nvidia_smi_nor_the_kernel_log_is_waited_for(tmp_path, held):
    config = replace(
        Config(test=True, port=0, address="127.0.0.1", **engines_in(str(tmp_path))),
        doctor_deadline=0.3,
    )
    results = asyncio.run(examine(config, unit_dirs=[str(tmp_path)]))
    checks = [r.check for r in results]
    assert results[0] == Result("nvidia-smi", "ok", "not used: --test serves synthetic devices")
    assert checks[1:3] == ["/proc", "cgroups"] and "kernel log" not in checks
    notify = next(r for r in results if r.check == "notifications")
    assert notify.detail == (
        "no answer within the doctor's 0.3s: waited for Apprise, to load its services"
    )
    assert "doctor-probe_kernel_log" not in held


@pytest.mark.timeout(30)
def test_the_probes_answer_with_the_configurations_limits_without_waiting_on_a_full_socket(
    tmp_path,
):
    """The job map read to the configured size of a file; a unix socket whose server takes no
    more connections (its backlog full) answered at once, not waited on until the bound."""
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o755)
    (jobs / "4242").write_text("x" * 100)
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(0)
    queued = []
    while True:  # fill the backlog: a blocking connect now waits for room
        knock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        knock.setblocking(False)
        try:
            knock.connect(path)
        except BlockingIOError:
            knock.close()
            break
        queued.append(knock)
    config = replace(
        Config(
            test=True,
            port=0,
            address="127.0.0.1",
            slurm_job_map=str(jobs),
            socket=path,
            **engines_in(str(tmp_path)),
        ),
        job_map_file_limit=16,
        doctor_deadline=10.0,
    )
    try:
        found = {r.check: r for r in asyncio.run(examine(config, unit_dirs=[str(tmp_path)]))}
    finally:
        for sock in [listener, *queued]:
            sock.close()
    assert found["Slurm job map"].detail == (
        f"{jobs}: 1 file(s), 0 job(s); 1 file(s) not read as a map: 4242 over 16 bytes: the "
        "lines past them are not read"
    )
    assert found["unix socket"].detail.startswith(
        f"{path}: a stale socket nobody answers on, replaced at start"
    )
