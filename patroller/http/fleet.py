"""The fleet view (--fleet): every listed host's GPUs as its own daemon says, asked by this
daemon, for /fleet.json and the /fleet page.

Each host has a loop of its own on the event loop, first run at its own moment of
--fleet-interval (host i of n at i/n of it: 1,000 hosts are a steady trickle of askings, not a
burst every round), each moment put off to the end of its Config.fleet_slot (50 ms: the dozen
hosts due in it are asked in one turn of the loop and their answers read in a few; at 1,000
hosts that nearly halved the loop's CPU for an asking, which had a turn or more of its own). Each
asking: ask its /status on the connection kept open to it (fleetlink.Link), and its /devices
only when the /status answer's X-Devices-ETag names another inventory than the one kept
(a daemon that sends none, an older one, is asked both every round); keep the GPUs it answered,
or why it did not answer (refused, not answering, failed) and since when; wait for its next
moment; ask again. --fleet-connect-timeout bounds the connecting, --fleet-timeout the answers
of one asking. A host that never answers costs its own loop one timeout a round and never holds
up another host's. /fleet.json is built from each host's part, serialized once when the host
was asked, at most once every Config.fleet_build_every, only after a change and only when
someone asks for it (while nobody looks, nothing is built or packed): a request copies bytes,
and never waits for a host.

A host may answer anything, so what it sends is bounded before it is believed: no more than
--fleet-max-bytes of an answer's body is read (Tornado's HTTP/1 reader stops there), and the two
answers are decoded and checked against Patroller's own schema (answers.check: the fields the
views read, their types, at most Config.fleet_max_gpus GPUs) in a thread of their own, off the
event loop, one host at a time as the askings trickle in: a host's 1 MiB of 350,000 empty
identities takes 230 ms to check. Answers the same as last time are not read again. A host that
fails is "failed", its error "bad answer: " and why; the others are not touched.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
from tornado.iostream import StreamClosedError
from tornado.tcpclient import TCPClient

from patroller import __version__, answers, hosts
from patroller.config import Config
from patroller.http.encoding import dumps
from patroller.http.fleetbody import Packed, Packer
from patroller.http.fleetlink import Cut, Link, Reply, Silent
from patroller.http.hiding import FLEET_AGENT
from patroller.observe.stats import iso_time

log = logging.getLogger(__name__)

# What a host is, as last heard: it answered; not asked yet (this daemon just started); it
# refused the connection (no daemon on that port); it did not answer in time; anything else
# (a name that does not resolve, a connection reset, an answer that is not Patroller's).
UP, ASKING, REFUSED, SILENT, FAILED = "up", "asking", "refused", "not answering", "failed"
PATHS = ("/status", "/devices")
DEVICES_TAG = "X-Devices-ETag"  # on a /status answer: the ETag its host's /devices has now


class NotPatroller(Exception):
    """A host answered, but not as a Patroller daemon does: not HTTP 200, or not JSON."""


@dataclass
class Host:
    """One host of the fleet as this daemon last heard it."""

    host: str  # as the configuration names it
    url: str  # where its API is: http://host:port
    since: float  # wall time it began to answer, or stopped: its state's start
    state: str = ASKING
    error: str | None = None  # why it is not up
    last_seen: float | None = None  # wall time of its last answer; None: not since we started
    checked: float | None = None  # wall time its last asking ended
    gpus: list[dict[str, Any]] = field(default_factory=list)  # while up
    # How it is asked: its connection, the /devices body kept and its ETag, the bodies last
    # read (the same again is not read again), and its part of /fleet.json, serialized.
    link: Link | None = field(default=None, repr=False)
    devices: bytes | None = field(default=None, repr=False)
    tag: str | None = field(default=None, repr=False)
    read: tuple[bytes, bytes] | None = field(default=None, repr=False)
    shown: bytes | None = field(default=None, repr=False)  # None: to serialize again

    def answered(self, gpus: list[dict[str, Any]], now: float) -> None:
        if self.state != UP:
            self.since = now
        self.state, self.error, self.gpus, self.shown = UP, None, gpus, None
        self.last_seen = self.checked = now

    def failed(self, state: str, error: str, asked: float, now: float) -> None:
        """It did not answer the asking that began at `asked`: down since then, at the latest
        (a host down one way, then another, stays down since the first)."""
        if self.state in (UP, ASKING):
            self.since = asked
        self.state, self.error, self.gpus, self.shown = state, error, [], None
        self.checked = now

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "url": self.url,
            "state": self.state,
            "error": self.error,
            "since": iso_time(self.since),
            "last_seen": iso_time(self.last_seen) if self.last_seen is not None else None,
            "checked": iso_time(self.checked) if self.checked is not None else None,
            "free": sum(1 for gpu in self.gpus if gpu["free"]) if self.state == UP else None,
            "gpus": self.gpus,
        }


def read(bodies: Sequence[bytes], max_gpus: int) -> list[dict[str, Any]]:
    """One host's GPUs from the bodies of its /status and /devices. NotPatroller if they are
    not JSON; answers.BadAnswer if they are not as Patroller's schema says."""
    decoded = []
    for path, body in zip(PATHS, bodies, strict=True):
        try:
            decoded.append(orjson.loads(body))
        except orjson.JSONDecodeError:
            raise NotPatroller(f"{path} did not answer JSON") from None
    status, devices = decoded
    answers.check(status, devices, max_gpus)
    return gpus_of(status, devices)


def gpus_of(status: dict[str, Any], devices: dict[str, Any]) -> list[dict[str, Any]]:
    """One host's GPUs from its /status and /devices as answers.check passed them, in device
    order (a lost one last)."""
    found = []
    for uuid, info in devices.items():
        entry = status.get(uuid) or {}
        claim = entry.get("claim") or {}
        found.append(
            {
                "uuid": uuid,
                "number": info.get("number"),
                "group": info.get("group", "gpu"),
                "name": info.get("name"),
                "state": "lost" if info.get("lost") else claim.get("state", "free"),
                "user": claim.get("user"),  # the holder's identity, as /status shows it
                "users": claim.get("users") or [],  # everyone whose processes run there
                "withheld": bool(claim.get("withheld")),
                "idle_for": claim.get("idle_for"),
                "free": answers.free(info, entry),  # the rule `patroller status --free` counts by
                "sm": entry.get("sm"),
                "fb": entry.get("fb"),
                "fb_total": entry.get("fb_total") or info.get("total_mem"),
                "stale": bool(entry.get("stale")),
            }
        )
    return sorted(
        found,
        key=lambda gpu: (
            gpu["state"] == "lost",
            gpu["group"],
            gpu["number"] if gpu["number"] is not None else -1,
        ),
    )


def cut(path: str, head: list[str], limit: int) -> str | None:
    """Why the answer to `path` whose head's lines are `head` ended in a closed connection,
    when that was the client's limit (it closes at the limit without saying so); None when the
    head was not all there, or said a length within the limit: then it broke off."""
    if not head or head[-1] != "\r\n":
        return None
    fields = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip().lower()
    if "content-length" in fields:
        length = fields["content-length"]
        if not (length.isascii() and length.isdigit()):
            return f"{path} has a Content-Length that is not a number"
        return f"{path} is {int(length)} bytes, more than {limit}" if int(length) > limit else None
    if "chunked" in fields.get("transfer-encoding", ""):
        return f"{path} broke off, or is more than {limit} bytes"
    return f"{path} is more than {limit} bytes"  # no length: it ends when the host closes


class Fleet:
    """Asks every host of `config.fleet`, each in a loop of its own, and keeps their answers."""

    def __init__(
        self,
        config: Config,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.monotonic = monotonic
        self.interval = config.fleet_interval
        self.timeout = config.fleet_timeout
        self.connect_timeout = config.fleet_connect_timeout
        self.max_bytes = config.fleet_max_bytes
        self.max_gpus = config.fleet_max_gpus
        self.build_every = config.fleet_build_every
        self.slot = config.fleet_slot
        self.packer = Packer(config.fleet_gzip_level)  # the body gzipped, and its ETags
        started = clock()
        self.hosts = [Host(host, hosts.base_url(host), started) for host in config.fleet]
        self.tcp: TCPClient | None = None
        self.reader: ThreadPoolExecutor | None = None  # decodes and checks the answers
        self.tasks: set[asyncio.Task[None]] = set()
        self.asked: dict[str, int] = {path: 0 for path in PATHS}  # answers taken, by path
        self.builds = 0  # /fleet.json bodies built
        self.reads = 0  # answers decoded and checked (those the same as the last are not)
        self._body: bytes | None = None
        self._data: dict[str, Any] | None = None  # the body as data, once asked for
        self._built = 0.0
        self._changed = True  # a host changed since the body was built

    def start(self) -> None:
        """Start asking every host, on the current loop, each at its own moment of the
        interval: host i of n first at i/n of it, so that the askings are spread evenly."""
        self.tcp = TCPClient()
        self.reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet")
        agent = f"patroller/{__version__} {FLEET_AGENT}"  # a host hides its users from it
        for host in self.hosts:
            host.link = Link(
                host.url, self.tcp, self.connect_timeout, self.timeout, self.max_bytes, agent
            )
        count = len(self.hosts)
        self.tasks = {
            asyncio.ensure_future(self._watch(host, n * self.interval / count))
            for n, host in enumerate(self.hosts)
        }

    async def stop(self, grace: float) -> None:
        """Stop asking: every loop is cancelled, a request in flight with it."""
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=grace)
        self.tasks = set()
        for host in self.hosts:
            if host.link is not None:
                host.link.close()
                host.link = None
        if self.tcp is not None:
            self.tcp.close()
            self.tcp = None
        if self.reader is not None:  # a check under way ends by itself, within its bound
            self.reader.shutdown(wait=False, cancel_futures=True)
            self.reader = None

    async def _watch(self, host: Host, delay: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        slot = self.slot
        while True:
            # at the end of the slot it falls in: the hosts of one slot wake together
            wake = math.ceil(due / slot) * slot if slot > 0 else due
            await asyncio.sleep(max(0.0, wake - loop.time()))
            try:
                await self.ask(host)
            except Exception:  # a bug of ours: said, and the host asked again next round
                log.exception("asking %s failed", host.host)
            due += self.interval
            late = loop.time() - due
            if late > 0:  # it took longer than the interval: the next moment of its own
                due += math.ceil(late / self.interval) * self.interval

    async def ask(self, host: Host) -> None:
        """Ask one host once, and keep what it answered or why it did not. /devices is asked
        only when the host's /status names another version of it than the one kept (or none:
        an older daemon), and the answers are read again only when they changed."""
        assert self.reader is not None
        asked = self.clock()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        error: BaseException | None = None
        try:
            status = await self._get(host, "/status", deadline)
            tag = status.headers.get(DEVICES_TAG)
            if host.devices is None or tag is None or tag != host.tag:
                devices = await self._get(host, "/devices", deadline)
                host.devices, host.tag = devices.body, devices.headers.get("ETag")
            bodies = (status.body, host.devices)
            if host.state != UP or bodies != host.read:
                self.reads += 1
                host.gpus = await loop.run_in_executor(self.reader, read, bodies, self.max_gpus)
                host.read = bodies
        except Exception as exc:
            error = exc
        now = self.clock()
        if error is not None:
            state, why = self.trouble(error)
            if host.state != state or host.error != why:
                log.info("fleet: %s %s: %s", host.host, state, why)
            host.failed(state, why, asked, now)
            host.devices = host.tag = host.read = None  # all asked again, next time
        else:
            if host.state != UP:
                log.info("fleet: %s answers: %d GPUs", host.host, len(host.gpus))
            host.answered(host.gpus, now)
        host.shown = dumps(host.to_json())  # here, as the askings trickle in: not all at once
        self._changed = True

    async def _get(self, host: Host, path: str, deadline: float) -> Reply:
        """A host's answer to `path`, of at most --fleet-max-bytes, before `deadline`."""
        assert host.link is not None
        try:
            reply = await host.link.get(path, deadline)
        except Cut as exc:
            why = cut(path, exc.head, self.max_bytes)
            if why is not None:
                raise answers.BadAnswer(why + " (--fleet-max-bytes)") from None
            raise
        if reply.code != 200:
            raise NotPatroller(f"{path} answered HTTP {reply.code}")
        self.asked[path] += 1
        return reply

    def trouble(self, error: BaseException) -> tuple[str, str]:
        """(state, why) for what asking a host raised."""
        if isinstance(error, Silent):
            return SILENT, str(error)
        if isinstance(error, ConnectionRefusedError):
            return REFUSED, "connection refused"
        if isinstance(error, answers.BadAnswer):
            return FAILED, f"bad answer: {error}"
        if isinstance(error, NotPatroller):
            return FAILED, f"bad answer: {error}: is it a Patroller daemon?"
        if isinstance(error, (Cut, StreamClosedError)):
            return FAILED, "the connection closed before the answer ended"
        if isinstance(error, OSError):
            return FAILED, error.strerror or str(error) or type(error).__name__
        return FAILED, str(error) or type(error).__name__

    def body(self) -> bytes:
        """/fleet.json: every host as last heard, in the order given, and the totals. Built
        from each host's own part (serialized once, when the host was last asked), at most
        once every Config.fleet_build_every, and only when a host changed: a request never
        costs more than the copy of the bytes."""
        now = self.monotonic()
        if self._body is None or (self._changed and now - self._built >= self.build_every):
            self._body, self._data, self._built, self._changed = self._build(), None, now, False
            self.builds += 1
        return self._body

    async def packed(self) -> Packed:
        """The newest body packed (fleetbody.Packer): what an answer to /fleet.json copies."""
        return await self.packer.of(self.body())

    def data(self) -> dict[str, Any]:
        """The body as data (never to be changed: it is shared until the next build)."""
        body = self.body()
        if self._data is None:
            self._data = orjson.loads(body)
        return self._data

    def _build(self) -> bytes:
        states: dict[str, int] = {}
        answering = free = 0
        for host in self.hosts:
            if host.state == UP:
                answering += 1
                free += sum(1 for gpu in host.gpus if gpu["free"])
            for gpu in host.gpus:
                states[gpu["state"]] = states.get(gpu["state"], 0) + 1
        head = {
            "time": iso_time(self.clock()),
            "interval": self.interval,
            "timeout": self.timeout,
            "totals": {
                "hosts": len(self.hosts),
                "answering": answering,
                "gpus": sum(states.values()),
                "free": free,
                "states": dict(sorted(states.items())),
            },
        }
        for host in self.hosts:
            if host.shown is None:
                host.shown = dumps(host.to_json())
        return (
            dumps(head)[:-1]
            + b',"hosts":['
            + b",".join(host.shown or b"" for host in self.hosts)
            + b"]}"
        )
