"""Device discovery from `nvidia-smi -q -x`, on written fixtures."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from patroller.core.devices import Device, Inventory, MigInstance
from patroller.observe.nvsmi.discovery import DiscoveryError, ProcessInfo, parse_inventory

FIXTURES = Path(__file__).parent / "fixtures" / "nvsmi"


def read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


GTX = dict(name="GeForce GTX 1080 Ti", brand="GeForce", total_mem="11172 MiB")
RTX = dict(
    name="NVIDIA GeForce RTX 4090", brand="GeForce", arch="Ada Lovelace", total_mem="24564 MiB"
)
A100 = dict(name="NVIDIA A100-SXM4-40GB", brand="NVIDIA", arch="Ampere", total_mem="40960 MiB")
V100 = dict(name="Tesla V100-SXM2-16GB", brand="Tesla", arch="Volta", total_mem="16384 MiB")

CASES = {
    "smi_q_x_v9_driver384.xml": dict(
        driver="384.130",
        cuda=None,
        devices=[
            Device(
                "GPU-3b1e4f2a-9c1d-7e55-0a8b-4d2f6c91e0b7",
                0,
                pci_address="00000000:02:00.0",
                minor_number=0,
                **GTX,
            ),
            Device(
                "GPU-8c0d5e11-24aa-f3b9-61c7-5a0e9d3b2f48",
                1,
                pci_address="00000000:03:00.0",
                minor_number=1,
                **GTX,
            ),
        ],
        processes={
            "GPU-3b1e4f2a-9c1d-7e55-0a8b-4d2f6c91e0b7": [
                ProcessInfo(1867, "G", "/usr/lib/xorg/Xorg", "17 MiB"),
                ProcessInfo(2410, "C", "python", "10703 MiB"),
            ],
            "GPU-8c0d5e11-24aa-f3b9-61c7-5a0e9d3b2f48": [],
        },
    ),
    "smi_q_x_v12_driver535.xml": dict(
        driver="535.129.03",
        cuda="12.2",
        devices=[
            # bus 01:00.0 is minor 1, bus C1:00.0 is minor 0: the index follows the bus
            Device(
                "GPU-5e6f7a8b-1c2d-3e4f-5a6b-7c8d9e0f1a2b",
                0,
                pci_address="00000000:01:00.0",
                minor_number=1,
                **RTX,
            ),
            Device(
                "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d",
                1,
                pci_address="00000000:C1:00.0",
                minor_number=0,
                **RTX,
            ),
        ],
        processes={
            "GPU-5e6f7a8b-1c2d-3e4f-5a6b-7c8d9e0f1a2b": [
                ProcessInfo(2143, "G", "/usr/lib/xorg/Xorg", "167 MiB"),
                ProcessInfo(48213, "C", "/opt/conda/bin/python3", "18650 MiB"),
            ],
            "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d": [],
        },
    ),
    "smi_q_x_v12_mig.xml": dict(
        driver="550.54.15",
        cuda="12.4",
        devices=[
            # total_mem is the GPU's, not that of the mig_device children listed before it
            Device(
                "GPU-d1e2f3a4-b5c6-d7e8-f9a0-b1c2d3e4f5a6",
                0,
                pci_address="00000000:07:00.0",
                minor_number=2,
                mig_mode="Enabled",
                **A100,
            ),
            Device(
                "GPU-a6f5e4d3-c2b1-a0f9-e8d7-c6b5a4f3e2d1",
                1,
                pci_address="00000000:0F:00.0",
                minor_number=3,
                mig_mode="Disabled",
                **A100,
            ),
        ],
        processes={
            "GPU-d1e2f3a4-b5c6-d7e8-f9a0-b1c2d3e4f5a6": [
                ProcessInfo(
                    77120, "C", "python", "4096 MiB", gpu_instance_id=2, compute_instance_id=0
                ),
            ],
            "GPU-a6f5e4d3-c2b1-a0f9-e8d7-c6b5a4f3e2d1": [],
        },
        mig={
            "GPU-d1e2f3a4-b5c6-d7e8-f9a0-b1c2d3e4f5a6": [
                MigInstance(index=0, gpu_instance_id=1, compute_instance_id=0, memory_mib=19968),
                MigInstance(index=1, gpu_instance_id=2, compute_instance_id=0, memory_mib=19968),
            ],
        },
    ),
    "mig-h100-r570.xml": dict(
        driver="570.124.06",
        cuda="12.8",
        devices=[
            Device(
                "GPU-4f3c2b1a-0e9d-8c7b-6a59-483726150f1e",
                0,
                name="NVIDIA H100 80GB HBM3",
                brand="NVIDIA",
                arch="Hopper",
                pci_address="00000000:18:00.0",
                total_mem="81559 MiB",
                minor_number=1,
                mig_mode="Enabled",
            ),
            Device(
                "GPU-9a8b7c6d-5e4f-3a2b-1c0d-efdcba987654",
                1,
                name="NVIDIA H100 80GB HBM3",
                brand="NVIDIA",
                arch="Hopper",
                pci_address="00000000:2A:00.0",
                total_mem="81559 MiB",
                minor_number=0,
                mig_mode="Disabled",
            ),
        ],
        processes={
            "GPU-4f3c2b1a-0e9d-8c7b-6a59-483726150f1e": [
                ProcessInfo(
                    91234,
                    "C",
                    "python3 train.py, stage 2",
                    "20200 MiB",
                    gpu_instance_id=2,
                    compute_instance_id=0,
                ),
                ProcessInfo(
                    91802,
                    "C",
                    "/usr/bin/vllm",
                    "9500 MiB",
                    gpu_instance_id=3,
                    compute_instance_id=0,
                ),
            ],
            # not MIG: the instance ids are N/A
            "GPU-9a8b7c6d-5e4f-3a2b-1c0d-efdcba987654": [
                ProcessInfo(93011, "C", "python", "61440 MiB")
            ],
        },
        mig={
            "GPU-4f3c2b1a-0e9d-8c7b-6a59-483726150f1e": [
                MigInstance(index=0, gpu_instance_id=2, compute_instance_id=0, memory_mib=40192),
                MigInstance(index=1, gpu_instance_id=3, compute_instance_id=0, memory_mib=19968),
                MigInstance(index=2, gpu_instance_id=9, compute_instance_id=0, memory_mib=9856),
            ],
        },
    ),
    "smi_q_x_v11_four_gpus.xml": dict(
        driver="510.47.03",
        cuda="11.6",
        devices=[
            Device(
                "GPU-11111111-2222-3333-4444-555555555555",
                0,
                pci_address="00000000:1A:00.0",
                minor_number=1,
                **V100,
            ),
            Device(
                "GPU-22222222-3333-4444-5555-666666666666",
                1,
                pci_address="00000000:1B:00.0",
                minor_number=2,
                **V100,
            ),
            Device(
                "GPU-33333333-4444-5555-6666-777777777777",
                2,
                pci_address="00000000:3D:00.0",
                minor_number=3,
                **V100,
            ),
            Device(
                "GPU-44444444-5555-6666-7777-888888888888",
                3,
                pci_address="00000000:3E:00.0",
                minor_number=0,
                **V100,
            ),
        ],
        processes={
            "GPU-11111111-2222-3333-4444-555555555555": [],
            "GPU-22222222-3333-4444-5555-666666666666": [],
            "GPU-33333333-4444-5555-6666-777777777777": [],
            "GPU-44444444-5555-6666-7777-888888888888": [
                ProcessInfo(9001, "C", "python", "15990 MiB"),
            ],
        },
    ),
    "smi_q_x_v10_cloud_domain.xml": dict(
        driver="440.33.01",
        cuda="10.2",
        devices=[
            Device(
                "GPU-6f2c9a1e-3d4b-5c6d-7e8f-9a0b1c2d3e4f",
                0,
                name="Tesla T4",
                brand="Tesla",
                pci_address="00001580:00:00.0",
                total_mem="15109 MiB",
                minor_number=0,
            ),
        ],
        processes={"GPU-6f2c9a1e-3d4b-5c6d-7e8f-9a0b1c2d3e4f": []},
    ),
    "smi_q_x_no_doctype.xml": dict(
        driver="470.82.01",
        cuda="11.4",
        devices=[
            Device(
                "GPU-7a6b5c4d-3e2f-1a0b-9c8d-7e6f5a4b3c2d",
                0,
                name="NVIDIA A10G",
                brand="NVIDIA",
                pci_address="00000000:00:1E.0",
                total_mem="22731 MiB",
                minor_number=0,
            ),
        ],
        processes={"GPU-7a6b5c4d-3e2f-1a0b-9c8d-7e6f5a4b3c2d": []},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_inventory(name: str) -> None:
    expected = CASES[name]
    found = parse_inventory(read(name))
    assert found.driver_version == expected["driver"]
    assert found.cuda_version == expected["cuda"]
    assert found.devices == expected["devices"]
    assert found.processes == expected["processes"]
    assert found.warnings == []
    assert len(Inventory(found.devices)) == len(expected["devices"])
    # every device has an entry: its MIG devices, [] when it has none
    assert found.mig == {
        d.uuid: expected.get("mig", {}).get(d.uuid, []) for d in expected["devices"]
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_total_memory_in_mib(name: str) -> None:
    found = parse_inventory(read(name))
    # the GPU's own total, never that of a MIG device listed before it
    assert found.memory_mib == {
        d.uuid: int(d.total_mem.split()[0]) if d.total_mem else None
        for d in CASES[name]["devices"]
    }
    assert all(isinstance(v, int) for v in found.memory_mib.values())


def test_odd_values_give_none_and_gpus_without_uuid_are_skipped() -> None:
    found = parse_inventory(read("smi_q_x_v13_odd_values.xml"))
    assert found.driver_version == "590.44.01"
    assert found.devices == [
        Device(
            "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0",
            0,
            name="Graphics Device",
            brand=None,
            arch=None,
            pci_address="00000000:17:00.0",
            total_mem=None,
            minor_number=None,
            mig_mode=None,
        ),
        # the numbers keep the document position although GPUs 1 and 2 were skipped
        Device(
            "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
            3,
            name=None,
            brand=None,
            arch="Blackwell",
            pci_address="00000000:CA:00.0",
            total_mem=None,
            minor_number=None,
            mig_mode=None,
        ),
    ]
    assert found.processes == {
        "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0": [
            ProcessInfo(4242, "C", None, None),  # empty name, used_memory N/A
            ProcessInfo(4343, "C+G", "blender", "812 MiB"),
        ],
        "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0": None,  # <processes>N/A</processes>
    }
    assert len(found.warnings) == 3
    pid_warning, uuid_error, uuid_missing = found.warnings
    assert "GPU-9f8e7d6c" in pid_warning and "pid" in pid_warning
    assert uuid_error.startswith("GPU 1 (00000000:31:00.0)") and "'Unknown Error'" in uuid_error
    assert uuid_missing.startswith("GPU 2 ") and "missing" in uuid_missing


def test_numbers_follow_document_order_not_minor_numbers() -> None:
    devices = parse_inventory(read("smi_q_x_v11_four_gpus.xml")).devices
    assert [d.number for d in devices] == [0, 1, 2, 3]
    assert [d.minor_number for d in devices] == [1, 2, 3, 0]
    # dmon/pmon print index 3 for the GPU at bus 3E, which is /dev/nvidia0
    third = Inventory(devices).by_number(3)
    assert third is not None and third.pci_address == "00000000:3E:00.0"


def test_fixtures_cover_renamed_elements_and_doctypes() -> None:
    texts = {path.name: path.read_text() for path in FIXTURES.glob("*.xml")}
    joined = "".join(texts.values())
    for marker in (
        "<power_readings>",
        "<gpu_power_readings>",
        "<clocks_throttle_reasons>",
        "<clocks_event_reasons>",
        "<mig_device>",
        '<?xml version="1.0"?>',
    ):
        assert marker in joined
    for version in (9, 10, 11, 12, 13):
        assert f'"nvsmi_device_v{version}.dtd"' in joined
    assert "<product_architecture>" not in texts["smi_q_x_v9_driver384.xml"]
    assert "DOCTYPE" not in texts["smi_q_x_no_doctype.xml"]


MINIMAL = """<nvidia_smi_log>
    <driver_version>{driver}</driver_version>
    <gpu id="00000000:01:00.0"><uuid>GPU-aaaa-0001</uuid>{extra}</gpu>
</nvidia_smi_log>
"""


def minimal(driver: str = "550.54.15", extra: str = "") -> str:
    return MINIMAL.format(driver=driver, extra=extra)


@pytest.mark.parametrize(
    "odd",
    [
        "N/A",
        "Unknown Error",
        "Requested functionality has been deprecated",
        "[N/A]",
        "[Not Supported]",
        "",
        "  ",
    ],
)
def test_odd_driver_version_is_none(odd: str) -> None:
    assert parse_inventory(minimal(driver=odd)).driver_version is None


def test_a_minimal_document_gives_none_for_everything_missing() -> None:
    found = parse_inventory(minimal())
    assert found.devices == [Device("GPU-aaaa-0001", 0, pci_address="00000000:01:00.0")]
    assert found.processes == {"GPU-aaaa-0001": None}
    assert found.cuda_version is None


def test_pci_bus_id_used_when_the_id_attribute_is_missing() -> None:
    text = (
        "<nvidia_smi_log><gpu><uuid>GPU-aaaa-0001</uuid>"
        "<pci><pci_bus_id>00000001:41:00.0</pci_bus_id></pci></gpu></nvidia_smi_log>"
    )
    assert parse_inventory(text).devices[0].pci_address == "00000001:41:00.0"


def test_repeated_uuid_is_skipped_with_a_warning() -> None:
    second = '<gpu id="00000000:02:00.0"><uuid>GPU-aaaa-0001</uuid></gpu>'
    text = minimal().replace("</gpu>", "</gpu>" + second)
    found = parse_inventory(text)
    assert [d.number for d in found.devices] == [0]
    assert found.warnings == ["GPU 1 repeats uuid GPU-aaaa-0001: skipped"]


def test_no_gpu_at_all_is_a_warning_not_an_error() -> None:
    found = parse_inventory("<nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>")
    assert found.devices == [] and found.warnings == ["nvidia-smi -q -x lists no reservable GPU"]


@pytest.mark.parametrize("prefix", ["\n\n", "\ufeff", '<?xml version="1.0" encoding="UTF-8"?>\n'])
def test_leading_whitespace_bom_and_encoding_declaration(prefix: str) -> None:
    found = parse_inventory(prefix + read("smi_q_x_no_doctype.xml").split("\n", 1)[1])
    assert [d.uuid for d in found.devices] == ["GPU-7a6b5c4d-3e2f-1a0b-9c8d-7e6f5a4b3c2d"]
    assert found.warnings == []


def test_text_before_the_document_is_ignored_with_a_warning() -> None:
    found = parse_inventory("WARNING: infoROM is corrupted at gpu 0000:02:00.0\n" + minimal())
    assert len(found.devices) == 1
    assert found.warnings == [
        "ignored text before the XML document: 'WARNING: infoROM is corrupted at gpu 0000:02:00.0'"
    ]


def test_doctype_fetches_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Were the DTD loaded, its default attribute would give the <gpu> an id.
    dtd = tmp_path / "nvsmi_device_v12.dtd"
    dtd.write_text('<!ATTLIST gpu id CDATA "FROM-THE-DTD">\n')

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the parser tried to open a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    for system in (dtd.as_uri(), str(dtd), "http://203.0.113.9/nvsmi_device_v12.dtd"):
        text = (
            f'<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "{system}">\n'
            "<nvidia_smi_log><gpu><uuid>GPU-aaaa-0001</uuid></gpu></nvidia_smi_log>\n"
        )
        assert parse_inventory(text).devices[0].pci_address is None


TRUNCATED = read("smi_q_x_v12_driver535.xml")[:3000]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "printed nothing"),
        (" \n\t\n", "printed nothing"),
        ("No devices were found\n", "no XML: 'No devices were found'"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make "
            "sure "
            "that the latest NVIDIA driver is installed and running.\n",
            "no XML: .NVIDIA-SMI has failed because",
        ),
        (
            "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: "
            "570.124\n",
            "no XML: 'Failed to initialize NVML: Driver/library version mismatch",
        ),
        (TRUNCATED, r"not well-formed XML \(no element found"),
        ('<?xml version="1.0"?>\n<html><body>502</body></html>\n', "got <html>"),
        ("<nvidia_smi_log><gpu></nvidia_smi_log>", "not well-formed XML"),
        (
            '<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaaaaaaaa">]>\n'
            "<nvidia_smi_log>&a;</nvidia_smi_log>",
            "declares XML entities",
        ),
    ],
)
def test_not_a_document_raises_discovery_error(text: str, message: str) -> None:
    with pytest.raises(DiscoveryError, match=message):
        parse_inventory(text)


MIG_DEVICE = """<mig_device>
    <index>{index}</index><gpu_instance_id>{gi}</gpu_instance_id>
    <compute_instance_id>{ci}</compute_instance_id>
    <fb_memory_usage><total>{total}</total><used>0 MiB</used></fb_memory_usage>
</mig_device>"""


def mig_device(index: str = "0", gi: str = "1", ci: str = "0", total: str = "9856 MiB") -> str:
    return MIG_DEVICE.format(index=index, gi=gi, ci=ci, total=total)


@pytest.mark.parametrize(
    "listing",
    [
        "<mig_devices>None</mig_devices>",
        "<mig_devices>\n\t\t\tNone\n\t\t</mig_devices>",
        "<mig_devices>N/A</mig_devices>",
        "<mig_devices>Unknown Error</mig_devices>",
        "<mig_devices></mig_devices>",
        "<mig_devices/>",
        "",  # drivers before MIG print no element at all
    ],
)
def test_no_mig_devices_is_an_empty_list(listing: str) -> None:
    found = parse_inventory(
        minimal(extra="<mig_mode><current_mig>Disabled</current_mig></mig_mode>" + listing)
    )
    assert found.mig == {"GPU-aaaa-0001": []}
    assert found.warnings == []


def test_mig_device_values_that_are_no_numbers_are_none() -> None:
    devices = "".join(
        [
            mig_device("0", "7", "0", "9856 MiB"),
            mig_device("N/A", "Unknown Error", "[N/A]", "N/A"),
            mig_device("2", "8", "1", "Requested functionality has been deprecated"),
            "<mig_device><index>3</index></mig_device>",  # everything else missing
            mig_device("4", "13", "0", "4864"),  # a size without its unit
        ]
    )
    found = parse_inventory(minimal(extra=f"<mig_devices>{devices}</mig_devices>"))
    assert found.mig == {
        "GPU-aaaa-0001": [
            MigInstance(0, 7, 0, 9856),
            MigInstance(None, None, None, None),
            MigInstance(2, 8, 1, None),
            MigInstance(3, None, None, None),
            MigInstance(4, 13, 0, 4864),
        ]
    }
    # a MIG device's memory is not the GPU's: the GPU printed none
    assert found.memory_mib == {"GPU-aaaa-0001": None}
    assert found.devices[0].total_mem is None


@pytest.mark.parametrize(
    "total, mib",
    [
        ("40960 MiB", 40960),
        ("  16280 MiB  ", 16280),
        ("16280", 16280),
        ("16280MiB", 16280),
        ("N/A", None),
        ("Unknown Error", None),
        ("[N/A]", None),
        ("", None),
        ("Insufficient Permissions", None),
        ("lots MiB", None),
        ("-1 MiB", None),
        ("12.5 GiB", None),
    ],
)
def test_total_memory_in_mib(total: str, mib: object) -> None:
    extra = f"<fb_memory_usage><total>{total}</total></fb_memory_usage>"
    assert parse_inventory(minimal(extra=extra)).memory_mib == {"GPU-aaaa-0001": mib}


def test_memory_missing_is_none_and_skipped_gpus_have_no_entry() -> None:
    found = parse_inventory(read("smi_q_x_v13_odd_values.xml"))
    assert found.memory_mib == {d.uuid: None for d in found.devices}
    assert found.mig == {d.uuid: [] for d in found.devices}
    assert found.memory_mib.keys() == found.processes.keys()


@pytest.mark.parametrize(
    "gi, ci, expected",
    [
        ("3", "0", (3, 0)),
        ("N/A", "N/A", (None, None)),
        ("Unknown Error", "1", (None, 1)),
        (None, None, (None, None)),  # before 495: no such elements
    ],
)
def test_process_instance_ids(gi: object, ci: object, expected: tuple) -> None:
    ids = (
        ""
        if gi is None
        else (
            f"<gpu_instance_id>{gi}</gpu_instance_id>"
            f"<compute_instance_id>{ci}</compute_instance_id>"
        )
    )
    extra = (
        f"<processes><process_info>{ids}<pid>5150</pid><type>C</type>"
        "<process_name>python</process_name><used_memory>N/A</used_memory>"
        "</process_info></processes>"
    )
    (process,) = parse_inventory(minimal(extra=extra)).processes["GPU-aaaa-0001"]  # type: ignore
    assert (process.gpu_instance_id, process.compute_instance_id) == expected
    assert process.pid == 5150 and process.used_memory is None
