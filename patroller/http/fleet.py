"""The fleet view (--fleet): every listed host's GPUs as its own daemon says, asked by this
daemon, for /fleet.json and the /fleet page.

Each host has a loop of its own on the event loop: ask its /status and /devices at once with
Tornado's AsyncHTTPClient, each request bounded by --fleet-timeout; keep the GPUs it answered,
or why it did not answer (refused, not answering, failed) and since when; wait out the rest of
--fleet-interval; ask again. A host that never answers costs its own loop one timeout a round
and never holds up another host's; one that comes back is shown again after its next round.
The client has a connection for every request that can be in flight (two a host), so no
request waits in its queue behind a silent host's. /fleet.json serializes what the loops kept:
it never waits for a host.

A host may answer anything, so what it sends is bounded before it is believed: the client reads
no more than --fleet-max-bytes of an answer (Tornado's max_body_size stops the reading there),
and the two answers are decoded and checked against Patroller's own schema (answers.check: the
fields the views read, their types, at most Config.fleet_max_gpus GPUs) in a thread of their own,
off the event loop: a host's 1 MiB of 350,000 empty identities takes 230 ms to check. A host
that fails is "failed", its error "bad answer: " and why; the others are not touched.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import orjson
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse
from tornado.simple_httpclient import HTTPStreamClosedError, HTTPTimeoutError

from patroller import __version__, answers, durations, hosts
from patroller.config import Config
from patroller.observe.stats import iso_time

log = logging.getLogger(__name__)

# What a host is, as last heard: it answered; not asked yet (this daemon just started); it
# refused the connection (no daemon on that port); it did not answer in time; anything else
# (a name that does not resolve, a connection reset, an answer that is not Patroller's).
UP, ASKING, REFUSED, SILENT, FAILED = "up", "asking", "refused", "not answering", "failed"
PATHS = ("/status", "/devices")


class NotPatroller(Exception):
    """A host answered, but not as a Patroller daemon does: not HTTP 200, or not JSON."""


@dataclass
class Host:
    """One host of the fleet as this daemon last heard it."""

    host: str  # as the configuration names it
    url: str  # where its API is: http://host:port
    since: float  # wall time it began to answer, or stopped: its state's start
    state: str = ASKING
    error: Optional[str] = None  # why it is not up
    last_seen: Optional[float] = None  # wall time of its last answer; None: not since we started
    checked: Optional[float] = None  # wall time its last asking ended
    gpus: List[Dict[str, Any]] = field(default_factory=list)  # while up

    def answered(self, gpus: List[Dict[str, Any]], now: float) -> None:
        if self.state != UP:
            self.since = now
        self.state, self.error, self.gpus = UP, None, gpus
        self.last_seen = self.checked = now

    def failed(self, state: str, error: str, asked: float, now: float) -> None:
        """It did not answer the asking that began at `asked`: down since then, at the latest
        (a host down one way, then another, stays down since the first)."""
        if self.state in (UP, ASKING):
            self.since = asked
        self.state, self.error, self.gpus = state, error, []
        self.checked = now

    def to_json(self) -> Dict[str, Any]:
        return {"host": self.host, "url": self.url, "state": self.state, "error": self.error,
                "since": iso_time(self.since),
                "last_seen": iso_time(self.last_seen) if self.last_seen is not None else None,
                "checked": iso_time(self.checked) if self.checked is not None else None,
                "free": sum(1 for gpu in self.gpus if gpu["free"]) if self.state == UP else None,
                "gpus": self.gpus}


def read(bodies: Sequence[bytes], max_gpus: int) -> List[Dict[str, Any]]:
    """One host's GPUs from the bodies of its /status and /devices. NotPatroller if they are
    not JSON; answers.BadAnswer if they are not as Patroller's schema says."""
    decoded = []
    for path, body in zip(PATHS, bodies):
        try:
            decoded.append(orjson.loads(body))
        except orjson.JSONDecodeError:
            raise NotPatroller(f"{path} did not answer JSON") from None
    status, devices = decoded
    answers.check(status, devices, max_gpus)
    return gpus_of(status, devices)


def gpus_of(status: Dict[str, Any], devices: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One host's GPUs from its /status and /devices as answers.check passed them, in device
    order (a lost one last)."""
    found = []
    for uuid, info in devices.items():
        entry = status.get(uuid) or {}
        claim = entry.get("claim") or {}
        found.append({
            "uuid": uuid, "number": info.get("number"), "group": info.get("group", "gpu"),
            "name": info.get("name"),
            "state": "lost" if info.get("lost") else claim.get("state", "free"),
            "user": claim.get("user"),  # the holder's identity, as /status shows it
            "users": claim.get("users") or [],  # everyone whose processes run there
            "withheld": bool(claim.get("withheld")), "idle_for": claim.get("idle_for"),
            "free": answers.free(info, entry),  # the rule `patroller status --free` counts by
            "sm": entry.get("sm"), "fb": entry.get("fb"),
            "fb_total": entry.get("fb_total") or info.get("total_mem"),
            "stale": bool(entry.get("stale"))})
    return sorted(found, key=lambda gpu: (gpu["state"] == "lost", gpu["group"],
                                          gpu["number"] if gpu["number"] is not None else -1))


def cut(path: str, head: List[str], limit: int) -> Optional[str]:
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

    def __init__(self, config: Config, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.interval = config.fleet_interval
        self.timeout = config.fleet_timeout
        self.max_bytes = config.fleet_max_bytes
        self.max_gpus = config.fleet_max_gpus
        started = clock()
        self.hosts = [Host(host, hosts.base_url(host), started) for host in config.fleet]
        self.client: Optional[AsyncHTTPClient] = None
        self.reader: Optional[ThreadPoolExecutor] = None  # decodes and checks the answers
        self.tasks: Set["asyncio.Task[None]"] = set()

    def start(self) -> None:
        """Start asking every host, on the current loop."""
        # Two requests a host can be in flight: a connection for each, never a queue.
        self.client = AsyncHTTPClient(force_instance=True, max_clients=2 * len(self.hosts),
                                      max_body_size=self.max_bytes)
        self.reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet")
        self.tasks = {asyncio.ensure_future(self._watch(host)) for host in self.hosts}

    async def stop(self, grace: float) -> None:
        """Stop asking: every loop is cancelled, a request in flight with it."""
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=grace)
        self.tasks = set()
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.reader is not None:  # a check under way ends by itself, within its bound
            self.reader.shutdown(wait=False, cancel_futures=True)
            self.reader = None

    async def _watch(self, host: Host) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            try:
                await self.ask(host)
            except Exception:  # a bug of ours: said, and the host asked again next round
                log.exception("asking %s failed", host.host)
            await asyncio.sleep(max(0.0, began + self.interval - loop.time()))

    async def ask(self, host: Host) -> None:
        """Ask one host once, and keep what it answered or why it did not."""
        assert self.client is not None and self.reader is not None
        asked = self.clock()
        bodies = await asyncio.gather(*(self._get(host.url, path) for path in PATHS),
                                      return_exceptions=True)
        errors = [b for b in bodies if isinstance(b, BaseException)]
        gpus: List[Dict[str, Any]] = []
        if not errors:
            try:
                gpus = await asyncio.get_running_loop().run_in_executor(
                    self.reader, read, bodies, self.max_gpus)
            except (NotPatroller, answers.BadAnswer) as exc:
                errors.append(exc)
        now = self.clock()
        if errors:
            state, why = self.trouble(errors[0])
            if host.state != state or host.error != why:
                log.info("fleet: %s %s: %s", host.host, state, why)
            host.failed(state, why, asked, now)
            return
        if host.state != UP:
            log.info("fleet: %s answers: %d GPUs", host.host, len(gpus))
        host.answered(gpus, now)

    async def _get(self, url: str, path: str) -> bytes:
        """The body of a host's answer to `path`, of at most --fleet-max-bytes."""
        assert self.client is not None
        head: List[str] = []  # the answer's head, line by line: to say why it was cut
        request = HTTPRequest(
            url + path, connect_timeout=self.timeout, request_timeout=self.timeout,
            follow_redirects=False, headers={"Accept": "application/json"},
            user_agent=f"patroller/{__version__} (fleet view)", header_callback=head.append,
            decompress_response=False)  # the bound counts what comes, as cut() says it
        try:
            response: HTTPResponse = await self.client.fetch(request, raise_error=False)
        except HTTPStreamClosedError:
            why = cut(path, head, self.max_bytes)
            if why is not None:
                raise answers.BadAnswer(why + " (--fleet-max-bytes)") from None
            raise
        if response.code != 200:
            raise NotPatroller(f"{path} answered HTTP {response.code}")
        return response.body

    def trouble(self, error: BaseException) -> Tuple[str, str]:
        """(state, why) for what asking a host raised."""
        if isinstance(error, HTTPTimeoutError):
            return SILENT, f"no answer within {durations.describe(self.timeout)}"
        if isinstance(error, ConnectionRefusedError):
            return REFUSED, "connection refused"
        if isinstance(error, answers.BadAnswer):
            return FAILED, f"bad answer: {error}"
        if isinstance(error, NotPatroller):
            return FAILED, f"bad answer: {error}: is it a Patroller daemon?"
        if isinstance(error, OSError):
            return FAILED, error.strerror or str(error) or type(error).__name__
        if isinstance(error, HTTPClientError):
            return FAILED, error.message or str(error)
        return FAILED, str(error) or type(error).__name__

    def data(self) -> Dict[str, Any]:
        """/fleet.json: every host as last heard, in the order given, and the totals."""
        states: Dict[str, int] = {}
        for host in self.hosts:
            for gpu in host.gpus:
                states[gpu["state"]] = states.get(gpu["state"], 0) + 1
        answering = [host for host in self.hosts if host.state == UP]
        return {
            "time": iso_time(self.clock()), "interval": self.interval, "timeout": self.timeout,
            "totals": {"hosts": len(self.hosts), "answering": len(answering),
                       "gpus": sum(states.values()),
                       "free": sum(1 for host in answering for gpu in host.gpus if gpu["free"]),
                       "states": dict(sorted(states.items()))},
            "hosts": [host.to_json() for host in self.hosts]}
