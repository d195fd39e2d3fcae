"""GPU host mode: discover the devices with `nvidia-smi -q -x`, then watch them with dmon/pmon."""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import shlex
import subprocess
from typing import List, Mapping, Optional, Union

from ..devices import Inventory
from ..signals import Signals
from .discovery import Discovery, DiscoveryError, parse_inventory
from .monitors import INTERVAL, DmonMonitor, PmonMonitor

log = logging.getLogger(__name__)

__all__ = ["INTERVAL", "GpuHostError", "command", "discover", "monitors", "query"]

DISCOVERY_TIMEOUT = 120.0  # one query has been seen to take 15 s on a large host
HINT = "run with --test to try Patroller without a GPU"


class GpuHostError(Exception):
    """The GPUs cannot be discovered; the message is one line for the user."""


def command(nvidia_smi: str) -> List[str]:
    """The configured nvidia-smi command as argv (it may carry arguments of its own)."""
    return shlex.split(nvidia_smi)


def _one_line(text: str, limit: int = 300) -> str:
    words = " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return words if len(words) <= limit else words[:limit] + "..."


def query(argv: List[str], env: Optional[Mapping[str, str]] = None,
          timeout: float = DISCOVERY_TIMEOUT) -> Discovery:
    """Run `nvidia-smi -q -x` (blocking) and parse it; GpuHostError says what went wrong."""
    shown = " ".join([*argv, "-q", "-x"])
    try:
        result = subprocess.run([*argv, "-q", "-x"], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, errors="replace",
                                timeout=timeout, env=None if env is None else dict(env))
    except FileNotFoundError:
        raise GpuHostError(f"cannot list the GPUs: {argv[0]} was not found; {HINT}") from None
    except PermissionError:
        raise GpuHostError(f"cannot list the GPUs: {argv[0]} is not executable; {HINT}") from None
    except subprocess.TimeoutExpired:
        raise GpuHostError(f"cannot list the GPUs: `{shown}` did not answer in "
                           f"{timeout:.0f} s; {HINT}") from None
    if result.returncode != 0:
        said = _one_line(result.stderr) or _one_line(result.stdout) or "nothing"
        raise GpuHostError(f"cannot list the GPUs: `{shown}` failed with status "
                           f"{result.returncode}: {said}; {HINT}")
    try:
        found = parse_inventory(result.stdout)
    except DiscoveryError as exc:
        raise GpuHostError(f"cannot list the GPUs: {exc}; {HINT}") from None
    for warning in found.warnings:
        log.warning("discovery: %s", warning)
    if not found.devices:
        raise GpuHostError(f"cannot list the GPUs: `{shown}` lists no GPU with a uuid; {HINT}")
    return found


async def discover(argv: List[str], env: Optional[Mapping[str, str]] = None) -> Discovery:
    """`query` off the event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(query, argv, env))


def monitors(inventory: Inventory, signals: Signals, argv: List[str],
             env: Optional[Mapping[str, str]] = None, silence: Optional[float] = None,
             startup: Optional[float] = None) -> List[Union[DmonMonitor, PmonMonitor]]:
    """The dmon and pmon monitors over every device; a stream silent for `silence` s is hung."""
    base = dict(os.environ if env is None else env)
    return [DmonMonitor(inventory, signals, argv, base, silence=silence, startup=startup),
            PmonMonitor(inventory, signals, argv, base, silence=silence, startup=startup)]
