"""The host account of a process in a user namespace, from the kernel's word on who made the
namespace (NS_GET_OWNER_UID): a rootless container that no cgroup names (rootless engines on
cgroup v1 make none) counts as the user who runs it, not as the subordinate uid it runs as."""

import os
import subprocess
import time

import pytest
from helpers import SHIFTED_UID, async_test

from patroller.config import Config
from patroller.identify import procfs
from patroller.identify.cgroups import ContainerRef, SlurmStep
from patroller.identify.resolver import ProcessIdentifier, account_of, host_identity, misplaced

SHIFTED_FROM = Config.shifted_uids_from


def test_who_a_process_counts_as():
    lxd = ContainerRef("lxd", "c1")
    rootless = ContainerRef("podman", "a" * 64, owner=1234)
    docker = ContainerRef("docker", "b" * 64)
    # a rootless container's slice names its user, whoever made the namespace
    assert account_of(rootless, SHIFTED_UID, SHIFTED_FROM, ns_owner=0).uid == 1234
    # a user's namespace: that user, whatever uid the process runs as, in a container or not
    assert account_of(None, SHIFTED_UID, SHIFTED_FROM, ns_owner=4321).uid == 4321
    assert account_of(docker, 0, SHIFTED_FROM, ns_owner=4321).uid == 4321
    # root's namespace (LXD, userns-remap): a shifted uid names nobody
    assert account_of(lxd, SHIFTED_UID, SHIFTED_FROM, ns_owner=0) is None
    assert account_of(None, SHIFTED_UID, SHIFTED_FROM, ns_owner=0) is None
    assert account_of(None, 1000, SHIFTED_FROM, ns_owner=0).uid == 1000
    # our own namespace: a process in no container is its own uid's, whatever the uid
    assert account_of(None, SHIFTED_UID, SHIFTED_FROM).uid == SHIFTED_UID
    assert account_of(docker, SHIFTED_UID, SHIFTED_FROM) is None
    assert account_of(docker, 1000, SHIFTED_FROM).uid == 1000
    # the first shifted uid is shifted; the one below it is an account
    assert account_of(docker, SHIFTED_FROM, SHIFTED_FROM) is None
    assert account_of(docker, SHIFTED_FROM - 1, SHIFTED_FROM).uid == SHIFTED_FROM - 1


def test_our_own_namespace_has_no_owner_to_tell(tmp_path):
    assert procfs.userns_owner(os.getpid()) is None
    assert procfs.userns_owner(os.getpid(), str(tmp_path)) is None  # a tree of a test's own
    assert procfs.userns_owner(2**22 + 1) is None  # no such process


@pytest.fixture
def user():
    """A throwaway user with subordinate uid and gid ranges."""
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("making a throwaway user needs root")
    from podman import Account

    account = Account()
    try:
        yield account
    finally:
        account.remove()


def in_namespace(user, *inside):
    """`inside` run by `user` in a user namespace of their own: their uid is its root, and their
    subordinate uids its others (newuidmap maps them)."""
    process = subprocess.Popen(
        ["unshare", "--user", "--map-auto", "--map-root-user", "--", *inside],
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        cwd="/",
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while procfs.userns_owner(process.pid) is None:
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "the process never entered its namespace"
        time.sleep(0.02)
    return process


@pytest.mark.parametrize("shifted", [False, True])
@async_test
async def test_a_process_in_a_users_namespace_counts_as_that_user(user, shifted):
    become = ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups"] if shifted else []
    process = in_namespace(user, *become, "sleep", "600")
    try:
        deadline = time.monotonic() + 10
        while (procfs.uid(process.pid) != user.uid) != shifted:  # setpriv has run
            assert time.monotonic() < deadline, "the process never became its uid"
            time.sleep(0.02)
        assert (procfs.uid(process.pid) > SHIFTED_FROM) == shifted
        assert procfs.userns_owner(process.pid) == user.uid
        identifier = ProcessIdentifier(Config())
        identity = await identifier.resolve(process.pid)
        identifier.close()
    finally:
        process.kill()
        process.wait()
    assert identity == host_identity(user.uid) and identity.account == user.name


A = ContainerRef("docker", "a" * 64, owner=1234)
NESTED = ContainerRef("docker", "a" * 64, owner=1234, nested=0)


@pytest.mark.parametrize(
    "container,job,uid,ns_owner,refused",
    [
        (A, None, 1234, None, False),  # the user's own rootless container, as the user
        (A, None, SHIFTED_UID, 1234, False),  # as a shifted uid of the user's namespace
        (A, None, 4321, None, True),  # another uid, in no namespace
        (A, None, SHIFTED_UID, 4321, True),  # in another user's namespace
        (A, None, SHIFTED_UID, None, True),  # a shifted uid in our own namespace: nobody's
        (NESTED, None, 1234, None, True),  # another uid's slice nested in the user's
        (
            ContainerRef("docker", "a" * 64),
            None,
            4321,
            None,
            False,
        ),  # the system's: not judged here
        (None, SlurmStep("4242", "0", 1001), 1001, None, False),  # slurmd's uid_1001, as uid 1001
        (None, SlurmStep("4242", "0", 1001), 2002, None, True),  # as another uid
        (None, SlurmStep("4242", "0"), 2002, None, False),  # v2 names no uid: the map's is checked
    ],
)
def test_what_a_cgroup_says_is_believed_only_of_its_own_users_process(
    container, job, uid, ns_owner, refused
):
    assert (misplaced(container, job, uid, ns_owner) is not None) == refused
