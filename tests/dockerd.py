"""A private Docker Engine for the identity tests: started, used and stopped by the tests.

Everything lives under one short directory (unix socket paths are limited to 107 bytes). The
test image is busybox imported from a tarball: no registry is needed. Containers run with
`--network none`.
"""
from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from typing import Dict, List, Optional, Union

IMAGE = "patroller-test-busybox"


class EngineUnavailable(Exception):
    """No Docker Engine can be started here; the message says why."""


class Engine:
    """dockerd in a private directory, and the containers the tests ran on it."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="ptd", dir="/tmp")
        self.socket = os.path.join(self.root, "docker.sock")
        self.url = f"unix://{self.socket}"
        self.process: Optional[subprocess.Popen] = None
        self.containers: List[str] = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 30) -> "Engine":
        for tool in ("dockerd", "docker", "busybox"):
            if shutil.which(tool) is None:
                raise EngineUnavailable(f"{tool} is not installed (tests/setup.sh installs "
                                        "docker.io and busybox-static on Debian and Ubuntu)")
        if os.geteuid() != 0:
            raise EngineUnavailable("dockerd needs root")
        log = open(os.path.join(self.root, "dockerd.log"), "wb")
        self.process = subprocess.Popen(
            ["dockerd", "--host", self.url, "--data-root", os.path.join(self.root, "data"),
             "--exec-root", os.path.join(self.root, "exec"),
             "--pidfile", os.path.join(self.root, "dockerd.pid"),
             "--iptables=false", "--ip6tables=false", "--ip-masq=false", "--bridge=none",
             "--storage-driver=overlay2", "--exec-opt", "native.cgroupdriver=cgroupfs"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            close_fds=True)
        log.close()
        deadline = time.monotonic() + timeout
        while self.docker("version", check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log()[-2000:]
                self.stop()
                raise EngineUnavailable(f"dockerd did not start: {tail}")
            time.sleep(0.1)
        try:
            self._import_image()
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Remove the containers, stop dockerd, delete the directory."""
        if self.process is not None and self.process.poll() is None:
            if self.containers:
                self.docker("rm", "-f", *self.containers, check=False)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        subprocess.run(["umount", "-R", os.path.join(self.root, "exec")], capture_output=True)
        subprocess.run(["umount", "-R", os.path.join(self.root, "data")], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        try:
            with open(os.path.join(self.root, "dockerd.log"), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # -- using it -----------------------------------------------------------------------

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run the docker CLI against this engine."""
        result = subprocess.run(["docker", "--host", self.url, *args], capture_output=True,
                                text=True, timeout=60)
        if check and result.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {result.stderr.strip()}")
        return result

    def run(self, *args: str, labels: Optional[Dict[str, str]] = None,
            command: Union[str, List[str]] = "sleep 600") -> "Container":
        """Start a container of the test image, with labels, and no network."""
        label_args = [arg for key, value in (labels or {}).items()
                      for arg in ("--label", f"{key}={value}")]
        argv = command.split() if isinstance(command, str) else command
        cid = self.docker("run", "-d", "--network", "none", *label_args, *args, IMAGE,
                          *argv).stdout.strip()
        self.containers.append(cid)
        return Container(self, cid)

    def _import_image(self) -> None:
        result = subprocess.run(
            ["docker", "--host", self.url, "import", "-c", "ENV PATH=/bin", "-c", 'CMD ["/bin/sh"]',
             "-", IMAGE], input=busybox_rootfs(), capture_output=True, timeout=60)
        if result.returncode != 0:
            raise EngineUnavailable(f"cannot import the test image: {result.stderr.decode()}")


def busybox_rootfs() -> bytes:
    """A tarball of a root file system: the host's busybox and a link for each of its applets."""
    busybox = shutil.which("busybox")
    assert busybox is not None
    listed = subprocess.run([busybox, "--list"], capture_output=True, text=True).stdout.split()
    applets = sorted(set(listed) - {"busybox"})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in ("bin", "tmp", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in applets:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    return buffer.getvalue()


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


def _mount_of(controllers: str) -> Optional[str]:
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


def _pids_in_cgroup_of(pid: int) -> List[int]:
    with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
        line = next(l for l in f if ":memory:" in l or l.startswith("0::"))
    number, controllers, path = line.rstrip("\n").split(":", 2)
    mount = _mount_of(controllers)
    assert mount is not None
    with open(os.path.join(mount, path.lstrip("/"), "cgroup.procs"), encoding="ascii") as f:
        return [int(x) for x in f.read().split()]
