"""Cgroup paths at the edges of what names a pod or a Slurm step (identify/cgroups.py): a pod
directory is a pod only under kubepods (or a QoS class under it), wherever it sits in the path;
a Slurm step only where slurmd puts it, however many `..` come before."""

import pytest

from patroller.identify.cgroups import ContainerRef, SlurmStep, container_of_path, parse_slurm

ID = "c81412db6243dd1de3fe8782f83b4160a8c8545022b9922208a095d173f6944d"
ID2 = "e910be4c0517af10b36261502a4c6eadfa05f3d70e3c6724ca593593d12c0cd2"
POD = "1f2e3d4c-5b6a-7980-1a2b-3c4d5e6f7a8b"


def test_a_container_at_the_top_of_the_tree_is_in_no_pod():
    assert container_of_path(f"/docker-{ID}.scope") == ContainerRef("docker", ID)
    assert container_of_path(f"/{ID}") == ContainerRef("", ID)


def test_a_pod_two_levels_above_its_container_is_found():
    # the pod's directory, then a sandbox's, then the container: the pod is not its parent
    assert container_of_path(f"/kubepods/besteffort/pod{POD}/{ID2}/{ID}") == ContainerRef(
        "", ID, None, POD, "besteffort"
    )
    assert container_of_path(f"/kubepods/pod{POD}/{ID2}/x/{ID}") == ContainerRef(
        "", ID, None, POD, "guaranteed"
    )


@pytest.mark.parametrize(
    "path",
    [
        f"/kubepods/besteffort/{ID}",  # a QoS class's directory, no pod in it
        f"/pod{POD}/kubepods/{ID}",  # a pod directory at the top: nothing above it
        f"/kubepods/other/pod{POD}/{ID}",  # not under a QoS class
        f"/besteffort/pod{POD}/{ID}",  # a QoS class's name not under kubepods
        f"/besteffort/pod{POD}/x-kubepods/{ID}",  # kubepods below the pod, not above
    ],
)
def test_a_pod_directory_anywhere_but_under_kubepods_names_no_pod(path):
    assert container_of_path(path) == ContainerRef("", ID)


def test_a_slurm_step_after_one_or_more_dotdots_is_found():
    for up in ("..", "../.."):
        text = f"0::/{up}/system.slice/slurmstepd.scope/job_42/step_1\n"
        assert parse_slurm(text) == SlurmStep("42", "1")


@pytest.mark.parametrize("path", ["/system.slice", "/..", "/", "/system.slice/slurmstepd.scope"])
def test_a_path_too_short_for_a_step_is_in_no_job(path):
    assert parse_slurm(f"0::{path}\n") is None
