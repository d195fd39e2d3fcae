"""The doctor's checks of nvidia-smi, probed in the test process on the simulator: named as the
PATH finds it, a -q -x answer that is not nvidia-smi's, a driver version with no branch in it and
a document without a DOCTYPE, pmon and -L failing as a lost GPU makes them, a GPU slowed and
with ECC errors, `topo -m` printing no matrix or another host's. Where the simulator has no
such answer, nvidia-smi is a script that prints it and hands every other command to the
simulator, as a driver that answers the rest would. Each check's words compared whole, with the
command lines and times the probe saw (tests/test_doctor_checks.py has the others)."""

import asyncio
import subprocess

import pytest
from helpers import ScenarioFile

from patroller.config import Config
from patroller.doctor.gpu import probe
from patroller.doctor.gpuchecks import FALLBACK, RUN_BY_HAND, gpu_results
from patroller.doctor.results import Result
from patroller.durations import describe

GPU = {"name": "NVIDIA A100-SXM4-80GB"}


def results(command):
    """(the probe's facts, the checks by name) of nvidia-smi run as `command`."""
    config = Config(nvidia_smi=command)
    facts = asyncio.run(probe(config))
    return facts, {r.check: r for r in gpu_results(facts, config)}


def nvidia_smi(folder, simulator, **answers):
    """An `nvidia-smi` in `folder` printing `answers[first argument]` for those commands, the
    simulator answering the rest."""
    folder.mkdir(exist_ok=True)
    cases = "".join(
        f"{word}) cat <<'EOF'\n{text}\nEOF\nexit 0;;\n" for word, text in answers.items()
    )
    script = folder / "nvidia-smi"
    script.write_text(f'#!/bin/sh\ncase "$1" in\n{cases}esac\nexec {simulator} "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_nvidia_smi_is_named_where_the_path_finds_it(tmp_path, monkeypatch):
    healthy = ScenarioFile(str(tmp_path / "s.json"), devices=[GPU])
    tools = tmp_path / "bin"
    nvidia_smi(tools, healthy.command)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    _, found = results("nvidia-smi")
    assert found["nvidia-smi"] == Result(
        "nvidia-smi",
        "ok",
        f"{tools}/nvidia-smi: driver 550.54.15 (R550 branch, document nvsmi_device_v12.dtd), "
        "CUDA 12.4",
    )
    # one whose -q -x prints what nvidia-smi never does: named where found all the same
    nvidia_smi(tools, healthy.command, **{"-q": '<?xml version="1.0" ?>\n<nvidia_smi_log><gpu'})
    facts, found = results("nvidia-smi")
    assert found["nvidia-smi"] == Result(
        "nvidia-smi",
        "degraded",
        f"{tools}/nvidia-smi: driver version unknown (-q -x gave no answer)",
        "see nvidia-smi -q -x below",
    )
    query = found["nvidia-smi -q -x"]
    said = f"answered in {describe(facts.inventory.seconds)}, but not as nvidia-smi does: "
    assert (query.status, query.fix) == ("failed", RUN_BY_HAND), query
    assert query.detail.startswith(said) and query.detail != f"{said}None", query
    assert query.detail[len(said) :] == facts.unreadable and "XML" in facts.unreadable, query


@pytest.mark.parametrize(
    "version, about",
    [("550.54.15", "R550 branch, no DOCTYPE"), ("beta", "no DOCTYPE")],
)
def test_a_driver_without_a_doctype_or_a_branch_says_so(tmp_path, version, about):
    plain = ScenarioFile(
        str(tmp_path / "s.json"), devices=[GPU], doctype=None, driver_version=version
    )
    _, found = results(plain.command)
    assert found["nvidia-smi"] == Result(
        "nvidia-smi", "ok", f"{plain.command}: driver {version} ({about}), CUDA 12.4"
    )


def test_a_lost_gpu_fails_pmon_and_hides_the_mig_devices(tmp_path):
    lost = ScenarioFile(
        str(tmp_path / "s.json"),
        devices=[
            {
                **GPU,
                "mig": "Enabled",
                "mig_devices": [
                    {"gpu_instance_id": 1, "compute_instance_id": 0, "memory_mib": 9856}
                ],
            }
        ],
        faults={"pmon": {"fail": "gpu_lost"}, "-L": {"fail": "gpu_lost"}},
    )
    facts, found = results(lost.command)
    fell = "a GPU fell off the bus: reboot the host (dmesg says which, Xid 79)"
    pmon = facts.pmon.runs[-1]
    assert found["nvidia-smi pmon"] == Result(
        "nvidia-smi pmon",
        "failed",
        f"`{pmon.shown}` {pmon.trouble()}: no process is attributed to its user",
        fell,
    )
    assert found["MIG"] == Result(
        "MIG",
        "degraded",
        "on for GPU 0 (1 instance(s)): a MIG GPU is reserved whole; its processes are "
        f"attributed by --query-compute-apps; `nvidia-smi -L` {facts.listing.trouble()}: the "
        "MIG devices' uuids are unknown (the kubelet names them so)",
        fell,
    )
    assert "GPU is lost" in facts.listing.trouble()


def test_a_gpu_slowed_with_ecc_errors_and_alone(tmp_path):
    hot = ScenarioFile(
        str(tmp_path / "s.json"),
        devices=[
            {**GPU, "health": {"slowdowns": ["hw_thermal_slowdown"], "ecc_uncorrectable": 2}}
        ],
        topology="pcie",
    )
    _, found = results(hot.command)
    assert found["GPU 0 health"] == Result(
        "GPU 0 health",
        "degraded",
        "2 uncorrectable ECC error(s) since the last reset; clocks slowed (hw_thermal_slowdown)",
        "reset the GPU (`nvidia-smi -r -i 0`) when nothing runs on it; if they come back, have "
        "the GPU checked; check its cooling and power",
    )
    assert found["GPU topology"] == Result(
        "GPU topology", "ok", "1 GPU(s): no other GPU to link to"
    )


def test_topo_printing_no_matrix_or_another_hosts_falls_back(tmp_path):
    two = ScenarioFile(str(tmp_path / "two.json"), devices=[GPU, GPU])
    three = ScenarioFile(str(tmp_path / "three.json"), devices=[GPU] * 3, topology="pcie")
    other = subprocess.run(
        [*three.command.split(), "topo", "-m"], capture_output=True, text=True, check=True
    ).stdout
    for answer, said in (
        (
            "NVIDIA topology is not ready",
            "`nvidia-smi topo -m` printed no matrix Patroller can read (no matrix: no header "
            "row naming GPU0)",
        ),
        (other, "`topo -m` lists GPUs [0, 1, 2], the inventory [0, 1]"),
    ):
        command = nvidia_smi(tmp_path / "bin", two.command, topo=answer.rstrip("\n"))
        _, found = results(command)
        assert found["GPU topology"] == Result(
            "GPU topology", "degraded", f"{said}: {FALLBACK}", RUN_BY_HAND
        )
