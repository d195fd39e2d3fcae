"""Container ids from /proc/<pid>/cgroup in every layout, and identities from labels (pure)."""
import os

import pytest

from patroller.identify import procfs
from patroller.identify.cgroups import parse_cgroup, read_container
from patroller.identify.containers import ContainerInfo, _info, container_identity, email_in

ID = "c81412db6243dd1de3fe8782f83b4160a8c8545022b9922208a095d173f6944d"
ID2 = "e910be4c0517af10b36261502a4c6eadfa05f3d70e3c6724ca593593d12c0cd2"

LAYOUTS = {
    "v1 cgroupfs": (f"12:pids:/docker/{ID}\n4:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n", "docker", ID),
    "v2 cgroupfs": (f"0::/docker/{ID}\n", "docker", ID),
    "v2 systemd scope": (f"0::/system.slice/docker-{ID}.scope\n", "docker", ID),
    "v1 systemd scope": (f"11:devices:/system.slice/docker-{ID}.scope\n1:name=systemd:/system.slice/docker-{ID}.scope\n", "docker", ID),
    "nested parent": (f"4:memory:/system.slice/docker.service/docker/{ID}\n0::/system.slice/docker.service/docker/{ID}\n", "docker", ID),
    "other parent": (f"0::/my-lab/gpu-jobs/{ID}\n", "", ID),
    "podman systemd": (f"0::/machine.slice/libpod-{ID}.scope/container\n", "libpod", ID),
    "podman cgroupfs": (f"0::/libpod_parent/libpod-{ID}\n", "libpod", ID),
    "containerd systemd": (f"0::/system.slice/containerd.service/cri-containerd-{ID}.scope\n", "cri-containerd", ID),
    "kubepods systemd": (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e3d4c_5b6a_7980_1a2b_3c4d5e6f7a8b.slice/cri-containerd-{ID}.scope\n", "cri-containerd", ID),
    "kubepods cgroupfs": (f"4:memory:/kubepods/burstable/pod1f2e3d4c-5b6a-7980-1a2b-3c4d5e6f7a8b/{ID}\n", "", ID),
    "cri-o": (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podabc.slice/crio-{ID}.scope\n", "crio", ID),
    "docker in a kube pod": (f"0::/kubepods/besteffort/podabc/{ID2}/docker/{ID}\n", "docker", ID),
    "malformed lines first": (f"garbage\n::\nx:y\n4:memory:/docker/{ID}\n", "docker", ID),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_names_its_container(name):
    text, runtime, cid = LAYOUTS[name]
    found = parse_cgroup(text)
    assert found is not None and found.id == cid and found.runtime == runtime
    assert found.short == cid[:12]


@pytest.mark.parametrize("text", [
    "0::/\n",
    "12:pids:/user.slice/user-1000.slice/session-3.scope\n0::/user.slice/user-1000.slice/session-3.scope\n",
    "4:memory:/process_api/cb8c240692e8428b9fdc0a806cce55ac\n0::/\n",  # 32 hex: not a container
    f"0::/docker/{ID[:63]}\n",  # one digit short
    "",
    "not a cgroup file at all",
])
def test_host_processes_are_in_no_container(text):
    assert parse_cgroup(text) is None


def test_readers_use_an_injectable_proc_root(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/system.slice/docker-{ID}.scope\n")
    (tmp_path / "4242" / "stat").write_text(
        "4242 (python (a) b) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10\n")
    assert read_container(4242, str(tmp_path)).id == ID
    assert procfs.stat(4242, str(tmp_path)).start == 987654
    with pytest.raises(OSError):
        read_container(1, str(tmp_path))


def test_the_real_proc_of_this_process():
    assert procfs.stat(os.getpid()).start > 0


@pytest.mark.parametrize("value,email", [
    ("alice@example.org", "alice@example.org"),
    ("Alice Smith <alice.smith@lab.example.org>", "alice.smith@lab.example.org"),
    ("  bob+gpu@example.co.uk ", "bob+gpu@example.co.uk"),
    ("not an address", None),
    ("Alice <nobody>", None),
    ("", None),
    ("a@b", None),
])
def test_email_in_label_values(value, email):
    assert email_in(value) == email


def test_identity_from_the_first_label_that_holds_an_email():
    info = ContainerInfo(ID, "train-7", {"maintainer": "Bob <bob@example.org>", "email": "n/a",
                                          "team": "vision", "project": "x"})
    identity = container_identity(info, ("user.email", "email", "maintainer"), ("project", "team", "absent"))
    assert identity.user == "bob@example.org" and identity.email == "bob@example.org"
    assert identity.container == (ID[:12], "train-7")
    assert identity.to_json()["info"] == {"project": "x", "team": "vision"}
    assert identity.source == "container" and not identity.degraded


def test_a_container_without_an_email_label_is_itself():
    identity = container_identity(ContainerInfo(ID, "scratch", {}), ("user.email",), ())
    assert identity.user == f"container:{ID[:12]}" and identity.email is None
    assert identity.to_json()["container"] == {"id": ID[:12], "name": "scratch"}


def test_user_keys_ignore_the_case_of_addresses():
    a = container_identity(ContainerInfo(ID, "a", {"email": "Alice@Example.org"}), ("email",), ())
    b = container_identity(ContainerInfo(ID2, "b", {"email": "alice@example.org"}), ("email",), ())
    assert a.same_user(b)


class _Inspected:
    """The shape of a docker SDK Container: id, name, labels, attrs (from `docker inspect`)."""

    def __init__(self, attrs):
        self.attrs = attrs
        self.id = attrs["Id"]
        self.name = attrs["Name"].lstrip("/")
        self.labels = attrs["Config"]["Labels"]


def test_network_addresses_from_inspect_data():
    attrs = {"Id": ID, "Name": "/web", "Config": {"Labels": {"email": "c@example.org"}},
             "NetworkSettings": {"Networks": {
                 "bridge": {"IPAddress": "172.17.0.5", "GlobalIPv6Address": ""},
                 "lab": {"IPAddress": "10.20.0.7", "GlobalIPv6Address": "fd00::7"},
                 "none": None}}}
    info = _info(_Inspected(attrs))
    assert info.addresses == ("10.20.0.7", "172.17.0.5", "fd00::7")
    assert info.name == "web" and info.labels == {"email": "c@example.org"}
