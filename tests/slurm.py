"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd of Debian's packages,
started, used and stopped by the tests, with four GPUs that are fake character devices.

Everything lives in one temporary directory: slurm.conf, gres.conf, cgroup.conf and an empty
plugstack.conf; a munge key; state, spool and logs; dev/nvidia0..3 (mknod, major 195 as on a
real host); prolog.d/ and epilog.d/ with wrappers that run contrib/slurm/prolog.sh and epilog.sh
with PATROLLER_SLURM_JOB_MAP set to the directory's job-map/ (the Prolog=, Epilog= and
PrologFlags= lines are those of contrib/slurm/slurm.conf.example); and work/, owned by the job
user, where jobs run and write their output. Nothing under /etc is read or changed (SLURM_CONF
points the client commands at the cluster's own slurm.conf), and the daemons listen on loopback
ports chosen free.

`start_node()` starts one (conftest.py's `slurm_node` fixture: one for the session): under
CI=true a missing Slurm, munge or root fails the test, elsewhere it is skipped with the reason
(tests/setup.sh installs slurmctld, slurmd, slurm-client and munge as root on Debian or Ubuntu).

The choices this host (cgroup v1, no systemd) needs, and why:
- ProctrackType=proctrack/cgroup and TaskPlugin=task/cgroup with CgroupPlugin=cgroup/v1: a
  job's processes sit in /sys/fs/cgroup/<controller>/slurm_<node>/uid_<uid>/job_<id>/step_<step>
  (freezer: the step; devices: step_<step>/task_<n>), as on a cgroup v1 node. Debian builds
  Slurm for several slurmd per host, hence slurm_<node> where other builds have slurm.
  cgroup/v1 needs no systemd, and the v1 controllers are already mounted under /sys/fs/cgroup,
  so CgroupAutomount=no: nothing is mounted. (cgroup/v2 would need the unified hierarchy at
  /sys/fs/cgroup itself, and systemd over dbus for slurmstepd's scope unless IgnoreSystemd,
  which cgroup.conf calls a development setting.)
  task/cgroup constrains only devices (ConstrainDevices=yes: a job may open only its own
  dev/nvidia<N>, another is EPERM); cores and memory are not constrained, so the cpuset and
  memory settings of the host's cgroups do not matter and the jobs are not limited by them.
- The node declares 8 CPUs whatever the host has (SlurmdParameters=config_overrides), so that
  four one-GPU jobs run at once on a two-core test machine.
- The cgroup directories are the machine's own (/sys/fs/cgroup/*/slurm_<node>) and may be shared
  with another cluster of this kind started at the same time; job ids start at a random number
  (FirstJobId) so that two clusters do not name the same job directory, and at the end only
  this cluster's job directories are removed.
"""

from __future__ import annotations

import os
import pwd
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROLOG = os.path.join(ROOT, "contrib", "slurm", "prolog.sh")
EPILOG = os.path.join(ROOT, "contrib", "slurm", "epilog.sh")

NOBODY = 65534
GPU_MAJOR = 195  # the NVIDIA driver's character devices
CGROUP = "/sys/fs/cgroup"
TOOLS = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "scontrol",
    "scancel",
    "squeue",
    "sinfo",
)
# Job states after which nothing of the job runs and its epilog has finished (scontrol shows
# COMPLETING while an epilog still runs).
FINISHED = {
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
}
# Node state words that mean it has been taken out of service.
OUT_OF_SERVICE = ("DRAIN", "DOWN", "FAIL", "INVAL", "NOT_RESPONDING")


class SlurmUnavailable(Exception):
    """No Slurm cluster can be started here; the message says why."""


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_hostname() -> str:
    """This host's name as slurmd names its node: up to the first dot."""
    return socket.gethostname().split(".")[0]


class SlurmNode:
    """munged, slurmctld and slurmd of a one-node cluster in a private directory, its node this
    host with `gpus` GPUs (fake devices), one partition `gpu`; jobs are submitted as `user`
    (a uid; nobody by default). With ids_only the prolog writes bare job ids
    (PATROLLER_SLURM_MAP_IDS_ONLY=1)."""

    def __init__(self, gpus: int = 4, user: int = NOBODY, ids_only: bool = False) -> None:
        self.gpus = gpus
        self.uid = user
        self.gid = pwd.getpwuid(user).pw_gid
        self.user = pwd.getpwuid(user).pw_name
        self.ids_only = ids_only
        self.node = short_hostname()
        self.partition = "gpu"
        self.root = tempfile.mkdtemp(prefix="pts", dir="/tmp")
        os.chmod(self.root, 0o755)  # the job user reads slurm.conf; the daemon reads job-map/
        self.etc = os.path.join(self.root, "etc")
        self.conf = os.path.join(self.etc, "slurm.conf")
        self.munge = os.path.join(self.root, "munge")
        self.munge_socket = os.path.join(self.munge, "munge.socket")
        self.logs = os.path.join(self.root, "log")
        self.work = os.path.join(self.root, "work")
        self.job_map = os.path.join(self.root, "job-map")  # made by the prolog
        self.devices = [os.path.join(self.root, "dev", f"nvidia{i}") for i in range(gpus)]
        self.first_job_id = random.randrange(100_000, 60_000_000, 1000)
        self.cluster = f"pt{self.first_job_id // 1000}"
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        for name in ("SLURM_JOB_ID", "SLURM_JOBID"):  # a test run inside a Slurm job
            self.env.pop(name, None)
        self.processes: dict[str, subprocess.Popen] = {}
        self.jobs: set[str] = set()  # every job this cluster ran, for the cleanup
        self.startup = 0.0  # seconds from start() to an idle node

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> SlurmNode:
        """Write the configuration, start the daemons and wait until the node is idle."""
        began = time.monotonic()
        try:
            for tool in TOOLS:
                if shutil.which(tool) is None:
                    raise SlurmUnavailable(
                        f"{tool} is not installed (tests/setup.sh installs "
                        "slurmctld, slurmd, slurm-client and munge)"
                    )
            if os.geteuid() != 0:
                raise SlurmUnavailable("slurmd and the job cgroups need root")
            if not os.path.isdir(os.path.join(CGROUP, "freezer")):
                raise SlurmUnavailable(
                    f"no cgroup v1 freezer hierarchy at {CGROUP}/freezer: "
                    "this cluster is configured for cgroup v1"
                )
            self._write()
            self._start_munged(deadline=began + timeout)
            for attempt in range(3):
                self._write_conf()
                self._spawn("slurmctld", ["slurmctld", "-D", "-f", self.conf])
                self._spawn("slurmd", ["slurmd", "-D", "-N", self.node, "-f", self.conf])
                try:
                    self._until(self._idle, "the node is not idle", deadline=began + timeout)
                    break
                except AssertionError:
                    # A port chosen free was taken in the meantime: again, on others.
                    if attempt == 2 or "Address already in use" not in self.log():
                        raise
                    for name in ("slurmd", "slurmctld"):
                        self._end(name)
                    for name in ("slurmctld", "slurmd"):
                        for suffix in (".log", ".out"):
                            _remove(os.path.join(self.logs, name + suffix))
                    for name in ("state", "spool"):
                        shutil.rmtree(os.path.join(self.root, name))
                        os.makedirs(os.path.join(self.root, name), mode=0o755)
        except BaseException:
            self.stop()
            raise
        self.startup = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Cancel every job, stop the daemons, remove the jobs' cgroups and the directory."""
        if self._alive("slurmctld"):
            self.jobs.update(self._listed_jobs())
            running = [job for job in self.jobs if self.state(job) not in FINISHED | {""}]
            if running:
                self._quietly(["scancel", *running])
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and any(
                    self.state(job) not in FINISHED | {""} for job in running
                ):
                    time.sleep(0.1)
        for name in ("slurmd", "slurmctld", "munged"):
            self._end(name)
        self._kill_steps()
        self._remove_cgroups()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SlurmNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self) -> str:
        """The end of every daemon's log, and what the prolog and epilog said."""
        parts = []
        for name in (
            "munged.log",
            "slurmctld.log",
            "slurmd.log",
            "slurmctld.out",
            "slurmd.out",
            "munged.out",
            "prolog.err",
            "epilog.err",
        ):
            try:
                with open(os.path.join(self.logs, name), encoding="utf-8", errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            parts.append(f"--- {name} ---\n{text[-6000:]}")
        return "\n".join(parts)

    # -- the client commands ------------------------------------------------------------

    def command(
        self,
        argv: Sequence[str],
        user: int | None = None,
        check: bool = True,
        timeout: float = 60,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster, as `user` (a uid) or root."""
        as_user = (
            {}
            if user is None
            else dict(user=user, group=pwd.getpwuid(user).pw_gid, extra_groups=[])
        )
        result = subprocess.run(
            list(argv),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            cwd=self.work,
            **as_user,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {result.returncode}: "
                f"{result.stdout}{result.stderr}\n{self.log()}"
            )
        return result

    def _quietly(self, argv: Sequence[str]) -> None:
        """Run a client command whose failure does not matter (the cleanup)."""
        try:
            subprocess.run(list(argv), env=self.env, capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass

    def _job_options(
        self, gpus: int, name: str | None, account: str | None, extra: Sequence[str]
    ) -> list[str]:
        options = ["-N", "1", "-n", "1", f"--partition={self.partition}"]
        if gpus:
            options.append(f"--gres=gpu:{gpus}")
        if name:
            options.append(f"--job-name={name}")
        if account:
            options.append(f"--account={account}")
        return options + list(extra)

    def sbatch(
        self,
        script: str,
        user: int | None = None,
        gpus: int = 0,
        name: str | None = None,
        account: str | None = None,
        extra: Sequence[str] = (),
    ) -> str:
        """Submit a batch script (its text; it should start with #!) as `user` (the
        cluster's job user by default) asking for `gpus` GPUs; the job id."""
        user = self.uid if user is None else user
        argv = [
            "sbatch",
            "--parsable",
            f"--chdir={self.work}",
            f"--output={self.work}/slurm-%j.out",
            *self._job_options(gpus, name, account, extra),
        ]
        job = self.command(argv, user=user, input=script).stdout.strip().split(";")[0]
        assert re.fullmatch(r"[0-9]+", job), job
        self.jobs.add(job)
        return job

    def srun(
        self,
        command: Sequence[str],
        user: int | None = None,
        gpus: int = 0,
        name: str | None = None,
        account: str | None = None,
        extra: Sequence[str] = (),
        timeout: float = 60,
    ) -> subprocess.CompletedProcess:
        """Run `command` as a job step with srun (a job of its own) as `user`, and wait."""
        user = self.uid if user is None else user
        argv = [
            "srun",
            f"--chdir={self.work}",
            *self._job_options(gpus, name, account, extra),
            *command,
        ]
        return self.command(argv, user=user, check=False, timeout=timeout)

    def srun_background(
        self,
        command: Sequence[str],
        user: int | None = None,
        gpus: int = 0,
        name: str | None = None,
        account: str | None = None,
        extra: Sequence[str] = (),
    ) -> tuple[subprocess.Popen, str]:
        """Start `command` under srun as `user` without waiting; the srun process (its output
        in pipes: communicate() after the job ends) and the job's id, once slurmctld has the
        job (it may still be pending)."""
        user = self.uid if user is None else user
        name = name or f"srun{random.randrange(10**9)}"
        argv = [
            "srun",
            f"--chdir={self.work}",
            *self._job_options(gpus, name, account, extra),
            *command,
        ]
        process = subprocess.Popen(
            argv,
            env=self.env,
            cwd=self.work,
            user=user,
            group=pwd.getpwuid(user).pw_gid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            job = self._until(
                lambda: self.job_named(name),
                f"no job named {name}",
                deadline=time.monotonic() + 60,
                died=lambda: process.poll() is not None,
            )
        except AssertionError as exc:
            if process.poll() is None:
                process.kill()
            out, err = process.communicate()
            raise AssertionError(f"srun: {out}{err}\n{exc}") from None
        self.jobs.add(job)
        return process, job

    def job_named(self, name: str) -> str | None:
        """The id of the job called `name`, if there is one."""
        listed = self.command(["squeue", "-h", "-n", name, "-o", "%i"], check=False)
        ids = listed.stdout.split()
        return ids[0] if listed.returncode == 0 and ids else None

    # -- jobs -------------------------------------------------------------------------------

    def show_job(self, job: str, detail: bool = False) -> str:
        """`scontrol show job` of one job (with -d: its GPU indices); '' once it is gone."""
        argv = ["scontrol", *(["-d"] if detail else []), "show", "job", job]
        shown = self.command(argv, check=False)
        return shown.stdout if shown.returncode == 0 else ""

    def state(self, job: str) -> str:
        """A job's state (PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED...); '' when
        slurmctld no longer knows it."""
        found = re.search(r"\bJobState=(\S+)", self.show_job(job))
        return found.group(1) if found else ""

    def wait_state(self, job: str, *states: str, timeout: float = 60) -> str:
        """Wait until the job is in one of `states`; that state. Fails at once when the job
        finished in another."""

        def reached() -> str | None:
            now = self.state(job)
            if now in states:
                return now
            if now in FINISHED | {""}:
                raise AssertionError(
                    f"job {job} is {now or 'gone'}, not {states}:\n"
                    f"{self.show_job(job)}\n{self.log()}"
                )
            return None

        return self._until(
            reached, f"job {job} did not reach {states}", deadline=time.monotonic() + timeout
        )

    def wait_finished(self, job: str, timeout: float = 60) -> str:
        """Wait until the job finished and its epilog ran; its final state."""
        return self.wait_state(job, *sorted(FINISHED), timeout=timeout)

    def cancel(self, job: str, wait: bool = True, timeout: float = 60) -> str:
        """scancel the job (as root); with `wait`, wait until its epilog ran: its state."""
        done = self.command(["scancel", job], check=False)
        if done.returncode != 0 and self.state(job) not in FINISHED:  # not one that ended
            raise AssertionError(f"scancel {job}: {done.stderr}\n{self.log()}")
        return self.wait_finished(job, timeout) if wait else self.state(job)

    def job_pids(self, job: str) -> list[int]:
        """The pids of the job's processes on the node, from `scontrol listpids` (the
        proctrack cgroups of its steps); slurmstepd is not among them."""
        listed = self.command(["scontrol", "listpids", job], check=False)
        pids = []
        for line in listed.stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0].isdigit():
                pids.append(int(fields[0]))
        return sorted(set(pids))

    def wait_pids(self, job: str, count: int = 1, timeout: float = 30) -> list[int]:
        """Wait until the job has at least `count` processes; their pids. (A job is RUNNING
        from its allocation; its processes start once the prolog has run.)"""
        return self._until(
            lambda: (lambda pids: pids if len(pids) >= count else None)(self.job_pids(job)),
            f"job {job} has no {count} processes",
            deadline=time.monotonic() + timeout,
        )

    def job_gpus(self, job: str) -> list[int]:
        """The GRES indices of the job's GPUs, from `scontrol -d show job`."""
        found = re.search(
            r"\bGRES=gpu(?::[^(\s]*)?\(IDX:([0-9,\-]+)\)", self.show_job(job, detail=True)
        )
        return expand(found.group(1)) if found else []

    def cgroup_bases(self) -> list[str]:
        """Where slurmd makes its cgroups in every v1 controller: slurm_<node> (Debian builds
        Slurm for several slurmd per host, which adds the node name) or slurm."""
        found = []
        for controller in sorted(os.listdir(CGROUP)):
            for name in (f"slurm_{self.node}", "slurm"):
                base = os.path.join(CGROUP, controller, name)
                if os.path.isdir(base):
                    found.append(base)
        return found

    def job_cgroups(self, job: str) -> list[str]:
        """The job's cgroup directories (.../uid_<uid>/job_<id>) in every v1 controller."""
        found = []
        for base in self.cgroup_bases():
            for uid_dir in os.listdir(base):
                where = os.path.join(base, uid_dir, f"job_{job}")
                if uid_dir.startswith("uid_") and os.path.isdir(where):
                    found.append(where)
        return found

    # -- the node and the job map ---------------------------------------------------------

    def node_state(self) -> str:
        """The node's state as scontrol shows it (IDLE, MIXED, ALLOCATED, IDLE+DRAIN...); ''
        while slurmctld does not answer."""
        shown = self.command(["scontrol", "show", "node", self.node], check=False, timeout=20)
        found = re.search(r"\bState=(\S+)", shown.stdout)
        return found.group(1) if shown.returncode == 0 and found else ""

    def node_reason(self) -> str:
        """Why the node was taken out of service, if it was."""
        shown = self.command(["scontrol", "show", "node", self.node], check=False, timeout=20)
        found = re.search(r"\bReason=(.*)", shown.stdout)
        return found.group(1).strip() if found else ""

    def in_service(self) -> bool:
        """Whether the node is neither drained nor down."""
        state = self.node_state()
        return bool(state) and not any(word in state for word in OUT_OF_SERVICE)

    def job_map_files(self) -> dict[str, list[str]]:
        """{file name: its lines} of the job map (names starting with a dot left out)."""
        found: dict[str, list[str]] = {}
        if not os.path.isdir(self.job_map):
            return found
        for name in sorted(os.listdir(self.job_map)):
            if name.startswith("."):
                continue
            with open(os.path.join(self.job_map, name), encoding="utf-8") as f:
                found[name] = f.read().splitlines()
        return found

    def job_map_of(self, job: str) -> dict[str, str]:
        """{file name: the job's line} for every file of the job map that names the job."""
        return {
            name: line
            for name, lines in self.job_map_files().items()
            for line in lines
            if line.split()[:1] == [job]
        }

    def script_runs(self, which: str) -> list[tuple[int, str]]:
        """(uid, job id) of every run of the prolog or the epilog (`which`), as the wrappers
        recorded them before they ran the script."""
        try:
            with open(os.path.join(self.logs, f"{which}.ran"), encoding="utf-8") as f:
                return [(int(uid), job) for uid, job in (x.split() for x in f if x.strip())]
        except OSError:
            return []

    def script_errors(self, which: str) -> str:
        """What the prolog or epilog (`which`) wrote on stderr, every run of it (the scripts
        say only problems)."""
        try:
            with open(
                os.path.join(self.logs, f"{which}.err"), encoding="utf-8", errors="replace"
            ) as f:
                return f.read()
        except OSError:
            return ""

    def script_env(self, which: str, job: str) -> dict[str, str]:
        """The environment slurmd gave the prolog or epilog (`which`) of a job."""
        path = os.path.join(self.logs, f"{which}.{job}.env")
        with open(path, "rb") as f:
            pairs = [entry.split(b"=", 1) for entry in f.read().split(b"\0") if b"=" in entry]
        return {key.decode(): value.decode(errors="replace") for key, value in pairs}

    # -- the parts --------------------------------------------------------------------------

    def _write(self) -> None:
        for folder in (
            self.etc,
            self.logs,
            os.path.join(self.root, "dev"),
            os.path.join(self.root, "state"),
            os.path.join(self.root, "spool"),
        ):
            os.makedirs(folder, mode=0o755)
        os.makedirs(self.work)
        os.chown(self.work, self.uid, self.gid)
        os.chmod(self.work, 0o1777)  # the job user's, and any other user's who submits a job
        for minor, path in enumerate(self.devices):
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(GPU_MAJOR, minor))
        # As contrib/slurm/slurm.conf.example has them: every script of prolog.d and epilog.d.
        for name, script in (("prolog", PROLOG), ("epilog", EPILOG)):
            os.makedirs(os.path.join(self.etc, f"{name}.d"), mode=0o755)
            self._write_file(
                os.path.join(self.etc, f"{name}.d", "patroller.sh"),
                self._wrapper(name, script),
                0o755,
            )
        last = self.gpus - 1
        self._write_file(
            os.path.join(self.etc, "gres.conf"),
            "\n".join(
                [
                    "AutoDetect=off",
                    f"Name=gpu File={self.root}/dev/nvidia[0-{last}]"
                    if last
                    else f"Name=gpu File={self.devices[0]}",
                    "",
                ]
            ),
        )
        self._write_file(
            os.path.join(self.etc, "cgroup.conf"),
            "\n".join(
                [
                    "CgroupPlugin=cgroup/v1",
                    f"CgroupMountpoint={CGROUP}",
                    "CgroupAutomount=no",
                    "ConstrainCores=no",
                    "ConstrainRAMSpace=no",
                    "ConstrainSwapSpace=no",
                    "ConstrainDevices=yes",
                    "",
                ]
            ),
        )
        self._write_file(os.path.join(self.etc, "plugstack.conf"), "")

    def _write_conf(self) -> None:
        """slurm.conf, with two loopback ports free now."""
        slurmctld_port, slurmd_port = free_port(), free_port()
        while slurmd_port == slurmctld_port:
            slurmd_port = free_port()
        root = self.root
        self._write_file(
            self.conf,
            "\n".join(
                [
                    "# A one-node cluster of Patroller's tests (tests/slurm.py).",
                    f"ClusterName={self.cluster}",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={slurmctld_port}",
                    f"SlurmdPort={slurmd_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={root}/state",
                    f"SlurmdSpoolDir={root}/spool",
                    f"SlurmctldPidFile={root}/slurmctld.pid",
                    f"SlurmdPidFile={root}/slurmd.pid",
                    f"SlurmctldLogFile={self.logs}/slurmctld.log",
                    f"SlurmdLogFile={self.logs}/slurmd.log",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    f"PlugStackConfig={self.etc}/plugstack.conf",
                    "ProctrackType=proctrack/cgroup",
                    "TaskPlugin=task/cgroup",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "GresTypes=gpu",
                    "PrologFlags=Alloc",
                    f"Prolog={self.etc}/prolog.d/*",
                    f"Epilog={self.etc}/epilog.d/*",
                    "SchedulerType=sched/builtin",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "SwitchType=switch/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    f"FirstJobId={self.first_job_id}",
                    "MinJobAge=600",
                    "KillWait=2",
                    "InactiveLimit=0",
                    "SlurmdParameters=config_overrides",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs=8 Boards=1 SocketsPerBoard=1 "
                    f"CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1024 Gres=gpu:{self.gpus} "
                    "State=UNKNOWN",
                    f"PartitionName={self.partition} Nodes={self.node} Default=YES "
                    "MaxTime=INFINITE "
                    "State=UP",
                    "",
                ]
            ),
        )

    def _wrapper(self, which: str, script: str) -> str:
        """A prolog or epilog that records who ran it and with what environment, then runs the
        project's script with the cluster's job map."""
        ids_only = "PATROLLER_SLURM_MAP_IDS_ONLY=1\nexport PATROLLER_SLURM_MAP_IDS_ONLY\n"
        return "\n".join(
            [
                "#!/bin/sh",
                f"# The {which} of a test cluster (tests/slurm.py).",
                f'echo "$(id -u) $SLURM_JOB_ID" >>{self.logs}/{which}.ran',
                f'cat /proc/$$/environ >{self.logs}/{which}."$SLURM_JOB_ID".env',
                f"PATROLLER_SLURM_JOB_MAP={self.job_map}",
                "export PATROLLER_SLURM_JOB_MAP",
                ids_only if self.ids_only else "unset PATROLLER_SLURM_MAP_IDS_ONLY",
                f"exec {script} 2>>{self.logs}/{which}.err",
                "",
            ]
        )

    @staticmethod
    def _write_file(path: str, text: str, mode: int = 0o644) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, mode)

    def _start_munged(self, deadline: float) -> None:
        """munged as the munge user (as root where there is none) with a key of its own."""
        try:
            munge_user: pwd.struct_passwd | None = pwd.getpwnam("munge")
        except KeyError:
            munge_user = None
        os.makedirs(self.munge, mode=0o755)
        key = os.path.join(self.munge, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        as_user = {}
        if munge_user is not None:
            os.chown(self.munge, munge_user.pw_uid, munge_user.pw_gid)
            os.chown(key, munge_user.pw_uid, munge_user.pw_gid)
            as_user = dict(user=munge_user.pw_uid, group=munge_user.pw_gid, extra_groups=[])
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.munge}/munged.pid",
                f"--log-file={self.logs}/munged.log",
                f"--seed-file={self.munge}/munged.seed",
                "--num-threads=2",
                *([] if munge_user is not None else ["--force"]),
            ],
            **as_user,
        )
        self._until(
            lambda: os.path.exists(self.munge_socket),
            "munged made no socket",
            deadline=deadline,
            died=lambda: self.processes["munged"].poll() is not None,
        )

    def _spawn(self, name: str, argv: list[str], **as_user: object) -> None:
        with open(os.path.join(self.logs, f"{name}.out"), "wb") as out:
            self.processes[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=self.env,
                cwd=self.root,
                start_new_session=True,
                close_fds=True,
                **as_user,
            )  # type: ignore

    def _idle(self) -> bool:
        """Whether the node is idle; fails as soon as a daemon says it could not take its port
        (slurmctld tries for 10 s before it says so)."""
        if self.node_state() == "IDLE":
            return True
        if "Address already in use" in self.log():
            raise AssertionError("Address already in use")
        return False

    def _end(self, name: str) -> None:
        """Stop one daemon: SIGTERM, and SIGKILL if it lingers."""
        process = self.processes.get(name)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _alive(self, name: str) -> bool:
        process = self.processes.get(name)
        return process is not None and process.poll() is None

    def _until(self, probe, what: str, deadline: float, died=None):  # type: ignore
        """Poll probe() every 50 ms until it returns something true; fail at the deadline or
        when a daemon (or `died()`) ended, with the daemons' logs."""
        while True:
            found = probe()
            if found:
                return found
            gone = [name for name, process in self.processes.items() if process.poll() is not None]
            if gone or (died is not None and died()) or time.monotonic() > deadline:
                why = f" ({', '.join(gone)} exited)" if gone else ""
                raise AssertionError(f"Slurm test cluster: {what}{why}:\n{self.log()}")
            time.sleep(0.05)

    def _listed_jobs(self) -> set[str]:
        try:
            listed = subprocess.run(
                ["squeue", "-h", "-t", "all", "-o", "%i"],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            return set()
        return set(listed.stdout.split()) if listed.returncode == 0 else set()

    def _kill_steps(self) -> None:
        """Kill any slurmstepd of this cluster's jobs that outlived slurmd, and what runs in
        their cgroups."""
        prefixes = tuple(f"slurmstepd: [{job}." for job in self.jobs)
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if prefixes and cmdline.startswith(prefixes):
                _kill(int(name))
        for job in self.jobs:
            for where in self.job_cgroups(job):
                for pid in _pids_under(where):
                    _kill(pid)

    def _remove_cgroups(self) -> None:
        """Remove the job cgroups of this cluster that slurmd left (deepest first), and then
        their uid_<uid> directory where it is empty. The slurm_<node> directories stay, as on
        a real node: another cluster may be using them."""
        for job in self.jobs:
            for where in self.job_cgroups(job):
                for _ in range(50):
                    for folder, _subdirs, _files in sorted(
                        os.walk(where), reverse=True, key=lambda entry: len(entry[0])
                    ):
                        try:
                            os.rmdir(folder)
                        except OSError:
                            pass
                    if not os.path.isdir(where):
                        break
                    time.sleep(0.1)  # processes just killed leave their cgroups a moment later
                try:
                    os.rmdir(os.path.dirname(where))
                except OSError:
                    pass


def expand(indices: str) -> list[int]:
    """'0-1,3' -> [0, 1, 3]."""
    found: list[int] = []
    for part in indices.split(","):
        if "-" in part:
            first, last = part.split("-")
            found.extend(range(int(first), int(last) + 1))
        elif part:
            found.append(int(part))
    return found


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _pids_under(folder: str) -> list[int]:
    pids = []
    for where, _subdirs, files in os.walk(folder):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(where, "cgroup.procs"), encoding="ascii") as f:
                    pids.extend(int(line) for line in f if line.strip())
            except OSError:
                pass
    return pids


def start_node(**options: object) -> SlurmNode:
    """A started SlurmNode(**options); under CI=true one that cannot start fails the test,
    elsewhere it is skipped with the reason."""
    try:
        return SlurmNode(**options).start()  # type: ignore[arg-type]
    except SlurmUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Slurm tests, but no cluster started: {exc}")
        pytest.skip(f"no Slurm cluster here: {exc}")
    raise AssertionError("unreachable")
