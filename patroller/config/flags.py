"""The command line and the environment: every flag, its PATROLLER_* variable, its help, and
the checks that turn text into a Config (a bad value is refused at start, naming the flag)."""
from __future__ import annotations

import argparse
import math
import os
from typing import Callable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from patroller import __version__, durations, hosts
from patroller.config.settings import DEFAULT_USER_LABELS, Config, ConfigError

T = TypeVar("T")

LOG_LEVELS = ("debug", "info", "warning", "error")
SWITCHES = ("--test", "--hide-users")  # flags that take no value


# (flag, environment variable, help) for every setting, in the order of --help.
_SETTINGS = (
    ("--test", "PATROLLER_TEST", "synthetic devices: no GPU, no Docker, no nvidia-smi"),
    ("--port", "PATROLLER_PORT", "TCP port to listen on (default 80)"),
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
    ("--shifted-uids-from", "PATROLLER_SHIFTED_UIDS_FROM",
     "host uids from this one up are user namespaces' (the ranges /etc/subuid hands out): a "
     "container's process running as one is never taken for a host account (default 100000)"),
    ("--slurm-job-map", "PATROLLER_SLURM_JOB_MAP",
     "directory of the Slurm job map (one file per GPU index, listing its jobs; written by "
     "contrib/slurm's prolog): a GPU listed there is its jobs', never granted (default: none)"),
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
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="patroller",
        description="Know which user is on which GPU, and hand out free GPUs fairly.",
        epilog="Every flag falls back to the environment variable named in its help. The "
        "commands that talk to a running server: patroller run, status, release, wait and "
        "reserve (each with --help).",
    )
    for flag, env, text in _SETTINGS:
        shown = f"{text} [{env}]".replace("%", "%%")  # argparse formats help with %
        if flag in SWITCHES:
            parser.add_argument(flag, action="store_true", default=None, help=shown)
        else:
            parser.add_argument(flag, metavar="VALUE", help=shown)
    parser.add_argument("--version", action="version", version=f"patroller {__version__}")
    return parser


def _port(text: str) -> int:
    if not text.strip().isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError("is not a port number (0-65535)")
    return int(text)


def _silence(text: str) -> float:
    value = durations.parse(text)
    if value < 3:
        raise ValueError("must be at least 3 seconds: nvidia-smi prints once a second")
    return value


def _nonnegative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be zero or more")
    return value


def _existing_file(text: str) -> str:
    path = os.path.abspath(os.path.expanduser(text.strip()))
    if not os.path.isfile(path):
        raise ValueError("is not a file")
    return path


def _labels(text: str) -> Tuple[str, ...]:
    labels = tuple(part.strip() for part in text.split(",") if part.strip())
    if any(any(c.isspace() for c in label) for label in labels):
        raise ValueError("holds a label with white space")
    return labels


def _count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError("is not a whole number of 1 or more")
    return int(text)


def _user_labels(text: str) -> Tuple[str, ...]:
    labels = _labels(text)
    if not labels:
        raise ValueError("must name at least one label")
    return labels


def _log_level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise ValueError("must be one of " + ", ".join(LOG_LEVELS))
    return text.lower()


def _nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


def _socket_path(text: str) -> str:
    path = os.path.abspath(text.strip())
    if not text.strip():
        raise ValueError("must not be empty")
    if len(path.encode()) > 107:
        raise ValueError("is longer than a unix socket path may be (107 bytes)")
    if not os.path.isdir(os.path.dirname(path)):
        raise ValueError(f"is in a directory that does not exist ({os.path.dirname(path)})")
    return path


def _state_dir(text: str) -> Optional[str]:
    if text.strip().lower() in ("", "none"):
        return None
    path = os.path.abspath(os.path.expanduser(text.strip()))
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError("is not a directory")
    return path


def _job_map(text: str) -> Optional[str]:
    if text.strip().lower() in ("", "none"):
        return None
    path = os.path.abspath(os.path.expanduser(text.strip()))
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError("is not a directory")
    return path  # one that is not there yet is read once the prolog makes it


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


def _fleet(text: str) -> Tuple[str, ...]:
    return _fleet_hosts(hosts.split(text))


def _fleet_file(text: str) -> Tuple[str, ...]:
    path = os.path.abspath(os.path.expanduser(text.strip()))
    try:
        found = hosts.read(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    return _fleet_hosts(found)


def _fleet_hosts(found: List[str]) -> Tuple[str, ...]:
    if not found:
        raise ValueError("names no host")
    for host in found:
        try:
            hosts.base_url(host)
        except ValueError as exc:
            raise ValueError(f"names {host!r}, which {exc}") from None
    return tuple(found)


def _fleet_interval(text: str) -> float:
    value = durations.parse(text)
    if value < 0.5:
        raise ValueError("must be at least 0.5 seconds: every host is asked that often")
    return value


def _switch(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError("must be 1, true, yes or on; or 0, false, no, off or empty")


def _docker_host(text: str) -> str:
    if not text.strip().startswith(("unix://", "tcp://", "ssh://", "http://", "https://")):
        raise ValueError("must be a unix://, tcp://, ssh:// or http(s):// address")
    return text.strip()


def _unix_path_fits(address: str) -> str:
    if address.startswith("unix://") and len(address[len("unix://"):].encode()) > 107:
        raise ValueError("is longer than a unix socket path may be (107 bytes)")
    return address


def _engine_address(text: str) -> Optional[str]:
    """An engine's address; None for none (or nothing); a path is a unix socket's."""
    address = text.strip()
    if address.lower() in ("", "none"):
        return None
    return _docker_host("unix://" + address if address.startswith("/") else address)


def _engine_socket(text: str) -> Optional[str]:
    address = _engine_address(text)
    if address is None:
        return None
    if "{" in address or "}" in address:
        raise ValueError("holds braces: only the rootless sockets take {uid}")
    return _unix_path_fits(address)


def _engine_template(text: str) -> Optional[str]:
    address = _engine_address(text)
    if address is None:
        return None
    if "{uid}" not in address:
        raise ValueError("must hold {uid}, which stands for the uid of the engine's user")
    try:
        widest = address.format(uid=4294967294)  # the largest uid there can be
    except (KeyError, IndexError, ValueError):
        raise ValueError("may hold {uid} and nothing else in braces") from None
    _unix_path_fits(widest)
    return address


def load(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> Config:
    """Build the Config from argv (default sys.argv[1:]) and environ (default os.environ).

    Raises ConfigError naming the flag or variable whose value is unusable. argparse itself
    exits with status 2 on an unknown flag.
    """
    environ = os.environ if environ is None else environ
    args = _parser().parse_args(argv)

    def pick(flag: str, env: str, convert: Callable[[str], T], default: T) -> T:
        attr = flag[2:].replace("-", "_")
        given: Optional[str] = getattr(args, attr)
        source = flag
        if given is None:
            given, source = environ.get(env), env
        if given is None:
            return default
        try:
            return convert(given)
        except ValueError as exc:
            raise ConfigError(f"{source}: {given!r} {exc}") from None

    env_names = {flag: env for flag, env, _ in _SETTINGS}
    test = bool(args.test) or bool(environ.get("PATROLLER_TEST"))
    fleet = pick("--fleet", env_names["--fleet"], _fleet, ())
    from_file = pick("--fleet-file", env_names["--fleet-file"], _fleet_file, ())
    if fleet and from_file:
        raise ConfigError("--fleet-file: given with --fleet too (or PATROLLER_FLEET_FILE with "
                          "PATROLLER_FLEET); name the fleet's hosts one way")
    fleet = fleet or from_file
    return Config(
        test=test,
        port=pick("--port", env_names["--port"], _port, Config.port),
        address=pick("--address", env_names["--address"], str.strip, Config.address),
        lease=pick("--lease", env_names["--lease"], durations.parse, Config.lease),
        max_waiting_per_user=pick("--max-waiting-per-user", env_names["--max-waiting-per-user"],
                                  _count, Config.max_waiting_per_user),
        user_labels=pick("--user-labels", env_names["--user-labels"], _user_labels, DEFAULT_USER_LABELS),
        user_info_labels=pick("--user-info-labels", env_names["--user-info-labels"], _labels, ()),
        nvidia_smi=pick("--nvidia-smi", env_names["--nvidia-smi"], _nonempty, Config.nvidia_smi),
        stream_silence=pick("--stream-silence", env_names["--stream-silence"], _silence,
                            Config.stream_silence),
        inventory_every=pick("--inventory-every", env_names["--inventory-every"], durations.parse,
                             Config.inventory_every),
        cross_check_every=pick("--cross-check-every", env_names["--cross-check-every"],
                               durations.parse,
                               Config.cross_check_every),
        socket=pick("--socket", env_names["--socket"], _socket_path, None),
        state_dir=pick("--state-dir", env_names["--state-dir"], _state_dir,
                       default_state_dir(test, environ, os.getuid())),
        hide_users=bool(args.hide_users) or pick("--hide-users", env_names["--hide-users"],
                                                 _switch, Config.hide_users),
        docker_host=pick("--docker-host", env_names["--docker-host"], _docker_host, None),
        podman_socket=pick("--podman-socket", env_names["--podman-socket"], _engine_socket,
                           Config.podman_socket),
        rootless_docker_socket=pick("--rootless-docker-socket",
                                    env_names["--rootless-docker-socket"], _engine_template,
                                    Config.rootless_docker_socket),
        rootless_podman_socket=pick("--rootless-podman-socket",
                                    env_names["--rootless-podman-socket"], _engine_template,
                                    Config.rootless_podman_socket),
        shifted_uids_from=pick("--shifted-uids-from", env_names["--shifted-uids-from"], _count,
                               Config.shifted_uids_from),
        slurm_job_map=pick("--slurm-job-map", env_names["--slurm-job-map"], _job_map, None),
        log_level=pick("--log-level", env_names["--log-level"], _log_level, Config.log_level),
        body_timeout=pick("--body-timeout", env_names["--body-timeout"], durations.parse,
                          Config.body_timeout),
        header_timeout=pick("--header-timeout", env_names["--header-timeout"], durations.parse,
                            Config.header_timeout),
        max_connections_per_caller=pick("--max-connections-per-caller",
                                        env_names["--max-connections-per-caller"], _count,
                                        Config.max_connections_per_caller),
        max_per_user=pick("--max-per-user", env_names["--max-per-user"], _count, None),
        limits_file=pick("--limits-file", env_names["--limits-file"], _existing_file, None),
        starvation_bound=pick("--starvation-bound", env_names["--starvation-bound"],
                              durations.parse,
                              Config.starvation_bound),
        max_hold=pick("--max-hold", env_names["--max-hold"], durations.parse, Config.max_hold),
        idle_sm=pick("--idle-sm", env_names["--idle-sm"], _nonnegative, Config.idle_sm),
        idle_memory=pick("--idle-memory", env_names["--idle-memory"], _nonnegative,
                         Config.idle_memory),
        idle_after=pick("--idle-after", env_names["--idle-after"], durations.parse,
                        Config.idle_after),
        idle_release=pick("--idle-release", env_names["--idle-release"], durations.parse, None),
        audit_log=pick("--audit-log", env_names["--audit-log"], _nonempty, None),
        fleet=fleet,
        fleet_interval=pick("--fleet-interval", env_names["--fleet-interval"], _fleet_interval,
                            Config.fleet_interval),
        fleet_timeout=pick("--fleet-timeout", env_names["--fleet-timeout"], durations.parse,
                           Config.fleet_timeout),
    )


def settings_table() -> List[Tuple[str, str, str]]:
    """(flag, variable, meaning) for every setting: docs/configuration.md's table is checked
    against it."""
    return list(_SETTINGS)
