"""The entry point: configuration, logging, the daemon, and one ordered shutdown.

`patroller [flags]` runs the daemon; `patroller run|status|release|wait ...` are the command
line's client commands (cli.py), which need neither Tornado nor the Docker SDK.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections import Counter
from typing import TYPE_CHECKING, Optional, Sequence

from . import __version__, cli

if TYPE_CHECKING:
    from .app import Daemon
    from .config import Config

log = logging.getLogger("patroller")

SHUTDOWN_GRACE = 2.0  # seconds the whole stop may take: monitors, then connections


def main(argv: Optional[Sequence[str]] = None) -> int:
    """A client command (`patroller run ...`), or the daemon: run until SIGINT or SIGTERM
    (SIGHUP logs the state). The daemon's exit: 0 stopped, 1 failed, 2 bad config."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in cli.COMMANDS:
        return cli.main(args)
    if args and args[0] == "serve":  # the daemon by name, for symmetry with the commands
        args = args[1:]
    return daemon_main(args)


def daemon_main(argv: Sequence[str]) -> int:
    """The daemon, with its flags."""
    from .config import ConfigError, load  # the daemon's imports: Tornado, the Docker SDK

    try:
        config = load(argv)
    except ConfigError as exc:
        print(f"patroller: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from .app import StartError

    try:
        return asyncio.run(serve(config))
    except StartError as exc:
        print(f"patroller: {exc}", file=sys.stderr)
        return 1


async def serve(config: "Config") -> int:
    """Build, listen, run until a stop signal, then stop in order."""
    from .app import StartError, build

    daemon = await build(config)
    try:
        urls = daemon.listen(config.port, config.address, config.socket)
    except OSError as exc:
        where = f"{config.address or 'all interfaces'} port {config.port}"
        if config.socket and exc.filename is None and "port" not in str(exc):
            where += f" or {config.socket}"
        raise StartError(f"cannot listen on {where}: {exc.strerror or exc}; "
                         "choose another --port, --address or --socket") from None
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    # SIGHUP is the reload signal (systemctl reload): nothing is reloaded yet, so it says what the
    # daemon holds and goes on; never the default action, which would kill it uncleanly.
    loop.add_signal_handler(signal.SIGHUP, lambda: log.info("SIGHUP: nothing to reload; %s",
                                                            summary(daemon)))
    daemon.start()
    mode = "test mode, synthetic devices" if config.test else "GPU host mode"
    log.info("patroller %s serving %d devices (%s) on %s", __version__, len(daemon.inventory),
             mode, ", ".join(urls))
    await stopping.wait()
    log.info("stopping")
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(signum)
    await daemon.stop(grace=SHUTDOWN_GRACE)
    log.info("stopped")
    return 0


def summary(daemon: "Daemon") -> str:
    """One line on what the daemon holds: devices by state, and requests waiting."""
    states = Counter(daemon.leases.state(device.uuid) for device in daemon.inventory)
    held = ", ".join(f"{states[state]} {state}" for state in ("reserved", "claimed", "shared", "free"))
    return (f"{len(daemon.inventory)} devices: {held}; "
            f"{daemon.leases.waiting} requests waiting, still serving")
