"""The floor for anything placed between an HTTP client and an HTTP server: `tcp_forwarder.py URL`.

Listens on a free 127.0.0.1 port and, for each connection it accepts, opens one to URL's host and
port and copies bytes both ways from the event loop's callbacks: no HTTP parsing, no task per
message. Prints `listening on URL` with its own port in the URL and serves until it is stopped.
Scenario 3b times it next to the sidecar, so that what the sidecar adds can be read against what
the extra hop alone costs (two more loopback connections and a process woken for every read).
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast
from urllib.parse import urlsplit, urlunsplit


class Leg(asyncio.Protocol):
    """One side of a forwarded connection: what it reads goes out on `peer`'s transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Leg | None = None
        self.early: list[bytes] = []  # read before the other side was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def join(self, peer: Leg) -> None:
        self.peer = peer
        assert peer.transport is not None
        for data in self.early:
            peer.transport.write(data)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is None or self.peer.transport is None:
            self.early.append(data)
        else:
            self.peer.transport.write(data)

    # Flow control: while the other side cannot keep up, stop reading this one.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def serve(target: str) -> None:
    loop = asyncio.get_running_loop()
    parts = urlsplit(target)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    connecting: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak references)

    def front() -> Leg:
        leg = Leg()

        async def connect() -> None:
            try:
                _, back = await loop.create_connection(Leg, host, port)
            except OSError:
                if leg.transport is not None:
                    leg.transport.close()
                return
            back.join(leg)
            leg.join(back)

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return leg

    server = await loop.create_server(front, "127.0.0.1", 0)
    own = server.sockets[0].getsockname()[1]
    print(f"listening on {urlunsplit(parts._replace(netloc=f'127.0.0.1:{own}'))}", flush=True)
    await server.serve_forever()


def main() -> int:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(sys.argv[1]))
    else:
        uvloop.run(serve(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
