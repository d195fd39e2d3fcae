"""Shared fixtures: every test fails if the daemon logged an error while it ran; a fake clock
and a lease manager on it; the container engines and the Slurm cluster, which a mutation run
(scripts/mutation.sh) leaves out."""

import logging
import os
import subprocess

import pytest

# As the daemon sets it before it imports gRPC (observe/grpcunix.py): the tests' own gRPC
# servers (grpc_server.py, kubelet.py) run in the process that also starts the daemon's children.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
# The host's own configuration file (/etc/patroller/patroller.toml on a lab host) is never the
# tests': the daemons, doctors and command lines they start read none unless a test names one,
# and neither does load() called with an environment of its own.
os.environ["PATROLLER_CONFIG"] = "none"
import patroller.config.file

patroller.config.file.DEFAULT_PATH = os.path.join(os.path.dirname(__file__), "no-such-file.toml")

from helpers import FakeClock, engines_left_out, lease_manager, need_root  # noqa: E402 (after the variable above)


@pytest.fixture(autouse=True)
def no_errors_logged(caplog, request):
    """A 500, an uncaught exception or a failing callback is a bug even if the test passed."""
    yield
    if request.node.get_closest_marker("errors_expected"):
        return
    errors = [
        r
        for r in caplog.get_records("call") + caplog.get_records("teardown")
        if r.levelno >= logging.ERROR
    ]
    assert not errors, "errors logged: " + "; ".join(r.getMessage() for r in errors)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "errors_expected: the test provokes logged errors on purpose"
    )


@pytest.fixture
def clock():
    """A fake clock at 1000.0 that moves only when told to."""
    return FakeClock()


@pytest.fixture
def leases(clock):
    """A lease manager with the daemon's defaults on the synthetic inventory and `clock`."""
    return lease_manager(clock)


@pytest.fixture(scope="session")
def engine():
    """A private Docker Engine with the busybox test image. Under CI=true it must start."""
    from dockerd import Engine, EngineUnavailable

    engines_left_out("a Docker Engine")
    try:
        started = Engine().start()
    except EngineUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Docker tests, but no engine started: {exc}")
        pytest.skip(f"no Docker Engine here: {exc}")
    yield started
    started.stop()


@pytest.fixture(scope="session")
def containerd():
    """A private containerd (tests/containerd.py) with the busybox test image in its k8s.io and
    default namespaces. Under CI=true it must start."""
    from containerd import Containerd, ContainerdUnavailable

    engines_left_out("containerd")
    try:
        started = Containerd().start()
    except ContainerdUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the containerd tests, but containerd did not start: {exc}")
        pytest.skip(f"no containerd here: {exc}")
    yield started
    started.stop()


@pytest.fixture(scope="session")
def slurm_node():
    """A one-node Slurm cluster of the tests' own (tests/slurm.py): this host with 4 fake GPUs,
    the project's prolog and epilog, jobs as nobody. Under CI=true it must start."""
    from helpers import need_root
    from slurm import start_node

    engines_left_out("a Slurm cluster")
    need_root("slurmd runs jobs as their users and makes their cgroups")
    node = start_node()
    yield node
    node.stop()


@pytest.fixture
def engine_sockets():
    """A directory for container engines' sockets, short enough for unix socket paths."""
    import secrets
    import shutil

    path = f"/tmp/pt{os.getpid()}e{secrets.token_hex(3)}"
    os.makedirs(path)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def sleeper():
    """A real process (sleep) whose pid a simulator scenario can list on a GPU."""
    process = subprocess.Popen(["sleep", "120"])
    yield process
    process.kill()
    process.wait()


def _podman_or_skip(start, strict=False):
    """Start a Podman service with `start()`; skip where Podman is missing or this is not root,
    but fail under CI=true, which must run the Podman tests. `strict`: any other reason it does
    not start fails the tests, wherever they run."""
    import shutil

    from podman import PodmanUnavailable, UserNamespacesRefused

    engines_left_out("a Podman service")
    missing = [
        tool
        for tool in ("podman", "runc", "conmon", "busybox", "newuidmap", "unshare")
        if shutil.which(tool) is None
    ]
    try:
        if missing:
            raise PodmanUnavailable(
                f"{', '.join(missing)} not installed (tests/setup.sh installs "
                "podman, runc, uidmap and busybox-static)"
            )
        if os.geteuid() != 0:
            raise PodmanUnavailable("the tests' Podman services need root")
    except PodmanUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Podman tests, but no Podman service started: {exc}")
        pytest.skip(f"no Podman here: {exc}")
    try:
        return start()
    except UserNamespacesRefused as exc:
        pytest.skip(f"the kernel refuses user namespaces: {exc}")
    except PodmanUnavailable as exc:
        if strict or os.environ.get("CI") == "true":
            pytest.fail(f"no Podman service started: {exc}")
        pytest.skip(f"no Podman here: {exc}")


@pytest.fixture(scope="session")
def podman():
    """A private rootful Podman service with the busybox test image. Under CI=true it must
    start."""
    from podman import Podman

    service = _podman_or_skip(lambda: Podman().start())
    yield service
    service.stop()


@pytest.fixture(scope="session")
def rootless_podman():
    """A private rootless Podman service of a throwaway user, with the test image. It skips only
    where the kernel refuses that user a user namespace (or as `podman` does)."""
    from podman import Account, Podman

    made = []

    def start():
        user = Account()
        made.append(user)
        user.check_user_namespaces()
        return Podman(user).start()

    try:
        service = _podman_or_skip(start, strict=True)
    except BaseException:
        for user in made:
            user.remove()
        raise
    yield service
    service.stop()
    made[0].remove()


@pytest.fixture
def stranger():
    """A throwaway user (useradd), removed after: another local user, for the attacks."""
    need_root("making a throwaway user takes root")
    from podman import Account

    account = Account()
    try:
        yield account
    finally:
        account.remove()


@pytest.fixture
def users():
    """Two throwaway users (useradd), removed after."""
    need_root("making throwaway users takes root")
    from podman import Account

    made = []
    try:
        made.append(Account())
        made.append(Account())
        yield made
    finally:
        for account in made:
            account.remove()


@pytest.fixture
def reachable():
    """A folder every user may enter: the client's files, and room for the daemon's socket."""
    import shutil
    import tempfile

    from helpers import ROOT
    from test_cli import client_files

    path = tempfile.mkdtemp(prefix="pnotify", dir="/tmp")
    os.chmod(path, 0o755)
    for name in client_files():
        os.makedirs(os.path.join(path, os.path.dirname(name)), exist_ok=True)
        shutil.copy(os.path.join(ROOT, name), os.path.join(path, name))
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def read_only(tmp_path):
    """A tmpfs with a private folder `state` in it, then made read-only (the doctor's tests)."""
    need_root("it mounts a tmpfs")
    where = tmp_path / "ro"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "doctor", str(where)], check=True)
    try:
        (where / "state").mkdir(mode=0o700)
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)
