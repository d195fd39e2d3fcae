"""A private containerd for the identity tests: started, used, stopped (and restarted) by them.

Everything lives under one short directory (unix socket paths are limited to 107 bytes): its
root, its state, its socket and its config, which turns off what cannot work here (the CRI
plugin, which would want CNI and a kubelet) and uses the native snapshotter (no overlay mounts).
The test image is busybox, an OCI image tarball built here and imported with ctr: no registry.
Containers run with runc in a private network namespace, in the cgroup the test names (as the
kubelet would have containerd's CRI place them: /kubepods/<qos>/pod<uid>/<id>).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time

from private import PrivateDaemon, Unavailable, busybox_rootfs

IMAGE = "docker.io/library/patroller-test-busybox:latest"
NAMESPACES = ("k8s.io", "default")
_CONFIG = """version = 2
root = "{root}/root"
state = "{root}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = "{root}/debug.sock"
[metrics]
  address = ""
"""


class ContainerdUnavailable(Unavailable):
    """No containerd can be started here; the message says why."""


class Containerd(PrivateDaemon):
    """containerd in a private directory, and the containers the tests ran on it."""

    what, log_name, unavailable = "containerd", "containerd.log", ContainerdUnavailable

    def __init__(self) -> None:
        super().__init__("ctrd-")
        self.socket = self.path("c.sock")
        self.address = f"unix://{self.socket}"
        self.containers: list[tuple[str, str]] = []  # (namespace, id)
        self.pod_cgroups: list[str] = []  # /kubepods/... directories made for pods

    # -- lifecycle ------------------------------------------------------------------------

    def prepare(self) -> None:
        self.need(
            ("containerd", "ctr", "runc", "busybox"),
            "tests/setup.sh installs containerd, runc and busybox-static",
        )
        with open(self.path("config.toml"), "w", encoding="utf-8") as f:
            f.write(_CONFIG.format(root=self.root, socket=self.socket))

    def run_daemon(self, timeout: float | None = None) -> None:
        """Start containerd (again: its containers and their tasks are still there)."""
        self.spawn(
            ["containerd", "--config", self.path("config.toml")],
            lambda: self.ctr("version", check=False).returncode == 0,
            timeout,
        )

    def kill(self) -> None:
        """Kill containerd as a crash would: its socket file stays, nobody answers on it."""
        assert self.running()
        self.halt(signal.SIGKILL)

    def terminate(self) -> None:
        """Stop containerd in order (SIGTERM, as systemctl stop does): it removes its socket."""
        assert self.running()
        self.halt(signal.SIGTERM)

    def stop(self) -> None:
        """Remove the containers, stop containerd, delete the directory and the pods' cgroups."""
        if self.running():
            for namespace, cid in reversed(self.containers):
                self.remove(namespace, cid)
        self.halt()
        for path in reversed(self.pod_cgroups):
            remove_cgroup(path)
        subprocess.run(["umount", "-R", self.path("state")], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- using it -----------------------------------------------------------------------

    def ctr(
        self, *args: str, namespace: str = "k8s.io", check: bool = True, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess:
        """Run ctr against this containerd."""
        result = subprocess.run(
            ["ctr", "--address", self.socket, "--namespace", namespace, *args],
            input=stdin,
            capture_output=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {result.stderr.decode().strip()}")
        return result

    def run(
        self,
        cid: str,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        cgroup: str | None = None,
        namespace: str = "k8s.io",
    ) -> int:
        """Start `sleep 600` in a new container `cid`, with labels and OCI annotations, in the
        cgroup `cgroup` (a pod's: its parents are removed at stop); its host pid."""
        args = [f"--label={k}={v}" for k, v in (labels or {}).items()]
        args += [f"--annotation={k}={v}" for k, v in (annotations or {}).items()]
        if cgroup is not None:
            args.append(f"--cgroup={cgroup}")
            parent = os.path.dirname(cgroup)
            if parent not in self.pod_cgroups:
                self.pod_cgroups.append(parent)
        self.containers.append((namespace, cid))
        self.ctr(
            "run",
            "--detach",
            "--snapshotter",
            "native",
            *args,
            IMAGE,
            cid,
            "sleep",
            "600",
            namespace=namespace,
        )
        return self.pid(cid, namespace)

    def pid(self, cid: str, namespace: str = "k8s.io") -> int:
        """The host pid of the container's task."""
        listed = self.ctr("task", "list", namespace=namespace).stdout.decode().splitlines()
        for line in listed[1:]:
            fields = line.split()
            if fields and fields[0] == cid:
                return int(fields[1])
        raise RuntimeError(f"no task for {cid}")

    def remove(self, namespace: str, cid: str) -> None:
        """Kill the container's task (waiting for it to end) and delete it all."""
        self.ctr("task", "kill", "--signal", "SIGKILL", cid, namespace=namespace, check=False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.ctr("task", "delete", cid, namespace=namespace, check=False).returncode == 0:
                break
            if (
                b"not found"
                in self.ctr("task", "ps", cid, namespace=namespace, check=False).stderr
            ):
                break
            time.sleep(0.05)
        self.ctr("container", "delete", cid, namespace=namespace, check=False)
        if (namespace, cid) in self.containers:
            self.containers.remove((namespace, cid))

    def import_image(self) -> None:
        image = oci_image()
        for namespace in NAMESPACES:
            result = self.ctr(
                "image",
                "import",
                "--snapshotter",
                "native",
                "-",
                namespace=namespace,
                stdin=image,
                check=False,
            )
            if result.returncode != 0:
                raise ContainerdUnavailable(
                    f"cannot import the test image: {result.stderr.decode().strip()}"
                )


def oci_image() -> bytes:
    """An OCI image layout, as a tarball: busybox and its applets in one layer, PATH=/bin."""
    layer = busybox_rootfs()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _digest(layer),
                    "size": len(layer),
                }
            ],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": IMAGE,
                        "org.opencontainers.image.ref.name": "latest",
                    },
                }
            ],
        }
    )
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        files = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index.encode())]
        files += [
            (f"blobs/sha256/{_digest(blob)[7:]}", blob) for blob in (layer, config, manifest)
        ]
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def remove_cgroup(path: str) -> None:
    """Remove a cgroup directory (and its parents up to the top, where empty) from every
    hierarchy; those in use stay."""
    for base in ["/sys/fs/cgroup"] + [
        os.path.join("/sys/fs/cgroup", m) for m in os.listdir("/sys/fs/cgroup")
    ]:
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), 0, -1):
            try:
                os.rmdir(os.path.join(base, *parts[:depth]))
            except OSError:
                break
