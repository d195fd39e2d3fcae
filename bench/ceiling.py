"""The ceiling: the same answer served by a bare asyncio server, to measure Patroller against.

`python -m bench.ceiling BODY_FILE` listens on a loopback port (printed on stdout), and answers
every request it reads, whatever it asks, with BODY_FILE as a 200 JSON answer carrying the
headers Patroller sends. No routing, no parsing beyond finding the end of each request's head,
no framework: what Python and asyncio cost to answer over HTTP/1.1 keep-alive on this machine.
Patroller's throughput and p99 are reported as ratios of this server's (bench/measures.py).
"""

from __future__ import annotations

import asyncio
import sys

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=UTF-8\r\n"
    b"Cache-Control: no-store\r\nServer: patroller\r\nContent-Length: %d\r\n\r\n"
)


class Answer(asyncio.Protocol):
    """Writes the answer once per request head received (requests carry no body)."""

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.pending = b""
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.pending += data
        heads = self.pending.count(b"\r\n\r\n")
        if heads:
            self.pending = self.pending[self.pending.rfind(b"\r\n\r\n") + 4 :]
            self.transport.write(self.response * heads)


async def serve(body: bytes) -> None:
    response = HEAD % len(body) + body
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Answer(response), "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        asyncio.run(serve(f.read()))
