"""Many fleet hosts in one process: `python -m bench.replicas STATUS DEVICES COUNT`.

Listens on COUNT loopback ports and answers GET /status and /devices on each with the bodies of
a real test-mode daemon (the files STATUS and DEVICES, with the ETag that daemon gave), over
HTTP/1.1 keep-alive, as that daemon's fast lane does; `Connection: close` is honoured. Every
other /status answer ends in a blank, so that its bytes change every round as a busy host's
do and the fleet daemon reads every one (it skips an answer the same as the last). Prints
the ports, one line, then serves until stdin closes. The benchmark's fleet step tops its real
daemons up with these where memory does not hold 1,000 daemons (each about 38 MiB).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys


def answer(body: bytes, extra: bytes, close: bool) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=UTF-8\r\n"
        b"Cache-Control: no-store\r\nServer: patroller\r\n"
        + extra
        + (b"Connection: close\r\n" if close else b"")
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


async def main(status_file: str, devices_file: str, count: int) -> None:
    with open(status_file, "rb") as f:
        status = f.read()
    with open(devices_file, "rb") as f:
        devices = f.read()
    tag = b'"%s"' % hashlib.blake2b(devices, digest_size=8).hexdigest().encode()
    bodies = {
        b"/status": (status, b"X-Devices-ETag: " + tag + b"\r\n"),
        b"/devices": (devices, b"ETag: " + tag + b"\r\n"),
    }

    changed = (status + b" ", b"X-Devices-ETag: " + tag + b"\r\n")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        asked = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                close = b"connection: close" in head.lower()
                body, extra = bodies.get(path, (b'{"error":"no such path"}', b""))
                if path == b"/status":
                    asked += 1
                    body, extra = changed if asked % 2 else (body, extra)
                writer.write(answer(body, extra, close))
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    servers = [await asyncio.start_server(serve, "127.0.0.1", 0, backlog=64) for _ in range(count)]
    ports: list[int] = [s.sockets[0].getsockname()[1] for s in servers]
    print(" ".join(map(str, ports)), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
