"""Containers from /proc/<pid>/cgroup in every runtime's layout, and identities from labels
(pure)."""

import os

import pytest

from patroller.identify import procfs
from patroller.identify.cgroups import ContainerRef, parse_cgroup
from patroller.identify.containers import ContainerInfo, _info, container_identity, email_in

ID = "c81412db6243dd1de3fe8782f83b4160a8c8545022b9922208a095d173f6944d"
ID2 = "e910be4c0517af10b36261502a4c6eadfa05f3d70e3c6724ca593593d12c0cd2"
POD = "1f2e3d4c-5b6a-7980-1a2b-3c4d5e6f7a8b"  # a pod's uid, as the API shows it
POD_ = POD.replace("-", "_")  # as systemd's unit names carry it
STATIC_POD = "3b1f6f0c8b3e6f7e1c0b0e0c1d2e3f40"  # a static pod's uid: a hash
USER = "/user.slice/user-1000.slice/user@1000.service"  # a user's systemd manager

# name: (cgroup path, the container it names)
SHAPES = {
    # Docker
    "docker cgroupfs": (f"/docker/{ID}", ContainerRef("docker", ID)),
    "docker systemd": (f"/system.slice/docker-{ID}.scope", ContainerRef("docker", ID)),
    "docker nested parent": (
        f"/system.slice/docker.service/docker/{ID}",
        ContainerRef("docker", ID),
    ),
    "docker in docker": (
        f"/system.slice/docker-{ID2}.scope/docker/{ID}",
        ContainerRef("docker", ID),
    ),
    "other parent": (f"/my-lab/gpu-jobs/{ID}", ContainerRef("", ID)),
    # Podman, rootful
    "podman systemd": (f"/machine.slice/libpod-{ID}.scope", ContainerRef("podman", ID)),
    "podman systemd, container child": (
        f"/machine.slice/libpod-{ID}.scope/container",
        ContainerRef("podman", ID),
    ),
    "podman systemd, in a pod": (
        f"/machine.slice/machine-libpod_pod_{ID2}.slice/libpod-{ID}.scope",
        ContainerRef("podman", ID),
    ),
    "podman cgroupfs": (f"/libpod_parent/libpod-{ID}", ContainerRef("podman", ID)),
    # rootless: the owner is the uid of the user slice
    "rootless docker": (f"{USER}/user.slice/docker-{ID}.scope", ContainerRef("docker", ID, 1000)),
    "rootless podman": (f"{USER}/user.slice/libpod-{ID}.scope", ContainerRef("podman", ID, 1000)),
    "rootless podman, container child": (
        f"{USER}/user.slice/libpod-{ID}.scope/container",
        ContainerRef("podman", ID, 1000),
    ),
    "rootless podman, in a pod": (
        f"{USER}/user.slice/user-libpod_pod_{ID2}.slice/libpod-{ID}.scope",
        ContainerRef("podman", ID, 1000),
    ),
    "rootless docker, cgroupfs-like": (f"{USER}/docker/{ID}", ContainerRef("docker", ID, 1000)),
    "rootless, of root's own manager": (
        f"/user.slice/user-0.slice/user@0.service/user.slice/docker-{ID}.scope",
        ContainerRef("docker", ID, 0),
    ),
    # containerd and CRI-O outside Kubernetes
    "containerd systemd": (
        f"/system.slice/containerd.service/cri-containerd-{ID}.scope",
        ContainerRef("containerd", ID),
    ),
    "crio systemd": (f"/system.slice/crio-{ID}.scope", ContainerRef("crio", ID)),
    # Kubernetes, systemd driver
    "kubepods systemd burstable containerd": (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice/"
        f"cri-containerd-{ID}.scope",
        ContainerRef("containerd", ID, None, POD, "burstable"),
    ),
    "kubepods systemd besteffort crio": (
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_}.slice/"
        f"crio-{ID}.scope",
        ContainerRef("crio", ID, None, POD, "besteffort"),
    ),
    "kubepods systemd guaranteed docker": (
        f"/kubepods.slice/kubepods-pod{POD_}.slice/docker-{ID}.scope",
        ContainerRef("docker", ID, None, POD, "guaranteed"),
    ),
    "kubepods systemd, kubelet- prefix": (
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{POD_}.slice/cri-containerd-{ID}.scope",
        ContainerRef("containerd", ID, None, POD, "besteffort"),
    ),
    # Kubernetes, cgroupfs driver: the runtime is not in the path
    "kubepods cgroupfs burstable": (
        f"/kubepods/burstable/pod{POD}/{ID}",
        ContainerRef("", ID, None, POD, "burstable"),
    ),
    "kubepods cgroupfs besteffort": (
        f"/kubepods/besteffort/pod{POD}/{ID}",
        ContainerRef("", ID, None, POD, "besteffort"),
    ),
    "kubepods cgroupfs guaranteed": (
        f"/kubepods/pod{POD}/{ID}",
        ContainerRef("", ID, None, POD, "guaranteed"),
    ),
    "kubepods cgroupfs static pod": (
        f"/kubepods/besteffort/pod{STATIC_POD}/{ID}",
        ContainerRef("", ID, None, STATIC_POD, "besteffort"),
    ),
    "docker in a kube pod": (
        f"/kubepods/besteffort/pod{POD}/{ID2}/docker/{ID}",
        ContainerRef("docker", ID, None, POD, "besteffort"),
    ),
    # LXD: named, at the top; whatever runs inside is the LXD container's
    "lxd": ("/lxc.payload.c1", ContainerRef("lxd", "c1")),
    "lxd init": ("/lxc.payload.c1/init.scope", ContainerRef("lxd", "c1")),
    "lxd, a service inside": (
        "/lxc.payload.web-2/system.slice/ssh.service",
        ContainerRef("lxd", "web-2"),
    ),
    "lxd, a project's instance": (
        "/lxc.payload.vision_train-7",
        ContainerRef("lxd", "vision_train-7"),
    ),
    "docker in lxd": (
        f"/lxc.payload.c1/system.slice/docker-{ID}.scope",
        ContainerRef("lxd", "c1"),
    ),
}


def as_v2(path):
    return f"0::{path}\n"


def as_v1(path):
    """Every controller of a v1 host (and the empty v2 line of a hybrid one) names it."""
    return (
        "".join(
            f"{n}:{c}:{path}\n"
            for n, c in ((12, "pids"), (11, "freezer"), (4, "memory"), (1, "name=systemd"))
        )
        + "0::/\n"
    )


def as_v1_one_line(path):
    """One hierarchy names it, the others say the host's (a process moved in one of them)."""
    return (
        "12:pids:/\n11:freezer:" + path + "\n4:memory:/process_api/cb8c240692e8428b9f\n"
        "1:name=systemd:/user.slice/user-1000.slice/session-3.scope\n0::/\n"
    )


@pytest.mark.parametrize("layout", [as_v2, as_v1, as_v1_one_line])
@pytest.mark.parametrize("name", SHAPES)
def test_every_shape_names_its_container(name, layout):
    path, container = SHAPES[name]
    assert parse_cgroup(layout(path)) == container


@pytest.mark.parametrize("name", SHAPES)
def test_a_trailing_slash_and_white_space_change_nothing(name):
    path, container = SHAPES[name]
    assert parse_cgroup(f" 0::{path}/ \n") == container


def test_the_first_line_that_names_a_container_gives_it():
    text = f"garbage\n::\nx:y\n4:memory:/docker/{ID}\n0::/system.slice/crio-{ID2}.scope\n"
    assert parse_cgroup(text) == ContainerRef("docker", ID)


def test_what_a_container_says_of_itself():
    rootless = parse_cgroup(as_v2(SHAPES["rootless docker"][0]))
    assert rootless.rootless and rootless.owner == 1000 and rootless.short == ID[:12]
    assert not parse_cgroup(as_v2(SHAPES["docker systemd"][0])).rootless
    assert parse_cgroup(as_v2(SHAPES["rootless, of root's own manager"][0])).rootless
    assert parse_cgroup(as_v2("/lxc.payload.vision_train-7")).short == "vision_train-7"


# A user makes what they like under their manager: the owner is the outermost user's, and any
# other uid's slice nested there is marked, whatever it says (identify/resolver.py refuses it).
NESTED = {
    "another user's slice": (f"{USER}/user-1001.slice/docker-{ID}.scope", 1001),
    "another user's manager": (
        f"{USER}/user-1001.slice/user@1001.service/user.slice/docker-{ID}.scope",
        1001,
    ),
    "another user's manager alone": (f"{USER}/user@1001.service/libpod-{ID}.scope", 1001),
    "root's slice": (f"{USER}/user-0.slice/docker-{ID}.scope", 0),
    "a slice that disagrees with the manager": (
        f"/user.slice/user-1000.slice/user@1001.service/docker-{ID}.scope",
        1001,
    ),
}


@pytest.mark.parametrize("name", NESTED)
def test_a_slice_nested_in_a_users_subtree_is_marked_and_the_owner_is_outermost(name):
    path, nested = NESTED[name]
    found = parse_cgroup(as_v2(path))
    assert found is not None and found.id == ID
    assert found.owner == 1000 and found.nested == nested


def test_the_users_own_slices_nested_in_their_subtree_are_theirs():
    found = parse_cgroup(as_v2(f"{USER}/user.slice/user-1000.slice/docker-{ID}.scope"))
    assert found.owner == 1000 and found.nested is None


@pytest.mark.parametrize(
    "text",
    [
        "0::/\n",
        "",
        "not a cgroup file at all",
        # a user's processes that are in no container
        "12:pids:/user.slice/user-1000.slice/session-3.scope\n0::/user.slice/user-1000.slice/session-3.scope\n",
        f"0::{USER}/app.slice/dbus.service\n",
        f"0::{USER}/user.slice/podman-pause-1a2b3c4d.scope\n",
        f"0::{USER}/init.scope\n",
        # 32 hex digits: not a container
        "4:memory:/process_api/cb8c240692e8428b9fdc0a806cce55ac\n0::/\n",
        # ids one digit short, one too long, or not as runtimes write them
        f"0::/docker/{ID[:63]}\n",
        f"0::/system.slice/docker-{ID[:63]}.scope\n",
        f"0::{USER}/user.slice/libpod-{ID[:63]}.scope\n",
        f"0::/docker/{ID}0\n",
        f"0::/docker/{ID.upper()}\n",
        f"0::/system.slice/docker-{ID}.service\n",
        f"0::/system.slice/var-lib-docker-overlay2-{ID}-merged.mount\n",
        # the runtimes' monitors, not their containers
        f"0::/machine.slice/libpod-conmon-{ID}.scope\n",
        f"0::{USER}/user.slice/libpod-conmon-{ID}.scope\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_}.slice/crio-conmon-{ID}.scope\n",
        "0::/lxc.monitor.c1\n",
        "9:freezer:/lxc.monitor.c1\n",
        # a pod's own cgroup, with no container in it
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice\n",
        f"0::/kubepods/burstable/pod{POD}\n",
        # LXD only at the top, which only root can write: never in a user's own slice
        "0::/lxc.payload.\n",
        f"0::{USER}/lxc.payload.c1\n",
        "0::/system.slice/lxc.payload.c1\n",
        "0::/lxc.payload.-x\n",
        # Slurm's and a scheduler's own
        "6:freezer:/slurm_vm/uid_65534/job_4242/step_0\n",
        "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
    ],
)
def test_processes_in_no_container(text):
    assert parse_cgroup(text) is None


def test_readers_use_an_injectable_proc_root(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/system.slice/docker-{ID}.scope\n")
    (tmp_path / "4242" / "stat").write_text(
        "4242 (python (a) b) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10\n"
    )
    assert parse_cgroup(procfs.cgroup(4242, str(tmp_path))).id == ID
    assert procfs.stat(4242, str(tmp_path)).start == 987654
    with pytest.raises(OSError):
        procfs.cgroup(1, str(tmp_path))


def test_the_real_proc_of_this_process():
    assert procfs.stat(os.getpid()).start > 0


@pytest.mark.parametrize(
    "value,email",
    [
        ("alice@example.org", "alice@example.org"),
        ("Alice Smith <alice.smith@lab.example.org>", "alice.smith@lab.example.org"),
        ("  bob+gpu@example.co.uk ", "bob+gpu@example.co.uk"),
        ("not an address", None),
        ("Alice <nobody>", None),
        ("", None),
        ("a@b", None),
    ],
)
def test_email_in_label_values(value, email):
    assert email_in(value) == email


def test_identity_from_the_first_label_that_holds_an_email():
    info = ContainerInfo(
        ID,
        "train-7",
        {"maintainer": "Bob <bob@example.org>", "email": "n/a", "team": "vision", "project": "x"},
    )
    identity = container_identity(
        info, ("user.email", "email", "maintainer"), ("project", "team", "absent")
    )
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
    attrs = {
        "Id": ID,
        "Name": "/web",
        "Config": {"Labels": {"email": "c@example.org"}},
        "NetworkSettings": {
            "Networks": {
                "bridge": {"IPAddress": "172.17.0.5", "GlobalIPv6Address": ""},
                "lab": {"IPAddress": "10.20.0.7", "GlobalIPv6Address": "fd00::7"},
                "none": None,
            }
        },
    }
    info = _info(_Inspected(attrs))
    assert info.addresses == ("10.20.0.7", "172.17.0.5", "fd00::7")
    assert info.name == "web" and info.labels == {"email": "c@example.org"}


@pytest.mark.parametrize(
    "pid, kept", [(4242, 4242), (1, 1), (0, None), (-1, None), ("4242", None), (None, None)]
)
def test_a_containers_main_pid_is_kept_when_it_is_a_process(pid, kept):
    """`State.Pid` is 0 for a stopped container; any positive number is its main process, as
    the engine names it (the lowest, 1, included); anything else is none."""
    attrs = {"Id": ID, "Name": "/web", "Config": {"Labels": {}}, "State": {"Pid": pid}}
    assert _info(_Inspected(attrs)).pid == kept
