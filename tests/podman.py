"""A private Podman service for the identity tests: started, used and stopped by the tests.

Rootful: `podman system service` as root, with its own storage (--root, --runroot) and socket
in one temporary directory. Rootless: the same, as a throwaway user made for the run (useradd,
with subordinate uid and gid ranges in /etc/subuid and /etc/subgid; newuidmap maps them), its
socket at <directory>/<uid>/podman/podman.sock, as --rootless-podman-socket's template says
where a user's service listens. The test image is busybox imported from a tarball: no registry.

What this host allows (cgroup v1, the tests run as root in a container), and so what is used
everywhere: the vfs storage driver, the cgroupfs cgroup manager, runc (crun refuses cgroup v1
"hybrid mode"), `--network none`, and file limits at 1024 (Podman's default exceeds the hard
limit of some hosts). A rootful container's cgroup is then /libpod_parent/libpod-<id>.

A rootless Podman makes cgroups for its containers only with systemd on cgroup v2 (a user's
delegated slice): elsewhere its containers stay in the cgroup of whoever started them. There,
the test puts the container's process into the cgroup Podman would have made for it,
/user.slice/user-<uid>.slice/user@<uid>.service/user.slice/libpod-<id>.scope/container
(`Container.place`); the container, its process, its uid and the service are Podman's own.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from helpers import cgroup_root, unused_uid, user_manager
from private import LabelledRuns, PrivateDaemon, Unavailable, busybox_rootfs

from patroller.identify.cgroups import parse_cgroup

IMAGE = "localhost/patroller-test-busybox:latest"
LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


class PodmanUnavailable(Unavailable):
    """No Podman service can be started here; the message says why."""


class UserNamespacesRefused(PodmanUnavailable):
    """The kernel lets no unprivileged user make a user namespace: rootless Podman cannot run."""


class Account:
    """A throwaway user with subordinate uid and gid ranges, removed after."""

    def __init__(self) -> None:
        self.uid = unused_uid(50000 + os.getpid() % 10000)
        self.name = f"podman-t{self.uid}"
        made = subprocess.run(
            [
                "useradd",
                "--uid",
                str(self.uid),
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                self.name,
            ],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise PodmanUnavailable(f"useradd {self.name}: {made.stderr.strip()}")
        self.gid = pwd.getpwnam(self.name).pw_gid
        try:
            for table, flag in (
                ("/etc/subuid", "--add-subuids"),
                ("/etc/subgid", "--add-subgids"),
            ):
                if not _ranges_of(table, self.name):  # useradd did not give it one
                    first = max([100000] + [start + count for _, start, count in _ranges(table)])
                    subprocess.run(
                        ["usermod", flag, f"{first}-{first + 65535}", self.name],
                        capture_output=True,
                        check=True,
                    )
        except (OSError, subprocess.CalledProcessError) as exc:
            self.remove()
            raise PodmanUnavailable(f"cannot give {self.name} subordinate ids: {exc}") from None

    def check_user_namespaces(self) -> None:
        """Raise UserNamespacesRefused if the kernel refuses this user a user namespace."""
        tried = subprocess.run(
            ["unshare", "--user", "true"],
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            cwd="/",
        )
        if tried.returncode != 0:
            raise UserNamespacesRefused(
                f"`unshare --user true` as uid {self.uid} failed: {tried.stderr.strip()}"
            )

    def kill_processes(self) -> None:
        """Every process of this user (the rootless service's pause process among them)."""
        for pid in _pids_of(self.uid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self) -> None:
        self.kill_processes()
        deadline = time.monotonic() + 10
        while _pids_of(self.uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run(["userdel", self.name], capture_output=True)


class Podman(PrivateDaemon, LabelledRuns["Container"]):
    """A Podman service in a private directory, and the containers the tests ran on it;
    rootless when it runs as `user`."""

    what, log_name, unavailable = "podman system service", "service.log", PodmanUnavailable
    start_timeout = 60
    image, options = IMAGE, LIMITS

    def __init__(self, user: Account | None = None) -> None:
        super().__init__("podman-")
        self.user = user
        os.chmod(self.root, 0o755)
        if user is None:
            self.socket = self.path("podman.sock")
            self.home = self.runtime = self.root
        else:
            self.runtime = self.path(str(user.uid))  # its XDG_RUNTIME_DIR
            self.socket = os.path.join(self.runtime, "podman", "podman.sock")
            self.home = self.path("home")
            for folder in (
                self.runtime,
                os.path.dirname(self.socket),
                self.home,
                self.path("store"),
            ):
                os.makedirs(folder, mode=0o700, exist_ok=True)
                os.chown(folder, user.uid, user.gid)
        self.url = f"unix://{self.socket}"
        # --rootless-podman-socket for this service: {uid} is the user's
        self.template = f"unix://{self.root}/{{uid}}/podman/podman.sock"
        store = self.path("store")
        self.storage = [
            "--root",
            os.path.join(store, "root"),
            "--runroot",
            os.path.join(store, "run"),
            "--tmpdir",
            os.path.join(store, "tmp"),
            "--storage-driver",
            "vfs",
            "--cgroup-manager",
            "cgroupfs",
            "--runtime",
            "runc",
            "--events-backend",
            "file",
        ]
        self.containers: list[str] = []
        self.cgroups: list[str] = []  # the cgroups `place` made, deepest last

    # -- lifecycle ------------------------------------------------------------------------

    def run_daemon(self, timeout: float | None = None) -> None:
        """`podman system service` on this directory's socket (again, after stop_service)."""
        self.spawn(
            ["podman", *self.storage, "system", "service", "--time=0", self.url],
            self.answers,
            timeout,
            cwd="/",
            env=self._env(),
            **self._as_user(),
        )

    def stop_service(self, signum: int = signal.SIGTERM) -> None:
        """Stop the service; its containers run on (conmon watches them)."""
        self.halt(signum)

    def stop(self) -> None:
        """Remove the containers, stop the service, delete the directory."""
        if self.containers:
            self.podman("rm", "-f", "-t", "0", *self.containers, check=False)
        self.stop_service()
        if self.user is not None:
            self.user.kill_processes()  # the service's pause process, holding its namespace
        # conmon and the `podman container cleanup` it runs when a container ends: left to
        # finish, then killed, so that none writes into the directory after it is deleted
        deadline = time.monotonic() + 20
        while _pids_using(self.root) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in _pids_using(self.root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for path in reversed(self.cgroups):
            _remove_cgroup(path)
        mounts = [
            line.split()[1]
            for line in Path("/proc/self/mounts").read_text(encoding="utf-8").splitlines()
            if line.split()[1].startswith(self.root + "/")
        ]
        for mount in reversed(mounts):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def answers(self) -> bool:
        """Whether the service answers a ping on its socket."""
        try:
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(5)
                conn.connect(self.socket)
                conn.sendall(b"GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n")
                return conn.recv(64).startswith((b"HTTP/1.0 200 ", b"HTTP/1.1 200 "))
        except OSError:
            return False

    # -- using it -----------------------------------------------------------------------

    def podman(
        self, *args: str, check: bool = True, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess:
        """Run the podman command on this service's storage (as its user)."""
        result = subprocess.run(
            ["podman", *self.storage, *args],
            input=stdin,
            capture_output=True,
            timeout=120,
            cwd="/",
            env=self._env(),
            **self._as_user(),
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: {result.stderr.decode().strip()}")
        return result

    def output(self, *args: str) -> str:
        return self.podman(*args).stdout.decode().strip()

    def container(self, cid: str) -> Container:
        return Container(self, cid)

    def import_image(self) -> None:
        result = self.podman(
            "import", "-c", "ENV PATH=/bin", "-", IMAGE, stdin=busybox_rootfs(), check=False
        )
        if result.returncode != 0:
            raise PodmanUnavailable(f"cannot import the test image: {result.stderr.decode()}")

    def _env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": self.home,
            "XDG_RUNTIME_DIR": self.runtime,
        }

    def _as_user(self) -> dict[str, object]:
        if self.user is None:
            return {}
        return {"user": self.user.uid, "group": self.user.gid, "extra_groups": []}


class Container:
    """A running test container of the Podman service."""

    def __init__(self, podman: Podman, cid: str) -> None:
        self.podman = podman
        self.id = cid
        self.short = cid[:12]
        name, pid = (
            podman.podman("inspect", "--format", "{{.Name}} {{.State.Pid}}", cid)
            .stdout.decode()
            .split()
        )
        self.name, self.pid = name, int(pid)

    def place(self) -> None:
        """Where Podman made no cgroup of the rootless shape for this container (rootless, but
        not systemd on cgroup v2), put its process in the one it makes there."""
        user = self.podman.user
        assert user is not None
        with open(f"/proc/{self.pid}/cgroup", encoding="ascii") as f:
            found = parse_cgroup(f.read())
        if found is not None and found.runtime == "podman" and found.owner == user.uid:
            return  # Podman did it
        version = 1 if cgroup_root(1) is not None else 2
        root = cgroup_root(version)
        assert root is not None, "this host mounts no cgroup hierarchy to make cgroups in"
        path = f"{user_manager(user.uid)}/user.slice/libpod-{self.id}.scope/container"
        parts = [p for p in path.split("/") if p]
        for depth in range(1, len(parts) + 1):
            where = os.path.join(root, *parts[:depth])
            if not os.path.isdir(where):
                os.mkdir(where)
                self.podman.cgroups.append(where)
        with open(os.path.join(root, *parts, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(str(self.pid))

    def remove(self) -> None:
        self.podman.podman("rm", "-f", "-t", "0", self.id, check=False)


def _remove_cgroup(path: str) -> None:
    """rmdir a cgroup once the processes in it are gone; one with cgroups of others stays."""
    deadline = time.monotonic() + 10
    while os.path.isdir(path):
        if any(entry.is_dir() for entry in os.scandir(path)):
            return  # another test's cgroup below a shared parent (user.slice)
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return
        except OSError:  # its processes are still leaving
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def _ranges(table: str) -> list[tuple]:
    try:
        with open(table, encoding="utf-8") as f:
            rows = [line.strip().split(":") for line in f if line.count(":") == 2]
    except FileNotFoundError:
        return []
    return [
        (name, int(start), int(count))
        for name, start, count in rows
        if start.isdigit() and count.isdigit()
    ]


def _ranges_of(table: str, name: str) -> list[tuple]:
    return [row for row in _ranges(table) if row[0] == name]


def _pids_using(root: str) -> list[int]:
    """Processes whose command line names the private directory `root`: Podman's own."""
    found = []
    needle = root.encode() + b"/"
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(name))
            except OSError:
                continue
    return found


def _pids_of(uid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    found.append(int(name))
            except OSError:
                continue
    return found
