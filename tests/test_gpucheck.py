"""The real-GPU check (python -m bench.gpucheck) run end to end where no GPU is: the simulator
stands in for nvidia-smi, and a fake libcuda.so.1 (tests/fake_libcuda.c, compiled here) for
the driver: each process the check starts loads it through ctypes as it would the real one,
its allocation is written to a ledger, and the test lists that process on its GPU, with its
memory, in the simulator's scenario, as nvidia-smi would show it. Real throwaway users, a real
daemon, real claim()."""

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest
from helpers import ROOT, TESTS, ScenarioFile, need_root

from bench.gpucheck.host import anonymised

UUIDS = ["GPU-5d0ab2d1-0b0b-4c1e-9a55-0d1a2b3c4d5e", "GPU-8e7f6a5b-1c2d-4e3f-8a9b-0c1d2e3f4a5b"]


@pytest.fixture
def fake_libcuda():
    """(the fake library, the ledger it writes to), in a folder every user may read."""
    need_root("the check makes throwaway users")
    if shutil.which("gcc") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the GPU check's test: gcc is missing")
        pytest.skip("no gcc to build the fake libcuda")
    folder = tempfile.mkdtemp(prefix="fakecuda-", dir="/tmp")
    os.chmod(folder, 0o755)
    library, ledger = os.path.join(folder, "libcuda.so.1"), os.path.join(folder, "ledger")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-o", library, os.path.join(TESTS, "fake_libcuda.c")],
        check=True,
        capture_output=True,
    )
    os.chmod(library, 0o755)
    open(ledger, "w").close()
    os.chmod(ledger, 0o666)  # the throwaway users append to it
    yield library, ledger
    shutil.rmtree(folder)


class Ledger(threading.Thread):
    """Lists each process that allocated through the fake libcuda on its GPU (the first of
    its CUDA_VISIBLE_DEVICES; 0 when unset), with the memory it allocated."""

    def __init__(self, path, scenario):
        super().__init__(daemon=True)
        self.path, self.scenario = path, scenario
        self.stopped = threading.Event()
        self.seen = []

    def run(self):
        done = 0
        while not self.stopped.wait(0.02):
            with open(self.path) as f:
                lines = f.read().splitlines()
            for line in lines[done:]:
                _, pid, visible, size = line.split()
                first = visible.split(",")[0]
                gpu = UUIDS.index(first) if first in UUIDS else int(first) if first != "-" else 0
                self.seen.append((int(pid), gpu))
                processes = self.scenario.scenario["processes"] + [
                    {
                        "pid": int(pid),
                        "gpu": gpu,
                        "type": "C",
                        "name": "python3",
                        "used_mib": int(size) >> 20,
                        "sm": 30,
                        "mem": 10,
                    }
                ]
                self.scenario.write(processes=processes)
            done = len(lines)


def test_the_gpu_check_passes_end_to_end_on_the_simulator_with_a_fake_libcuda(
    tmp_path, fake_libcuda
):
    library, ledger = fake_libcuda
    scenario = ScenarioFile(
        str(tmp_path / "scenario.json"),
        live_pids_only=True,
        processes=[],
        devices=[
            {"name": "NVIDIA A100-SXM4-80GB", "uuid": UUIDS[0]},
            {"name": "NVIDIA H100 80GB HBM3", "uuid": UUIDS[1]},
        ],
    )
    watch = Ledger(ledger, scenario)
    watch.start()
    out = tmp_path / "out"
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.gpucheck",
                "--out",
                str(out),
                "--nvidia-smi",
                scenario.command,
                "--cuda",
                "libcuda",
                "--libcuda",
                library,
                "--mib",
                "64",
                "--seconds",
                "1",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": ROOT, "FAKE_CUDA_LEDGER": ledger},
        )
    finally:
        watch.stopped.set()
        watch.join()
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((out / "result.json").read_text())
    steps = {s["name"]: s for s in result["steps"]}
    assert list(steps) == [
        "doctor",
        "captures",
        "parsers",
        "daemon",
        "users",
        "processes attributed",
        "claim",
        "released",
        "cleaned up",
    ]
    assert all(s["ok"] for s in steps.values()), steps
    assert result["ok"] and result["gpus"] == 2
    assert result["driver"] == "550.54.15" and result["gpu"] == "NVIDIA A100-SXM4-80GB"
    # two users' processes, then the claimant's, each on the GPU it was given
    assert [gpu for _, gpu in watch.seen] == [0, 1, watch.seen[2][1]], watch.seen
    assert "on GPU 0" in steps["processes attributed"]["detail"]
    assert "on GPU 1" in steps["processes attributed"]["detail"]
    assert "(libcuda)" in steps["claim"]["detail"] and "claimed in" in steps["claim"]["detail"]
    stem = "550.54.15-nvidia-a100-sxm4-80gb"
    assert sorted(os.listdir(out / "captures")) == sorted(
        f"{stem}-{what}" for what in ("q-x.xml", "L.txt", "dmon-pucvmet.txt", "pmon-um.txt")
    )
    assert UUIDS[1] in (out / "captures" / f"{stem}-L.txt").read_text()
    doctor = json.loads((out / "doctor.json").read_text())
    assert {r["check"]: r["status"] for r in doctor}["nvidia-smi pmon"] == "ok"
    assert "serving 2 devices" in (out / "daemon.log").read_text()
    # the table, then one line that says where the result is
    shown = done.stdout.splitlines()
    assert shown[0].split() == ["step", "result", "seconds", "detail"]
    assert len(shown) == 1 + len(steps) + 1 and shown[-1].startswith("passed in ")
    # nothing is left behind: no user, no process of theirs, no work folder
    assert not [p.pw_name for p in pwd.getpwall() if p.pw_name.startswith("gpuck")]
    for pid, _ in watch.seen:
        assert not os.path.exists(f"/proc/{pid}"), pid
    assert not [n for n in os.listdir("/tmp") if n.startswith("gpucheck-")]


def test_it_refuses_to_run_as_anyone_but_root(tmp_path):
    need_root("it becomes nobody to try")
    done = subprocess.run(
        [
            "/usr/bin/python3",
            "-c",
            "import os, sys; os.setgid(65534); os.setuid(65534); "
            "sys.path.insert(0, sys.argv[1]); from bench.gpucheck.__main__ import main; "
            "sys.exit(main(['--out', sys.argv[2]]))",
            ROOT,
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "run it as root" in done.stderr, done


def test_only_the_serials_of_a_capture_are_anonymised():
    path = os.path.join(TESTS, "fixtures", "nvsmi", "real", "netdata-rtx-4090-r535.xml")
    with open(path, encoding="utf-8") as f:
        xml = f.read()
    cleaned = anonymised(xml)
    assert "<serial>" in xml and cleaned.count("<serial>0000000000000</serial>") == xml.count(
        "<serial>"
    )
    strip = __import__("re").compile(r"<serial>[^<]*</serial>")
    assert strip.sub("", cleaned) == strip.sub("", xml)


def test_the_script_runs_the_check_with_the_python_it_is_given(tmp_path):
    done = subprocess.run(
        ["sh", os.path.join(ROOT, "scripts", "gpu-check.sh"), "--help"],
        env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m bench.gpucheck")
    assert "--libcuda" in done.stdout and "--nvidia-smi" in done.stdout
