"""The floors for anything placed between an HTTP client and an HTTP server: `tcp_forwarder.py URL [--parse]`.

Listens on a free 127.0.0.1 port and, for each connection it accepts, opens one to URL's host and
port and copies bytes both ways from the event loop's callbacks: no task per message. Prints
`listening on URL` with its own port in the URL and serves until it is stopped.

Bare, it does nothing else. With `--parse` it also parses every request and every answer as
HTTP/1.1 (httptools) and decodes every JSON-RPC message in them (a JSON body, each SSE event's
data) with orjson: the reading any MCP middleman has to do, and nothing more; the bytes still go on
unchanged as they arrive. Scenario 3b times both next to the sidecar, so that what the sidecar adds
can be read against what the extra hop alone costs (two more loopback connections and a process
woken for every read) and what parsing and decoding add to it.
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast
from urllib.parse import urlsplit, urlunsplit

import httptools
import orjson

Parser = type[httptools.HttpRequestParser] | type[httptools.HttpResponseParser]


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


class MessageReader:
    """Parses one direction of an HTTP/1.1 connection (httptools) and decodes every JSON-RPC message
    in it: a JSON body whole, an SSE stream event by event."""

    def __init__(self, parser: Parser) -> None:
        self.parser = parser(self)
        self.body = bytearray()
        self.events = False  # the message being read is an SSE stream

    def feed(self, data: bytes) -> None:
        self.parser.feed_data(data)

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.events = value.startswith(b"text/event-stream")

    def on_body(self, body: bytes) -> None:
        self.body += body
        while self.events and (end := self.body.find(b"\n\n")) >= 0:
            for line in bytes(self.body[:end]).split(b"\n"):
                if line.startswith(b"data:"):
                    orjson.loads(line[5:])
            del self.body[: end + 2]

    def on_message_complete(self) -> None:
        if self.body and not self.events:
            orjson.loads(self.body)
        self.body.clear()
        self.events = False


class ParsingLeg(Leg):
    """A `Leg` that reads what it forwards with a `MessageReader` first."""

    def __init__(self, parser: Parser) -> None:
        super().__init__()
        self.reader = MessageReader(parser)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        super().data_received(data)


async def serve(target: str, parse: bool) -> None:
    loop = asyncio.get_running_loop()
    parts = urlsplit(target)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    connecting: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak references)

    def upstream_leg() -> Leg:
        return ParsingLeg(httptools.HttpResponseParser) if parse else Leg()

    def front() -> Leg:
        leg = ParsingLeg(httptools.HttpRequestParser) if parse else Leg()

        async def connect() -> None:
            try:
                _, back = await loop.create_connection(upstream_leg, host, port)
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
    target, parse = sys.argv[1], "--parse" in sys.argv[2:]
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(target, parse))
    else:
        uvloop.run(serve(target, parse))
    return 0


if __name__ == "__main__":
    sys.exit(main())
