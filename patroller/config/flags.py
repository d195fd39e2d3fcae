"""The command line and the environment: every flag, its PATROLLER_* variable, its help, and
the checks that turn text into a Config (a bad value is refused at start, naming the flag)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import patroller.config.file as configfile
import patroller.config.values as values
from patroller import __version__, durations
from patroller.config.options import REPEATED, SECRET, SETTINGS, SWITCHES
from patroller.config.settings import (
    DEFAULT_POD_USER_KEYS,
    DEFAULT_USER_LABELS,
    KERNEL_LOG,
    KUBELET_SOCKET,
    Config,
    ConfigError,
)

T = TypeVar("T")


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
    for flag, env, text in SETTINGS:
        shown = f"{text} [{env}]".replace("%", "%%")  # argparse formats help with %
        if flag in SWITCHES:
            parser.add_argument(flag, action="store_true", default=None, help=shown)
        elif flag in REPEATED:
            parser.add_argument(flag, metavar="VALUE", action="append", help=shown)
        else:
            parser.add_argument(flag, metavar="VALUE", help=shown)
    parser.add_argument("--version", action="version", version=f"patroller {__version__}")
    return parser


def default_state_dir(test: bool, environ: Mapping[str, str], uid: int) -> str | None:
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


def load(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    origins: dict[str, str] | None = None,
) -> Config:
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
            return given  # type: ignore[return-value]  # a switch's T is bool: pick is generic
        try:
            return convert(given)
        except ValueError as exc:
            said = ",".join(given) if isinstance(given, list) else given
            if flag in SECRET:  # a URL with a password in it: the error says which, not what
                raise ConfigError(f"{source}: {exc}") from None
            raise ConfigError(f"{source}: {said!r} {exc}") from None

    env_names = {flag: env for flag, env, _ in SETTINGS}
    test = pick("--test", env_names["--test"], bool, False)  # the variable: any text is true
    none: tuple[str, ...] = ()
    fleet = pick("--fleet", env_names["--fleet"], values.fleet, none)
    from_file = pick("--fleet-file", env_names["--fleet-file"], values.fleet_file, none)
    if fleet and from_file:
        raise ConfigError(
            "--fleet-file: given with --fleet too (or PATROLLER_FLEET_FILE with "
            "PATROLLER_FLEET); name the fleet's hosts one way"
        )
    fleet = fleet or from_file
    test_processes = pick("--test-processes", env_names["--test-processes"], values.switch, False)
    if test_processes and not test:
        raise ConfigError("--test-processes: only with --test: a GPU host's processes are its own")
    return Config(
        test=test,
        test_processes=test_processes,
        port=pick("--port", env_names["--port"], values.port, Config.port),
        address=pick("--address", env_names["--address"], str.strip, Config.address),
        lease=pick("--lease", env_names["--lease"], durations.parse, Config.lease),
        max_waiting_per_user=pick(
            "--max-waiting-per-user",
            env_names["--max-waiting-per-user"],
            values.count,
            Config.max_waiting_per_user,
        ),
        user_labels=pick(
            "--user-labels", env_names["--user-labels"], values.user_labels, DEFAULT_USER_LABELS
        ),
        user_info_labels=pick(
            "--user-info-labels", env_names["--user-info-labels"], values.labels, ()
        ),
        nvidia_smi=pick(
            "--nvidia-smi", env_names["--nvidia-smi"], values.nonempty, Config.nvidia_smi
        ),
        stream_silence=pick(
            "--stream-silence",
            env_names["--stream-silence"],
            values.silence,
            Config.stream_silence,
        ),
        inventory_every=pick(
            "--inventory-every",
            env_names["--inventory-every"],
            durations.parse,
            Config.inventory_every,
        ),
        cross_check_every=pick(
            "--cross-check-every",
            env_names["--cross-check-every"],
            durations.parse,
            Config.cross_check_every,
        ),
        socket=pick("--socket", env_names["--socket"], values.socket_path, None),
        state_dir=pick(
            "--state-dir",
            env_names["--state-dir"],
            values.directory,
            default_state_dir(test, environ, os.getuid()),
        ),
        hide_users=pick(
            "--hide-users", env_names["--hide-users"], values.switch, Config.hide_users
        ),
        docker_host=pick("--docker-host", env_names["--docker-host"], values.docker_host, None),
        podman_socket=pick(
            "--podman-socket",
            env_names["--podman-socket"],
            values.engine_socket,
            Config.podman_socket,
        ),
        rootless_docker_socket=pick(
            "--rootless-docker-socket",
            env_names["--rootless-docker-socket"],
            values.engine_template,
            Config.rootless_docker_socket,
        ),
        rootless_podman_socket=pick(
            "--rootless-podman-socket",
            env_names["--rootless-podman-socket"],
            values.engine_template,
            Config.rootless_podman_socket,
        ),
        containerd_socket=pick(
            "--containerd-socket",
            env_names["--containerd-socket"],
            values.containerd_socket,
            Config.containerd_socket,
        ),
        containerd_namespaces=pick(
            "--containerd-namespaces",
            env_names["--containerd-namespaces"],
            values.namespaces,
            Config.containerd_namespaces,
        ),
        pod_user_keys=pick(
            "--pod-user-key", env_names["--pod-user-key"], values.keys, DEFAULT_POD_USER_KEYS
        ),
        shifted_uids_from=pick(
            "--shifted-uids-from",
            env_names["--shifted-uids-from"],
            values.count,
            Config.shifted_uids_from,
        ),
        slurm_job_map=pick(
            "--slurm-job-map", env_names["--slurm-job-map"], values.directory, None
        ),
        kubelet_socket=pick(
            "--kubelet-socket",
            env_names["--kubelet-socket"],
            values.optional_socket,
            None if test else KUBELET_SOCKET,
        ),
        kernel_log=pick(
            "--kernel-log",
            env_names["--kernel-log"],
            values.optional_path,
            None if test else KERNEL_LOG,
        ),
        log_level=pick(
            "--log-level", env_names["--log-level"], values.log_level, Config.log_level
        ),
        body_timeout=pick(
            "--body-timeout", env_names["--body-timeout"], durations.parse, Config.body_timeout
        ),
        header_timeout=pick(
            "--header-timeout",
            env_names["--header-timeout"],
            durations.parse,
            Config.header_timeout,
        ),
        max_connections_per_caller=pick(
            "--max-connections-per-caller",
            env_names["--max-connections-per-caller"],
            values.count,
            Config.max_connections_per_caller,
        ),
        max_per_user=pick("--max-per-user", env_names["--max-per-user"], values.count, None),
        limits_file=pick("--limits-file", env_names["--limits-file"], values.existing_file, None),
        starvation_bound=pick(
            "--starvation-bound",
            env_names["--starvation-bound"],
            durations.parse,
            Config.starvation_bound,
        ),
        max_hold=pick("--max-hold", env_names["--max-hold"], durations.parse, Config.max_hold),
        idle_sm=pick("--idle-sm", env_names["--idle-sm"], values.nonnegative, Config.idle_sm),
        idle_memory=pick(
            "--idle-memory", env_names["--idle-memory"], values.nonnegative, Config.idle_memory
        ),
        idle_after=pick(
            "--idle-after", env_names["--idle-after"], durations.parse, Config.idle_after
        ),
        idle_release=pick("--idle-release", env_names["--idle-release"], durations.parse, None),
        audit_log=pick("--audit-log", env_names["--audit-log"], values.nonempty, None),
        usage=pick("--usage", env_names["--usage"], values.usage, Config.usage),
        usage_interval=pick(
            "--usage-interval",
            env_names["--usage-interval"],
            values.usage_interval,
            Config.usage_interval,
        ),
        usage_days=pick(
            "--usage-days", env_names["--usage-days"], values.count, Config.usage_days
        ),
        usage_busy_sm=pick(
            "--usage-busy-sm", env_names["--usage-busy-sm"], values.percent, Config.usage_busy_sm
        ),
        notify=pick("--notify", env_names["--notify"], values.notify_urls, Config.notify),
        notify_events=pick(
            "--notify-events",
            env_names["--notify-events"],
            values.notify_kinds,
            Config.notify_events,
        ),
        notify_repeat=pick(
            "--notify-repeat", env_names["--notify-repeat"], durations.parse, Config.notify_repeat
        ),
        notify_escalate=pick(
            "--notify-escalate",
            env_names["--notify-escalate"],
            values.zero_or_duration,
            Config.notify_escalate,
        ),
        notify_idle_after=pick(
            "--notify-idle-after",
            env_names["--notify-idle-after"],
            durations.parse,
            Config.notify_idle_after,
        ),
        notify_before=pick(
            "--notify-before", env_names["--notify-before"], durations.parse, Config.notify_before
        ),
        notify_user_default=pick(
            "--notify-user-default",
            env_names["--notify-user-default"],
            values.notify_template,
            Config.notify_user_default,
        ),
        notify_terminal=bool(args.notify_terminal)
        or pick(
            "--notify-terminal",
            env_names["--notify-terminal"],
            values.switch,
            Config.notify_terminal,
        ),
        notify_digest=pick(
            "--notify-digest", env_names["--notify-digest"], values.weekly, Config.notify_digest
        ),
        fleet=fleet,
        fleet_interval=pick(
            "--fleet-interval",
            env_names["--fleet-interval"],
            values.fleet_interval,
            Config.fleet_interval,
        ),
        fleet_timeout=pick(
            "--fleet-timeout", env_names["--fleet-timeout"], durations.parse, Config.fleet_timeout
        ),
        fleet_connect_timeout=pick(
            "--fleet-connect-timeout",
            env_names["--fleet-connect-timeout"],
            durations.parse,
            Config.fleet_connect_timeout,
        ),
        fleet_max_bytes=pick(
            "--fleet-max-bytes",
            env_names["--fleet-max-bytes"],
            values.size,
            Config.fleet_max_bytes,
        ),
    )


def file_keys() -> dict[str, str]:
    """Every key of the configuration file (a long flag's name), and the kind of value it takes."""
    return configfile.kinds([flag for flag, _, _ in SETTINGS], SWITCHES, REPEATED)


def settings_table() -> list[tuple[str, str, str]]:
    """(flag, variable, meaning) for every setting: docs/configuration.md's table is checked
    against it."""
    return list(SETTINGS)


def daemon_parser() -> argparse.ArgumentParser:
    """The daemon's command line, as `patroller --help` shows it: the doctor, which takes the
    same flags, shows them in its own help."""
    return _parser()
