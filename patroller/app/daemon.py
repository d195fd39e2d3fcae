"""One Patroller daemon started and stopped: `Daemon` starts what assembly.py built, in order
(the files first, so last run's reservations come back before anything is served), listens,
and stops it all in order within the stop's grace. It builds nothing."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time

from patroller.durations import describe
from patroller.heap import Heap
from patroller.http.api import Api
from patroller.http.fastlane import FastLane
from patroller.http.routes import lane_headers, lane_routes
from patroller.http.server import (
    PeerServer,
    SocketFile,
    SocketPathError,
    remove_unix_socket,
    tcp_sockets,
    unix_socket,
)
from patroller.notify.notifier import NotifyError
from patroller.services import Services
from patroller.state.directory import BookError
from patroller.state.pseudonyms import PseudonymError

log = logging.getLogger(__name__)


class StartError(Exception):
    """The daemon cannot start; the message says why, in one line."""


class Daemon:
    """Starts and stops what `build` made. It builds nothing, and reads nothing but what
    `start` opens."""

    def __init__(self, services: Services, api: Api) -> None:
        self.services = services
        self.api = api
        self.server: PeerServer | None = None
        self.unix_file: SocketFile | None = None  # what we bound there, removed at stop
        self.heap = Heap(services.config.gc_refreeze_every)
        self._switch_interval: float | None = None  # Python's, while the daemon's is set

    def start(self) -> None:
        """Open the audit record's file, the lease book and the pseudonyms' key (last run's
        reservations come back before anything is served), then start the usage store's
        writer and its sampler (with a state directory), expiring leases,
        watching the processes devices are held for, the web page's feed, asking the fleet's
        hosts (with --fleet) and the monitors, on the current loop. Raises StartError if a file
        cannot be opened."""
        services = self.services
        try:
            services.audit.open()
        except OSError as exc:
            raise StartError(
                f"cannot open the audit log {services.config.audit_log}: {exc.strerror or exc}"
            ) from None
        if services.book is not None:
            try:
                services.book.open()
            except BookError as exc:
                services.audit.close()
                raise StartError(str(exc)) from None
        if services.pseudonyms is not None:  # its key lives in the book's directory, made now
            try:
                services.pseudonyms.open(services.book is not None and services.book.read_only)
            except PseudonymError as exc:
                if services.book is not None:
                    services.book.close()
                services.audit.close()
                raise StartError(str(exc)) from None
        if services.notifier is not None:  # before any event: a grant restored is told of
            try:
                services.notifier.start()
            except NotifyError as exc:
                if services.book is not None:
                    services.book.close()
                services.audit.close()
                raise StartError(str(exc)) from None
        if services.book is not None:
            services.book.attach(services.leases)
        if services.usage is not None and services.sampler is not None:
            services.usage.open()  # its writer thread opens the file
            if services.usage.state != "read_only":
                services.sampler.start()
        if services.health is not None:  # a GPU unhealthy from the start: told, its holder
            services.health.start()  # (the book's) named
        services.timer.start()
        services.lifelines.start()
        self.api.feed.start()
        if self.api.fleet is not None:
            self.api.fleet.start()
        for monitor in services.monitors:
            monitor.start()
        self.heap.start()  # what the daemon made to start is frozen from now on
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(services.config.gil_switch_interval)

    def listen(self, port: int, address: str = "", unix_path: str | None = None) -> list[str]:
        """Bind and serve; return where, as URLs. Raises OSError if it cannot bind, StartError
        if another daemon serves on `unix_path` or that path is not a socket."""
        sockets = tcp_sockets(port, address)
        if unix_path:
            try:
                sock, self.unix_file = unix_socket(unix_path)
            except (OSError, SocketPathError) as exc:
                for sock in sockets:
                    sock.close()
                if isinstance(exc, SocketPathError):
                    raise StartError(str(exc)) from None
                raise
            sockets.append(sock)
        api = self.api
        assert api.app is not None
        config = self.services.config
        lane = FastLane(
            lane_routes(api),
            api.requests.count,
            hand_back_after=config.header_timeout / 2,
            headers=lane_headers(api),
        )
        self.server = PeerServer(
            api.app,
            lane,
            config=config,
            read_facts=self.services.identifier.peer_facts,
            requests=api.requests,
        )
        self.server.add_sockets(sockets)
        return [_url(s) for s in sockets]

    async def stop(self, grace: float) -> None:
        """Stop accepting, answer waiters, stop asking the fleet's hosts, stop monitors, close
        connections, end the requests still handled: within `grace` s.

        The monitors get half of it, all stopped together; each child has half of that to
        answer SIGTERM before its group is killed, so no child outlives the stop. Connections,
        then the requests that outlived theirs, get the rest: one still running then is
        cancelled and answered 503 (499 if its client left).
        """
        services = self.services
        deadline = time.monotonic() + grace
        self.api.inflight.stopping = True
        if self.server is not None:
            self.server.stop()
        if self.unix_file is not None:
            remove_unix_socket(self.unix_file)  # only if it is still ours
        if services.sampler is not None:
            services.sampler.stop()  # the interval so far is sampled too
        services.leases.close()  # waiters are answered 503
        self.api.feed.stop()  # pages' streams end (browsers reconnect by themselves)
        if self.api.fleet is not None:  # the other hosts are asked no more
            await self.api.fleet.stop(grace / 4)
        await asyncio.sleep(0)  # let their answers go out
        services.timer.stop()
        self.heap.stop()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None
        services.lifelines.stop()
        services.tracker.close()
        await self._stop_monitors(grace / 2)
        if self.server is not None:
            try:
                await asyncio.wait_for(
                    self.server.close_all_connections(), max(0.0, deadline - time.monotonic())
                )
            except asyncio.TimeoutError:
                log.warning("some connections did not close in time")
        # A request outlives its connection when its client half-closed: answered before
        # the engines' clients, the book and the audit record it may use are closed.
        late = await self.api.inflight.drain(deadline - time.monotonic())
        if late:
            log.warning(
                "%d requests were cut short by the stop (503, 499 if the client left)", late
            )
        services.identifier.close()  # the container engines' clients, the Docker Engine's too
        if services.usage is not None:  # what is queued is written, within a bound
            await asyncio.get_running_loop().run_in_executor(
                None, services.usage.close, max(0.1, deadline - time.monotonic())
            )
        if services.notifier is not None:  # what is being sent meanwhile is given a moment
            services.notifier.turns.finish()  # the events waiting for a turn, handled first
            await asyncio.get_running_loop().run_in_executor(
                None, services.notifier.stop, max(0.1, deadline - time.monotonic())
            )
        if services.book is not None:
            services.book.close()
        services.audit.close()

    async def _stop_monitors(self, grace: float) -> None:
        """Start every monitor's stop, then await them together (terminado's kill_all)."""
        stops = {asyncio.ensure_future(m.stop(grace / 2)): m for m in self.services.monitors}
        if not stops:
            return
        done, late = await asyncio.wait(stops, timeout=grace)
        for task in late:  # a child stuck in the kernel: it dies when it returns
            task.cancel()
            log.warning("%s did not stop within %s", stops[task].name, describe(grace))
        for task in done:
            if task.exception() is not None:
                log.error("stopping %s failed", stops[task].name, exc_info=task.exception())


def _url(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        return f"unix://{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"
