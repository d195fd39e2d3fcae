"""Every flag of the daemon: its PATROLLER_* variable and its help, in the order of --help, and
which take no value, which may be given more than once and which hold secrets. flags.py reads
them into a Config; the configuration file's keys are the same names (file.py)."""

from __future__ import annotations

SWITCHES = (
    "--test",
    "--hide-users",
    "--notify-terminal",
    "--test-processes",
)  # flags that take no value
REPEATED = ("--pod-user-key", "--notify")  # flags that may be given more than once
SECRET = (
    "--notify",
    "--notify-user-default",
)  # flags whose values hold passwords or tokens: never repeated back


# (flag, environment variable, help) for every setting, in the order of --help.
SETTINGS = (
    (
        "--config",
        "PATROLLER_CONFIG",
        "a TOML file of settings, its keys the long flags' names (port = 8080); a flag or a "
        "variable wins over it; none: no file (default /etc/patroller/patroller.toml when it "
        "exists)",
    ),
    ("--test", "PATROLLER_TEST", "synthetic devices: no GPU, no Docker, no nvidia-smi"),
    (
        "--test-processes",
        "PATROLLER_TEST_PROCESSES",
        "with --test: synthetic processes that come, compute, idle and go on the GPUs, the "
        "holder's on each held one and a stranger's on the last, so that every usage category "
        "shows within minutes (default: none, a held GPU only looks busy)",
    ),
    ("--port", "PATROLLER_PORT", "TCP port to listen on (default 8080)"),
    ("--address", "PATROLLER_ADDRESS", "address to bind (default: all interfaces)"),
    ("--lease", "PATROLLER_LEASE", "seconds an unclaimed reservation is held (default 10)"),
    (
        "--max-waiting-per-user",
        "PATROLLER_MAX_WAITING_PER_USER",
        "/wait requests one user may have waiting at once; more get 429 (default 100)",
    ),
    (
        "--user-labels",
        "PATROLLER_USER_LABELS",
        "container labels searched for the user's e-mail, comma-separated "
        "(default user.email,email,maintainer)",
    ),
    (
        "--user-info-labels",
        "PATROLLER_USER_INFO_LABELS",
        "extra container labels copied into the identity, comma-separated (default none)",
    ),
    ("--nvidia-smi", "PATROLLER_NVIDIA_SMI", "the nvidia-smi command (default nvidia-smi)"),
    (
        "--stream-silence",
        "PATROLLER_STREAM_SILENCE",
        "seconds dmon or pmon may print nothing before it is taken as hung, killed and restarted "
        "(default 5; at least 3, as they print every second)",
    ),
    (
        "--inventory-every",
        "PATROLLER_INVENTORY_EVERY",
        "seconds between readings of the GPU inventory (nvidia-smi -q -x), so that a GPU lost or "
        "added is seen (default 60; also read at once when a stream says a GPU is gone)",
    ),
    (
        "--cross-check-every",
        "PATROLLER_CROSS_CHECK_EVERY",
        "seconds between queries of the compute processes (nvidia-smi --query-compute-apps) of "
        "GPUs whose pmon cannot attribute processes: MIG, or busy with none listed (default 10)",
    ),
    (
        "--socket",
        "PATROLLER_SOCKET",
        "also serve the API on this unix socket; its callers are identified by the kernel",
    ),
    (
        "--state-dir",
        "PATROLLER_STATE_DIR",
        "directory of the lease book, so that reservations survive a restart; none or empty: no "
        "book (default /var/lib/patroller as root, else ~/.local/state/patroller; none in "
        "test mode)",
    ),
    (
        "--hide-users",
        "PATROLLER_HIDE_USERS",
        "show every caller the users other than themselves as stable pseudonyms; the host's root "
        "sees every name (PATROLLER_HIDE_USERS: 1/true/yes or 0/false/no)",
    ),
    (
        "--docker-host",
        "DOCKER_HOST",
        "the Docker Engine to read container labels from (default unix:///var/run/docker.sock)",
    ),
    (
        "--podman-socket",
        "PATROLLER_PODMAN_SOCKET",
        "the Podman service (its Docker-compatible API) to read the labels of Podman's containers "
        "from; none: not asked (default unix:///run/podman/podman.sock)",
    ),
    (
        "--rootless-docker-socket",
        "PATROLLER_ROOTLESS_DOCKER_SOCKET",
        "where the rootless Docker Engine of a user listens, {uid} standing for the user's uid: "
        "the labels of containers in that user's slice are read there; none: not asked "
        "(default unix:///run/user/{uid}/docker.sock)",
    ),
    (
        "--rootless-podman-socket",
        "PATROLLER_ROOTLESS_PODMAN_SOCKET",
        "where a user's rootless Podman service listens, {uid} standing for the user's uid; none: "
        "not asked (default unix:///run/user/{uid}/podman/podman.sock)",
    ),
    (
        "--containerd-socket",
        "PATROLLER_CONTAINERD_SOCKET",
        "containerd's socket, whose API names its containers and Kubernetes pods (containerd's "
        "CRI); used only when it is there; none: not asked "
        "(default /run/containerd/containerd.sock)",
    ),
    (
        "--containerd-namespaces",
        "PATROLLER_CONTAINERD_NAMESPACES",
        "containerd namespaces to look for a container in, in order, comma-separated "
        "(default k8s.io,default)",
    ),
    (
        "--pod-user-key",
        "PATROLLER_POD_USER_KEYS",
        "a pod label or annotation key whose value (an e-mail or a name) names the pod's user; "
        "may be given more than once (the variable: comma-separated); looked for before "
        "--user-labels (default patroller/user)",
    ),
    (
        "--shifted-uids-from",
        "PATROLLER_SHIFTED_UIDS_FROM",
        "host uids from this one up are user namespaces' (the ranges /etc/subuid hands out): a "
        "container's process running as one is never taken for a host account (default 100000)",
    ),
    (
        "--slurm-job-map",
        "PATROLLER_SLURM_JOB_MAP",
        "directory of the Slurm job map (one file per GPU index, listing its jobs; written by "
        "contrib/slurm's prolog): a GPU listed there is its jobs', never granted; it must be "
        "root's or the daemon's user's and writable by nobody else (default: none)",
    ),
    (
        "--kubelet-socket",
        "PATROLLER_KUBELET_SOCKET",
        "the kubelet's pod-resources socket, asked only while it is there: a GPU it assigns to a "
        "pod is the pod's, never granted; none or empty: not asked (default "
        "/var/lib/kubelet/pod-resources/kubelet.sock; none in test mode)",
    ),
    (
        "--kernel-log",
        "PATROLLER_KERNEL_LOG",
        "the kernel log followed for Xid lines, a GPU's faults (reading /dev/kmsg takes root); "
        "none or empty: not followed, the GPUs' health comes from nvidia-smi -q -x alone "
        "(default /dev/kmsg; none in test mode)",
    ),
    ("--log-level", "PATROLLER_LOG_LEVEL", "debug, info, warning or error (default info)"),
    (
        "--body-timeout",
        "PATROLLER_BODY_TIMEOUT",
        "seconds a request body may take to arrive before the request is refused (default 10)",
    ),
    (
        "--header-timeout",
        "PATROLLER_HEADER_TIMEOUT",
        "seconds a connection may take to send a request's head, or sit idle between requests, "
        "before it is closed (default 30)",
    ),
    (
        "--max-connections-per-caller",
        "PATROLLER_MAX_CONNECTIONS_PER_CALLER",
        "connections one caller may hold open at once: one uid (the kernel's word, on the socket "
        "and from this host), or one address; more are closed at once (default 512)",
    ),
    (
        "--max-per-user",
        "PATROLLER_MAX_PER_USER",
        "devices one user may hold at once, every way (default: no limit)",
    ),
    (
        "--limits-file",
        "PATROLLER_LIMITS_FILE",
        "JSON object of per-user limits overriding --max-per-user (null: no limit); read again on "
        "SIGHUP",
    ),
    (
        "--starvation-bound",
        "PATROLLER_STARVATION_BOUND",
        "seconds a waiting request may be overtaken by later ones; then the devices it needs are "
        "set aside for it (default 600)",
    ),
    (
        "--max-hold",
        "PATROLLER_MAX_HOLD",
        "the longest reservation one may ask for with hold=<duration> (default 12h)",
    ),
    ("--idle-sm", "PATROLLER_IDLE_SM", "a held device using at most this % of SM ... (default 5)"),
    (
        "--idle-memory",
        "PATROLLER_IDLE_MEMORY",
        "... and less than this many MiB of memory is idle (default 1024)",
    ),
    (
        "--idle-after",
        "PATROLLER_IDLE_AFTER",
        "seconds a held device must be idle before /status says so (default 1800)",
    ),
    (
        "--idle-release",
        "PATROLLER_IDLE_RELEASE",
        "release a reservation with no process on it after this many seconds idle; a hold for "
        "a duration is kept to its end (default: never)",
    ),
    (
        "--audit-log",
        "PATROLLER_AUDIT_LOG",
        "also append the audit record to this file as JSON lines; - for standard output "
        "(default: the daemon's log only)",
    ),
    (
        "--usage",
        "PATROLLER_USAGE",
        "where GPU usage history is kept: sqlite (<state-dir>/usage.sqlite3, the default; none "
        "without a state directory) or none",
    ),
    (
        "--usage-interval",
        "PATROLLER_USAGE_INTERVAL",
        "seconds between usage samples, one row per GPU each (default 60; at least 0.1)",
    ),
    (
        "--usage-days",
        "PATROLLER_USAGE_DAYS",
        "days usage samples are kept; older ones are folded into daily totals (default 400)",
    ),
    (
        "--usage-busy-sm",
        "PATROLLER_USAGE_BUSY_SM",
        "a statistics reading with at least this % of SM use counts as computing in the usage "
        "categories; less is idle (default 1)",
    ),
    (
        "--notify",
        "PATROLLER_NOTIFY",
        "tell the admin of trespasses, GPUs used unasked, idle and ending holds, granted waits "
        "and GPUs lost, at this Apprise URL "
        "(mailtos://..., json://..., slack://..., ntfy://...; once per destination; "
        "PATROLLER_NOTIFY: URLs separated by spaces); needs the notify extra "
        "(pip install 'patroller[notify]') (default: nobody is told)",
    ),
    (
        "--notify-events",
        "PATROLLER_NOTIFY_EVENTS",
        "the kinds the admin is told of, comma-separated: trespass, unreserved, idle, expiring, "
        "granted, lost, unhealthy, daemon, digest (only with --notify-digest) (default all)",
    ),
    (
        "--notify-escalate",
        "PATROLLER_NOTIFY_ESCALATE",
        "how long a trespass goes on before the admin is told (the users concerned are told at "
        "once); 0: at once (default 30m)",
    ),
    (
        "--notify-idle-after",
        "PATROLLER_NOTIFY_IDLE_AFTER",
        "how long a hold computes nothing before its holder is told (default 2h)",
    ),
    (
        "--notify-before",
        "PATROLLER_NOTIFY_BEFORE",
        "how long before a hold for a duration ends its holder is told (default 15m)",
    ),
    (
        "--notify-repeat",
        "PATROLLER_NOTIFY_REPEAT",
        "how long before something still going on (a trespass, a GPU still lost) is told "
        "again (default 6h)",
    ),
    (
        "--notify-user-default",
        "PATROLLER_NOTIFY_USER_DEFAULT",
        "the destination of a user who set none (patroller notify add), an Apprise URL with "
        "{user} in it, or {email} for users named by an e-mail address: "
        "'mailtos://smtp.lab.example?to={user}@lab.example' (default: such a user is not told)",
    ),
    (
        "--notify-terminal",
        "PATROLLER_NOTIFY_TERMINAL",
        "also write a trespass or an ending hold on the terminals where the users concerned are "
        "logged in, as `write` does (plain text, rate-limited; works without Apprise); a user "
        "turns it off with `patroller notify mute terminal` "
        "(PATROLLER_NOTIFY_TERMINAL: 1/true/yes or 0/false/no) (default off)",
    ),
    (
        "--notify-digest",
        "PATROLLER_NOTIFY_DIGEST",
        "send each week's digest of GPU use at this weekday and time, in UTC or the zone that "
        "follows ('mon 09:00', 'fri 17:30 Europe/Paris'): each user her own hours, the admin the "
        "lab's table; needs the usage store (default: off)",
    ),
    (
        "--fleet",
        "PATROLLER_FLEET",
        "serve /fleet, one live page of these hosts' GPUs (host:port,host:port,...), and "
        "/fleet.json; this daemon asks each host's /status itself (default: no fleet view)",
    ),
    (
        "--fleet-file",
        "PATROLLER_FLEET_FILE",
        "the same hosts from a file, one a line (# comments); not with --fleet",
    ),
    (
        "--fleet-interval",
        "PATROLLER_FLEET_INTERVAL",
        "seconds from one asking of a fleet host to the next (default 5; at least 0.5)",
    ),
    (
        "--fleet-timeout",
        "PATROLLER_FLEET_TIMEOUT",
        "seconds a fleet host may take to answer before it is shown as not answering (default 3)",
    ),
    (
        "--fleet-connect-timeout",
        "PATROLLER_FLEET_CONNECT_TIMEOUT",
        "seconds to connect to a fleet host before it is shown as not answering (default 1)",
    ),
    (
        "--fleet-max-bytes",
        "PATROLLER_FLEET_MAX_BYTES",
        "the largest answer taken from a fleet host, in bytes (or KiB, MiB); a larger one is not "
        "read past that, and the host is shown as failed: bad answer (default 1MiB)",
    ),
)
