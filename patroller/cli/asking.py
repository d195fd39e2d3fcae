"""Many hosts asked at once on one event loop: what `status --hosts` sends.

A thread a request, as the command first had (600 for 300 hosts), cost most of its deadline on
a busy machine: each `Thread.start` waits until the new thread has run, and a loaded machine
(load 12 on two cores) took 1.4 s to start them, more than the 1.5 s deadline, before the
answers were even read. Here every request is a task of one loop: a connection each (two per
host, at once), `Connection: close`, read to its end, at most `limit` bytes of body; each
distinct name is resolved once (a daemon thread a name), an address needs none.
The answer is parsed by the standard library's HTTP reader, and the errors are the client's
(patroller.client): the same words as one server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import ipaddress
import json
import socket
import ssl
import threading
import urllib.parse
from typing import Any

from patroller import client

HEAD_BYTES = 64 * 1024  # of an answer's status line and headers, at most


class _Answer(asyncio.Protocol):
    """One request sent, and its answer read to the end of the connection (or `cap` + 1
    bytes). A reset after the answer came (a host that closes without reading all that was
    sent) keeps what came; one before it is the error."""

    def __init__(self, request: bytes, cap: int, done: asyncio.Future[None]) -> None:
        self.request = request
        self.cap = cap
        self.done = done
        self.chunks: list[bytes] = []
        self.size = 0
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > self.cap and self.transport is not None:
            self.transport.close()  # enough to say that it is too long

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        if exc is not None and not self.chunks:
            self.done.set_exception(exc)
        else:
            self.done.set_result(None)

    async def whole(self) -> bytes:
        try:
            await self.done
        finally:
            if self.transport is not None:
                self.transport.close()
        return b"".join(self.chunks)


class _Read:
    """What http.client.HTTPResponse reads an answer from: the bytes already received."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


def _settle(future: asyncio.Future[list[Any]], answer: Any) -> None:
    if future.done():
        return
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)


class Asker:
    """GETs to many hosts on the running loop; each name resolved once for all of them. An
    answer is read to `limit` bytes of body at most (and its head)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.cap = limit + HEAD_BYTES  # bytes of one answer read at most: more is too long
        self.resolved: dict[str, asyncio.Future[list[Any]]] = {}

    async def _addresses(self, name: str) -> list[Any]:
        """The addresses of `name`, looked up once for every port and path asked of it, in a
        daemon thread: a lookup the resolver holds up (a DNS server that does not answer) is
        given up at the deadline, and does not hold the command's exit as a pool's would."""
        if name not in self.resolved:
            loop = asyncio.get_running_loop()
            found: asyncio.Future[list[Any]] = loop.create_future()

            def look_up() -> None:
                try:
                    answer: Any = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
                except OSError as exc:
                    answer = exc
                # a closed loop (RuntimeError): the command went on without this name
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, found, answer)

            threading.Thread(target=look_up, daemon=True, name=f"resolving {name}").start()
            self.resolved[name] = found
        return await asyncio.shield(self.resolved[name])

    async def _exchange(self, scheme: str, name: str, port: int, path: str) -> bytes:
        """The whole answer to GET `path`, or its first `cap` + 1 bytes (then it is too long)."""
        loop = asyncio.get_running_loop()
        netloc = "localhost" if scheme == "unix" else f"{name}:{port}"
        request = (
            f"GET {urllib.parse.quote(path, safe='/?=&')} HTTP/1.1\r\nHost: {netloc}\r\n"
            "Accept: application/json\r\nConnection: close\r\n\r\n"
        ).encode("ascii")
        answer = _Answer(request, self.cap, loop.create_future())
        if scheme == "unix":
            await loop.create_unix_connection(lambda: answer, name)
            return await answer.whole()
        tls = ssl.create_default_context() if scheme == "https" else None
        try:
            ipaddress.ip_address(name)
            found = [(socket.AF_INET6 if ":" in name else socket.AF_INET, name)]
        except ValueError:  # a name: its addresses, in the resolver's order
            found = [(family, where[0]) for family, _, _, _, where in await self._addresses(name)]
        error: OSError | None = None
        for family, address in found:
            try:
                await loop.create_connection(
                    lambda: answer,
                    address,
                    port,
                    family=family,
                    ssl=tls,
                    server_hostname=name if tls is not None else None,
                )
            except OSError as exc:  # the next address, as the client's connect does
                error = exc
                continue
            return await answer.whole()
        raise error or OSError(f"{name} has no address")

    async def get_json(self, host: str, path: str, timeout: float) -> Any:
        """The JSON `host` answers to GET `path`, as client.get_json says it (the same errors);
        within `timeout` seconds in all."""
        scheme, name, port = client.parse_server(host)
        where = name if scheme == "unix" else f"{name}:{port}"
        try:
            raw = await asyncio.wait_for(self._exchange(scheme, name, port, path), timeout)
            if len(raw) > self.cap:
                raise client.ServerUnreachable(
                    f"bad answer: {path} is more than {self.limit} bytes"
                )
            response = http.client.HTTPResponse(_Read(raw))  # type: ignore[arg-type]
            response.begin()
            body = response.read(self.limit + 1)
        except asyncio.TimeoutError:
            raise client.ServerUnreachable(f"Patroller at {where}: timed out") from None
        except (OSError, http.client.HTTPException) as exc:
            raise client.ServerUnreachable(f"Patroller at {where}: {exc}") from None
        if len(body) > self.limit:
            raise client.ServerUnreachable(f"bad answer: {path} is more than {self.limit} bytes")
        try:
            answer = json.loads(body.decode("utf-8"))
        except (ValueError, RecursionError):
            raise client.ServerUnreachable(
                f"{host} did not answer like Patroller (HTTP {response.status})"
            ) from None
        if response.status != 200:
            raise client.RequestRefused(response.status, answer)
        return answer


async def ask(
    requests: list[tuple[str, str]], timeout: float, limit: int, wait: float
) -> dict[int, Any]:
    """{n: the JSON requests[n] (host, path) was answered, or the error raised} for every
    request answered within `wait` seconds; each bounded by `timeout` too. A request not
    answered by then is left out (and cancelled)."""
    asker = Asker(limit)

    async def one(host: str, path: str) -> Any:
        try:
            return await asker.get_json(host, path, timeout)
        except (client.PatrollerError, ValueError) as exc:  # ValueError: not an address
            return exc

    tasks = {asyncio.ensure_future(one(host, path)): n for n, (host, path) in enumerate(requests)}
    if not tasks:
        return {}
    done, pending = await asyncio.wait(tasks, timeout=wait)
    for task in pending:
        task.cancel()
    for resolving in asker.resolved.values():
        if resolving.done() and not resolving.cancelled():
            resolving.exception()  # looked at: a failed lookup's error was told its askers
        resolving.cancel()
    return {tasks[task]: task.result() for task in done}
