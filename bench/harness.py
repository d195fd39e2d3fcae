"""The benchmark's machinery: a daemon on the simulator, real processes, wrk, /proc readings."""

from __future__ import annotations

import http.client
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the private Docker Engine of the tests

TICK = os.sysconf("SC_CLK_TCK")


def raise_file_limit() -> int:
    """Allow as many open files as the hard limit does (1,000 waiters need 2,000 sockets)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return wanted


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    with open("/proc/meminfo", encoding="ascii") as f:
        memory = int(f.readline().split()[1]) // 1024 // 1024
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": memory,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d"),
    }


# -- processes ------------------------------------------------------------------------------


class Sleepers:
    """Real host processes that stand for GPU jobs."""

    def __init__(self) -> None:
        self.processes: dict[int, subprocess.Popen] = {}

    def start(self, count: int) -> list[int]:
        started = [subprocess.Popen(["sleep", "86400"]) for _ in range(count)]
        for process in started:
            self.processes[process.pid] = process
        return [p.pid for p in started]

    def kill(self, pid: int) -> None:
        process = self.processes.pop(pid)
        process.kill()
        process.wait()

    def stop(self) -> None:
        for pid in list(self.processes):
            self.kill(pid)


class Containers:
    """Labelled containers full of processes, on the tests' private Docker Engine, if any."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.reason = ""

    def start(self) -> bool:
        try:
            from dockerd import Engine, EngineUnavailable
        except ImportError as exc:
            self.reason = str(exc)
            return False
        try:
            self.engine = Engine().start()
        except EngineUnavailable as exc:
            self.reason = str(exc)
            return False
        return True

    @property
    def url(self) -> str | None:
        return self.engine.url if self.engine else None

    def run(self, email: str, processes: int) -> tuple[Any, list[int]]:
        """A container labelled with `email` running `processes` sleeps; (container, their
        pids)."""
        script = f"for i in $(seq {processes}); do sleep 86400 & done; wait"
        container = self.engine.run(
            labels={"user.email": email, "team": "bench"}, command=["sh", "-c", script]
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = [p for p in cgroup_pids(container.pid) if p != container.pid]
            if len(pids) >= processes:
                return container, pids[:processes]
            time.sleep(0.05)
        raise RuntimeError("the container's processes did not start")

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()


def cgroup_pids(pid: int) -> list[int]:
    """The pids in the memory (or v2) cgroup of a process."""
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
        for line in f:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers in ("memory", ""):
                base = "/sys/fs/cgroup/memory" if controllers else "/sys/fs/cgroup/unified"
                with open(
                    os.path.join(base, path.lstrip("/"), "cgroup.procs"), encoding="ascii"
                ) as procs:
                    return [int(x) for x in procs.read().split()]
    return []


# -- the daemon -----------------------------------------------------------------------------


class Daemon:
    """`python -m patroller` in GPU host mode on the simulator, with its scenario."""

    def __init__(
        self,
        gpus: int,
        interval: float = 1.0,
        lease: float = 10.0,
        docker_host: str | None = None,
        state_dir: str | None = None,
    ) -> None:
        self.dir = tempfile.mkdtemp(prefix="pbench")
        self.scenario_path = os.path.join(self.dir, "scenario.json")
        self.trace = os.path.join(self.dir, "pmon.trace")
        self.scenario: dict[str, Any] = {
            "era": "r550",
            "interval": interval,
            "live_pids_only": True,
            "trace": self.trace,
            "devices": [{"minor": n} for n in range(gpus)],
            "processes": [],
        }
        self.write()
        self.lease = lease
        self.docker_host = docker_host
        self.state_dir = state_dir  # None: no lease book (the default would be the machine's)
        self._next_gpu = 0
        self.process: subprocess.Popen | None = None
        self.port = 0
        self._log = open(os.path.join(self.dir, "daemon.log"), "w+")  # noqa: SIM115 (closed when the child is stopped)

    def write(self, processes: list[dict[str, Any]] | None = None) -> None:
        """Rewrite the scenario (atomically): the simulator picks it up at its next interval."""
        if processes is not None:
            self.scenario["processes"] = processes
        temporary = self.scenario_path + ".new"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(self.scenario, f)
        os.replace(temporary, self.scenario_path)

    def place(self, pids: Iterable[int]) -> None:
        """Put processes on the devices, round robin; a process already placed stays put."""
        gpus = len(self.scenario["devices"])
        placed = {p["pid"]: p["gpu"] for p in self.scenario["processes"]}
        processes = []
        for pid in pids:
            if pid not in placed:
                placed[pid] = self._next_gpu % gpus
                self._next_gpu += 1
            processes.append({"pid": pid, "gpu": placed[pid], "type": "C", "name": "python"})
        self.write(processes)

    def start(self) -> Daemon:
        simulator = f"{sys.executable} -m patroller.simulator --scenario {self.scenario_path}"
        # One process stands for many users here (10,000 waiters): no per-caller connection cap.
        # --config none: never the host's own /etc/patroller/patroller.toml
        args = [
            sys.executable,
            "-m",
            "patroller",
            "--config",
            "none",
            "--port",
            "0",
            "--address",
            "127.0.0.1",
            "--max-connections-per-caller",
            "1000000",
            "--lease",
            str(self.lease),
            "--state-dir",
            self.state_dir or "none",
            "--nvidia-smi",
            simulator,
            "--log-level",
            os.environ.get("PBENCH_LOG_LEVEL", "warning"),
        ]
        env = {**os.environ, "PYTHONPATH": ROOT}
        if self.docker_host:
            env["DOCKER_HOST"] = self.docker_host
        else:
            env["DOCKER_HOST"] = f"unix://{self.dir}/no-docker.sock"  # none: host accounts only
        self.process = subprocess.Popen(
            args,
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        # The log level hides the "serving" line: find the port from the listening socket.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.port = listening_port(self.process.pid)
            if self.port:
                return self
            if self.process.poll() is not None:
                raise RuntimeError("the daemon exited: " + self.log())
            time.sleep(0.05)
        raise RuntimeError("the daemon did not start: " + self.log())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        self._log.flush()
        with open(self._log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-3000:]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = 30) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    def raw(self, path: str) -> bytes:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", path)
            return connection.getresponse().read()
        finally:
            connection.close()

    def ok(self, path: str) -> Any:
        status, body = self.get(path)
        if status != 200:
            raise RuntimeError(f"{path}: {status} {body}")
        return body

    def wait_for(self, predicate: Any, timeout: float = 60, every: float = 0.05) -> float:
        """Poll until predicate(/status) is true; the time it became true."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.ok("/status")):
                return time.time()
            time.sleep(every)
        raise RuntimeError("condition not reached: " + self.log())

    def streams(self) -> list[list[str]]:
        """The command lines of the simulator's dmon and pmon the daemon runs (its children)."""
        assert self.process is not None
        found = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                if parent != self.process.pid:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = [arg.decode() for arg in f.read().split(b"\0")[:-1]]
            except (OSError, ValueError, IndexError):
                continue  # not a process, or one that ended meanwhile
            if "patroller.simulator" in argv and {"dmon", "pmon"} & set(argv):
                found.append(argv)
        return sorted(found)

    def cpu_seconds(self) -> float:
        """The daemon's CPU time so far (user + system), not its children's."""
        assert self.process is not None
        return cpu_seconds(self.process.pid)

    def rss_mib(self) -> float:
        assert self.process is not None
        return rss_mib(self.process.pid)


class Streams:
    """The simulator's dmon and pmon as a daemon ran them, printing into /dev/null: the load the
    GPU's own tools put on a host whatever reads them (here the simulator stands for
    nvidia-smi, on the same 2 cores as the server and wrk). Made from a running daemon; its
    scenario is copied, so that it runs on after the daemon stops."""

    def __init__(self, daemon: Daemon) -> None:
        self.argvs = daemon.streams()
        self.scenario = dict(daemon.scenario)
        self.processes: list[subprocess.Popen] = []
        self.dir = ""

    def __enter__(self) -> Streams:
        self.dir = tempfile.mkdtemp(prefix="pstreams")
        path = os.path.join(self.dir, "scenario.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({**self.scenario, "trace": os.path.join(self.dir, "pmon.trace")}, f)
        env = {**os.environ, "PYTHONPATH": ROOT}
        for argv in self.argvs:
            at = argv.index("--scenario") + 1
            self.processes.append(
                subprocess.Popen(
                    [*argv[:at], path, *argv[at + 1 :]],
                    cwd=ROOT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        return self

    def __exit__(self, *exc: Any) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(10)
        self.processes = []
        shutil.rmtree(self.dir, ignore_errors=True)


def listening_port(pid: int) -> int:
    """The TCP port a process listens on, from its sockets and /proc/net/tcp."""
    try:
        inodes = {
            os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1]
            for fd in os.listdir(f"/proc/{pid}/fd")
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")
        }
    except OSError:
        return 0
    with open("/proc/net/tcp", encoding="ascii") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                return int(fields[1].split(":")[1], 16)
    return 0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def processes_on(status: dict[str, Any]) -> int:
    """The processes on the GPUs whose owners are known: one still being looked up shows as
    `unknown` for the moment it takes, and the benchmark's processes all have owners (a
    measurement waits for them, not for their lookups to be under way)."""
    return sum(
        1
        for entry in status.values()
        for process in entry["claim"]["process_detail"]
        if process["user"] != "unknown"
    )


# -- load -----------------------------------------------------------------------------------


def wrk(
    url: str, seconds: float, connections: int = 32, headers: Iterable[str] = ()
) -> dict[str, Any]:
    """Requests per second and latency percentiles from wrk (one thread, N connections), each
    request with `headers` ("Name: value") added; no percentile (None) where no request was
    answered: wrk prints a latency of 0 for them, which a ratio would read as fast."""
    extra = [arg for header in headers for arg in ("-H", header)]
    result = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    text = result.stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    percentiles: dict[str, float | None] = {}
    for name, value, unit in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", text, re.M):
        scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
        percentiles[f"p{name}_ms"] = round(float(value) * scale, 2)
    done = re.search(r"(\d+) requests in", text)
    if done is None or int(done.group(1)) == 0:  # wrk prints 0 for a run that ended none
        percentiles = {"p50_ms": None, "p99_ms": None}
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    return {
        "requests_per_s": round(rate),
        **percentiles,
        "errors": int(errors.group(1)) if errors else 0,
    }


def middle(values: Iterable[float | None]) -> float | None:
    """The median of the values measured (None: a run that measured nothing), or None."""
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def ratio(part: float | None, whole: float | None, digits: int = 2) -> float | None:
    """`part` as a multiple of `whole`; None unless both were measured (and `whole` is not 0)."""
    return round(part / whole, digits) if part is not None and whole else None


def have_wrk() -> bool:
    return shutil.which("wrk") is not None
