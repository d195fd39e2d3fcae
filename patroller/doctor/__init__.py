"""The doctor: `patroller doctor` and `GET /doctor`. It checks what the daemon would meet on
this host, one result a check (`ok`, `degraded` or `failed`, with what was found and how to fix
it): nvidia-smi and each of its commands, timed; MIG; /proc and the cgroups; the container
engines and the kubelet; the Slurm job map; the state directory, the lease book and the usage
history; the port and the unix socket; the systemd unit. A flag value the daemon would refuse
is a failed check of its own (command.py).

Small probes gather facts (nvidia-smi through the one supervisor, the rest in the executor);
the checks are pure functions over them (results.py, gpuchecks.py, and the `check_*` of
host.py, places.py, listening.py and runtimes.py).

Owns: the probes, the checks, the examination (examine.py) and the command (command.py).
May import: `patroller.state`, `patroller.identify`, `patroller.observe`, `patroller.config`,
`patroller.core`, `patroller.durations` (how long, said as everywhere else); tornado (to bind as
the daemon binds).
"""

from patroller.doctor.examine import Doctor, examine
from patroller.doctor.results import DEGRADED, FAILED, OK, Result

__all__ = ["DEGRADED", "Doctor", "FAILED", "OK", "Result", "examine"]
