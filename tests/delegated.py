"""A user's delegated cgroup subtree, made as systemd makes it for `user@<uid>.service`
(`Delegate=yes`): the manager's directory and its `cgroup.procs` belong to the user, who may make
any cgroup under it and move their own processes there. Needs root (it makes and removes the
directories, and moves the user's first process in, as systemd starts it there)."""

import os
import subprocess
import time

from helpers import cgroup_root, user_manager

# The user's own shell: it waits until root has moved it into the manager's cgroup, makes the
# cgroup it chose and moves itself there (as any user may, in their subtree), then runs on.
MOVE_IN = 'read go; mkdir -p "$0" && echo $$ > "$0/cgroup.procs" && exec "$@"'


class Delegated:
    """The subtree systemd delegates to one user, in one hierarchy (v1's freezer or v2's)."""

    def __init__(self, uid: int, gid: int, version: int) -> None:
        root = cgroup_root(version)
        if root is None:
            raise LookupError(f"no cgroup v{version} hierarchy to delegate a subtree in")
        self.uid, self.gid, self.root = uid, gid, root
        self.base = user_manager(uid)
        parts = [p for p in self.base.split("/") if p]
        self._made = [
            os.path.join(root, *parts[:depth])
            for depth in range(1, len(parts) + 1)
            if not os.path.isdir(os.path.join(root, *parts[:depth]))
        ]
        self.directory = os.path.join(root, *parts)
        os.makedirs(self.directory, exist_ok=True)
        for name in ("", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control", "tasks"):
            path = os.path.join(self.directory, name)
            if os.path.exists(path):
                os.chown(path, uid, gid)
        self._processes: list[subprocess.Popen] = []

    def run(
        self, inside: str, *command: str, env: dict | None = None, stdout: int | None = None
    ) -> subprocess.Popen:
        """`command`, run by the user in the cgroup `inside` (a path below their manager,
        which they make themselves); returns once the process is there."""
        where = os.path.join(self.directory, inside.strip("/"))
        process = subprocess.Popen(
            ["sh", "-c", MOVE_IN, where, *command],
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", **(env or {})},
        )
        self._processes.append(process)
        with open(os.path.join(self.directory, "cgroup.procs"), "w") as f:
            f.write(str(process.pid))  # as systemd starts a user's processes under the manager
        assert process.stdin is not None
        process.stdin.write(b"go\n")
        process.stdin.close()
        process.stdin = None  # said and closed: communicate() has nothing more to send
        wanted = f"{self.base}/{inside.strip('/')}"
        deadline = time.monotonic() + 10
        while not self._is_in(process.pid, wanted):
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, f"pid {process.pid} never moved into {wanted}"
            time.sleep(0.01)
        return process

    @staticmethod
    def _is_in(pid: int, path: str) -> bool:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as f:
            return any(line.rstrip("\n").split(":", 2)[-1] == path for line in f)

    def remove(self) -> None:
        """Stop the processes, then remove every directory under the manager and those made."""
        for process in self._processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        for top, dirs, _ in sorted(os.walk(self.directory), key=lambda w: -w[0].count("/")):
            for name in dirs:
                _rmdir(os.path.join(top, name))
        for path in reversed(self._made):
            _rmdir(path)


def _rmdir(path: str) -> None:
    deadline = time.monotonic() + 2
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:  # a process killed a moment ago is still leaving it; or a shared parent
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
