"""What the tests' private container engines share (dockerd.py, containerd.py, podman.py).

Each lives in one short temporary directory of its own (unix socket paths are limited to 107
bytes), with its socket and its log file there; is started in a session of its own and waited
for until it answers (the tail of its log in the error when it does not), then given the test
image, busybox from a tarball made here (no registry); is removed whole when any step of its
start fails; and is stopped with SIGTERM, then killed if it lingers. The Docker Engine and
Podman also share how a test starts a container: the test image, with labels, and no network
(`LabelledRuns`).
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
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar


class Unavailable(Exception):
    """No such engine can be started here; the message says why."""


D = TypeVar("D", bound="PrivateDaemon")


class PrivateDaemon(ABC):
    """A daemon in a private directory: `what` it is (in errors), the file it logs to, the
    exception that says it cannot run here, and how long its start may take."""

    what: ClassVar[str]
    log_name: ClassVar[str]
    unavailable: ClassVar[type[Unavailable]]
    start_timeout: ClassVar[float] = 30

    def __init__(self, prefix: str) -> None:
        self.root = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        self.process: subprocess.Popen | None = None

    def start(self: D, timeout: float | None = None) -> D:
        """Check what it needs, start it, wait until it answers, import the test image; when
        any of it fails, stop (its directory removed) and raise."""
        try:
            self.prepare()
            self.run_daemon(timeout)
            self.import_image()
        except Exception:
            self.stop()
            raise
        return self

    def prepare(self) -> None:  # noqa: B027 (a hook with a default: not abstract)
        """Before the daemon starts: check the tools, write its configuration. Nothing by
        default."""

    @abstractmethod
    def run_daemon(self, timeout: float | None = None) -> None:
        """Start the daemon (`spawn`), and return once it answers."""

    @abstractmethod
    def import_image(self) -> None:
        """Give the daemon the test image."""

    @abstractmethod
    def stop(self) -> None:
        """Remove what the tests made, stop the daemon (`halt`), delete the directory."""

    def path(self, *parts: str) -> str:
        """A path in the private directory."""
        return os.path.join(self.root, *parts)

    def need(self, tools: tuple[str, ...], hint: str) -> None:
        """Raise `unavailable` unless every tool is installed (`hint`: what installs them) and
        this runs as root."""
        for tool in tools:
            if shutil.which(tool) is None:
                raise self.unavailable(f"{tool} is not installed ({hint})")
        if os.geteuid() != 0:
            raise self.unavailable(f"{self.what} needs root")

    def spawn(
        self, argv: list[str], answers: Callable[[], bool], timeout: float | None, **popen: Any
    ) -> None:
        """Start `argv` in a session of its own, its output appended to the log; return once
        `answers()`; raise `unavailable`, with the log's tail, if it exits or `timeout` s
        (`start_timeout` if None) pass first."""
        with open(self.path(self.log_name), "ab") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
                **popen,
            )
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while not answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise self.unavailable(f"{self.what} did not start: {self.log()[-2000:]}")
            time.sleep(0.1)

    def running(self) -> bool:
        """Whether the daemon was started and has not exited."""
        return self.process is not None and self.process.poll() is None

    def halt(self, signum: int = signal.SIGTERM, grace: float = 20) -> None:
        """Send the daemon `signum` and wait for it to end; kill it after `grace` s."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        """What the daemon printed."""
        try:
            with open(self.path(self.log_name), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""


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


C = TypeVar("C")


class LabelledRuns(ABC, Generic[C]):
    """`run` of an engine with a Docker-like command line: a container of the busybox test
    `image`, with labels, and no network, kept in `containers` to be removed at stop."""

    image: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ()  # of every `run`
    containers: list[str]

    def run(
        self,
        *args: str,
        labels: dict[str, str] | None = None,
        command: str | list[str] = "sleep 600",
    ) -> C:
        """Start a container of the test image, with labels, and no network."""
        label_args = [
            arg for key, value in (labels or {}).items() for arg in ("--label", f"{key}={value}")
        ]
        argv = command.split() if isinstance(command, str) else command
        cid = self.output(
            "run", "-d", "--network", "none", *self.options, *label_args, *args, self.image, *argv
        )
        self.containers.append(cid)
        return self.container(cid)

    @abstractmethod
    def output(self, *args: str) -> str:
        """What the engine's command prints, run with `args` (stripped); an error if it fails."""

    @abstractmethod
    def container(self, cid: str) -> C:
        """The container `cid`, started by `run`."""
