"""The entry point: configuration, logging, the daemon, and one ordered shutdown.

`patroller [flags]` runs the daemon; `patroller run|status|release|wait ...` are the command
line's client commands (cli.py), which need neither Tornado nor the Docker SDK; `patroller
doctor [flags]` checks what the daemon would meet here (doctor/); `patroller config [flags]`
shows each setting and where it came from (config/shown.py); `patroller --help`, `completion`
and `manpage` are made from the whole command line (manual.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from patroller import __version__, cli

if TYPE_CHECKING:
    from patroller.config import Config
    from patroller.services import Services

log = logging.getLogger("patroller")


def main(argv: Sequence[str] | None = None) -> int:
    """A client command (`patroller run ...`), or the daemon: run until SIGINT or SIGTERM
    (SIGHUP logs the state). The daemon's exit: 0 stopped, 1 failed, 2 bad config."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in cli.COMMANDS:
        return cli.main(args)
    if args and args[0] == "doctor":
        return doctor_main(args[1:])
    if args and args[0] == "config":
        from patroller.config.shown import main as show_config

        return show_config(args[1:])
    if args and args[0] in ("completion", "manpage"):
        from patroller import manual  # the whole command line: the daemon's flags too

        return manual.main(args)
    if any(word in ("-h", "--help") for word in args):  # the daemon's flags and every command
        from patroller.manual import full_help

        sys.stdout.write(full_help())
        return 0
    if args and args[0] == "serve":  # the daemon by name, for symmetry with the commands
        args = args[1:]
    if argv is None:  # the program itself (not a caller in the same process: a test)
        system_allocator()
    return daemon_main(args)


def system_allocator() -> None:
    """The daemon on the C library's allocator: unless the environment names one already,
    start again, once, the same, with PYTHONMALLOC=malloc (before anything is opened: the
    process id, descriptors and environment are kept). Config.system_allocator says why."""
    if "PYTHONMALLOC" in os.environ or not sys.executable:
        return  # named already (the systemd unit names it): nothing more imported for it
    from patroller.config.settings import Config

    if not Config.system_allocator:
        return
    os.environ["PYTHONMALLOC"] = "malloc"
    os.execv(sys.executable, sys.orig_argv)


def doctor_main(argv: Sequence[str]) -> int:
    """`patroller doctor`: what the daemon these flags describe would meet on this host. 0 when
    no check failed, 78 (EX_CONFIG) when one did, 2 for a bad flag."""
    from patroller.cli.exits import EX_CONFIG, EX_OK, EX_USAGE
    from patroller.doctor.command import FAILING, HEALTHY
    from patroller.doctor.command import main as doctor

    return {HEALTHY: EX_OK, FAILING: EX_CONFIG}.get(doctor(argv), EX_USAGE)


def daemon_main(argv: Sequence[str]) -> int:
    """The daemon, with its flags."""
    from patroller.config import ConfigError, load  # the daemon's imports: Tornado, the Docker SDK

    try:
        config = load(argv)
    except ConfigError as exc:
        print(f"patroller: error: {exc}", file=sys.stderr)
        return 2
    handler = logging.StreamHandler()
    handler.setFormatter(
        JournalFormatter()
        if under_journal()
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=config.log_level.upper(), handlers=[handler])
    raise_file_limit()
    # Whatever the daemon or a library it uses makes is its own user's alone (each file it
    # writes also asks for 0600 itself: state/private.py); the socket is opened up on purpose.
    os.umask(0o077)
    from patroller.app import StartError

    def reread() -> tuple[Config, str | None]:  # SIGHUP: the same flags, the file again
        origins: dict[str, str] = {}
        return load(argv, origins=origins), origins.get("--config")

    try:
        return asyncio.run(serve(config, reread))
    except StartError as exc:
        print(f"patroller: {exc}", file=sys.stderr)
        return 1


def raise_file_limit() -> None:
    """Let the daemon use every descriptor it may: services often start with a soft limit of
    1,024, which slow clients could fill (each holds one); the hard limit is often far higher."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, hard, exc)
        return
    log.info("descriptors: the limit is raised from %d to %d", soft, hard)


Reread = Callable[[], tuple["Config", str | None]]  # the settings again, and the file's path


async def serve(config: Config, reread: Reread | None = None) -> int:
    """Build, start, listen, run until a stop signal, then stop in order. A stop signal that
    comes while the daemon is being built (discovery may take seconds, or hang) ends it at once:
    the nvidia-smi it waits for is killed. SIGHUP calls `reread` (by default: the same
    settings) and applies what may change live."""
    from patroller.app import StartError, build

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    building = asyncio.ensure_future(build(config))
    stopped = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({building, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not building.done():
        building.cancel()
        await asyncio.wait({building})
        log.info("stopped while starting")
        return 0
    stopped.cancel()
    daemon = building.result()
    daemon.start()
    try:
        urls = daemon.listen(config.port, config.address, config.socket)
    except (OSError, StartError) as exc:
        await daemon.stop(grace=config.shutdown_grace)
        if isinstance(exc, StartError):
            raise
        where = f"{config.address or 'all interfaces'} port {config.port}"
        if config.socket and exc.filename is None and "port" not in str(exc):
            where += f" or {config.socket}"
        raise StartError(
            f"cannot listen on {where}: {exc.strerror or exc}; "
            "choose another --port, --address or --socket"
        ) from None
    services = daemon.services
    # SIGHUP is the reload signal (systemctl reload): the configuration file and the per-user
    # limits file are read again, and one line says what the daemon holds; never the default
    # action, which would kill it.
    reloads: set[asyncio.Future[None]] = set()  # held until done
    running = {"config": config}  # what the last reload applied

    def hangup() -> None:
        task = asyncio.ensure_future(reload(services, running, reread or (lambda: (config, None))))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, hangup)
    mode = "test mode, synthetic devices" if config.test else "GPU host mode"
    log.info(
        "patroller %s serving %d devices (%s) on %s",
        __version__,
        len(services.inventory),
        mode,
        ", ".join(urls),
    )
    await stopping.wait()
    log.info("stopping")
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(signum)
    await daemon.stop(grace=config.shutdown_grace)
    log.info("stopped")
    return 0


def under_journal() -> bool:
    """Whether stderr is systemd's journal (systemd sets JOURNAL_STREAM to its device:inode)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        device, inode = (int(part) for part in stream.split(":"))
        info = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return False
    return (info.st_dev, info.st_ino) == (device, inode)


class JournalFormatter(logging.Formatter):
    """Lines for the journal: its own time stamps, and the level as a syslog priority prefix
    (`<4>` for a warning), which journald reads; `journalctl -p warning` then filters."""

    PRIORITIES = {
        logging.DEBUG: 7,
        logging.INFO: 6,
        logging.WARNING: 4,
        logging.ERROR: 3,
        logging.CRITICAL: 2,
    }

    def format(self, record: logging.LogRecord) -> str:
        priority = self.PRIORITIES.get(record.levelno, 6)
        text = f"{record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return "\n".join(f"<{priority}>{line}" for line in text.splitlines())


async def reload(services: Services, running: dict[str, Config], reread: Reread) -> None:
    """SIGHUP: the settings again (the configuration file read in the executor, never on the
    loop), then the policy from them and the limits file. What may change live does (the policy,
    the log level); a setting changed that takes a restart is named in one warning; a file that
    cannot be used keeps everything as it was (one warning)."""
    from patroller.app import StartError, make_policy
    from patroller.config import ConfigError, live

    loop = asyncio.get_running_loop()
    try:
        read, path = await loop.run_in_executor(None, reread)
    except ConfigError as exc:
        log.warning("SIGHUP: %s; the settings stay as they were; %s", exc, summary(services))
        return
    config, restart = live.applied(running["config"], read)
    if restart:
        log.warning(
            "SIGHUP: %s changed in %s: restart to apply",
            ", ".join(restart),
            path or "the settings read again (no configuration file now)",
        )
    try:
        services.leases.policy = await loop.run_in_executor(None, make_policy, config)
    except StartError as exc:
        log.warning("SIGHUP: %s; the limits stay as they were; %s", exc, summary(services))
        return
    running["config"] = config
    logging.getLogger().setLevel(config.log_level.upper())
    limits = services.leases.policy.limits
    log.info(
        "SIGHUP: limits read again (%d per-user limit(s)%s); %s",
        len(limits),
        f" from {config.limits_file}" if config.limits_file else "",
        summary(services),
    )


def summary(services: Services) -> str:
    """One line on what the daemon holds: devices by state, and requests waiting."""
    states = Counter(services.leases.state(device.uuid) for device in services.inventory)
    held = ", ".join(
        f"{states[state]} {state}"
        for state in ("reserved", "allocated", "claimed", "shared", "free")
        if state != "allocated" or states[state]
    )
    return (
        f"{len(services.inventory)} devices: {held}; "
        f"{len(services.leases.waiters)} requests waiting, still serving"
    )
