"""The command line and the environment: every flag, its PATROLLER_* variable, its help, and
the checks that turn text into a Config (a bad value is refused at start, naming the flag)."""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

from patroller import __version__, durations
import patroller.config.file as configfile
import patroller.config.values as values
from patroller.config.settings import (DEFAULT_POD_USER_KEYS, DEFAULT_USER_LABELS,
                                       KERNEL_LOG, KUBELET_SOCKET, Config, ConfigError)

T = TypeVar("T")

SWITCHES = ("--test", "--hide-users", "--notify-terminal", "--test-processes")  # flags that take no value
REPEATED = ("--pod-user-key", "--notify")  # flags that may be given more than once
SECRET = ("--notify", "--notify-user-default")  # flags whose values hold passwords or tokens: never repeated back


# (flag, environment variable, help) for every setting, in the order of --help.
_SETTINGS = (
    ("--config", "PATROLLER_CONFIG",
     "a TOML file of settings, its keys the long flags' names (port = 8080); a flag or a "
     "variable wins over it; none: no file (default /etc/patroller/patroller.toml when it "
     "exists)"),
    ("--test", "PATROLLER_TEST", "synthetic devices: no GPU, no Docker, no nvidia-smi"),
    ("--test-processes", "PATROLLER_TEST_PROCESSES",
     "with --test: synthetic processes that come, compute, idle and go on the GPUs, the holder's "
     "on each held one and a stranger's on the last, so that every usage category shows within "
     "minutes (default: none, a held GPU only looks busy)"),
    ("--port", "PATROLLER_PORT", "TCP port to listen on (default 8080)"),
    ("--address", "PATROLLER_ADDRESS", "address to bind (default: all interfaces)"),
    ("--lease", "PATROLLER_LEASE", "seconds an unclaimed reservation is held (default 10)"),
    ("--max-waiting-per-user", "PATROLLER_MAX_WAITING_PER_USER",
     "/wait requests one user may have waiting at once; more get 429 (default 100)"),
    ("--user-labels", "PATROLLER_USER_LABELS",
     "container labels searched for the user's e-mail, comma-separated "
     "(default user.email,email,maintainer)"),
    ("--user-info-labels", "PATROLLER_USER_INFO_LABELS",
     "extra container labels copied into the identity, comma-separated (default none)"),
    ("--nvidia-smi", "PATROLLER_NVIDIA_SMI", "the nvidia-smi command (default nvidia-smi)"),
    ("--stream-silence", "PATROLLER_STREAM_SILENCE",
     "seconds dmon or pmon may print nothing before it is taken as hung, killed and restarted "
     "(default 5; at least 3, as they print every second)"),
    ("--inventory-every", "PATROLLER_INVENTORY_EVERY",
     "seconds between readings of the GPU inventory (nvidia-smi -q -x), so that a GPU lost or "
     "added is seen (default 60; also read at once when a stream says a GPU is gone)"),
    ("--cross-check-every", "PATROLLER_CROSS_CHECK_EVERY",
     "seconds between queries of the compute processes (nvidia-smi --query-compute-apps) of GPUs "
     "whose pmon cannot attribute processes: MIG, or busy with none listed (default 10)"),
    ("--socket", "PATROLLER_SOCKET",
     "also serve the API on this unix socket; its callers are identified by the kernel"),
    ("--state-dir", "PATROLLER_STATE_DIR",
     "directory of the lease book, so that reservations survive a restart; none or empty: no "
     "book (default /var/lib/patroller as root, else ~/.local/state/patroller; none in test mode)"),
    ("--hide-users", "PATROLLER_HIDE_USERS",
     "show every caller the users other than themselves as stable pseudonyms; the host's root "
     "sees every name (PATROLLER_HIDE_USERS: 1/true/yes or 0/false/no)"),
    ("--docker-host", "DOCKER_HOST",
     "the Docker Engine to read container labels from (default unix:///var/run/docker.sock)"),
    ("--podman-socket", "PATROLLER_PODMAN_SOCKET",
     "the Podman service (its Docker-compatible API) to read the labels of Podman's containers "
     "from; none: not asked (default unix:///run/podman/podman.sock)"),
    ("--rootless-docker-socket", "PATROLLER_ROOTLESS_DOCKER_SOCKET",
     "where the rootless Docker Engine of a user listens, {uid} standing for the user's uid: "
     "the labels of containers in that user's slice are read there; none: not asked "
     "(default unix:///run/user/{uid}/docker.sock)"),
    ("--rootless-podman-socket", "PATROLLER_ROOTLESS_PODMAN_SOCKET",
     "where a user's rootless Podman service listens, {uid} standing for the user's uid; none: "
     "not asked (default unix:///run/user/{uid}/podman/podman.sock)"),
    ("--containerd-socket", "PATROLLER_CONTAINERD_SOCKET",
     "containerd's socket, whose API names its containers and Kubernetes pods (containerd's "
     "CRI); used only when it is there; none: not asked "
     "(default /run/containerd/containerd.sock)"),
    ("--containerd-namespaces", "PATROLLER_CONTAINERD_NAMESPACES",
     "containerd namespaces to look for a container in, in order, comma-separated "
     "(default k8s.io,default)"),
    ("--pod-user-key", "PATROLLER_POD_USER_KEYS",
     "a pod label or annotation key whose value (an e-mail or a name) names the pod's user; "
     "may be given more than once (the variable: comma-separated); looked for before "
     "--user-labels (default patroller/user)"),
    ("--shifted-uids-from", "PATROLLER_SHIFTED_UIDS_FROM",
     "host uids from this one up are user namespaces' (the ranges /etc/subuid hands out): a "
     "container's process running as one is never taken for a host account (default 100000)"),
    ("--slurm-job-map", "PATROLLER_SLURM_JOB_MAP",
     "directory of the Slurm job map (one file per GPU index, listing its jobs; written by "
     "contrib/slurm's prolog): a GPU listed there is its jobs', never granted; it must be "
     "root's or the daemon's user's and writable by nobody else (default: none)"),
    ("--kubelet-socket", "PATROLLER_KUBELET_SOCKET",
     "the kubelet's pod-resources socket, asked only while it is there: a GPU it assigns to a "
     "pod is the pod's, never granted; none or empty: not asked (default "
     "/var/lib/kubelet/pod-resources/kubelet.sock; none in test mode)"),
    ("--kernel-log", "PATROLLER_KERNEL_LOG",
     "the kernel log followed for Xid lines, a GPU's faults (reading /dev/kmsg takes root); "
     "none or empty: not followed, the GPUs' health comes from nvidia-smi -q -x alone "
     "(default /dev/kmsg; none in test mode)"),
    ("--log-level", "PATROLLER_LOG_LEVEL", "debug, info, warning or error (default info)"),
    ("--body-timeout", "PATROLLER_BODY_TIMEOUT",
     "seconds a request body may take to arrive before the request is refused (default 10)"),
    ("--header-timeout", "PATROLLER_HEADER_TIMEOUT",
     "seconds a connection may take to send a request's head, or sit idle between requests, "
     "before it is closed (default 30)"),
    ("--max-connections-per-caller", "PATROLLER_MAX_CONNECTIONS_PER_CALLER",
     "connections one caller may hold open at once: one uid (the kernel's word, on the socket "
     "and from this host), or one address; more are closed at once (default 512)"),
    ("--max-per-user", "PATROLLER_MAX_PER_USER",
     "devices one user may hold at once, every way (default: no limit)"),
    ("--limits-file", "PATROLLER_LIMITS_FILE",
     "JSON object of per-user limits overriding --max-per-user (null: no limit); read again on "
     "SIGHUP"),
    ("--starvation-bound", "PATROLLER_STARVATION_BOUND",
     "seconds a waiting request may be overtaken by later ones; then the devices it needs are "
     "set aside for it (default 600)"),
    ("--max-hold", "PATROLLER_MAX_HOLD",
     "the longest reservation one may ask for with hold=<duration> (default 12h)"),
    ("--idle-sm", "PATROLLER_IDLE_SM",
     "a held device using at most this % of SM ... (default 5)"),
    ("--idle-memory", "PATROLLER_IDLE_MEMORY",
     "... and less than this many MiB of memory is idle (default 1024)"),
    ("--idle-after", "PATROLLER_IDLE_AFTER",
     "seconds a held device must be idle before /status says so (default 1800)"),
    ("--idle-release", "PATROLLER_IDLE_RELEASE",
     "release a reservation with no process on it after this many seconds idle; a hold for "
     "a duration is kept to its end (default: never)"),
    ("--audit-log", "PATROLLER_AUDIT_LOG",
     "also append the audit record to this file as JSON lines; - for standard output "
     "(default: the daemon's log only)"),
    ("--usage", "PATROLLER_USAGE",
     "where GPU usage history is kept: sqlite (<state-dir>/usage.sqlite3, the default; none "
     "without a state directory) or none"),
    ("--usage-interval", "PATROLLER_USAGE_INTERVAL",
     "seconds between usage samples, one row per GPU each (default 60; at least 0.1)"),
    ("--usage-days", "PATROLLER_USAGE_DAYS",
     "days usage samples are kept; older ones are folded into daily totals (default 400)"),
    ("--usage-busy-sm", "PATROLLER_USAGE_BUSY_SM",
     "a statistics reading with at least this % of SM use counts as computing in the usage "
     "categories; less is idle (default 1)"),
    ("--notify", "PATROLLER_NOTIFY",
     "tell the admin of trespasses, GPUs used unasked, idle and ending holds, granted waits "
     "and GPUs lost, at this Apprise URL "
     "(mailtos://..., json://..., slack://..., ntfy://...; once per destination; "
     "PATROLLER_NOTIFY: URLs separated by spaces); needs the notify extra "
     "(pip install 'patroller[notify]') (default: nobody is told)"),
    ("--notify-events", "PATROLLER_NOTIFY_EVENTS",
     "the kinds the admin is told of, comma-separated: trespass, unreserved, idle, expiring, "
     "granted, lost, unhealthy, daemon, digest (only with --notify-digest) (default all)"),
    ("--notify-escalate", "PATROLLER_NOTIFY_ESCALATE",
     "how long a trespass goes on before the admin is told (the users concerned are told at "
     "once); 0: at once (default 30m)"),
    ("--notify-idle-after", "PATROLLER_NOTIFY_IDLE_AFTER",
     "how long a hold computes nothing before its holder is told (default 2h)"),
    ("--notify-before", "PATROLLER_NOTIFY_BEFORE",
     "how long before a hold for a duration ends its holder is told (default 15m)"),
    ("--notify-repeat", "PATROLLER_NOTIFY_REPEAT",
     "how long before something still going on (a trespass, a GPU still lost) is told "
     "again (default 6h)"),
    ("--notify-user-default", "PATROLLER_NOTIFY_USER_DEFAULT",
     "the destination of a user who set none (patroller notify add), an Apprise URL with "
     "{user} in it, or {email} for users named by an e-mail address: "
     "'mailtos://smtp.lab.example?to={user}@lab.example' (default: such a user is not told)"),
    ("--notify-terminal", "PATROLLER_NOTIFY_TERMINAL",
     "also write a trespass or an ending hold on the terminals where the users concerned are "
     "logged in, as `write` does (plain text, rate-limited; works without Apprise); a user "
     "turns it off with `patroller notify mute terminal` "
     "(PATROLLER_NOTIFY_TERMINAL: 1/true/yes or 0/false/no) (default off)"),
    ("--notify-digest", "PATROLLER_NOTIFY_DIGEST",
     "send each week's digest of GPU use at this weekday and time, in UTC or the zone that "
     "follows ('mon 09:00', 'fri 17:30 Europe/Paris'): each user her own hours, the admin the "
     "lab's table; needs the usage store (default: off)"),
    ("--fleet", "PATROLLER_FLEET",
     "serve /fleet, one live page of these hosts' GPUs (host:port,host:port,...), and "
     "/fleet.json; this daemon asks each host's /status itself (default: no fleet view)"),
    ("--fleet-file", "PATROLLER_FLEET_FILE",
     "the same hosts from a file, one a line (# comments); not with --fleet"),
    ("--fleet-interval", "PATROLLER_FLEET_INTERVAL",
     "seconds from one asking of a fleet host to the next (default 5; at least 0.5)"),
    ("--fleet-timeout", "PATROLLER_FLEET_TIMEOUT",
     "seconds a fleet host may take to answer before it is shown as not answering "
     "(default 3)"),
    ("--fleet-connect-timeout", "PATROLLER_FLEET_CONNECT_TIMEOUT",
     "seconds to connect to a fleet host before it is shown as not answering (default 1)"),
    ("--fleet-max-bytes", "PATROLLER_FLEET_MAX_BYTES",
     "the largest answer taken from a fleet host, in bytes (or KiB, MiB); a larger one is not "
     "read past that, and the host is shown as failed: bad answer (default 1MiB)"),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="patroller",
        description="Know which user is on which GPU, and hand out free GPUs fairly.",
        epilog="Every flag falls back to the environment variable named in its help, then to "
        "the configuration file (--config). The commands that talk to a running server: "
        "patroller run, status, release, wait and reserve (each with --help). `patroller "
        "doctor` with these flags checks what the daemon would meet on this host; `patroller "
        "config` with them shows each setting's value and where it came from.",
    )
    for flag, env, text in _SETTINGS:
        shown = f"{text} [{env}]".replace("%", "%%")  # argparse formats help with %
        if flag in SWITCHES:
            parser.add_argument(flag, action="store_true", default=None, help=shown)
        elif flag in REPEATED:
            parser.add_argument(flag, metavar="VALUE", action="append", help=shown)
        else:
            parser.add_argument(flag, metavar="VALUE", help=shown)
    parser.add_argument("--version", action="version", version=f"patroller {__version__}")
    return parser


def default_state_dir(test: bool, environ: Mapping[str, str], uid: int) -> Optional[str]:
    """Where the lease book lives when no --state-dir is given: none in test mode (test daemons
    run many at once), the system's state directory for root, the user's own otherwise."""
    if test:
        return None
    if uid == 0:
        return "/var/lib/patroller"
    base = environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec says to ignore a relative one
        base = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "patroller")


def load(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None,
         origins: Optional[Dict[str, str]] = None) -> Config:
    """Build the Config from argv (default sys.argv[1:]), environ (default os.environ) and the
    configuration file they name (or the default one, if it exists), in that order of
    precedence. `origins`, when given, is filled with where each setting given came from, by
    flag: the flag, the variable, or the file and line (a setting not in it: its default).

    Raises ConfigError naming the flag, variable or file line whose value is unusable. argparse
    itself exits with status 2 on an unknown flag.
    """
    environ = os.environ if environ is None else environ
    args = _parser().parse_args(argv)
    path, settings = configfile.named(args.config, environ, file_keys())
    origins = {} if origins is None else origins
    if path is not None:
        origins["--config"] = path

    def pick(flag: str, env: str, convert: Callable[[str], T], default: T) -> T:
        key = flag[2:]
        given: Any = getattr(args, key.replace("-", "_"))
        source = where = flag
        if given is None:
            given, source = environ.get(env), env
            where = source
            if given is not None and flag in REPEATED:
                given = [given]
        if given is None and key in settings:  # the file's, under both
            given, where = settings[key].value, settings[key].where
            source = f"{where}: {key}"
        if given is None:
            return default
        origins[flag] = where
        if isinstance(given, bool):  # a switch's, given on the command line or in the file
            return given  # type: ignore[return-value]
        try:
            return convert(given)
        except ValueError as exc:
            said = ",".join(given) if isinstance(given, list) else given
            if flag in SECRET:  # a URL with a password in it: the error says which, not what
                raise ConfigError(f"{source}: {exc}") from None
            raise ConfigError(f"{source}: {said!r} {exc}") from None

    env_names = {flag: env for flag, env, _ in _SETTINGS}
    test = pick("--test", env_names["--test"], bool, False)  # the variable: any text is true
    none: Tuple[str, ...] = ()
    fleet = pick("--fleet", env_names["--fleet"], values.fleet, none)
    from_file = pick("--fleet-file", env_names["--fleet-file"], values.fleet_file, none)
    if fleet and from_file:
        raise ConfigError("--fleet-file: given with --fleet too (or PATROLLER_FLEET_FILE with "
                          "PATROLLER_FLEET); name the fleet's hosts one way")
    fleet = fleet or from_file
    test_processes = pick("--test-processes", env_names["--test-processes"], values.switch,
                          False)
    if test_processes and not test:
        raise ConfigError("--test-processes: only with --test: a GPU host's processes are its "
                          "own")
    return Config(
        test=test,
        test_processes=test_processes,
        port=pick("--port", env_names["--port"], values.port, Config.port),
        address=pick("--address", env_names["--address"], str.strip, Config.address),
        lease=pick("--lease", env_names["--lease"], durations.parse, Config.lease),
        max_waiting_per_user=pick("--max-waiting-per-user", env_names["--max-waiting-per-user"],
                                  values.count, Config.max_waiting_per_user),
        user_labels=pick("--user-labels", env_names["--user-labels"], values.user_labels, DEFAULT_USER_LABELS),
        user_info_labels=pick("--user-info-labels", env_names["--user-info-labels"], values.labels, ()),
        nvidia_smi=pick("--nvidia-smi", env_names["--nvidia-smi"], values.nonempty, Config.nvidia_smi),
        stream_silence=pick("--stream-silence", env_names["--stream-silence"], values.silence,
                            Config.stream_silence),
        inventory_every=pick("--inventory-every", env_names["--inventory-every"], durations.parse,
                             Config.inventory_every),
        cross_check_every=pick("--cross-check-every", env_names["--cross-check-every"],
                               durations.parse,
                               Config.cross_check_every),
        socket=pick("--socket", env_names["--socket"], values.socket_path, None),
        state_dir=pick("--state-dir", env_names["--state-dir"], values.directory,
                       default_state_dir(test, environ, os.getuid())),
        hide_users=pick("--hide-users", env_names["--hide-users"], values.switch,
                        Config.hide_users),
        docker_host=pick("--docker-host", env_names["--docker-host"], values.docker_host, None),
        podman_socket=pick("--podman-socket", env_names["--podman-socket"], values.engine_socket,
                           Config.podman_socket),
        rootless_docker_socket=pick("--rootless-docker-socket",
                                    env_names["--rootless-docker-socket"], values.engine_template,
                                    Config.rootless_docker_socket),
        rootless_podman_socket=pick("--rootless-podman-socket",
                                    env_names["--rootless-podman-socket"], values.engine_template,
                                    Config.rootless_podman_socket),
        containerd_socket=pick("--containerd-socket", env_names["--containerd-socket"],
                               values.containerd_socket, Config.containerd_socket),
        containerd_namespaces=pick("--containerd-namespaces",
                                   env_names["--containerd-namespaces"], values.namespaces,
                                   Config.containerd_namespaces),
        pod_user_keys=pick("--pod-user-key", env_names["--pod-user-key"], values.keys,
                           DEFAULT_POD_USER_KEYS),
        shifted_uids_from=pick("--shifted-uids-from", env_names["--shifted-uids-from"], values.count,
                               Config.shifted_uids_from),
        slurm_job_map=pick("--slurm-job-map", env_names["--slurm-job-map"], values.directory, None),
        kubelet_socket=pick("--kubelet-socket", env_names["--kubelet-socket"],
                            values.optional_socket, None if test else KUBELET_SOCKET),
        kernel_log=pick("--kernel-log", env_names["--kernel-log"], values.optional_path,
                        None if test else KERNEL_LOG),
        log_level=pick("--log-level", env_names["--log-level"], values.log_level, Config.log_level),
        body_timeout=pick("--body-timeout", env_names["--body-timeout"], durations.parse,
                          Config.body_timeout),
        header_timeout=pick("--header-timeout", env_names["--header-timeout"], durations.parse,
                            Config.header_timeout),
        max_connections_per_caller=pick("--max-connections-per-caller",
                                        env_names["--max-connections-per-caller"], values.count,
                                        Config.max_connections_per_caller),
        max_per_user=pick("--max-per-user", env_names["--max-per-user"], values.count, None),
        limits_file=pick("--limits-file", env_names["--limits-file"], values.existing_file, None),
        starvation_bound=pick("--starvation-bound", env_names["--starvation-bound"],
                              durations.parse,
                              Config.starvation_bound),
        max_hold=pick("--max-hold", env_names["--max-hold"], durations.parse, Config.max_hold),
        idle_sm=pick("--idle-sm", env_names["--idle-sm"], values.nonnegative, Config.idle_sm),
        idle_memory=pick("--idle-memory", env_names["--idle-memory"], values.nonnegative,
                         Config.idle_memory),
        idle_after=pick("--idle-after", env_names["--idle-after"], durations.parse,
                        Config.idle_after),
        idle_release=pick("--idle-release", env_names["--idle-release"], durations.parse, None),
        audit_log=pick("--audit-log", env_names["--audit-log"], values.nonempty, None),
        usage=pick("--usage", env_names["--usage"], values.usage, Config.usage),
        usage_interval=pick("--usage-interval", env_names["--usage-interval"],
                            values.usage_interval, Config.usage_interval),
        usage_days=pick("--usage-days", env_names["--usage-days"], values.count,
                        Config.usage_days),
        usage_busy_sm=pick("--usage-busy-sm", env_names["--usage-busy-sm"], values.percent,
                           Config.usage_busy_sm),
        notify=pick("--notify", env_names["--notify"], values.notify_urls, Config.notify),
        notify_events=pick("--notify-events", env_names["--notify-events"],
                           values.notify_kinds, Config.notify_events),
        notify_repeat=pick("--notify-repeat", env_names["--notify-repeat"], durations.parse,
                           Config.notify_repeat),
        notify_escalate=pick("--notify-escalate", env_names["--notify-escalate"],
                             values.zero_or_duration, Config.notify_escalate),
        notify_idle_after=pick("--notify-idle-after", env_names["--notify-idle-after"],
                               durations.parse, Config.notify_idle_after),
        notify_before=pick("--notify-before", env_names["--notify-before"], durations.parse,
                           Config.notify_before),
        notify_user_default=pick("--notify-user-default",
                                 env_names["--notify-user-default"], values.notify_template,
                                 Config.notify_user_default),
        notify_terminal=bool(args.notify_terminal) or pick(
            "--notify-terminal", env_names["--notify-terminal"], values.switch,
            Config.notify_terminal),
        notify_digest=pick("--notify-digest", env_names["--notify-digest"], values.weekly,
                           Config.notify_digest),
        fleet=fleet,
        fleet_interval=pick("--fleet-interval", env_names["--fleet-interval"], values.fleet_interval,
                            Config.fleet_interval),
        fleet_timeout=pick("--fleet-timeout", env_names["--fleet-timeout"], durations.parse,
                           Config.fleet_timeout),
        fleet_connect_timeout=pick("--fleet-connect-timeout",
                                   env_names["--fleet-connect-timeout"], durations.parse,
                                   Config.fleet_connect_timeout),
        fleet_max_bytes=pick("--fleet-max-bytes", env_names["--fleet-max-bytes"], values.size,
                             Config.fleet_max_bytes),
    )


def file_keys() -> Dict[str, str]:
    """Every key of the configuration file (a long flag's name), and the kind of value it takes."""
    return configfile.kinds([flag for flag, _, _ in _SETTINGS], SWITCHES, REPEATED)


def settings_table() -> List[Tuple[str, str, str]]:
    """(flag, variable, meaning) for every setting: docs/configuration.md's table is checked
    against it."""
    return list(_SETTINGS)


def daemon_parser() -> argparse.ArgumentParser:
    """The daemon's command line, as `patroller --help` shows it: the doctor, which takes the
    same flags, shows them in its own help."""
    return _parser()
