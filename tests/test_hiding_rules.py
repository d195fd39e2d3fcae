"""--hide-users, every rule in one table: what each kind of caller sees of each field that names
someone, on /status, /users, /queue, /history, the live feed (/events), /fleet.json, /metrics and
in the command line's output. The pure layer under tests/test_hide_users.py's real daemons.

One lease manager on a fake clock holds every case: a holder (a container with an e-mail, an
account and a label), a trespasser on her GPU and on two allocated ones, a Slurm job from a map
of bare ids (its user learned from its process), a Kubernetes pod, an account over its limit, a
waiter for whom free GPUs are set aside, and a process nobody can be found for. The read models
build their data as the daemon's do, and hiding.py derives each caller's view through the cached
serialization the server sends (Shown). No daemon, no socket, no file.

The callers: the user the field names (`holder`), the host's root, every other user of the case
and a stranger (`other`), a caller that could not be identified, and a scraper of /metrics
(which identifies nobody: every caller of /metrics is one). What each sees of a field: its real
value (NAME), the named user's pseudonym (PSEUDONYM), or nothing (HIDDEN: null, empty or `-`).
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from helpers import FakeClock, lease_manager

from patroller.cli.records import history_table, queue_table, users_table
from patroller.cli.status import format_status
from patroller.config import Config, policy_of
from patroller.core.identity import Identity, Viewer
from patroller.core.jobs import Allocation, Job
from patroller.core.leases import Event
from patroller.core.pods import Pod, PodAllocation
from patroller.http import hiding
from patroller.http.access import Requests
from patroller.http.fleet import Fleet, gpus_of
from patroller.http.hiding import NOBODY, Hiding, Shown, viewer_of
from patroller.http.metrics import DaemonCollector
from patroller.http.statusview import StatusView
from patroller.http.views import DevicesView, job_view, queue_view, users_view
from patroller.observe.idle import IdleWatch
from patroller.observe.signals import ProcessSamples, Signals
from patroller.observe.stats import StatsStore, iso_time
from patroller.observe.tally import Tally
from patroller.state.audit import AuditLog
from patroller.state.pseudonyms import Pseudonyms
from patroller.state.usage.sampler import UsageSampler

NAME, PSEUDONYM, HIDDEN = "name", "pseudonym", "hidden"
WALL = 1_800_000_000.0  # the audit record's and the fleet's clock

ALICE = Identity(
    user="alice@example.org",
    source="container",
    email="alice@example.org",
    account="alice",
    uid=1001,
    container=("0123456789ab", "alice-train"),
    info=(("team", "optics"),),
)
BOB = Identity(user="bob", source="host", account="bob", uid=1002)
CAROL = Identity(user="carol", source="host", account="carol", uid=1003)
DORA = Identity(
    user="dora@example.org",
    source="pod",
    email="dora@example.org",
    uid=1004,
    pod=(("namespace", "vision"), ("name", "trainer-0"), ("container", "dora-main")),
)
ERIN = Identity(
    user="erin", source="slurm", account="erin", uid=1005, job=(("id", "4242"), ("step", "batch"))
)
HENRY = Identity(
    user="henry@example.org",
    source="container",
    email="henry@example.org",
    account="henry",
    uid=1006,
    container=("fedcba987654", "henry-job"),
)
UNKNOWN = Identity(user="unknown", source="unknown")
ROOT = Identity(user="root", source="host", account="root", uid=0)
STRANGER = Identity(user="mallory", source="host", account="mallory", uid=1099)  # named nowhere
USERS = (ALICE, BOB, CAROL, DORA, ERIN, HENRY)
# What names each user, besides their user string: none of it may reach a caller who may not
# see them (test_nothing_names_a_user_to_whom_it_may_not).
SECRETS = {
    ALICE.user: ("alice", "alice-train", "0123456789ab", "optics", 1001),
    BOB.user: ("bob", 1002),
    CAROL.user: ("carol", 1003),
    DORA.user: ("dora", "vision", "trainer-0", "dora-main", "uid:1004", 1004),
    ERIN.user: ("erin", "4242", 1005),
    HENRY.user: ("henry", "henry-job", "fedcba987654", 1006),
}


class Case:
    """The daemon's state with every case in it, the read models' data built from it, and what
    each caller is sent of them."""

    def __init__(self) -> None:
        clock = FakeClock()
        config = Config()
        leases = lease_manager(clock, policy=replace(policy_of(config), limits={"henry": 1}))
        audit = AuditLog(None, config.audit_keep, 60.0, clock=lambda: WALL)
        leases.on_event(audit.record)
        self.uuid = uuid = [d.uuid for d in leases.inventory]
        # GPU 0: alice's, and bob's process on it (a trespass)
        leases.request(ALICE, {"gpu": 1})
        leases.process_started(uuid[0], 100, ALICE, "python")
        leases.process_started(uuid[0], 200, BOB, "stress")
        # GPU 1: a Slurm job from a map of bare ids; erin's process in it names its user
        leases.allocate(uuid[1], Allocation((Job(id="4242"),)))
        leases.process_started(uuid[1], 300, ERIN, "train")
        leases.process_started(uuid[1], 201, BOB, "stress")
        # GPU 2: a Kubernetes pod; dora's process in it names its user
        leases.allocate(
            uuid[2], PodAllocation((Pod("vision", "trainer-0", ("dora-main",)),)), "kubernetes"
        )
        leases.process_started(uuid[2], 400, DORA, "torchrun")
        leases.process_started(uuid[2], 202, BOB, "stress")
        # GPUs 3 and 4: henry's account may hold one; his process takes a second (over the limit)
        leases.request(HENRY, {"gpu": 1})
        leases.process_started(uuid[4], 500, HENRY, "extra")
        # GPU 5: a process nobody can be found for
        leases.process_started(uuid[5], 600, UNKNOWN, None)
        # GPUs 6 and 7 free, set aside for carol once she has waited past the starvation bound
        leases.wait(CAROL, {"gpu": 3}, lambda devices: None)
        clock.advance(config.starvation_bound + 1)
        leases.serve()

        signals = Signals()
        stats = StatsStore(leases.inventory, 15.0, 5.0, 120, clock=clock)
        stats.connect(signals)
        signals.process_sampled.send(
            None,
            record=ProcessSamples(
                {uuid[0]: {pid: {"fb": 100, "sm": 5} for pid in (100, 200)}}, WALL
            ),
        )
        self.pseudonyms = Pseudonyms(None, 1000)
        self.pseudonyms.open()
        self.devices = DevicesView(leases.inventory).data()
        idle = IdleWatch(leases)
        view = StatusView(leases.inventory, leases, stats, idle, 0.1, clock=clock)
        view.body()
        status = view.latest()
        self.data: dict[str, Any] = {
            "/status": status,
            "/users": users_view(leases, idle),
            "/queue": queue_view(leases),
            "/history": audit.since(0.0, 1000),
        }
        self.data["/events"] = {  # views.page_snapshot's, less what names nobody
            "time": iso_time(WALL),
            "mode": "test",
            "status": status,
            "queue": self.data["/queue"],
            "users": self.data["/users"],
            "events": self.data["/history"],
        }
        # The fleet heard this host as its root may: every name (the worst case)
        fleet = Fleet(replace(config, fleet=("gpu1:8080",)), clock=lambda: WALL)
        fleet.hosts[0].answered(gpus_of(orjson.loads(view.body()), self.devices), WALL)
        self.data["/fleet.json"] = fleet.data()
        # a minute of usage, counted as the sampler counts it (no store: nothing is written)
        sampler = UsageSampler(
            leases.inventory,
            leases,
            Tally(leases.inventory, 1.0),
            SimpleNamespace(put=lambda at, samples: None),
            60.0,
            clock=clock,
        )
        sampler.count([sampler.snapshot(device, 60.0) for device in leases.inventory])
        self.services = SimpleNamespace(
            leases=leases,
            inventory=leases.inventory,
            stats=stats,
            idle=idle,
            mode="test",
            monitors=(),
            book=None,
            usage=None,
            sampler=sampler,
            notifier=None,
            health=None,
            identifier=SimpleNamespace(docker_calls=0, proc_reads=0),
            callers=SimpleNamespace(lookups=0, descriptors_read=0),
        )
        self.view = view
        # What each test is sent is made in the test (hiding.py runs in it, not in the module's
        # set-up: a mutation run counts what a test calls), once per test.
        self.shown: dict[str, Shown] = {}
        self.metrics: dict[bool, list[dict[str, Any]]] = {}

    def body(self, endpoint: str, viewer: Viewer) -> Any:
        """What `viewer` is sent: JSON as the server serializes it, the metrics (the same for
        every caller), or a command's output from what the server sends."""
        if endpoint == "/metrics":  # it asks no one who they are: with the flag, one scrape
            hidden = viewer is not EVERY_NAME
            if hidden not in self.metrics:
                self.metrics[hidden] = scraped(
                    DaemonCollector(
                        self.services,
                        Requests(),
                        Hiding(self.pseudonyms, self.view) if hidden else None,
                    )
                )
            return self.metrics[hidden]
        if endpoint in COMMANDS:
            return COMMANDS[endpoint](self, viewer)
        if endpoint not in self.shown:
            self.shown[endpoint] = Shown(self.data[endpoint], RENDERS[endpoint], self.pseudonyms)
        return orjson.loads(self.shown[endpoint].body(viewer))

    def named(self, user: str, body: dict[str, Any]) -> str | None:
        """The key of `body` (a users-like map) that names `user`: the name or its pseudonym."""
        return next((key for key in (user, self.pseudonyms.of(user)) if key in body), None)


RENDERS: dict[str, hiding.Render] = {
    "/status": hiding.status,
    "/users": hiding.users,
    "/queue": hiding.queue,
    "/history": hiding.events,
    "/events": hiding.snapshot,
    "/fleet.json": hiding.fleet,
}
# The real values, as nothing hides them: what the daemon without --hide-users sends everyone.
EVERY_NAME = hiding.EVERYTHING


def scraped(collector: DaemonCollector) -> list[dict[str, Any]]:
    """Every sample of a scrape: its family, labels and value."""
    return [
        {"family": family.name, "value": sample.value, **sample.labels}
        for family in collector.collect()
        for sample in family.samples
    ]


COMMANDS: dict[str, Callable[[Case, Viewer], str]] = {
    "patroller status": lambda case, v: format_status(
        case.body("/status", v),
        case.devices,
        case.body("/queue", v),
        False,
        case.body("/users", v),
    ),
    "patroller history": lambda case, v: history_table(case.body("/history", v)),
    "patroller users": lambda case, v: users_table(case.body("/users", v)),
    "patroller queue": lambda case, v: queue_table(case.body("/queue", v)),
}

# The case, built in the test session (by the fixture below), never at import: a mutation run
# imports the tests once, then runs each mutant's tests in a fork of that process, where a case
# built at import would hold what the code did with no mutant in it.
CASE: Case


@pytest.fixture(scope="module", autouse=True)
def case() -> Case:
    global CASE
    CASE = Case()
    return CASE


@pytest.fixture(autouse=True)
def sent_afresh() -> None:
    """Each test makes what it is sent itself (Case.body)."""
    CASE.shown.clear()
    CASE.metrics.clear()


# -- reading a field out of an answer -----------------------------------------------------------


def dig(value: Any, *path: Any) -> Any:
    for step in path:
        if value is None:
            return None
        value = value[step] if not callable(step) else step(value)
    return value


def claim(gpu: int, *path: Any) -> Callable[[Any], Any]:
    return lambda body: dig(body[CASE.uuid[gpu]]["claim"], *path)


def pid(number: int) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    return lambda processes: next(p for p in processes if p["pid"] == number)


def user_entry(user: Identity, *path: Any) -> Callable[[Any], Any]:
    """A field of the /users entry of `user` (found under their name or their pseudonym)."""

    def get(body: dict[str, Any]) -> Any:
        key = CASE.named(user.user, body)
        return key if not path else dig(body.get(key), *path)

    return get


def user_key(user: Identity) -> Callable[[Any], Any]:
    return user_entry(user)


def event(kind: str, pid: int | None, *path: Any, gpu: int | None = None) -> Callable[[Any], Any]:
    """A field of the event of `kind` about process `pid` (a trespass, a claim), or on GPU
    `gpu` (a grant)."""

    def get(body: list[dict[str, Any]]) -> Any:
        return dig(
            next(
                e
                for e in body
                if e["event"] == kind
                and e.get("pid") == pid
                and gpu in (None, e["devices"][0]["number"])
            ),
            *path,
        )

    return get


def fleet_gpu(gpu: int, *path: Any) -> Callable[[Any], Any]:
    return lambda body: dig(next(g for g in body["hosts"][0]["gpus"] if g["number"] == gpu), *path)


def metric(family: str, label: str, **where: Any) -> Callable[[Any], Any]:
    """A label of the one sample of `family` whose other labels (or value) are `where`."""

    def get(samples: list[dict[str, Any]]) -> Any:
        [sample] = [
            s
            for s in samples
            if s["family"] == family and all(s.get(k) == v for k, v in where.items())
        ]
        return sample[label]

    return get


def cells(line: str) -> list[str]:
    return [cell for cell in line.strip().split("  ") if cell.strip()]


def status_row(gpu: int) -> Callable[[str], Any]:
    """The first name in the USER cell of GPU `gpu`'s row of `patroller status`."""

    def get(text: str) -> Any:
        [row] = [cells(line) for line in text.splitlines()[1:] if line.startswith(f"{gpu} ")]
        return row[3].split(", ")[0].strip()  # its holder first, then the trespasser

    return get


def line_after(prefix: str, until: str) -> Callable[[str], Any]:
    """The text between `prefix` and `until` on the output's line that starts with `prefix`."""

    def get(text: str) -> Any:
        [found] = [
            line[len(prefix) :].split(until)[0]
            for line in text.splitlines()
            if line.startswith(prefix) and until in line
        ]
        return found

    return get


def note(words: str) -> Callable[[str], Any]:
    """The name in the first status note that says `words` (`... set aside for NAME, ...`)."""

    def get(text: str) -> Any:
        return next(
            line.split(words, 1)[1].split(",")[0] for line in text.splitlines() if words in line
        )

    return get


def history_row(kind: str, detail: str, column: int) -> Callable[[str], Any]:
    """A cell of the row of `patroller history` of event `kind` whose DETAIL says `detail`."""

    def get(text: str) -> Any:
        [row] = [
            cells(line) for line in text.splitlines() if f"  {kind}  " in line and detail in line
        ]
        return row[column].strip()

    return get


def users_row(user: Identity, column: int) -> Callable[[str], Any]:
    """A cell of the row of `patroller users` that names `user` (name or pseudonym)."""

    def get(text: str) -> Any:
        names = (user.user, CASE.pseudonyms.of(user.user))
        rows = [cells(line) for line in text.splitlines()[1:]]
        return next((row[column].strip() for row in rows if row[0] in names), None)

    return get


def users_row_held(held: str, column: int) -> Callable[[str], Any]:
    """A cell of the row of `patroller users` of the user who holds `held` GPUs."""

    def get(text: str) -> Any:
        [row] = [cells(line) for line in text.splitlines()[1:] if cells(line)[1] == held]
        return row[column].strip()

    return get


# -- the table ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """What each caller sees of one field. `named`: whose pseudonym PSEUDONYM means, when the
    field is not the name itself (an account, a cell that says more than the name)."""

    endpoint: str
    case: str
    field: str
    subject: Identity  # the user the field names: the `holder` caller
    get: Callable[[Any], Any]
    holder: str
    root: str
    other: str
    unidentified: str
    scraper: str | None = None  # /metrics alone
    named: str | None = None


N, P, H = NAME, PSEUDONYM, HIDDEN
SEEN = (N, N, P, P)  # the holder and root see the name; others and the unidentified a pseudonym
GONE = (N, N, H, H)  # the holder and root see it; others and the unidentified nothing
SCRAPED_P = (P, P, P, P, P)  # /metrics: every caller is a scraper
SCRAPED_H = (H, H, H, H, H)
ALWAYS = (N, N, N, N)  # `unknown` names no one

TABLE: list[Rule] = [
    # /status: a device's claim
    Rule("/status", "holder", "claim.user.user", ALICE, claim(0, "user", "user"), *SEEN),
    Rule("/status", "holder", "claim.user.email", ALICE, claim(0, "user", "email"), *GONE),
    Rule("/status", "holder", "claim.user.account", ALICE, claim(0, "user", "account"), *GONE),
    Rule("/status", "holder", "claim.user.uid", ALICE, claim(0, "user", "uid"), *GONE),
    Rule("/status", "holder", "claim.user.container", ALICE, claim(0, "user", "container"), *GONE),
    Rule("/status", "holder", "claim.user.info", ALICE, claim(0, "user", "info"), *GONE),
    Rule(
        "/status",
        "holder",
        "claim.process_detail[].user",
        ALICE,
        claim(0, "process_detail", pid(100), "user"),
        *SEEN,
    ),
    Rule("/status", "trespasser", "claim.users[].user", BOB, claim(0, "users", 1, "user"), *SEEN),
    Rule(
        "/status",
        "trespasser",
        "claim.users[].account",
        BOB,
        claim(0, "users", 1, "account"),
        *GONE,
    ),
    Rule(
        "/status",
        "trespasser",
        "claim.process_detail[].user",
        BOB,
        claim(0, "process_detail", pid(200), "user"),
        *SEEN,
    ),
    Rule("/status", "bare-id job", "claim.jobs[].id", ERIN, claim(1, "jobs", 0, "id"), *GONE),
    Rule("/status", "bare-id job", "claim.user.user", ERIN, claim(1, "user", "user"), *SEEN),
    Rule("/status", "bare-id job", "claim.user.job", ERIN, claim(1, "user", "job"), *GONE),
    Rule(
        "/status", "pod", "claim.pods[].namespace", DORA, claim(2, "pods", 0, "namespace"), *GONE
    ),
    Rule("/status", "pod", "claim.pods[].name", DORA, claim(2, "pods", 0, "name"), *GONE),
    Rule(
        "/status", "pod", "claim.pods[].containers", DORA, claim(2, "pods", 0, "containers"), *GONE
    ),
    Rule("/status", "pod", "claim.user.user", DORA, claim(2, "user", "user"), *SEEN),
    Rule("/status", "pod", "claim.user.pod", DORA, claim(2, "user", "pod"), *GONE),
    Rule(
        "/status",
        "over-limit account",
        "claim.user.account",
        HENRY,
        claim(4, "user", "account"),
        *GONE,
    ),
    Rule("/status", "waiter", "claim.set_aside_for", CAROL, claim(6, "set_aside_for"), *SEEN),
    Rule("/status", "unknown", "claim.user.user", UNKNOWN, claim(5, "user", "user"), *ALWAYS),
    # /users: one entry per user, under their name
    Rule("/users", "holder", "its key", ALICE, user_key(ALICE), *SEEN),
    Rule(
        "/users",
        "holder",
        "accounts[].account",
        ALICE,
        user_entry(ALICE, "accounts", 0, "account"),
        *SEEN,
    ),
    Rule(
        "/users", "holder", "accounts[].uid", ALICE, user_entry(ALICE, "accounts", 0, "uid"), *GONE
    ),
    Rule("/users", "trespasser", "its key", BOB, user_key(BOB), *SEEN),
    Rule("/users", "bare-id job", "its key", ERIN, user_key(ERIN), *SEEN),
    Rule("/users", "bare-id job", "jobs", ERIN, user_entry(ERIN, "jobs"), *GONE),
    Rule("/users", "pod", "pods", DORA, user_entry(DORA, "pods"), *GONE),
    Rule(
        "/users",
        "over-limit account",
        "accounts[].account",
        HENRY,
        user_entry(HENRY, "accounts", 0, "account"),
        *SEEN,
    ),
    Rule(
        "/users",
        "over-limit account",
        "accounts[].uid",
        HENRY,
        user_entry(HENRY, "accounts", 0, "uid"),
        *GONE,
    ),
    Rule("/users", "waiter", "its key", CAROL, user_key(CAROL), *SEEN),
    Rule("/users", "unknown", "its key", UNKNOWN, user_key(UNKNOWN), *ALWAYS),
    # /queue
    Rule("/queue", "waiter", "[].user", CAROL, lambda body: body[0]["user"], *SEEN),
    # /history: the audit record's events
    Rule("/history", "holder", "grant: user", ALICE, event("grant", None, "user", gpu=0), *SEEN),
    Rule(
        "/history",
        "trespasser",
        "trespass on a held GPU: user",
        BOB,
        event("trespass", 200, "user"),
        *SEEN,
    ),
    Rule(
        "/history",
        "holder",
        "trespass on her GPU: holder",
        ALICE,
        event("trespass", 200, "holder"),
        *SEEN,
    ),
    Rule(
        "/history",
        "bare-id job",
        "trespass on its GPU: holder",
        ERIN,
        event("trespass", 201, "holder"),
        *SEEN,
    ),
    Rule(
        "/history",
        "bare-id job",
        "trespass on its GPU: jobs",
        ERIN,
        event("trespass", 201, "jobs"),
        *GONE,
    ),
    Rule(
        "/history", "pod", "trespass on its GPU: pods", DORA, event("trespass", 202, "pods"), *GONE
    ),
    Rule(
        "/history",
        "over-limit account",
        "trespass beyond a limit: user",
        HENRY,
        event("trespass", 500, "user"),
        *SEEN,
    ),
    Rule(
        "/history",
        "over-limit account",
        "trespass beyond a limit: account",
        HENRY,
        event("trespass", 500, "account"),
        *SEEN,
    ),
    Rule("/history", "unknown", "claim: user", UNKNOWN, event("claim", 600, "user"), *ALWAYS),
    # /fleet.json: this host as the fleet heard it (with every name)
    Rule("/fleet.json", "holder", "gpus[].user.user", ALICE, fleet_gpu(0, "user", "user"), *SEEN),
    Rule(
        "/fleet.json", "holder", "gpus[].user.email", ALICE, fleet_gpu(0, "user", "email"), *GONE
    ),
    Rule(
        "/fleet.json",
        "holder",
        "gpus[].user.container",
        ALICE,
        fleet_gpu(0, "user", "container"),
        *GONE,
    ),
    Rule(
        "/fleet.json",
        "trespasser",
        "gpus[].users[].user",
        BOB,
        fleet_gpu(0, "users", 1, "user"),
        *SEEN,
    ),
    Rule(
        "/fleet.json", "bare-id job", "gpus[].user.job", ERIN, fleet_gpu(1, "user", "job"), *GONE
    ),
    Rule("/fleet.json", "pod", "gpus[].user.pod", DORA, fleet_gpu(2, "user", "pod"), *GONE),
    Rule(
        "/fleet.json",
        "unknown",
        "gpus[].user.user",
        UNKNOWN,
        fleet_gpu(5, "user", "user"),
        *ALWAYS,
    ),
    # /metrics: nobody in particular scrapes
    Rule(
        "/metrics",
        "holder",
        "patroller_gpu_holder_info user",
        ALICE,
        metric("patroller_gpu_holder", "user", gpu="0"),
        *SCRAPED_P,
    ),
    Rule(
        "/metrics",
        "holder",
        "patroller_gpu_holder_info container",
        ALICE,
        metric("patroller_gpu_holder", "container", gpu="0"),
        *SCRAPED_H,
    ),
    Rule(
        "/metrics",
        "trespasser",
        "patroller_process_gpu_memory_bytes user",
        BOB,
        metric("patroller_process_gpu_memory_bytes", "user", pid="200"),
        *SCRAPED_P,
    ),
    Rule(
        "/metrics",
        "trespasser",
        "patroller_user_gpus_trespassing user",
        BOB,
        metric("patroller_user_gpus_trespassing", "user", value=3),
        *SCRAPED_P,
    ),
    Rule(
        "/metrics",
        "trespasser",
        "patroller_usage_gpu_seconds_total user",
        BOB,
        metric("patroller_usage_gpu_seconds", "user", category="trespass"),
        *SCRAPED_P,
    ),
    Rule(
        "/metrics",
        "over-limit account",
        "patroller_usage_gpu_seconds_total user",
        HENRY,
        metric("patroller_usage_gpu_seconds", "user", category="reserved_unused"),
        *SCRAPED_P,
    ),
    Rule(
        "/metrics",
        "bare-id job",
        "patroller_gpu_holder_info job",
        ERIN,
        metric("patroller_gpu_holder", "job", gpu="1"),
        *SCRAPED_H,
    ),
    Rule(
        "/metrics",
        "pod",
        "patroller_gpu_holder_info pod",
        DORA,
        metric("patroller_gpu_holder", "pod", gpu="2"),
        *SCRAPED_H,
    ),
    Rule(
        "/metrics",
        "over-limit account",
        "patroller_user_gpus_over_limit user",
        HENRY,
        metric("patroller_user_gpus_over_limit", "user", value=1),
        *SCRAPED_P,
    ),
    Rule(
        "/metrics",
        "waiter",
        "patroller_user_requests_waiting user",
        CAROL,
        metric("patroller_user_requests_waiting", "user", value=1),
        *SCRAPED_P,
    ),
    Rule(
        "/metrics",
        "unknown",
        "patroller_gpu_holder_info user",
        UNKNOWN,
        metric("patroller_gpu_holder", "user", gpu="5"),
        N,
        N,
        N,
        N,
        N,
    ),
    # the command line prints what the server sends, and nothing else
    Rule(
        "patroller status",
        "bare-id job",
        "USER of its GPU",
        ERIN,
        status_row(1),
        *SEEN,
        named=ERIN.user,
    ),
    Rule(
        "patroller status", "pod", "USER of its GPU", DORA, status_row(2), *SEEN, named=DORA.user
    ),
    Rule("patroller status", "waiter", "set aside for ...", CAROL, note("set aside for "), *SEEN),
    Rule(
        "patroller status",
        "waiter",
        "waiting 1: ...",
        CAROL,
        line_after("waiting 1: ", " wants"),
        *SEEN,
    ),
    Rule(
        "patroller status",
        "over-limit account",
        "user ...: ... beyond the limit",
        HENRY,
        line_after("user ", ": 2 held"),
        *SEEN,
    ),
    Rule(
        "patroller history",
        "trespasser",
        "USER of a trespass",
        BOB,
        history_row("trespass", "pid=200 ", 2),
        *SEEN,
    ),
    Rule(
        "patroller history",
        "over-limit account",
        "USER of a trespass beyond a limit",
        HENRY,
        history_row("trespass", "why=over_limit", 2),
        *SEEN,
    ),
    Rule("patroller users", "bare-id job", "JOBS/PODS", ERIN, users_row(ERIN, 8), *GONE),
    Rule("patroller users", "over-limit account", "USER", HENRY, users_row_held("2", 0), *SEEN),
    Rule(
        "patroller queue",
        "waiter",
        "USER",
        CAROL,
        lambda text: cells(text.splitlines()[1])[1],
        *SEEN,
    ),
]
# The live feed (/events) carries /status, /users, /queue and /history as they are alone.
FEED = {"/status": "status", "/users": "users", "/queue": "queue", "/history": "events"}
TABLE += [
    replace(
        rule,
        endpoint="/events",
        field=f"{FEED[rule.endpoint]}: {rule.field}",
        get=lambda body, rule=rule: rule.get(body[FEED[rule.endpoint]]),
    )
    for rule in TABLE
    if rule.endpoint in FEED
]

CALLERS = ("holder", "root", "other", "unidentified", "scraper")


def viewers(rule: Rule, caller: str) -> list[Viewer]:
    """The viewers a kind of caller is, for this rule: `other` is every user but the one the
    field names, and a stranger."""
    if caller == "holder":
        return [viewer_of(rule.subject)]
    if caller == "root":
        return [viewer_of(ROOT)]
    if caller == "other":
        return [viewer_of(u) for u in USERS + (STRANGER,) if u.user != rule.subject.user]
    return [viewer_of(None)]  # unidentified; a scraper is nobody either


def blank(value: Any) -> bool:
    return value in (None, "", "-", [], {})


@pytest.mark.parametrize(
    "rule, caller",
    [
        pytest.param(rule, caller, id=f"{rule.endpoint} {rule.case}: {rule.field}, {caller}")
        for rule in TABLE
        for caller in CALLERS
        if getattr(rule, caller) is not None
    ],
)
def test_what_each_caller_sees_of_each_field(rule: Rule, caller: str) -> None:
    expected = getattr(rule, caller)
    real = rule.get(CASE.body(rule.endpoint, EVERY_NAME))
    assert not blank(real), "the case must fill the field for the rule to mean anything"
    for viewer in viewers(rule, caller):
        seen = rule.get(CASE.body(rule.endpoint, viewer))
        if expected == NAME:
            assert seen == real, viewer
        elif expected == PSEUDONYM:
            assert seen == CASE.pseudonyms.of(rule.named or real), viewer
        else:
            assert blank(seen), viewer


def leaves(value: Any) -> list[Any]:
    """Every key and scalar of a JSON value."""
    if isinstance(value, dict):
        return [*value.keys(), *(leaf for v in value.values() for leaf in leaves(v))]
    if isinstance(value, list):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def leaks(found: list[Any], secrets: tuple) -> list[Any]:
    """The secrets among `found`: a string one as a word of a string ("erin" is not in
    "answering"), a number one as a number."""
    words = [
        re.compile(rf"(?<![A-Za-z0-9]){re.escape(s)}(?![A-Za-z0-9])")
        for s in secrets
        if isinstance(s, str)
    ]
    return [
        leaf
        for leaf in found
        if (isinstance(leaf, str) and any(word.search(leaf) for word in words))
        or (isinstance(leaf, int) and not isinstance(leaf, bool) and leaf in secrets)
    ]


@pytest.mark.parametrize("asker", [*USERS, STRANGER, None], ids=lambda u: u and u.user)
def test_nothing_names_a_user_to_whom_it_may_not(asker: Identity | None) -> None:
    """The other side of the table: nothing anywhere in what this caller is sent (every JSON
    field, every metric label, every line a command prints) says anything that names a user
    they may not see, whatever the field is called: one added later included."""
    viewer = viewer_of(asker)
    sent = [
        *(CASE.body(endpoint, viewer) for endpoint in RENDERS),
        *(CASE.body(command, viewer) for command in COMMANDS),
    ]
    labels = [
        value
        for sample in CASE.body("/metrics", viewer)
        for key, value in sample.items()
        if key not in ("family", "value")
    ]
    for user, secrets in SECRETS.items():
        if asker is not None and user == asker.user:
            continue
        assert leaks(leaves(sent) + labels, (user,) + secrets) == [], user


def test_a_job_that_names_its_user_is_theirs_whoever_holds_the_gpu() -> None:
    """A GPU may run several users' jobs (a shared GPU): a job the map names a user for is that
    user's, whoever holds the GPU; one it names no user for (a bare id) is the holder's."""
    franks = job_view(Job(id="77", uid=1010, user="frank", account="lab", partition="a100"))
    bare = job_view(Job(id="78"))

    def seen(job: dict[str, Any], viewer: Viewer) -> dict[str, Any]:
        return hiding.job_seen(job, ERIN.user, hiding.Redaction(viewer, CASE.pseudonyms))

    assert seen(franks, Viewer("frank")) == franks
    assert seen(franks, hiding.EVERYTHING) == franks
    assert seen(franks, Viewer(ERIN.user)) == {
        **franks,
        "id": None,
        "uid": None,
        "account": None,
        "user": CASE.pseudonyms.of("frank"),
    }
    assert seen(bare, Viewer(ERIN.user)) == bare
    assert seen(bare, Viewer("frank")) == {**bare, "id": None}


FRANK = Identity(
    user="frank", source="slurm", account="frank", uid=1010, job=(("id", "5151"), ("step", "0"))
)
GRACE = Identity(
    user="grace@example.org",
    source="pod",
    email="grace@example.org",
    uid=1011,
    pod=(("namespace", "audio"), ("name", "whisper-0"), ("container", "main")),
)


def test_a_trespassers_own_job_or_pod_and_a_deallocations_jobs_are_named_to_their_own() -> None:
    """/history: a trespasser's own Slurm job or pod (on another job's or pod's GPU) is theirs,
    shown to them alone (and root); the jobs a device was allocated to, when it is no more,
    are the user's whose they were."""
    clock = FakeClock()
    leases = lease_manager(clock)
    audit = AuditLog(None, Config().audit_keep, 60.0, clock=lambda: WALL)
    leases.on_event(audit.record)
    uuid = [d.uuid for d in leases.inventory]
    leases.allocate(uuid[1], Allocation((Job(id="4242"),)))
    leases.process_started(uuid[1], 300, ERIN, "train")
    leases.process_started(uuid[1], 700, FRANK, "stray")  # frank's own job, on erin's GPU
    leases.allocate(
        uuid[2], PodAllocation((Pod("vision", "trainer-0", ("dora-main",)),)), "kubernetes"
    )
    leases.process_started(uuid[2], 400, DORA, "torchrun")
    leases.process_started(uuid[2], 701, GRACE, "stray")  # grace's own pod, on dora's GPU
    leases.allocate(uuid[1], None)  # erin's job ends
    history = audit.since(0.0, 1000)

    def seen(viewer: Viewer) -> dict[str, dict[str, Any]]:
        shown = hiding.events(history, hiding.Redaction(viewer, CASE.pseudonyms))
        return {
            "frank": next(e for e in shown if e["event"] == "trespass" and e["pid"] == 700),
            "grace": next(e for e in shown if e["event"] == "trespass" and e["pid"] == 701),
            "ended": next(e for e in shown if e["event"] == "deallocated"),
        }

    mine = seen(Viewer("frank"))
    assert (mine["frank"]["job"], seen(Viewer("grace@example.org"))["grace"]["pod"]) == (
        "5151",
        "audio/whisper-0",
    )
    for viewer in (Viewer(ERIN.user), Viewer(DORA.user), NOBODY):
        assert seen(viewer)["frank"]["job"] is None and seen(viewer)["grace"]["pod"] is None
    assert seen(Viewer(ERIN.user))["ended"]["jobs"] == ["4242"]
    for viewer in (Viewer("frank"), NOBODY):
        assert seen(viewer)["ended"]["jobs"] is None
    root = seen(EVERY_NAME)
    assert (root["frank"]["job"], root["grace"]["pod"], root["ended"]["jobs"]) == (
        "5151",
        "audio/whisper-0",
        ["4242"],
    )


def test_the_fast_lane_leaves_a_caller_it_does_not_know_to_the_handler() -> None:
    assert Hiding(CASE.pseudonyms, CASE.view).lane_status(None) is None


def test_a_hidden_identity_keeps_its_pseudonym_its_source_and_whether_it_is_degraded() -> None:
    redaction = hiding.Redaction(NOBODY, CASE.pseudonyms)
    data = {**ALICE.to_json(), "degraded": True}
    assert redaction.identity(data) == {
        **{key: None for key in data},
        "user": CASE.pseudonyms.of(ALICE.user),
        "source": "container",
        "info": {},
        "degraded": True,
    }
    # a host of the fleet that says nothing of degraded identities (an older Patroller)
    assert redaction.identity({"user": "bob", "source": "host"}) == {
        "user": CASE.pseudonyms.of("bob"),
        "source": "host",
        "info": {},
        "degraded": False,
    }


def test_status_is_serialized_once_per_build_and_way_of_seeing_it() -> None:
    clock = FakeClock()
    leases = lease_manager(clock)
    stats = StatsStore(leases.inventory, 15.0, 5.0, 120, clock=clock)
    view = StatusView(leases.inventory, leases, stats, IdleWatch(leases), 0.1, clock=clock)
    shown = Hiding(CASE.pseudonyms, view)
    bob, alice = viewer_of(BOB), viewer_of(ALICE)
    before = shown.status_body(bob)
    assert shown.status_body(bob) is before
    [granted] = leases.request(ALICE, {"gpu": 1})  # shown by the next body, as in the daemon
    seen = orjson.loads(shown.status_body(bob))
    assert seen[granted.uuid]["claim"]["user"]["user"] == CASE.pseudonyms.of(ALICE.user)
    own = shown.status_body(alice)
    assert orjson.loads(own)[granted.uuid]["claim"]["user"]["user"] == ALICE.user
    assert shown.status_body(alice) is own and shown.status_body(hiding.EVERYTHING) is view.body()
    body = view.body()
    assert (
        Shown(view.latest(), hiding.status, CASE.pseudonyms, body).body(hiding.EVERYTHING) is body
    )


def test_the_metrics_label_a_container_by_its_name_else_its_id_and_nobody_with_blanks() -> None:
    labels = hiding.metric_labels
    assert (
        labels(None, None)
        == labels(None, CASE.pseudonyms.of)
        == {"user": "", "container": "", "job": "", "pod": ""}
    )
    assert labels(ALICE, None)["container"] == "alice-train"
    assert (
        labels(replace(ALICE, container=("0123456789ab", "")), None)["container"] == "0123456789ab"
    )
    assert labels(BOB, None) == {"user": "bob", "container": "", "job": "", "pod": ""}


def test_a_preemptions_jobs_are_shown_to_root_alone_not_to_the_user_it_preempted() -> None:
    """/history: a `preempted` event names the user whose hold a scheduler ended, and the jobs
    (pods) it allocated the device to; whose those are, the event does not say, so no one but
    root sees them, not even the user it preempted."""
    clock = FakeClock()
    leases = lease_manager(clock)
    audit = AuditLog(None, Config().audit_keep, 60.0, clock=lambda: WALL)
    leases.on_event(audit.record)
    [granted] = leases.request(FRANK, {"gpu": 1})
    leases.allocate(granted.uuid, Allocation((Job(id="4343"),)))
    history = audit.since(0.0, 1000)

    def preempted(viewer: Viewer) -> dict[str, Any]:
        shown = hiding.events(history, hiding.Redaction(viewer, CASE.pseudonyms))
        return next(e for e in shown if e["event"] == "preempted")

    assert preempted(EVERY_NAME)["jobs"] == ["4343"]
    assert preempted(EVERY_NAME)["user"] == "frank"
    for viewer in (Viewer("frank"), Viewer(ERIN.user), NOBODY):
        assert preempted(viewer)["jobs"] is None, viewer
    assert preempted(Viewer("frank"))["user"] == "frank"


def test_a_notifications_recipient_is_a_name_hidden_as_every_name() -> None:
    """/history: a notice's line names the user it was told to (its `recipient`): another
    caller reads her pseudonym, she and root her name; the admin is "admin" to root."""
    audit = AuditLog(None, Config().audit_keep, 60.0, clock=lambda: WALL)
    audit.record(
        Event(
            "notify",
            "carol",
            (("GPU-1", 1),),
            {
                "kind": "trespass",
                "recipient": "alice@example.org",
                "destination": 1,
                "result": "sent",
                "tries": 1,
            },
        )
    )
    [line] = audit.since(0.0, 10)

    def recipient(viewer: Viewer) -> Any:
        return hiding.events([line], hiding.Redaction(viewer, CASE.pseudonyms))[0]["recipient"]

    assert recipient(Viewer("alice@example.org")) == "alice@example.org"
    assert recipient(hiding.EVERYTHING) == "alice@example.org"
    assert (
        recipient(Viewer("bob")) == CASE.pseudonyms.of("alice@example.org") != "alice@example.org"
    )
