"""The nvidia-smi simulator, run as a real child process the way the daemon runs nvidia-smi."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIM = [sys.executable, "-m", "patroller.simulator"]

# Verbatim from NVIDIA-SMI.md.
DMON_R384 = "# gpu   pwr  temp    sm   mem   enc   dec  mclk  pclk"
DMON_R470 = "# gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk"
DMON_R550 = "# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk "
PMON_R384 = "# gpu     pid  type    sm   mem   enc   dec   command"
PMON_R470 = "# gpu        pid  type    sm   mem   enc   dec   command"
PMON_R470_UM = "# gpu        pid  type    sm   mem   enc   dec    fb   command"
PMON_R550_UM = (
    "# gpu         pid   type     sm    mem    enc    dec    jpg    ofa     fb   ccpm    command "
)


def scenario(
    era: str = "r550", devices: Any = 1, procs: Sequence[dict[str, Any]] = (), **extra: Any
) -> dict[str, Any]:
    """A scenario with these devices (a list, or how many default ones)."""
    listed = [{} for _ in range(devices)] if isinstance(devices, int) else devices
    base = {"era": era, "interval": 0.05, "devices": listed, "processes": list(procs)}
    return dict(base, **extra)


def write(path: Path, scn: Any) -> None:
    """Replace the scenario file at once, as a test driving a live stream should."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(scn if isinstance(scn, str) else json.dumps(scn))
    os.replace(tmp, path)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NVSMI_SHOW_ALL_DEVICES", None)
    env.pop("PATROLLER_SIM_SCENARIO", None)
    env.update(extra or {})
    return env


@pytest.fixture
def scn_file(tmp_path: Path) -> Path:
    return tmp_path / "scenario.json"


def run(
    path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One finished run; subprocess.run kills the child if it overruns."""
    return subprocess.run(
        SIM + ["--scenario", str(path)] + list(args),
        capture_output=True,
        text=True,
        timeout=10,
        env=_env(env),
    )


class Child:
    """A running simulator whose stdout lines arrive on a queue."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, done: Callable[[str], bool], timeout: float = 5.0) -> list[str]:
        """Lines read up to and including the first that satisfies `done`."""
        seen, deadline = [], time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            assert line is not None, f"stream ended after {seen}"
            seen.append(line)
            if done(line):
                return seen

    def quiet_for(self, seconds: float) -> bool:
        """True when nothing was printed for `seconds`."""
        try:
            self.lines.get(timeout=seconds)
            return False
        except queue.Empty:
            return True


@contextmanager
def child(path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Child]:
    """A streaming simulator, killed and reaped whatever the test does."""
    sim = Child(SIM + ["--scenario", str(path)] + list(args), _env(env))
    try:
        yield sim
    finally:
        if sim.proc.poll() is None:
            sim.proc.kill()
        sim.proc.wait(timeout=5)
        sim.reader.join(timeout=5)  # it sees EOF now; closing under it would race
        for pipe in (sim.proc.stdout, sim.proc.stderr):
            pipe.close()  # type: ignore[union-attr]


def data(stdout: str) -> list[list[str]]:
    """Data rows split on whitespace."""
    return [line.split() for line in stdout.splitlines() if line and not line.startswith("#")]


# ---- -q -x ------------------------------------------------------------------------------------


@pytest.mark.parametrize("era,dtd", [("r384", "v9"), ("r470", "v11"), ("r550", "v12")])
def test_xml_devices_in_index_order_with_minor_numbers(scn_file: Path, era: str, dtd: str) -> None:
    buses_minors = (("01", 1), ("41", 2), ("81", 3), ("C1", 0))  # minors out of order, as seen
    devices = [{"pci": f"00000000:{bus}:00.0", "minor": minor} for bus, minor in buses_minors]
    procs = [{"pid": 4242, "gpu": 2, "type": "C+G", "name": "a&b <x>", "used_mib": 512}]
    write(scn_file, scenario(era, procs=procs, devices=devices))
    out = run(scn_file, "-x", "-q")
    assert out.returncode == 0, out.stdout
    assert f'<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_{dtd}.dtd">' in out.stdout
    root = ET.fromstring(out.stdout)
    gpus = root.findall("gpu")
    assert [g.get("id") for g in gpus] == [d["pci"] for d in devices]
    assert [g.findtext("minor_number") for g in gpus] == ["1", "2", "3", "0"]
    assert all(g.findtext("uuid", "").startswith("GPU-") for g in gpus)
    # product_architecture came with driver 495, fb reserved with 510: only r550 has them
    assert (gpus[0].find("product_architecture") is None) == (era != "r550")
    assert (gpus[0].find("fb_memory_usage/reserved") is None) == (era != "r550")
    info = gpus[2].find("processes/process_info")
    assert info is not None and info.findtext("process_name") == "a&b <x>"
    fields = [info.findtext(tag) for tag in ("pid", "type", "used_memory")]
    assert fields == ["4242", "C+G", "512 MiB"]
    assert (info.find("gpu_instance_id") is None) == (era == "r384")
    if era != "r384":
        assert gpus[0].findtext("mig_mode/current_mig") == "Disabled"
        assert gpus[0].findtext("mig_devices", "").strip() == "None"


def test_query_compute_apps_lists_compute_processes(scn_file: Path) -> None:
    procs = [
        {"pid": 11, "gpu": 1, "used_mib": 100},
        {"pid": 12, "gpu": 0, "type": "G"},
        {"pid": 13, "gpu": 0, "type": "C+G"},
    ]
    write(scn_file, scenario(devices=2, procs=procs))
    out = run(
        scn_file, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"
    )
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert [line.split(", ")[1:] for line in lines] == [["13", "[N/A]"], ["11", "100"]]
    assert lines[1].startswith("GPU-00000001-")


# ---- dmon / pmon shapes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "era,args,head,units",
    [
        ("r384", [], DMON_R384, "# Idx     W     C     %     %     %     %   MHz   MHz"),
        ("r470", [], DMON_R470, "# Idx     W     C     C     %     %     %     %   MHz   MHz"),
        (
            "r550",
            [],
            DMON_R550,
            "# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz ",
        ),
        ("r550", ["-s", "m"], "# gpu     fb   bar1   ccpm ", "# Idx     MB     MB     MB "),
        ("r550", ["-s", "t"], "# gpu  rxpci  txpci ", "# Idx   MB/s   MB/s "),
    ],
)
def test_dmon_headers_per_era(
    scn_file: Path, era: str, args: list[str], head: str, units: str
) -> None:
    write(scn_file, scenario(era))
    out = run(scn_file, "dmon", "-c", "1", *args)
    assert out.returncode == 0
    assert out.stdout.splitlines()[:2] == [head, units]


def test_dmon_full_selection_adds_columns_in_fixed_order(scn_file: Path) -> None:
    write(scn_file, scenario("r550", devices=1, procs=[{"pid": 5, "used_mib": 300}]))
    lines = run(scn_file, "dmon", "-c", "1", "-s", "tempvcu").stdout.splitlines()
    assert lines[0].split()[13:] == [
        "pviol",
        "tviol",
        "fb",
        "bar1",
        "ccpm",
        "sbecc",
        "dbecc",
        "pci",
        "rxpci",
        "txpci",
    ]
    assert "bool" in lines[1] and "errs" in lines[1] and "MB/s" in lines[1]
    row = dict(zip(lines[0].split()[1:], lines[2].split(), strict=True))
    assert row["fb"] == "300" and row["mtemp"] == "-" and row["sbecc"] == "-"


@pytest.mark.parametrize(
    "era,select,head,units",
    [
        ("r384", "u", PMON_R384, "# Idx       #   C/G     %     %     %     %   name"),
        ("r470", "u", PMON_R470, "# Idx          #   C/G     %     %     %     %   name"),
        (
            "r470",
            "um",
            PMON_R470_UM,
            "# Idx          #   C/G     %     %     %     %    MB   name",
        ),
        (
            "r550",
            "um",
            PMON_R550_UM,
            "# Idx           #    C/G      %      %      %      %      %      %     MB     MB    name ",
        ),
    ],
)
def test_pmon_headers_per_era(
    scn_file: Path, era: str, select: str, head: str, units: str
) -> None:
    write(scn_file, scenario(era))
    assert run(scn_file, "pmon", "-c", "1", "-s", select).stdout.splitlines()[:2] == [head, units]


def test_only_four_devices_unless_asked(scn_file: Path) -> None:
    write(scn_file, scenario(devices=6))
    gpus = lambda out: sorted({row[0] for row in data(out.stdout)})
    assert gpus(run(scn_file, "dmon", "-c", "1")) == ["0", "1", "2", "3"]
    assert gpus(run(scn_file, "pmon", "-c", "1")) == ["0", "1", "2", "3"]
    assert gpus(run(scn_file, "dmon", "-c", "1", "-i", "0,1,2,3,4,5")) == list("012345")
    assert gpus(run(scn_file, "pmon", "-c", "1", "-i", "5,4")) == ["4", "5"]
    everything = {"NVSMI_SHOW_ALL_DEVICES": "1"}
    assert gpus(run(scn_file, "dmon", "-c", "1", env=everything)) == list("012345")
    write(scn_file, scenario(devices=6, show_all_devices=True))
    assert gpus(run(scn_file, "pmon", "-c", "1")) == list("012345")


def test_count_gives_that_many_intervals(scn_file: Path) -> None:
    write(scn_file, scenario(devices=2))
    out = run(scn_file, "dmon", "-c", "3", "-d", "0.01")
    assert out.returncode == 0
    assert [row[0] for row in data(out.stdout)] == ["0", "1"] * 3


def test_date_time_columns(scn_file: Path) -> None:
    write(scn_file, scenario("r470", procs=[{"pid": 7}]))
    lines = run(scn_file, "dmon", "-c", "1", "-o", "DT").stdout.splitlines()
    assert lines[0].startswith("#Date       Time        gpu   pwr gtemp mtemp")
    assert lines[1].startswith("#YYYYMMDD   HH:MM:SS    Idx")
    assert re.match(r"^ \d{8}   \d\d:\d\d:\d\d       0 ", lines[2])
    pmon = run(scn_file, "pmon", "-c", "1", "-o", "DT").stdout.splitlines()
    assert pmon[0].startswith("#Date       Time        gpu        pid")
    assert re.match(r"^ \d{8}   \d\d:\d\d:\d\d       0          7     C ", pmon[2])


def test_pmon_rows_seven_digit_pid_idle_devices_and_command(scn_file: Path) -> None:
    procs = [
        {"pid": 1426541, "gpu": 15, "name": "sglang::scheduler_tp0", "sm": 66, "mem": 12},
        {"pid": 1426541, "gpu": 13, "name": "python"},
        {"pid": 99, "gpu": 13, "type": "G", "name": ""},
    ]
    write(scn_file, scenario("r384", devices=16, procs=procs))
    lines = run(scn_file, "pmon", "-c", "1", "-i", "15,14,13").stdout.splitlines()[2:]
    assert lines[0].split() == ["13", "1426541", "C", "-", "-", "-", "-", "python"]
    assert lines[0].endswith("   python         ")  # padded to 15 characters
    assert lines[1].split() == ["13", "99", "G", "-", "-", "-", "-", "-"]  # no name: `-`
    assert lines[2].split() == ["14"] + ["-"] * 7
    assert "   15 1426541     C    66    12" in lines[3]
    assert lines[3].split()[-1] == "sglang::schedul"


# ---- live changes ---------------------------------------------------------------------------


def test_live_scenario_changes_reach_pmon(scn_file: Path) -> None:
    write(scn_file, scenario("r550"))
    idle = lambda line: line.split()[:2] == ["0", "-"]
    with child(scn_file, "pmon", "-d", "0.1") as sim:
        sim.until(idle)
        write(scn_file, scenario("r550", procs=[{"pid": 31337, "name": "train.py", "sm": 90}]))
        row = sim.until(lambda line: "31337" in line)[-1]
        assert row.split() == ["0", "31337", "C", "90", "-", "-", "-", "-", "-", "train.py"]
        write(scn_file, '{"era": "r550", "devi')  # half-written: the stream goes on unchanged
        sim.until(lambda line: "31337" in line)
        write(scn_file, scenario("r550"))
        sim.until(idle)
        assert sim.proc.poll() is None


def test_live_statistics_reach_dmon(scn_file: Path) -> None:
    write(scn_file, scenario("r470", devices=2))
    with child(scn_file, "dmon", "-d", "0.05") as sim:
        sim.until(lambda line: line.startswith("    1"))
        write(scn_file, scenario("r470", devices=[{}, {"stats": {"sm": 77, "mtemp": 51}}]))
        row = sim.until(lambda line: line.split()[:1] == ["1"] and "77" in line)[-1]
        assert row.split()[3:5] == ["51", "77"]


# ---- faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,era,status,text",
    [
        (
            "mismatch",
            "r550",
            18,
            "Failed to initialize NVML: Driver/library version mismatch\n"
            "NVML library version: 570.124\n",
        ),
        ("mismatch", "r470", 18, "Failed to initialize NVML: Driver/library version mismatch\n"),
        ("no_devices", "r550", 6, "No devices were found\n"),
        (
            "no_driver",
            "r384",
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA"
            " driver. Make sure that the latest NVIDIA driver is installed and"
            " running.\n",
        ),
        (
            "gpu_lost",
            "r550",
            15,
            "Unable to determine the device handle for GPU0000:01:00.0: GPU is"
            " lost. Reboot the system to recover this GPU\n",
        ),
        (
            "gpu_lost",
            "r470",
            15,
            "Unable to determine the device handle for GPU 0000:01:00.0: GPU is"
            " lost. Reboot the system to recover this GPU\n",
        ),
    ],
)
def test_fail(scn_file: Path, name: str, era: str, status: int, text: str) -> None:
    write(scn_file, scenario(era, faults={"fail": name}))
    for args in (["-q", "-x"], ["dmon"], ["pmon", "-c", "1"]):
        out = run(scn_file, *args)
        assert (out.returncode, out.stdout) == (status, text)


def test_fail_scoped_to_one_command_and_live(scn_file: Path) -> None:
    write(scn_file, scenario(faults={"dmon": {"fail": "nvml_unknown", "fail_status": 7}}))
    assert run(scn_file, "-q", "-x").returncode == 0
    assert run(scn_file, "pmon", "-c", "1").returncode == 0
    out = run(scn_file, "dmon")
    assert (out.returncode, out.stdout) == (7, "Failed to initialize NVML: Unknown Error\n")
    write(scn_file, scenario())
    with child(scn_file, "pmon", "-d", "0.05") as sim:
        sim.until(lambda line: line.startswith("    0"))
        write(scn_file, scenario(faults={"pmon": {"fail": "gpu_lost"}}))
        sim.until(lambda line: "GPU is lost" in line)
        assert sim.proc.wait(timeout=5) == 15


def test_exit_after_lines(scn_file: Path) -> None:
    write(scn_file, scenario(devices=2, faults={"exit_after_lines": 3, "exit_status": 4}))
    out = run(scn_file, "dmon", "-d", "0.01")
    assert out.returncode == 4
    assert len(out.stdout.splitlines()) == 5 and len(data(out.stdout)) == 3


def test_garbage_every(scn_file: Path) -> None:
    write(scn_file, scenario(faults={"garbage_every": 1}))
    lines = run(scn_file, "dmon", "-c", "3", "-d", "0.01").stdout.splitlines()
    assert len(lines) == 8
    row = lines[2]
    assert lines[2::2] == [row, row, row]  # every real row is still there
    assert lines[3] == ""
    assert lines[5].replace("^C", "") == row and "^C" in lines[5]
    assert lines[7] == row[: len(row) // 2]


def test_repeat_header_every(scn_file: Path) -> None:
    write(scn_file, scenario(devices=2, faults={"repeat_header_every": 2}))
    lines = run(scn_file, "dmon", "-c", "5", "-d", "0.01").stdout.splitlines()
    assert [i for i, line in enumerate(lines) if line == DMON_R550] == [0, 6, 12]
    assert len(data("\n".join(lines))) == 10


def test_stall_then_resume(scn_file: Path) -> None:
    write(scn_file, scenario(faults={"stall_after_lines": 2}))
    with child(scn_file, "dmon", "-d", "0.02") as sim:
        assert len(sim.until(lambda line: not line.startswith("#"))) == 3
        sim.until(lambda line: not line.startswith("#"))
        assert sim.quiet_for(0.4)
        assert sim.proc.poll() is None
        write(scn_file, scenario())
        sim.until(lambda line: not line.startswith("#"))


def sigterm_ignored(pid: int) -> bool:
    """Whether SIGTERM is in the process's ignored set (/proc/PID/status SigIgn)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        mask = next(line.split()[1] for line in f if line.startswith("SigIgn:"))
    return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))


def test_ignore_sigterm_leaves_only_sigkill(scn_file: Path) -> None:
    write(scn_file, scenario(faults={"pmon": {"ignore_sigterm": True}}))
    with child(scn_file, "dmon", "-d", "0.05") as sim:  # the fault is pmon's only
        sim.until(lambda line: not line.startswith("#"))
        assert not sigterm_ignored(sim.proc.pid)
    with child(scn_file, "pmon", "-d", "0.05") as sim:
        sim.until(lambda line: not line.startswith("#"))
        assert sigterm_ignored(sim.proc.pid)
        sim.proc.kill()
        assert sim.proc.wait(timeout=5) == -signal.SIGKILL


@pytest.mark.parametrize(
    "hung,answers",
    [
        ("-q", ["--query-compute-apps=pid", "--format=csv"]),
        ("--query-compute-apps", ["-q", "-x"]),
    ],
)
def test_hang_leaves_a_query_silent_and_alive_until_sigkill(
    scn_file: Path, hung: str, answers: list[str]
) -> None:
    write(scn_file, scenario(faults={hung: {"hang": True, "ignore_sigterm": True}}))
    assert run(scn_file, *answers).returncode == 0  # the other query is not hung
    args = ["-q", "-x"] if hung == "-q" else ["--query-compute-apps=pid", "--format=csv"]
    proc = subprocess.Popen(
        SIM + ["--scenario", str(scn_file), *args], stdout=subprocess.PIPE, text=True, env=_env()
    )
    try:
        deadline = time.monotonic() + 10
        while not sigterm_ignored(proc.pid):  # set just before it starts hanging
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.3)  # it hangs on, deaf to SIGTERM
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=5)
    assert proc.returncode == -signal.SIGKILL and out == ""


def test_stderr_text(scn_file: Path) -> None:
    warning = "WARNING: infoROM is corrupted at gpu 0000:01:00.0"
    write(scn_file, scenario(faults={"stderr": warning}))
    out = run(scn_file, "pmon", "-c", "1")
    assert out.returncode == 0 and out.stderr == warning + "\n"
    assert len(data(out.stdout)) == 1


# ---- errors and endings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,status,text",
    [
        ([], 2, "Invalid combination of input arguments"),
        (["-q"], 2, "Invalid combination of input arguments"),
        (["--frobnicate"], 2, "ERROR: Option --frobnicate is not recognized"),
        (["dmon", "-i", "7"], 6, "No devices were found"),
        (["pmon", "-s", "x"], 2, "Invalid combination of input arguments"),
        (["--query-compute-apps=bogus", "--format=csv"], 2, 'Field "bogus" is not a valid field'),
    ],
)
def test_bad_command_lines(scn_file: Path, args: list[str], status: int, text: str) -> None:
    write(scn_file, scenario(devices=2))
    out = run(scn_file, *args)
    assert out.returncode == status and out.stdout.startswith(text)


def test_host_without_devices(scn_file: Path) -> None:
    write(scn_file, scenario(devices=[]))
    for args in (["-q", "-x"], ["dmon", "-c", "1"], ["pmon", "-c", "1"]):
        out = run(scn_file, *args)
        assert (out.returncode, out.stdout) == (6, "No devices were found\n")


def test_scenario_from_environment(tmp_path: Path) -> None:
    path = tmp_path / "env.json"
    write(path, scenario("r384", devices=3))
    out = subprocess.run(
        SIM + ["dmon", "-c", "1"],
        capture_output=True,
        text=True,
        timeout=10,
        env=_env({"PATROLLER_SIM_SCENARIO": str(path)}),
    )
    assert out.stdout.splitlines()[0] == DMON_R384 and len(data(out.stdout)) == 3


@pytest.mark.parametrize("signum,status", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_signals_end_quietly(scn_file: Path, signum: int, status: int) -> None:
    write(scn_file, scenario())
    with child(scn_file, "pmon", "-d", "0.05") as sim:
        sim.until(lambda line: line.startswith("    0"))
        sim.proc.send_signal(signum)
        assert sim.proc.wait(timeout=5) == status
        assert sim.proc.stderr.read() == ""  # type: ignore[union-attr]


def test_broken_pipe_ends_quietly(scn_file: Path) -> None:
    write(scn_file, scenario(devices=4))
    proc = subprocess.Popen(
        SIM + ["--scenario", str(scn_file), "dmon", "-d", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    try:
        proc.stdout.readline()  # type: ignore[union-attr]
        proc.stdout.close()  # type: ignore[union-attr]
        assert proc.wait(timeout=5) == 0
        assert proc.stderr.read() == b""  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=5)
        proc.stderr.close()  # type: ignore[union-attr]


def test_live_pids_only_and_the_trace_file(scn_file: Path, tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    trace = tmp_path / "pmon.trace"
    try:
        procs = [
            {"pid": sleeper.pid, "gpu": 0},
            {"pid": 4194000, "gpu": 0},
        ]  # the second is not alive
        write(scn_file, dict(scenario("r550", procs=procs), live_pids_only=True, trace=str(trace)))
        out = run(scn_file, "pmon", "-c", "2", "-d", "0.05")
        pids = [row[1] for row in data(out.stdout)]
        assert pids == [str(sleeper.pid)] * 2
        lines = trace.read_text().splitlines()
        assert len(lines) == 1 and lines[0].split()[1:] == [str(sleeper.pid), "0"]
        assert abs(float(lines[0].split()[0]) - time.time()) < 30
    finally:
        sleeper.kill()
        sleeper.wait()


# ---- architecture and device figures ----------------------------------------------------------

ARCHITECTURES = [
    ("NVIDIA H100 80GB HBM3", "Hopper"),
    ("NVIDIA H200", "Hopper"),
    ("NVIDIA GH200 480GB", "Hopper"),
    ("NVIDIA A100-SXM4-80GB", "Ampere"),
    ("NVIDIA A30", "Ampere"),
    ("NVIDIA A10G", "Ampere"),
    ("NVIDIA A40", "Ampere"),
    ("NVIDIA RTX A6000", "Ampere"),
    ("Tesla V100-SXM2-16GB", "Volta"),
    ("Tesla P100-PCIE-16GB", "Pascal"),
    ("Tesla P40", "Pascal"),
    ("NVIDIA L4", "Ada Lovelace"),
    ("NVIDIA L40S", "Ada Lovelace"),
    ("NVIDIA GeForce RTX 4090", "Ada Lovelace"),
    ("NVIDIA B200", "Blackwell"),
    ("NVIDIA GB200", "Blackwell"),
    ("Tesla T4", "Turing"),
    ("Graphics Device", "Ampere"),  # unknown: the era's default
]


def test_architecture_follows_the_product_name(scn_file: Path) -> None:
    devices = [{"name": name} for name, _ in ARCHITECTURES] + [
        {"name": "NVIDIA H100", "arch": "X"}
    ]
    write(scn_file, scenario("r550", devices=devices))
    gpus = ET.fromstring(run(scn_file, "-q", "-x").stdout).findall("gpu")
    named = [(g.findtext("product_name"), g.findtext("product_architecture")) for g in gpus]
    assert named == ARCHITECTURES + [("NVIDIA H100", "X")]  # the scenario's arch wins
    write(scn_file, scenario("r470", devices=[{"name": "NVIDIA H100 80GB HBM3"}]))
    gpu = ET.fromstring(run(scn_file, "-q", "-x").stdout).find("gpu")
    assert gpu is not None and gpu.find("product_architecture") is None  # before 495: none


def dmon_rows(out: str) -> list[dict[str, str]]:
    """dmon's data rows as {column: value}."""
    names = out.splitlines()[0].lstrip("#").split()
    return [dict(zip(names, row, strict=True)) for row in data(out)]


@pytest.mark.parametrize("era", ["r384", "r470", "r550"])
def test_device_figures_follow_their_processes(scn_file: Path, era: str) -> None:
    procs = [
        {"pid": 1, "gpu": 0, "sm": 97, "mem": 40, "used_mib": 30000},
        {"pid": 2, "gpu": 1, "sm": 60, "mem": 70, "used_mib": 100},
        {"pid": 3, "gpu": 1, "sm": 60, "mem": 70, "used_mib": 200},
        {"pid": 4, "gpu": 2, "sm": 90, "used_mib": 50},
    ]
    devices = [{}, {}, {"stats": {"sm": 5, "pwr": 40}}, {}]
    write(scn_file, scenario(era, devices=devices, procs=procs))
    temp = "temp" if era == "r384" else "gtemp"
    rows = dmon_rows(run(scn_file, "dmon", "-c", "1", "-s", "pucvmt").stdout)
    figures = [[r["sm"], r["mem"], r["fb"], r["pwr"], r[temp]] for r in rows]
    assert figures == [
        ["97", "40", "30000", "316", "69"],  # 25 + 3 * 97 W, 30 + 0.4 * 97 C
        ["100", "100", "300", "325", "70"],  # sums, at most 100
        ["5", "0", "50", "40", "32"],  # the scenario's stats win
        ["0", "0", "0", "25", "30"],
    ]  # idle
    gpus = ET.fromstring(run(scn_file, "-q", "-x").stdout).findall("gpu")
    assert [g.findtext("utilization/gpu_util") for g in gpus] == ["97 %", "100 %", "5 %", "0 %"]
    assert gpus[0].findtext("fb_memory_usage/used") == "30000 MiB"


# ---- MIG and devices whose pmon attributes nothing ------------------------------------------

MIG_INSTANCES = [
    {"gpu_instance_id": 1, "compute_instance_id": 0, "memory_mib": 9856},
    {"gpu_instance_id": 2, "compute_instance_id": 0, "memory_mib": 9856},
]


def mig_host(era: str) -> dict[str, Any]:
    """A MIG GPU with two instances, a blind GPU and a plain one, each with a process."""
    devices = [
        {"name": "NVIDIA A100-SXM4-40GB", "mig": "Enabled", "mig_devices": MIG_INSTANCES},
        {"name": "NVIDIA H100 80GB HBM3", "pmon_blind": True},
        {"name": "NVIDIA L4"},
    ]
    procs = [
        {"pid": 501, "gpu": 0, "gi": 2, "ci": 0, "used_mib": 4096, "sm": 50, "name": "train"},
        {"pid": 502, "gpu": 0, "used_mib": 1000, "sm": 10},  # the first instance's
        {"pid": 601, "gpu": 1, "used_mib": 2048, "sm": 97, "name": "infer"},
        {"pid": 701, "gpu": 2, "used_mib": 512, "sm": 30, "name": "plain"},
    ]
    return scenario(era, devices=devices, procs=procs)


@pytest.mark.parametrize("era", ["r470", "r550"])
def test_mig_devices_and_instance_ids_in_xml(scn_file: Path, era: str) -> None:
    write(scn_file, mig_host(era))
    gpus = ET.fromstring(run(scn_file, "-q", "-x").stdout).findall("gpu")
    assert gpus[0].findtext("mig_mode/current_mig") == "Enabled"
    instances = gpus[0].findall("mig_devices/mig_device")
    ids = [
        [m.findtext(t) for t in ("index", "gpu_instance_id", "compute_instance_id")]
        for m in instances
    ]
    assert ids == [["0", "1", "0"], ["1", "2", "0"]]
    memory = [
        [m.findtext(f"fb_memory_usage/{t}") for t in ("total", "used", "free")] for m in instances
    ]
    assert memory == [["9856 MiB", "1000 MiB", "8856 MiB"], ["9856 MiB", "4096 MiB", "5760 MiB"]]
    assert (instances[0].find("fb_memory_usage/reserved") is None) == (era == "r470")
    procs = [
        [p.findtext(t) for t in ("pid", "gpu_instance_id", "compute_instance_id")]
        for p in gpus[0].findall("processes/process_info")
    ]
    assert procs == [["501", "2", "0"], ["502", "1", "0"]]
    assert gpus[0].findtext("utilization/gpu_util") == "N/A"  # no device-wide figure in MIG
    assert gpus[1].findtext("mig_devices", "").strip() == "None"
    assert gpus[1].findtext("processes/process_info/gpu_instance_id") == "N/A"
    assert gpus[1].findtext("processes/process_info/pid") == "601"  # blind to pmon only


def test_no_mig_before_r470(scn_file: Path) -> None:
    write(scn_file, mig_host("r384"))
    gpu = ET.fromstring(run(scn_file, "-q", "-x").stdout).find("gpu")
    assert gpu is not None and gpu.find("mig_mode") is None and gpu.find("mig_devices") is None
    assert gpu.find("processes/process_info/gpu_instance_id") is None
    rows = data(run(scn_file, "pmon", "-c", "1").stdout)
    assert [row[:2] for row in rows] == [["0", "501"], ["0", "502"], ["1", "-"], ["2", "701"]]


# ---- -L ---------------------------------------------------------------------------------------

MIG_LINE = re.compile(r"  MIG (\S+) +Device +(\d+): \(UUID: (MIG-[0-9a-f-]{36})\)")


@pytest.mark.parametrize("era", ["r470", "r550"])
@pytest.mark.parametrize("flag", ["-L", "--list-gpus"])
def test_list_gpus_names_each_gpu_and_its_mig_devices(scn_file: Path, era: str, flag: str) -> None:
    write(scn_file, mig_host(era))
    out = run(scn_file, flag)
    assert out.returncode == 0 and out.stderr == ""
    lines = out.stdout.splitlines()
    uuids = [f"GPU-{i:08x}-5a1e-4e57-8000-{i:012x}" for i in range(3)]
    assert lines[0] == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {uuids[0]})"
    assert lines[3:] == [
        f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {uuids[1]})",
        f"GPU 2: NVIDIA L4 (UUID: {uuids[2]})",
    ]
    # Padded as R470 and later print it: the profile in 11 columns, the index in 2.
    assert lines[1].startswith("  MIG 1g.10gb     Device  0: (UUID: MIG-")
    found = [MIG_LINE.fullmatch(line) for line in lines[1:3]]
    assert all(found) and [m.group(2) for m in found] == ["0", "1"]  # type: ignore[union-attr]
    migs = [m.group(3) for m in found]  # type: ignore[union-attr]
    assert len(set(migs)) == 2 and all(
        re.fullmatch(r"MIG-\w{8}-\w{4}-5\w{3}-\w{4}-\w{12}", m) for m in migs
    )  # version-5 uuids
    assert run(scn_file, "-L").stdout == out.stdout  # the same at every call
    other = mig_host(era)
    other["devices"][0]["uuid"] = "GPU-11111111-2222-4333-8444-555555555555"
    write(scn_file, other)
    assert not set(migs) & set(MIG_LINE.findall(run(scn_file, "-L").stdout)[0])  # another GPU's


def test_list_gpus_takes_a_given_uuid_and_profile_and_the_legacy_form(scn_file: Path) -> None:
    host = mig_host("r550")
    host["devices"][0]["mig_devices"] = [
        dict(
            MIG_INSTANCES[0], uuid="MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", profile="1g.10gb+me"
        ),
        MIG_INSTANCES[1],
    ]
    write(scn_file, host)
    lines = run(scn_file, "-L").stdout.splitlines()
    assert (
        lines[1] == "  MIG 1g.10gb+me  Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)"
    )
    write(scn_file, dict(host, legacy_mig_uuids=True))  # as R450-R465 print it
    gpu = "GPU-00000000-5a1e-4e57-8000-000000000000"
    assert run(scn_file, "-L").stdout.splitlines()[1:3] == [
        f"  MIG 1g.10gb+me Device 0: (UUID: MIG-{gpu}/1/0)",
        f"  MIG 1g.10gb Device 1: (UUID: MIG-{gpu}/2/0)",
    ]


def test_list_gpus_before_r470_and_without_mig_lists_gpus_only(scn_file: Path) -> None:
    write(scn_file, mig_host("r384"))
    assert [line.split(" (")[0] for line in run(scn_file, "-L").stdout.splitlines()] == [
        "GPU 0: NVIDIA A100-SXM4-40GB",
        "GPU 1: NVIDIA H100 80GB HBM3",
        "GPU 2: NVIDIA L4",
    ]
    write(scn_file, scenario("r550", devices=[{"mig": "Enabled"}]))  # MIG on, no instance
    assert len(run(scn_file, "-L").stdout.splitlines()) == 1


def test_list_gpus_faults_are_its_own(scn_file: Path) -> None:
    write(scn_file, dict(mig_host("r550"), faults={"-L": {"fail": "nvml_unknown"}}))
    out = run(scn_file, "-L")
    assert (out.returncode, out.stdout) == (255, "Failed to initialize NVML: Unknown Error\n")
    assert run(scn_file, "-q", "-x").returncode == 0
    write(scn_file, dict(mig_host("r550"), faults={"-L": {"hang": True}}))
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(
            SIM + ["--scenario", str(scn_file), "-L"], capture_output=True, timeout=0.5, env=_env()
        )
    assert run(scn_file, "-L", "-q").returncode == 2  # not a combination nvidia-smi takes


@pytest.mark.parametrize("era", ["r470", "r550"])
def test_pmon_attributes_nothing_on_mig_and_blind_devices(scn_file: Path, era: str) -> None:
    write(scn_file, mig_host(era))
    rows = data(run(scn_file, "pmon", "-c", "2", "-d", "0.01", "-s", "um").stdout)
    assert [row[:2] for row in rows] == [["0", "-"], ["1", "-"], ["2", "701"]] * 2
    assert set(rows[0][1:]) == {"-"} and set(rows[1][1:]) == {"-"}
    dmon = dmon_rows(run(scn_file, "dmon", "-c", "1", "-s", "pucvmt").stdout)
    assert [r["gpu"] for r in dmon] == ["0", "1", "2"]  # dmon still prints the MIG device
    assert [r["sm"] for r in dmon] == ["-", "97", "30"] and dmon[0]["mem"] == "-"
    assert dmon[0]["fb"] == "5096" and dmon[0]["pwr"] == str(25 + 3 * 60)
    apps = run(
        scn_file,
        "--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
        "--format=csv,noheader,nounits",
    ).stdout.splitlines()
    gpus = ET.fromstring(run(scn_file, "-q", "-x").stdout).findall("gpu")
    uuids = [g.findtext("uuid") for g in gpus]
    assert apps == [
        f"{uuids[0]}, 501, 4096, train",
        f"{uuids[0]}, 502, 1000, python",
        f"{uuids[1]}, 601, 2048, infer",
        f"{uuids[2]}, 701, 512, plain",
    ]


def test_pmon_trace_names_only_what_pmon_printed(scn_file: Path, tmp_path: Path) -> None:
    trace = tmp_path / "pmon.trace"
    write(scn_file, dict(mig_host("r550"), trace=str(trace)))
    run(scn_file, "pmon", "-c", "2", "-d", "0.01")
    assert [line.split()[1:] for line in trace.read_text().splitlines()] == [["701", "2"]]


def test_query_compute_apps_process_name_as_printed(scn_file: Path) -> None:
    procs = [{"pid": 11, "used_mib": 100, "name": "python3 train.py --lr=1,2"}, {"pid": 12}]
    write(scn_file, scenario(procs=procs))
    uuid = "GPU-00000000-5a1e-4e57-8000-000000000000"
    out = run(
        scn_file,
        "--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
        "--format=csv,noheader,nounits",
    )
    assert out.returncode == 0
    assert out.stdout == (
        f"{uuid}, 11, 100, python3 train.py --lr=1,2\n"  # unquoted, as it is
        f"{uuid}, 12, [N/A], python\n"
    )
    out = run(scn_file, "--query-compute-apps=pid,process_name,used_memory", "--format=csv")
    assert out.stdout.splitlines() == [
        "pid, process_name, used_gpu_memory [MiB]",
        "11, python3 train.py --lr=1,2, 100 MiB",
        "12, python, [N/A]",
    ]


# ---- devices that change while dmon/pmon run --------------------------------------------------


def board(n: int) -> dict[str, Any]:
    """A device with its own uuid and PCI id, so that it keeps them when others go."""
    return {
        "uuid": f"GPU-b0a4d{n:03d}-0000-4000-8000-00000000000{n}",
        "pci": f"00000000:{0x18 + n:02X}:00.0",
    }


@pytest.mark.parametrize("kind", ["dmon", "pmon"])
@pytest.mark.parametrize("era,how", [("r550", "index"), ("r470", "uuid"), ("r550", "pci")])
def test_a_watched_device_that_goes_is_lost(scn_file: Path, kind: str, era: str, how: str) -> None:
    boards = [board(0), board(1), board(2)]
    named = {
        "index": "1,2",
        "uuid": f"{boards[1]['uuid']},{boards[2]['uuid']}",
        "pci": f"{boards[1]['pci']},{boards[2]['pci']}",
    }[how]
    write(scn_file, scenario(era, devices=boards))
    first = lambda gpu: lambda line: line.split()[:1] == [gpu]
    with child(scn_file, kind, "-d", "0.05", "-i", named) as sim:
        sim.until(first("2"))
        write(scn_file, scenario(era, devices=[boards[1], boards[2]]))  # unwatched 0 goes
        sim.until(first("1"))
        sim.until(first("2"))  # the same gpu numbers as at start
        write(scn_file, scenario(era, devices=[boards[2]]))  # watched 1 goes
        sp = "" if era == "r550" else " "
        lost = (
            f"Unable to determine the device handle for GPU{sp}0000:19:00.0: GPU is lost."
            " Reboot the system to recover this GPU"
        )
        sim.until(lambda line: line == lost)
        assert sim.proc.wait(timeout=5) == 15


@pytest.mark.parametrize("kind", ["dmon", "pmon"])
def test_a_device_added_appears_after_a_restart(scn_file: Path, kind: str) -> None:
    write(scn_file, scenario("r550", devices=[board(0)]))
    with child(scn_file, kind, "-d", "0.05", "-i", "0") as sim:
        sim.until(lambda line: line.startswith("    0"))
        grown = scenario("r550", devices=[board(0), board(1)], procs=[{"pid": 9, "gpu": 1}])
        write(scn_file, grown)
        seen: list[str] = []  # ten intervals: the stream re-reads the file before each
        sim.until(lambda line: seen.append(line) or len(data("\n".join(seen))) == 10)
        assert {row[0] for row in data("\n".join(seen))} == {"0"}
    out = run(scn_file, kind, "-c", "1", "-i", "0,1")
    assert [row[:1] for row in data(out.stdout)] == [["0"], ["1"]]


# ---- the columns Patroller asks for, in every era, and fixtures made from them ---------------

FIXTURES = ROOT / "tests" / "fixtures" / "nvsmi"
ERA_COLUMNS = {
    ("r384", "dmon"): "gpu pwr temp sm mem enc dec mclk pclk pviol tviol fb bar1 rxpci txpci",
    ("r470", "dmon"): "gpu pwr gtemp mtemp sm mem enc dec mclk pclk pviol tviol fb bar1 rxpci"
    " txpci",
    ("r550", "dmon"): "gpu pwr gtemp mtemp sm mem enc dec jpg ofa mclk pclk pviol tviol fb bar1"
    " ccpm rxpci txpci",
    ("r384", "pmon"): "gpu pid type sm mem enc dec fb command",
    ("r470", "pmon"): "gpu pid type sm mem enc dec fb command",
    ("r550", "pmon"): "gpu pid type sm mem enc dec jpg ofa fb ccpm command",
}
# The streams the daemon runs; each fixture is three intervals of one process on a two-GPU host.
STREAMS = {
    "dmon": ["dmon", "-s", "pucvmt", "-i", "0,1"],
    "pmon": ["pmon", "-s", "um", "-i", "0,1"],
}


def fixture_scenario(era: str) -> dict[str, Any]:
    procs = [
        {
            "pid": 1426541,
            "gpu": 0,
            "name": "sglang::scheduler_tp0",
            "sm": 66,
            "mem": 20,
            "used_mib": 40210,
        }
    ]
    return scenario(era, devices=2, procs=procs)


def mig_fixture_scenario() -> dict[str, Any]:
    return dict(mig_host("r550"), driver_version="550.54.15")


def generate(path: Path, name: str) -> str:
    """What the simulator prints for the fixture `name` (see FIXTURES)."""
    if name.endswith("-q-x-mig.xml"):
        write(path, mig_fixture_scenario())
        return run(path, "-q", "-x").stdout
    era, kind = name.split("-")[:2]
    write(path, fixture_scenario(era))
    return run(path, *STREAMS[kind], "-c", "3", "-d", "0.01").stdout


def stream_fixture_names() -> list[str]:
    return [
        f"{era}-{kind}-{'pucvmt' if kind == 'dmon' else 'um'}.txt"
        for era in ("r384", "r470", "r550")
        for kind in ("dmon", "pmon")
    ]


@pytest.mark.parametrize("name", stream_fixture_names())
def test_stream_fixtures_are_what_the_simulator_prints(scn_file: Path, name: str) -> None:
    era, kind = name.split("-")[:2]
    fresh = generate(scn_file, name).splitlines()
    kept = (FIXTURES / name).read_text().splitlines()
    hint = f"regenerate with: python tests/test_simulator.py ({name})"
    assert fresh[:2] == kept[:2], hint  # headers identical
    assert kept[0].lstrip("#").split() == ERA_COLUMNS[(era, kind)].split()
    width = len(kept[0].lstrip("#").split())
    for lines in (fresh, kept):
        rows = data("\n".join(lines))
        assert len(rows) == 6 and all(len(row) == width for row in rows)
        assert [row[0] for row in rows] == ["0", "1"] * 3
    if kind == "pmon":  # the command is the name cut at 15 characters; rows split on spaces
        assert [row[1] for row in data("\n".join(kept))] == ["1426541", "-"] * 3
        assert data("\n".join(kept))[0][-1] == "sglang::schedul"
    assert data("\n".join(fresh)) == data("\n".join(kept)), hint


def test_mig_xml_fixture_is_what_the_simulator_prints(scn_file: Path) -> None:
    name = "r550-q-x-mig.xml"

    def elements(text: str) -> list[Any]:
        root = ET.fromstring(text)
        return [(e.tag, (e.text or "").strip()) for e in root.iter() if e.tag != "timestamp"]

    kept = (FIXTURES / name).read_text()
    assert elements(generate(scn_file, name)) == elements(kept), "regenerate: see __main__"
    gpu = ET.fromstring(kept).find("gpu")
    assert gpu is not None and len(gpu.findall("mig_devices/mig_device")) == 2


if __name__ == "__main__":  # python tests/test_simulator.py: write the fixtures again
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for fixture in stream_fixture_names() + ["r550-q-x-mig.xml"]:
            (FIXTURES / fixture).write_text(generate(Path(tmp) / "scenario.json", fixture))
            print("wrote", FIXTURES / fixture)
