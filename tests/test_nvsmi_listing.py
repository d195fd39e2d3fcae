"""`nvidia-smi -L` parsed (observe/nvsmi/listing.py): every era's lines, junk skipped, and the
MIG uuids given to the MIG instances of `-q -x`."""

from __future__ import annotations

import pytest

from patroller.core.devices import Device, MigInstance
from patroller.observe.nvsmi.listing import GpuListing, ListedMig, parse_list_gpus, with_mig_uuids

G0 = "GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16"
G1 = "GPU-d8594bd4-0fc3-8595-e355-7c98138f3b95"
M0 = "MIG-feb88891-0321-5fef-9c87-d4af3b54259e"
M1 = "MIG-a25704ba-3a06-5299-a795-fd7cf4d13973"

# R470 and later: the product name starts with NVIDIA, profile and index padded.
R535 = f"""GPU 0: NVIDIA A100-SXM4-80GB (UUID: {G0})
  MIG 1g.10gb     Device  0: (UUID: {M0})
  MIG 1g.10gb+me  Device  1: (UUID: {M1})
GPU 1: NVIDIA A100-SXM4-80GB (UUID: {G1})
"""
# R450 to R465: no NVIDIA in the name, single spaces, the MIG uuid names GPU, GI and CI.
R450 = f"""GPU 0: A100-SXM4-40GB (UUID: {G0})
  MIG 3g.20gb Device 0: (UUID: MIG-{G0}/1/0)
  MIG 3g.20gb Device 1: (UUID: MIG-{G0}/2/0)
GPU 1: A100-SXM4-40GB (UUID: {G1})
  MIG 7g.40gb Device 0: (UUID: MIG-{G1}/0/0)
"""
# Before MIG: the GPUs only.
R384 = f"""GPU 0: Tesla P100-PCIE-16GB (UUID: {G0})
GPU 1: Tesla P100-PCIE-16GB (UUID: {G1})
"""


def test_r470_and_later_mig_uuids_grouped_by_their_gpu():
    listing = parse_list_gpus(R535)
    assert listing.gpus == (G0, G1) and listing.skipped == ()
    assert listing.mig == {G0: (ListedMig(0, M0, "1g.10gb"), ListedMig(1, M1, "1g.10gb+me"))}


def test_r450_mig_uuids_carry_their_instance_ids():
    listing = parse_list_gpus(R450)
    assert listing.gpus == (G0, G1) and listing.skipped == ()
    assert listing.mig == {
        G0: (
            ListedMig(0, f"MIG-{G0}/1/0", "3g.20gb", 1, 0),
            ListedMig(1, f"MIG-{G0}/2/0", "3g.20gb", 2, 0),
        ),
        G1: (ListedMig(0, f"MIG-{G1}/0/0", "7g.40gb", 0, 0),),
    }


def test_drivers_before_mig_list_gpus_only():
    assert parse_list_gpus(R384) == GpuListing((G0, G1), {}, ())
    assert parse_list_gpus("") == GpuListing()


def test_crlf_tabs_and_odd_spacing_are_read():
    text = (
        f"GPU 0:\tNVIDIA H100 80GB HBM3 (UUID:{G0})\r\n"
        f"\tMIG  1c.3g.40gb   Device   3 :  (UUID: {M0} )\r\n"
    )
    assert parse_list_gpus(text).mig == {G0: (ListedMig(3, M0, "1c.3g.40gb"),)}


@pytest.mark.parametrize(
    "junk",
    [
        f"  MIG 1g.10gb     Device  1: (UUID: {M1}",  # cut short
        f"  MIG 1g.10gb     Device  1: (UUID: {M1[:12]}",
        f"  MIG 1g.10gb     Device  ^C1: (UUID: {M1})",  # a terminal's ^C
        f"  MIG 1g.10gb     Device  1: (UUID: \x00{M1})",
        f"  MIG 1g.10gb     Device  0: (UUID: {M1})",  # index 0 again
        f"  MIG 1g.10gb     Device  x: (UUID: {M1})",
        f"  MIG 3g.20gb Device 1: (UUID: MIG-{G1}/2/0)",  # the old form naming another GPU
        f"  MIG 3g.20gb Device 1: (UUID: MIG-{G0}/2)",  # the old form cut short
        "  MIG 3g.20gb Device 1: (UUID: MIG-abc/2/0)",
        "Failed to initialize NVML: Unknown Error",
        "No devices were found",
        "GPU 2: NVIDIA A100 (UUID: GPU-",
    ],
)
def test_junk_lines_are_skipped_and_counted(junk):
    listing = parse_list_gpus(R535.replace("GPU 1:", junk + "\nGPU 1:"))
    assert listing.gpus == (G0, G1) and listing.skipped == (junk.strip(),)
    assert listing.mig[G0] == (ListedMig(0, M0, "1g.10gb"), ListedMig(1, M1, "1g.10gb+me"))


def test_mig_lines_before_any_gpu_or_under_a_repeated_gpu_are_skipped():
    text = (
        f"  MIG 1g.10gb     Device  0: (UUID: {M0})\n"
        + R535
        + f"GPU 2: NVIDIA A100-SXM4-80GB (UUID: {G0})\n"
        f"  MIG 1g.10gb     Device  5: (UUID: {M1})\n"
    )
    listing = parse_list_gpus(text)
    assert listing.gpus == (G0, G1) and len(listing.skipped) == 3
    assert [m.index for m in listing.mig[G0]] == [0, 1]


def test_an_empty_or_blank_listing_gives_nothing():
    assert parse_list_gpus("\n \n\t\n") == GpuListing()


def instances(*ids):
    return tuple(MigInstance(index, gi, ci, 9856) for index, gi, ci in ids)


def test_instances_take_their_uuid_by_index_and_the_old_form_by_its_ids_too():
    devices = [
        Device(
            G0, 0, mig_mode="Enabled", mig_instances=instances((0, 1, 0), (1, 2, 0), (2, 3, 0))
        ),
        Device(G1, 1, mig_mode="Enabled", mig_instances=instances((0, 1, 0), (1, 2, 0))),
        Device("GPU-plain", 2),
    ]
    listed = {
        G0: (ListedMig(0, M0, "1g.10gb"), ListedMig(1, M1, "1g.10gb")),  # 2 is unlisted
        G1: (ListedMig(0, f"MIG-{G1}/1/0", "3g", 1, 0), ListedMig(1, f"MIG-{G1}/9/0", "3g", 9, 0)),
    }  # not instance 1's ids
    found = with_mig_uuids(devices, listed)
    assert [m.uuid for m in found[0].mig_instances] == [M0, M1, None]
    assert [m.uuid for m in found[1].mig_instances] == [f"MIG-{G1}/1/0", None]
    assert found[2] == devices[2]
    assert [m.uuid for d in with_mig_uuids(devices, {}) for m in d.mig_instances] == [None] * 5
    assert found[0].info()["mig_instances"][0] == {
        "index": 0,
        "gpu_instance_id": 1,
        "compute_instance_id": 0,
        "memory_mib": 9856,
        "uuid": M0,
    }


def test_mig_lines_after_an_unreadable_gpu_line_belong_to_no_gpu():
    text = R535.replace("GPU 1: NVIDIA", "GPU 1: NVIDIA^C") + (
        f"  MIG 1g.10gb     Device  2: (UUID: {M1})\n"
    )
    listing = parse_list_gpus(text)
    assert listing.gpus == (G0,) and len(listing.skipped) == 2
    assert [m.index for m in listing.mig[G0]] == [0, 1]
