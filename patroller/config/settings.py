"""Every setting of the daemon, in one immutable object built once at start.

A setting a user would change is a flag (config/flags.py gives each its PATROLLER_* variable);
the rest are internal defaults, documented here, that tests and the benchmark may set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

DEFAULT_USER_LABELS = ("user.email", "email", "maintainer")


class ConfigError(Exception):
    """A setting with a value that cannot be used; the message names the flag or variable."""


@dataclass(frozen=True)
class Config:
    """Everything the daemon is told at start. Immutable; passed down explicitly."""

    # -- where it serves, and how it runs (flags) --------------------------------------------
    test: bool = False  # synthetic devices: no GPU, no Docker, no nvidia-smi
    port: int = 80
    address: str = ""  # all interfaces
    socket: Optional[str] = None  # also serve on this unix socket
    log_level: str = "info"

    # -- leases and fair use (flags) ----------------------------------------------------------
    lease: float = 10.0  # seconds an unclaimed reservation is held
    max_waiting_per_user: int = 100  # /wait requests one user may have queued at once
    max_per_user: Optional[int] = None  # devices one user may hold at once
    limits_file: Optional[str] = None  # per-user overrides (JSON), read again on SIGHUP
    starvation_bound: float = 600.0  # seconds a waiting request may be overtaken
    max_hold: float = 12 * 3600.0  # the longest reservation one may ask for (hold=2h)
    idle_sm: float = 5.0  # %: at most this SM use ...
    idle_memory: float = 1024.0  # MiB: ... and less memory used than this is idle
    idle_after: float = 1800.0  # seconds idle before it shows
    idle_release: Optional[float] = None  # seconds idle (no process) before it is released

    # -- nvidia-smi (flags) -------------------------------------------------------------------
    nvidia_smi: str = "nvidia-smi"
    stream_silence: float = 5.0  # seconds a running dmon/pmon may print nothing: then it is hung
    stream_startup: float = 30.0  # seconds a fresh one may take to speak (slow NVML start)
    inventory_every: float = 60.0  # seconds between readings of `nvidia-smi -q -x`
    cross_check_every: float = 10.0  # seconds between compute-apps queries, when needed

    # -- identity (flags) ---------------------------------------------------------------------
    user_labels: Tuple[str, ...] = DEFAULT_USER_LABELS
    user_info_labels: Tuple[str, ...] = ()
    docker_host: Optional[str] = None  # None: the Docker SDK's default socket

    # -- state on disk (flags) ----------------------------------------------------------------
    state_dir: Optional[str] = None  # the lease book's directory; None: keep no book
    audit_log: Optional[str] = None  # also write the audit record here (JSON lines; - stdout)

    # -- HTTP (flags) -------------------------------------------------------------------------
    body_timeout: float = 10.0  # seconds a request body may take to arrive

    # -- internal defaults: core (the lease rules) --------------------------------------------

    # -- internal defaults: observe (nvidia-smi's children, statistics) -----------------------

    # -- internal defaults: identify (/proc, containers, callers) -----------------------------

    # -- internal defaults: state (the book, the audit record, lifetimes) ---------------------

    # -- internal defaults: http (the server, the views, the live feed) -----------------------
    max_body: int = 64 * 1024  # bytes: the largest request body taken (a form for /release)
    idle_timeout: float = 300.0  # seconds a keep-alive connection may sit idle between requests
    linger: float = 1.0  # seconds a refused connection's input is read and dropped before closing
    linger_bytes: int = 1 << 20  # bytes read and dropped so at most
    framing_reports: int = 20  # refused requests logged per window at most (the rest counted)
    framing_window: float = 10.0  # seconds: that window
    accept_batch: int = 128  # connections accepted per wake-up at most, so others get a turn
    accept_first_pause: float = 0.05  # seconds without accepting after accept() fails (EMFILE)
    accept_max_pause: float = 1.0  # seconds: the pause doubles after each failure up to this
    accept_report_every: float = 60.0  # seconds between two log lines about failing accepts
