"""Every setting of the daemon, in one immutable object built once at start.

A setting a user would change is a flag (config/flags.py gives each its PATROLLER_* variable);
the rest are internal defaults, documented here, that tests and the benchmark may set.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_USER_LABELS = ("user.email", "email", "maintainer")
KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"  # the kubelet's own default
KERNEL_LOG = "/dev/kmsg"  # --kernel-log's default on a GPU host
DEFAULT_POD_USER_KEYS = ("patroller/user",)
# What notifications tell of (notify/messages.py words each): a process on a GPU another holds,
# a GPU used without asking, a hold idle or ending, a wait granted, a GPU gone and back, and
# the daemon's own trouble (to the admin), a GPU unhealthy (to the admin and its holder), and
# the weekly digest of usage (only with --notify-digest: naming it among the kinds turns
# nothing on).
NOTIFY_KINDS = (
    "trespass",
    "unreserved",
    "idle",
    "expiring",
    "granted",
    "lost",
    "unhealthy",
    "daemon",
    "digest",
)
# When the weekly digest is due: (weekday, Monday 0; hour; minute; the zone, as given: UTC, an
# offset from UTC or a zone's name), config/values.py's `weekly` reads it from the flag.
Weekly = tuple[int, int, int, str]


class ConfigError(Exception):
    """A setting with a value that cannot be used; the message names the flag or variable."""


@dataclass(frozen=True)
class Config:
    """Everything the daemon is told at start. Immutable; passed down explicitly."""

    # -- where it serves, and how it runs (flags) --------------------------------------------
    test: bool = False  # synthetic devices: no GPU, no Docker, no nvidia-smi
    test_processes: bool = False  # with test: synthetic processes that compute and idle
    port: int = 8080  # the unit, the docs and the command line all say 8080
    address: str = ""  # all interfaces
    socket: str | None = None  # also serve on this unix socket
    log_level: str = "info"

    # -- leases and fair use (flags) ----------------------------------------------------------
    lease: float = 10.0  # seconds an unclaimed reservation is held
    max_waiting_per_user: int = 100  # /wait requests one user may have queued at once
    max_per_user: int | None = None  # devices one user may hold at once
    limits_file: str | None = None  # per-user overrides (JSON), read again on SIGHUP
    starvation_bound: float = 600.0  # seconds a waiting request may be overtaken
    max_hold: float = 12 * 3600.0  # the longest reservation one may ask for (hold=2h)
    idle_sm: float = 5.0  # %: at most this SM use ...
    idle_memory: float = 1024.0  # MiB: ... and less memory used than this is idle
    idle_after: float = 1800.0  # seconds idle before it shows
    idle_release: float | None = None  # seconds idle (no process) before it is released

    # -- nvidia-smi (flags) -------------------------------------------------------------------
    nvidia_smi: str = "nvidia-smi"
    stream_silence: float = 5.0  # seconds a running dmon/pmon may print nothing: then it is hung
    stream_startup: float = 30.0  # seconds a fresh one may take to speak (slow NVML start)
    inventory_every: float = 60.0  # seconds between readings of `nvidia-smi -q -x`
    cross_check_every: float = 10.0  # seconds between compute-apps queries, when needed

    # -- identity (flags) ---------------------------------------------------------------------
    user_labels: tuple[str, ...] = DEFAULT_USER_LABELS
    user_info_labels: tuple[str, ...] = ()
    docker_host: str | None = None  # None: the Docker SDK's default socket
    # The other engines that serve the Docker API, by the containers' cgroups (None: not
    # asked): Podman's, and each user's own, {uid} being the uid of the user's slice.
    podman_socket: str | None = "unix:///run/podman/podman.sock"
    rootless_docker_socket: str | None = "unix:///run/user/{uid}/docker.sock"
    rootless_podman_socket: str | None = "unix:///run/user/{uid}/podman/podman.sock"
    # containerd's API (its containers, Kubernetes pods under containerd's CRI; None: not
    # asked), the namespaces looked in, in order (Docker's own, moby, is the Docker Engine's),
    # and the pod label or annotation keys that name a pod's user, before --user-labels.
    containerd_socket: str | None = "unix:///run/containerd/containerd.sock"
    containerd_namespaces: tuple[str, ...] = ("k8s.io", "default")
    pod_user_keys: tuple[str, ...] = DEFAULT_POD_USER_KEYS
    # Host uids from here up, seen in a container, are shifted ones (a user namespace's, as
    # /etc/subuid hands them out): never looked up as host accounts.
    shifted_uids_from: int = 100000
    slurm_job_map: str | None = None  # the Slurm prolog's job map directory; None: none
    # The kubelet's pod-resources socket; None: not asked (the flag's default is KUBELET_SOCKET
    # outside test mode, asked only while it is there).
    kubelet_socket: str | None = None
    # the kernel log followed for Xid lines (a GPU's faults; KERNEL_LOG from the command
    # line); None: not followed (test mode, --kernel-log none)
    kernel_log: str | None = None
    hide_users: bool = False  # others' names shown as pseudonyms (http/hiding.py)

    # -- state on disk (flags) ----------------------------------------------------------------
    state_dir: str | None = None  # the lease book's directory; None: keep no book
    audit_log: str | None = None  # also write the audit record here (JSON lines; - stdout)
    usage: str = "sqlite"  # the usage store (<state-dir>/usage.sqlite3); "none": keep none
    usage_interval: float = 60.0  # seconds between usage samples: one row per GPU each
    usage_days: int = 400  # days each sample is kept; then folded into daily totals
    usage_busy_sm: float = 1.0  # %: a reading with at least this SM use counts as computing

    # -- notifications (flags; notify/) --------------------------------------------------------
    notify: tuple[str, ...] = ()  # the admin's destinations, as Apprise URLs (secrets in them)
    notify_events: tuple[str, ...] = NOTIFY_KINDS  # the kinds the admin is told of
    notify_repeat: float = 6 * 3600.0  # seconds before an episode still going on is told again
    notify_escalate: float = (
        1800.0  # seconds a trespass lasts before the admin is told; 0: at once
    )
    notify_idle_after: float = (
        2 * 3600.0
    )  # seconds a hold computes nothing before its holder is told
    notify_before: float = (
        900.0  # seconds before a hold for a duration ends that its holder is told
    )
    # a user's destination when she has set none: an Apprise URL with {user} (and {email}, for
    # a user whose name is an e-mail address) in it; None: a user with none is not told
    notify_user_default: str | None = None
    # also write trespasses and ending holds on the users' own logged-in terminals (notify/
    # terminal.py), as `write` does; a user turns it off with `patroller notify mute terminal`
    notify_terminal: bool = False
    notify_digest: Weekly | None = None  # when each week's digest is sent; None: never

    # -- HTTP (flags) -------------------------------------------------------------------------
    body_timeout: float = 10.0  # seconds a request body may take to arrive
    header_timeout: float = 30.0  # seconds a request's head may take, or a connection sit idle
    max_connections_per_caller: int = 512  # open at once per uid (or per address)

    # -- the fleet view: /fleet and /fleet.json (flags) ---------------------------------------
    fleet: tuple[str, ...] = ()  # the hosts shown, as given (host:port); none: no fleet view
    fleet_interval: float = 5.0  # seconds from one asking of a host's /status to the next
    fleet_timeout: float = 3.0  # seconds a host may take to answer: then it is not answering
    fleet_connect_timeout: float = 1.0  # seconds to connect to a host: then it is not answering
    # bytes: the largest answer taken from a host, never read past (a /status of 64 GPUs and
    # 500 processes is about 92 KB); a larger one is a bad answer
    fleet_max_bytes: int = 1 << 20

    # -- internal defaults: the daemon as a whole ----------------------------------------------
    shutdown_grace: float = 2.0  # seconds the whole stop may take: monitors, connections, requests
    # seconds a thread working in the background (writing /metrics' text, a report's rows)
    # keeps the interpreter before the event loop gets it back (sys.setswitchinterval; Python's
    # own is 0.005: a request waited up to 5 ms behind a scrape)
    gil_switch_interval: float = 0.0005
    # the daemon on the C library's allocator (PYTHONMALLOC=malloc): started as a program
    # without PYTHONMALLOC, it starts itself again once with it (main.py). Python's own keeps
    # each arena any object made in it still holds: after year-long reports the daemon kept
    # 21-38 MiB it had freed, with malloc 3-9 (docs/performance.md); False: as Python starts
    system_allocator: bool = True

    # -- internal defaults: notifications (notify/) --------------------------------------------
    notify_queue: int = 100  # notices waiting for one destination at most; more are dropped
    notify_timeout: float = 10.0  # seconds one sending may take to connect, and to be answered
    notify_tries: int = 3  # sendings of one notice to one destination at most
    notify_retry_first: float = 5.0  # seconds before the second try; doubled for each next
    notify_rate: int = 10  # notices sent to one destination per notify_rate_window at most;
    notify_rate_window: float = 600.0  # the rest are held back and summed up in the next one
    notify_episodes: int = 10000  # episodes remembered (so that each is told once) at most
    notify_outbox_lines: int = 10000  # lines the outbox journal grows to before it is rewritten
    notify_outbox_wait: float = 2.0  # seconds a try waits for its start to be on disk at most
    # seconds the outbox's writer gathers the lines handed over before it writes them (a try's
    # start, which waits, is written at once): a storm wakes it 20 times a second, not 1,000
    notify_outbox_gather: float = 0.05
    # the lease rules' events the notifier handles in one turn of the loop at most; more wait
    # for the next turns, the requests that came meanwhile served between (notify/turns.py)
    notify_per_turn: int = 1
    notify_backlog: int = 10000  # events waiting for a turn at most; more are dropped, counted
    # notices dropped at full queues written one by one in the audit record per
    # repeat_log_every at most; the rest are counted, one line each kind, recipient and
    # destination with their count (notify/outcomes.py)
    notify_dropped_audited: int = 100
    notify_check_every: float = 30.0  # seconds between looks for idle and ending holds
    notify_unreserved_repeat: float = 3600.0  # a GPU used without asking: told once an hour
    notify_trouble_after: float = 60.0  # seconds the daemon's own trouble lasts before it is told
    notify_user_most: int = 5  # destinations one user may set
    notify_url_longest: int = 2048  # characters of a user's URL at most
    notify_digest_recheck: float = 300.0  # seconds the digest's timer sleeps at most before it
    # looks at the wall clock again (one set meanwhile, a host that slept)
    notify_digest_lines: int = 30  # users in the admin's digest at most; the rest in one line
    notify_digest_least: float = 60.0  # GPU-seconds in a week from which a user gets a digest
    # the services a user may name (Apprise's schemes): those that send a message elsewhere;
    # never one that writes on this host (syslog://, dbus://, a local program), which runs as
    # the daemon's user
    # the users' terminals (--notify-terminal): the login records read (glibc's utmp), and
    # at most this many of its bytes (a record is 384); the terminals one user is written on at
    # most; the notices one user's terminals get per window (the rest held back, counted, and
    # summed up in the next one); and one message's shape: characters a line, lines, bytes
    notify_utmp: str = "/var/run/utmp"
    notify_utmp_bytes: int = 1 << 20
    notify_terminal_most: int = 8
    notify_terminal_rate: int = 3
    notify_terminal_rate_window: float = 600.0
    notify_terminal_width: int = 78
    notify_terminal_lines: int = 16
    notify_terminal_bytes: int = 2048
    notify_user_schemes: tuple[str, ...] = (
        "mailto",
        "mailtos",
        "json",
        "jsons",
        "form",
        "forms",
        "ntfy",
        "ntfys",
        "slack",
        "matrix",
        "matrixs",
        "mmost",
        "mmosts",
        "msteams",
        "discord",
        "tgram",
        "gotify",
        "gotifys",
        "pushover",
        "rocket",
        "rockets",
        "zulip",
        "signal",
        "signals",
        "ifttt",
    )

    # -- internal defaults: the doctor (patroller doctor, GET /doctor) -------------------------
    doctor_slow: float = 10.0  # seconds: an nvidia-smi query that takes longer is reported slow
    doctor_min_free_mib: int = 64  # MiB free under the state directory, at least: else degraded
    doctor_timeout: float = 3.0  # seconds a socket the doctor knocks on may take to answer
    # seconds the whole examination may take: a probe still out then (an engine answering a
    # byte at a time, a hung file system) is said degraded, with what it waited for
    doctor_deadline: float = 30.0

    # -- internal defaults: core (the lease rules) --------------------------------------------
    # Host accounts whose holds count by identity alone, not by account as well: root, as which
    # containers run unless told otherwise, whoever starts them.
    limits_uncounted_uids: tuple[int, ...] = (0,)
    max_waiters: int = 10000  # /wait requests queued at once, all users together: 503 past it

    # -- internal defaults: observe (nvidia-smi's children, statistics) -----------------------
    # A dmon or pmon that exits is started again after restart_first seconds, the delay doubling
    # at each exit up to restart_limit; a run of restart_healthy seconds went well: back to first.
    restart_first: float = 1.0
    restart_limit: float = 30.0
    restart_healthy: float = 60.0
    child_linger: float = 2.0  # seconds a child may live on after closing its output: then killed
    max_line: int = 64 * 1024  # bytes: a longer line from a child is garbage, dropped
    stderr_tail: int = 2048  # bytes of a child's stderr kept for the log when it exits
    repeat_log_every: float = 60.0  # seconds between log lines about a trouble that repeats
    # (unreadable lines, failing queries, a line handler's bug): the rest are counted
    sample_interval: float = 1.0  # seconds between dmon samples: nvidia-smi's default, kept
    stale_intervals: int = 3  # statistics older than this many sampling intervals are stale
    # A device that printed nothing for this many sampling intervals while the others printed
    # is silent: the inventory is read at once, and it is granted to nobody until heard again.
    silent_intervals: int = 2
    burst_gap: float = 0.03  # seconds of quiet after the last device's pmon rows: interval over
    discovery_timeout: float = 120.0  # seconds `nvidia-smi -q -x` may take (15 s seen on a
    # large host): then it is killed, at start and in the inventory watch
    rediscover_soonest: float = 5.0  # seconds at least between readings a failing stream asks for
    busy_mib: int = 64  # MiB used on a device that pmon lists no process on: someone computes
    cross_check_timeout: float = 30.0  # seconds a compute-apps query may take: then it is killed
    mig_list_timeout: float = 30.0  # seconds `nvidia-smi -L` (the MIG devices' uuids, read with
    # the inventory while a GPU has MIG on) may take: then it is killed, and they stay unknown
    topology_timeout: float = 30.0  # seconds `nvidia-smi topo -m` (read at start and after each
    # change of the inventory) may take: then it is killed, and the links are not known
    topology_exact: int = 500  # the most sets of free devices weighed one by one when choosing
    # the best-connected (core/topology.py; each costs some microseconds): beyond, a greedy search
    topology_seeds: int = 8  # from at most this many devices (one of each kind, the most
    # promising first), each grown among its `topology_near` strongest-linked free peers
    topology_near: int = 8
    job_map_every: float = 1.0  # seconds between readings of the Slurm job map directory
    job_map_file_limit: int = 64 * 1024  # bytes read at most of one job map file
    kubelet_every: float = 2.0  # seconds between calls of the kubelet's pod-resources List
    kubelet_timeout: float = 5.0  # seconds one call may take: then it failed
    # The resources of the kubelet's that are GPUs (shell patterns): the NVIDIA device plugin's
    # GPUs, its MIG devices (mixed strategy), and time-slicing's renamed replicas.
    kubelet_resources: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-*", "*.shared")
    kubelet_ids_logged: int = 10  # device ids matching no GPU logged one by one per reading at
    # most; the rest are counted in one line
    # bytes: the largest answer taken from the kubelet or containerd (gRPC's own default); a
    # larger one is a failed call, never decoded (110 pods of three containers, each with a
    # GPU, list in about 35 KB; decoding 4 MiB of the costliest junk takes about a second)
    grpc_max_message: int = 4 << 20
    test_devices: int = 8  # test mode's synthetic devices
    test_interval: float = 1.0  # seconds between test mode's samples
    # --test-processes: the synthetic processes' script (observe/testprocesses.py): seconds of
    # one cycle (computing two thirds of it, idle the rest), and from a hold to its process
    test_process_cycle: float = 90.0
    test_process_after: float = 5.0
    history_every: float = 5.0  # seconds between the points of a device's utilisation history
    history_points: int = 120  # points of it kept: ten minutes
    # pmon intervals of a device's process figures kept unmerged at most: they are merged when
    # read (observe/figures.py), so that an interval's end on a large host stays short
    figures_backlog: int = 4
    # The GPUs' health (core/health.py): the Xids logged this many seconds before the daemon
    # started that still count (from /dev/kmsg's ring, --kernel-log), the seconds between
    # looks at a log that has nothing new, between tries to open one that cannot be, and the
    # processes' faults (Xids of an application) shown per GPU at most.
    xid_recall: float = 3600.0
    kernel_log_poll: float = 0.5
    kernel_log_retry: float = 60.0
    health_faults_kept: int = 8

    # -- internal defaults: identify (/proc, containers, callers) -----------------------------
    proc_root: str = "/proc"  # where every reader of /proc looks (tests give a tree of their own)
    identity_ttl: float = 3600.0  # seconds a process's identity is cached (by pid and start)
    identity_cache: int = 65536  # identities cached at most
    owner_retry: float = 5.0  # seconds between attempts to learn a degraded owner (Docker down)
    container_ttl: float = 600.0  # seconds a container's labels are cached
    container_cache: int = 4096  # containers cached at most
    address_ttl: float = 10.0  # seconds the containers' network addresses are cached
    docker_timeout: float = 5.0  # seconds a call to the Docker Engine may take
    # seconds a lookup may take in all (each read of it is within docker_timeout): an engine
    # that answers a byte at a time, each in time, is down after it, not waited for
    docker_deadline: float = 10.0
    docker_retry_after: float = 5.0  # seconds an unreachable engine is not asked again
    containerd_timeout: float = 5.0  # seconds a call to containerd may take
    containerd_retry_after: float = 5.0  # seconds an unreachable containerd is not asked again
    engine_socket_ttl: float = 5.0  # seconds whether an engine's socket exists is remembered
    # seconds between attempts to name a container whose engine's socket was not there
    engine_recheck: float = 30.0
    engine_clients: int = 64  # engines (Podman's, users' own) with a client kept at most
    holder_search_budget: int = 50000  # descriptors read at most to find a TCP caller's process
    holder_sockets_remembered: int = 16384  # socket inodes seen in that search, remembered
    holder_descriptors_remembered: int = 16384  # descriptors read in it (by pid): 5 MiB at most
    recent_callers: int = 16  # pids that called lately, searched first

    # -- internal defaults: state (the book, the audit record, lifetimes) ---------------------
    audit_keep: int = 1000  # events of the audit record kept in memory for /history
    book_retry: float = 1.0  # seconds between tries to write the lease book while writes fail
    lifeline_poll: float = 0.5  # seconds between checks of a process held for, where pidfds
    # cannot be had
    pseudonyms_remembered: int = 65536  # pseudonyms kept once computed (--hide-users)
    usage_dir: str | None = None  # the usage store's directory; None: the state directory
    # (tests put it on a filesystem of its own: full, read-only; the benchmark elsewhere)
    usage_retry: float = 5.0  # seconds between tries while the usage store cannot be written
    usage_backlog: int = 1440  # intervals kept in memory meanwhile (a day at one a minute);
    # older ones are dropped, counted
    usage_fold_every: float = 3600.0  # seconds between foldings of old samples into daily totals
    usage_busy_timeout: float = 5.0  # seconds a connection waits for the other's lock (SQLite)
    # bytes the usage store leaves free on its filesystem (it writes only while they are), so
    # that the lease book (1 MiB at most, written beside the old one) and the audit record
    # always have room (the doctor's own floor for the state directory is the same 64 MiB)
    usage_reserve: int = 64 << 20
    usage_new_parties: int = 128  # parties made per interval at most; more are counted under
    # their host account alone (and counted: parties_overflow)
    usage_parties_remembered: int = 1024  # the writer's map of party ids (LRU): ~6 KB each at most
    # the niceness of the thread that reads reports (0-19): a year-long report is background
    # work, and must not take much of the CPU that serving /status needs; at 19 it got what
    # was left, none on two cores that serve /status flat out (a 365-day report took 0.76-2.5 s
    # against 0.12-0.15 s alone); at 5 it weighs a third of the loop (SQLite reads without the
    # interpreter's lock: queries.at_once). docs/performance.md, "Reports under /status load"
    usage_report_nice: int = 5
    # rows of reports kept to answer the same report again while nothing was written (a page
    # reloaded, a dashboard, several people): some 100 bytes a row
    usage_report_cache_rows: int = 100_000
    usage_reports_at_once: int = 2  # reports answered at once; the others wait for a turn
    usage_reports_waiting: int = 8  # reports that wait at most; the next is a 429 (Retry-After)
    usage_report_retry_after: int = 1  # seconds that 429 tells the client to wait
    # rows a report may hold (key, user and category): more is a 400 that says to narrow the
    # range or the grouping, found while it is read (70 to 90 bytes of answer a row measured:
    # a year of 20 users by day and user is 21,400 rows, 1.4 MB; so at most some 4.5 MB)
    usage_report_max_rows: int = 50_000
    # rows of a report in one slice of the event loop, which lets /status run between two
    # (reader.py, http/usage.py): SQLite's JSON text of them parsed, merged (two keys), summed.
    # A year by day's 21,500 rows in one call held the interpreter 10-19 ms; at 250, a year
    # by day,user's pieces took 0.64 ms each (median; 1.03 the most), by day 0.2-0.4 ms
    usage_report_chunk_rows: int = 250
    # rows of a report's answer ordered, made (GPU-hours by category rounded, its share) and
    # encoded in one slice of the event loop: some 10 us each measured, 50 at most 0.65 ms
    usage_report_chunk_entries: int = 50
    usage_reader_cache_kib: int = 2048  # the reader's SQLite page cache (SQLite's default)
    # seconds without a report after which the reader's connection and the answers it keeps
    # are let go, and the heap trimmed: most of the memory reports took comes back
    usage_reader_idle: float = 10.0

    # -- internal defaults: http (the server, the views, the live feed) -----------------------
    max_body: int = 64 * 1024  # bytes: the largest request body taken (a form for /release)
    linger: float = 1.0  # seconds a refused connection's input is read and dropped before closing
    linger_bytes: int = 1 << 20  # bytes read and dropped so at most
    framing_reports: int = 20  # refused requests logged per window at most (the rest counted)
    framing_window: float = 10.0  # seconds: that window
    accept_batch: int = 128  # connections accepted per wake-up at most, so others get a turn
    accept_first_pause: float = 0.05  # seconds without accepting after accept() fails (EMFILE)
    accept_max_pause: float = 1.0  # seconds: the pause doubles after each failure up to this
    accept_report_every: float = 60.0  # seconds between two log lines about failing accepts
    status_max_age: float = 0.1  # seconds the cached /status body may be old (its clocks move)
    # seconds between the cycle collector's full collections (patroller/heap.py): the daemon's
    # objects stay frozen in between; 0 leaves the collector as Python sets it
    gc_refreeze_every: float = 600.0
    # seconds a long run of work holds the event loop before it lets requests in: a burst of a
    # child's lines (5,000 pmon rows a second), the background rebuild of /status
    loop_slice: float = 0.001
    client_errors_logged: int = 20  # 4xx access-log lines per window at most; the rest counted
    client_errors_window: float = 10.0  # seconds
    feed_every: float = 1.0  # seconds at least between two snapshots of the web page's feed
    feed_keepalive: float = 15.0  # seconds between keep-alive comments on an idle feed
    feed_retry_ms: int = 1000  # how soon a browser reconnects after the feed ends
    max_pages: int = 200  # web pages open at once (/events)
    max_pages_per_user: int = 20  # of them, one user's: nobody keeps the others' pages out
    max_pages_unidentified: int = 20  # of them, those of callers who cannot be identified
    fleet_max_gpus: int = 256  # GPUs one fleet host may list: more is a bad answer
    # Seconds: each asking of a fleet host is put off to the next multiple of this on the loop's
    # clock, so that the hosts due in one slot are asked in one turn of the event loop (0: each
    # at its own moment). 50 ms: about ten hosts a slot at 1,000 hosts every 5 s.
    fleet_slot: float = 0.05
    fleet_build_every: float = 0.5  # seconds at least between two builds of /fleet.json's body
    fleet_gzip_level: int = 6  # /fleet.json's gzip (made in a thread once per body), 1 to 9
