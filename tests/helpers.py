"""Small real components shared by the tests: a fake clock, a lease manager as the daemon builds
one, a daemon on a loopback port."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import pickle
import pwd
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from patroller.app import Daemon, build
from patroller.config import Config, policy_of
from patroller.core.devices import Inventory
from patroller.core.identity import Identity
from patroller.core.leases import LeaseManager
from patroller.observe.testmode import synthetic_inventory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = 65534  # an unprivileged uid every Debian has


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def lease_manager(
    clock: Callable[[], float] | None = None, inventory: Inventory | None = None, **overrides: Any
) -> LeaseManager:
    """A lease manager as the daemon builds one, from Config()'s defaults and policy, on the
    synthetic inventory (or `inventory`) and `clock` (the monotonic clock if None). `overrides`
    replace any of lease, policy, max_waiters and max_waiting_per_user."""
    config = Config()
    settings: dict[str, Any] = dict(
        lease=config.lease,
        policy=policy_of(config),
        max_waiters=config.max_waiters,
        max_waiting_per_user=config.max_waiting_per_user,
    )
    unknown = set(overrides) - set(settings)
    if unknown:
        raise TypeError(f"lease_manager() takes no {sorted(unknown)}")
    settings.update(overrides)
    return LeaseManager(
        synthetic_inventory(config.test_devices) if inventory is None else inventory,
        clock=time.monotonic if clock is None else clock,
        **settings,
    )


def async_test(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test function in a fresh event loop."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


class Harness:
    """A running daemon and a way to talk to it over loopback."""

    def __init__(self, daemon: Daemon, url: str) -> None:
        self.daemon = daemon
        self.services = daemon.services  # what it is made of
        self.api = daemon.api  # and what its HTTP layer adds
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        self.http = AsyncHTTPClient(force_instance=True)

    async def call(
        self, path: str, method: str = "GET", body: bytes | None = None, timeout: float = 20
    ) -> tuple[int, Any]:
        """(status, decoded JSON body) of one request."""
        request = HTTPRequest(
            self.url + path,
            method=method,
            body=body,
            request_timeout=timeout,
            allow_nonstandard_methods=True,
        )
        response = await self.http.fetch(request, raise_error=False)
        return response.code, json.loads(response.body)

    async def ok(self, path: str) -> Any:
        """The body of a request that must succeed."""
        status, body = await self.call(path)
        assert status == 200, (path, status, body)
        return body

    async def raw(self, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A plain TCP connection that has sent `data`."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(data)
        await writer.drain()
        return reader, writer

    def uuids(self) -> list[str]:
        return [d.uuid for d in self.services.inventory]


@asynccontextmanager
async def serving(config: Config) -> AsyncIterator[Harness]:
    """The daemon `config` describes, listening on an ephemeral loopback port."""
    daemon = await build(config)
    async with started(daemon) as harness:
        yield harness


@asynccontextmanager
async def started(daemon: Daemon) -> AsyncIterator[Harness]:
    """A daemon built, started and listening on an ephemeral loopback port; stopped after."""
    daemon.start()
    try:
        urls = daemon.listen(0, "127.0.0.1", daemon.services.config.socket)
        harness = Harness(daemon, urls[0])
        try:
            yield harness
        finally:
            harness.http.close()
    finally:
        await daemon.stop(daemon.services.config.shutdown_grace)


def running(**settings: Any) -> Any:
    """A test-mode daemon (async context manager)."""
    return serving(replace(Config(test=True, port=0, address="127.0.0.1"), **settings))


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until predicate() is true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def claimed_known(claim: dict[str, Any]) -> bool:
    """A device's claim as /status shows it: claimed, by an owner known (not `identifying`)."""
    return claim["state"] == "claimed" and not (claim["user"] or {}).get("identifying", False)


def known_claim(leases: LeaseManager, uuid: str) -> bool:
    """The device is claimed by an owner known, not by a process still being looked up (whose
    GPU is claimed by `unknown` for the moment it takes: core/leases/holds.py)."""
    holder = leases.holder(uuid)
    return leases.state(uuid) == "claimed" and holder is not None and not holder.identifying


class ServerProcess:
    """`python -m patroller` as a child process on an ephemeral loopback port."""

    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.args = ["--port", "0", "--address", "127.0.0.1", *args]
        # No lease book unless the test names a --state-dir: in GPU host mode the default is
        # the machine's own directory. The allocator named, as the systemd unit names it: the
        # daemon then starts once, not again with it (main.system_allocator, which
        # test_allocator.py tests without it).
        self.env = {
            **os.environ,
            "PYTHONPATH": ROOT,
            "PATROLLER_STATE_DIR": "",
            "PYTHONMALLOC": "malloc",
            **(env or {}),
        }
        self.preexec_fn = preexec_fn  # run in the child before it starts (resource limits)
        self.process: subprocess.Popen | None = None
        self.url = ""
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed at stop) a file: a full pipe would stall it

    def start(self, timeout: float = 20) -> ServerProcess:
        """Start, and wait until it says where it listens."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "patroller", *self.args],
            env=self.env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            preexec_fn=self.preexec_fn,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r" on (http://[^\s,]+)", self.log)
            if found:
                self.url = found.group(1)
                return self
            if self.process.poll() is not None:
                raise AssertionError("server exited at start: " + self.log)
            time.sleep(0.02)
        self.stop(signal.SIGKILL)
        raise AssertionError("server did not start: " + self.log)

    @property
    def log(self) -> str:
        """Everything it printed so far."""
        self._log.seek(0)
        return self._log.read()

    @property
    def server(self) -> str:
        """host:port, as the client takes it."""
        return self.url[len("http://") :]

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 10) -> int:
        """Signal the server and wait for it; its exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


SIMULATOR = f"{sys.executable} -m patroller.simulator"


class ScenarioFile:
    """A simulator scenario on disk, rewritten atomically so a running simulator re-reads it."""

    def __init__(self, path: str, **scenario: Any) -> None:
        self.path = path
        self.scenario: dict[str, Any] = {"era": "r550", "interval": 0.1, **scenario}
        self.write()

    def write(self, **changes: Any) -> None:
        self.scenario.update(changes)
        temporary = self.path + ".new"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(self.scenario, f)
        os.replace(temporary, self.path)

    @property
    def command(self) -> str:
        """The --nvidia-smi value that runs the simulator on this scenario."""
        return f"{SIMULATOR} --scenario {self.path}"


def gpu_running(scenario: ScenarioFile, **settings: Any) -> Any:
    """A GPU-host-mode daemon on the simulator (async context manager). It follows no kernel
    log unless given one (`kernel_log=`, Config's default): the host's own /dev/kmsg may hold
    Xids of a real GPU at a PCI address the simulator's share."""
    return serving(
        replace(Config(port=0, address="127.0.0.1", nvidia_smi=scenario.command), **settings)
    )


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is `pid`, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(name))
    return found


def streams_of(pid: int) -> list[int]:
    """The children of `pid` that are nvidia-smi's dmon or pmon streams (the daemon also runs
    one-shot queries now and then: -q -x, topo -m)."""
    found = []
    for child in children_of(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if b"dmon" in words or b"pmon" in words:
            found.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def reuse_pid(pid: int) -> subprocess.Popen | None:
    """A new host process (sleep) with a pid that just ended, through
    /proc/sys/kernel/ns_last_pid; None where the kernel does not let us choose."""
    for _ in range(50):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        process = subprocess.Popen(["sleep", "60"])
        if process.pid == pid:
            return process
        process.kill()
        process.wait()
    return None


def need_root(why: str) -> None:
    """Skip when not root, except under CI, which runs as root and must run every test."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run this test as root: {why}")
        pytest.skip(f"needs root: {why}")


# scripts/mutation.sh sets it: a mutation run tests each mutant with the engine-free suite only.
WITHOUT_ENGINES = "PATROLLER_TESTS_WITHOUT_ENGINES"


def engines_left_out(what: str) -> None:
    """Skip a test that needs `what` (a container engine or Slurm) in a mutation run, where
    PATROLLER_TESTS_WITHOUT_ENGINES=1 leaves them out; under CI=true, which must run every test,
    that variable fails the test instead."""
    if os.environ.get(WITHOUT_ENGINES, "") in ("", "0"):
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the tests that need {what}, but {WITHOUT_ENGINES} is set")
    pytest.skip(f"{what} left out: {WITHOUT_ENGINES} is set (a mutation run, scripts/mutation.sh)")


def python_for(uid: int) -> str:
    """A Python that `uid` may run (the test's own may lie under root's home); stdlib only."""
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        try:
            subprocess.run(
                [candidate, "-c", ""],
                user=uid,
                group=uid,
                extra_groups=[],
                capture_output=True,
                check=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        return candidate
    pytest.fail(f"no Python that uid {uid} may run")


def unused_uid(start: int) -> int:
    """The first uid from `start` up that names no account here."""
    uid = start
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


# A rootless engine's user, and a uid of a user namespace (as LXD and the rootless engines hand
# them out): neither an account here, and each test run its own (cgroups are named after them).
ROOTLESS_UID = unused_uid(30000 + os.getpid() % 20000)
SHIFTED_UID = unused_uid(1000000 + os.getpid() % 50000)


def user_manager(uid: int) -> str:
    """The cgroup of a user's systemd manager, under which its rootless engines run."""
    return f"/user.slice/user-{uid}.slice/user@{uid}.service"


def engines_in(folder: str, **more: Any) -> dict[str, Any]:
    """Config settings with every container engine's socket in `folder` (none there unless a
    test puts it there), the Docker Engine's too, and `more`."""
    return {
        "docker_host": f"unix://{folder}/docker.sock",
        "podman_socket": f"unix://{folder}/podman.sock",
        "rootless_docker_socket": f"unix://{folder}/{{uid}}/docker.sock",
        "rootless_podman_socket": f"unix://{folder}/{{uid}}/podman/podman.sock",
        "containerd_socket": f"unix://{folder}/containerd.sock",
        **more,
    }


def cgroup_root(version: int) -> str | None:
    """Where a test may make cgroups of one hierarchy: v1's freezer (a process moved there
    runs on as before), or v2's (unified, on a hybrid host); None if the host has none."""
    if version == 1:
        root = "/sys/fs/cgroup/freezer"
        return root if os.path.isfile(os.path.join(root, "cgroup.procs")) else None
    for root in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.isfile(os.path.join(root, "cgroup.controllers")):
            return root
    return None


@contextmanager
def process_in_cgroup(
    path: str, uid: int = NOBODY, version: int = 1, env: dict[str, str] | None = None
) -> Iterator[int]:
    """`sleep` as `uid`, moved into the cgroup `path` (as a runtime would make it) of one
    hierarchy, v1 or v2: its pid. The directories made for it are removed after; those there
    before are left. Needs root."""
    need_root("it makes cgroups")
    root = cgroup_root(version)
    if root is None:
        pytest.skip(f"this host mounts no cgroup v{version} hierarchy to make cgroups in")
    parts = [p for p in path.split("/") if p]
    made = [
        depth
        for depth in range(1, len(parts) + 1)
        if not os.path.isdir(os.path.join(root, *parts[:depth]))
    ]
    where = os.path.join(root, *parts)
    for _ in range(20):  # another test may remove a shared parent (user.slice) meanwhile
        try:
            os.makedirs(where, exist_ok=True)
            break
        except FileNotFoundError:
            time.sleep(0.01)
    sleeper = subprocess.Popen(
        ["sleep", "120"],
        user=uid,
        group=uid,
        extra_groups=[],
        env={**(env or {}), "PATH": "/usr/bin:/bin"},
    )
    try:
        with open(os.path.join(where, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
        yield sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()
        for depth in reversed(made):
            try:
                os.rmdir(os.path.join(root, *parts[:depth]))
            except OSError:  # in use by another test's cgroup
                pass


@contextmanager
def slurm_job_process(
    job: str, step: str = "0", uid: int = NOBODY, **job_env: str
) -> Iterator[int]:
    """`sleep` as `uid`, moved into the cgroup of a job's step as slurmstepd makes it (a v1
    hierarchy, freezer, where the host has one; else v2), with SLURM_JOB_<KEY> variables from
    `job_env` (account=..., partition=...): its pid. Needs root."""
    need_root("it makes a job's cgroup")
    tag = f"pt{os.getpid()}_{job}_{step}"
    if cgroup_root(1) is not None:
        version, path = 1, f"slurm_{tag}/uid_{uid}/job_{job}/step_{step}"
    else:
        version, path = 2, f"system.slice/{tag}_slurmstepd.scope/job_{job}/step_{step}"
    env = {f"SLURM_JOB_{key.upper()}": value for key, value in job_env.items()}
    with process_in_cgroup(path, uid, version, env) as pid:
        yield pid


# -- the lease rules' tests of allocations (Slurm's, the kubelet's) -----------------------------


def host_user(user: str, uid: int) -> Identity:
    """A host account's process."""
    return Identity(user=user, source="host", account=user, uid=uid)


def recorded(leases) -> list:
    """The lease manager's audit events, as they come."""
    events: list = []
    leases.on_event(events.append)
    return events


def uuid_of(leases, number: int) -> str:
    """The uuid of device `number`."""
    return leases.inventory.by_number(number).uuid


# -- /metrics ---------------------------------------------------------------------------------


async def scrape(h, accept=None):
    """One scrape of /metrics, parsed with prometheus_client: {(sample name,
    frozenset(labels)): value}, its content type, and its text."""
    headers = {"Accept": accept} if accept else {}
    response = await h.http.fetch(HTTPRequest(h.url + "/metrics", headers=headers))
    text = response.body.decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, response.headers["Content-Type"], text


def find(samples, name, **labels):
    """Values of the samples of `name` whose labels include `labels`."""
    return [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]


# -- containers' processes (the Docker Engine's, Podman's) ----------------------------------

TESTS = os.path.dirname(os.path.abspath(__file__))


def on_gpu(*pids_and_gpus):
    """pmon's processes in a scenario: (pid, GPU) pairs, each a compute process."""
    return [{"pid": pid, "gpu": gpu, "type": "C", "name": "python"} for pid, gpu in pids_and_gpus]


def client_in(container, server, code):
    """Run the client in a fresh host process moved into the container's cgroups."""
    script = (
        "import json, os, sys\n"
        f"sys.path[:0] = [{ROOT!r}, {TESTS!r}]\n"
        "from dockerd import Container\n"
        "from patroller import client\n"
        f"Container.adopt_pid({container.pid}, os.getpid())\n"
        f"server = {server!r}\n"
        f"{code}\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def forked_as(user: Any, fn: Callable[[], Any]) -> Any:
    """fn() run in a child of this process that has become `user`, as a daemon that does not
    run as root; what it returned."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(reading)
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            answer = pickle.dumps(("returned", fn()))
        except BaseException as exc:  # noqa: B036 - told to the parent, whatever it is
            answer = pickle.dumps(("raised", repr(exc)))
        with os.fdopen(writing, "wb") as f:
            f.write(answer)
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as f:
        how, what = pickle.loads(f.read())
    os.waitpid(pid, 0)
    assert how == "returned", what
    return what
