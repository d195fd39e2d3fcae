"""A private Docker Engine for the identity tests: started, used and stopped by the tests.

Everything lives under one short directory (private.py says what the engines share). The test
image is busybox imported from a tarball: no registry is needed. Containers run with
`--network none`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from private import LabelledRuns, PrivateDaemon, Unavailable, busybox_rootfs

IMAGE = "patroller-test-busybox"


class EngineUnavailable(Unavailable):
    """No Docker Engine can be started here; the message says why."""


class Engine(PrivateDaemon, LabelledRuns["Container"]):
    """dockerd in a private directory, and the containers the tests ran on it."""

    what, log_name, unavailable = "dockerd", "dockerd.log", EngineUnavailable
    image = IMAGE

    def __init__(self) -> None:
        super().__init__("ptd")
        self.socket = self.path("docker.sock")
        self.url = f"unix://{self.socket}"
        self.containers: list[str] = []

    # -- lifecycle ------------------------------------------------------------------------

    def prepare(self) -> None:
        self.need(
            ("dockerd", "docker", "busybox"),
            "tests/setup.sh installs docker.io and busybox-static on Debian and Ubuntu",
        )

    def run_daemon(self, timeout: float | None = None) -> None:
        self.spawn(
            [
                "dockerd",
                "--host",
                self.url,
                "--data-root",
                self.path("data"),
                "--exec-root",
                self.path("exec"),
                "--pidfile",
                self.path("dockerd.pid"),
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
                "--bridge=none",
                "--storage-driver=overlay2",
                "--exec-opt",
                "native.cgroupdriver=cgroupfs",
            ],
            lambda: self.docker("version", check=False).returncode == 0,
            timeout,
        )

    def stop(self) -> None:
        """Remove the containers, stop dockerd, delete the directory."""
        if self.running() and self.containers:
            self.docker("rm", "-f", *self.containers, check=False)
        self.halt()
        subprocess.run(["umount", "-R", self.path("exec")], capture_output=True)
        subprocess.run(["umount", "-R", self.path("data")], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- using it -----------------------------------------------------------------------

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run the docker CLI against this engine."""
        result = subprocess.run(
            ["docker", "--host", self.url, *args], capture_output=True, text=True, timeout=60
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {result.stderr.strip()}")
        return result

    def output(self, *args: str) -> str:
        return self.docker(*args).stdout.strip()

    def container(self, cid: str) -> Container:
        return Container(self, cid)

    def import_image(self) -> None:
        result = subprocess.run(
            [
                "docker",
                "--host",
                self.url,
                "import",
                "-c",
                "ENV PATH=/bin",
                "-c",
                'CMD ["/bin/sh"]',
                "-",
                IMAGE,
            ],
            input=busybox_rootfs(),
            capture_output=True,
            timeout=60,
        )
        if result.returncode != 0:
            raise EngineUnavailable(f"cannot import the test image: {result.stderr.decode()}")


class Container:
    """A running test container."""

    def __init__(self, engine: Engine, cid: str) -> None:
        self.engine = engine
        self.id = cid
        self.short = cid[:12]
        self.name = engine.docker("inspect", "-f", "{{.Name}}", cid).stdout.strip().lstrip("/")
        self.pid = int(engine.docker("inspect", "-f", "{{.State.Pid}}", cid).stdout.strip())

    def exec_pid(self, command: str = "sleep 600") -> int:
        """Start another process in the container; its host pid."""
        self.engine.docker("exec", "-d", self.id, *command.split())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for pid in _pids_in_cgroup_of(self.pid):
                if pid != self.pid and _cmdline(pid).startswith(command.split()[0]):
                    return pid
            time.sleep(0.05)
        raise RuntimeError("the exec'd process did not show up")

    def adopt(self, pid: int) -> None:
        """Move a host process into this container's cgroups, so it looks like one of its own."""
        self.adopt_pid(self.pid, pid)

    @staticmethod
    def adopt_pid(container_pid: int, pid: int) -> None:
        """Move `pid` into the cgroups of the container whose main process is `container_pid`."""
        with open(f"/proc/{container_pid}/cgroup", encoding="ascii") as f:
            for line in f:
                number, controllers, path = line.rstrip("\n").split(":", 2)
                mount = _mount_of(controllers)
                if mount is None:
                    continue
                procs = os.path.join(mount, path.lstrip("/"), "cgroup.procs")
                try:
                    with open(procs, "w", encoding="ascii") as out:
                        out.write(str(pid))
                except OSError:
                    continue

    def remove(self) -> None:
        self.engine.docker("rm", "-f", self.id, check=False)


def _mount_of(controllers: str) -> str | None:
    if controllers == "":
        path = "/sys/fs/cgroup/unified"
        return path if os.path.isdir(path) else "/sys/fs/cgroup"
    name = controllers.split(",")[0].replace("name=", "")
    path = os.path.join("/sys/fs/cgroup", name)
    return path if os.path.isdir(path) else None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _pids_in_cgroup_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
        line = next(x for x in f if ":memory:" in x or x.startswith("0::"))
    number, controllers, path = line.rstrip("\n").split(":", 2)
    mount = _mount_of(controllers)
    assert mount is not None
    with open(os.path.join(mount, path.lstrip("/"), "cgroup.procs"), encoding="ascii") as f:
        return [int(x) for x in f.read().split()]
