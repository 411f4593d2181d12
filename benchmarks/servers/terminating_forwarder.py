"""A floor for a front of the proxy's own below ASGI: `terminating_forwarder.py URL`.

Listens on a free 127.0.0.1 port. Unlike `tcp_forwarder.py`, it ends HTTP on both sides as the
sidecar does, with only the least work such a front must do per call, all of it from the event
loop's callbacks (no task per request): each request is parsed whole (httptools), its headers
checked (Host, Origin, Accept, Content-Type, the session), its JSON-RPC message decoded and checked
(orjson) and its id kept; a POST of its own goes upstream on the client connection's own keep-alive
connection (a head rendered once per session, the body as it came); the answer is parsed whole
(`Content-Length`, chunked, SSE events each decoded), the response to the kept id found, and the
client answered with it as JSON. Prints `listening on URL` with its own port in the URL.

POSTs only (what benchmarks/httpclient.py sends); anything else is answered 405.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import httptools
import orjson

SESSION = b"mcp-session-id"
VERSION = b"mcp-protocol-version"


@dataclass(frozen=True)
class Target:
    """The upstream: where to connect, and its Host and path."""

    host: str
    port: int
    authority: bytes
    path: bytes


class Upstream(asyncio.Protocol):
    """The keep-alive connection to the upstream of one client connection; one request at a time."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.events = False
        self.messages: list[Any] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.upstream_lost()

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self.headers = {}
        self.body.clear()
        self.messages = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.events = self.headers.get(b"content-type", b"").startswith(b"text/event-stream")

    def on_body(self, body: bytes) -> None:
        self.body += body
        while self.events:  # an event ends at a blank line (sse-starlette writes CRLF)
            end, size = self.body.find(b"\r\n\r\n"), 4
            if end < 0:
                end, size = self.body.find(b"\n\n"), 2
                if end < 0:
                    return
            for line in bytes(self.body[:end]).splitlines():
                if line.startswith(b"data:"):
                    self.messages.append(orjson.loads(line[5:]))
            del self.body[: end + size]

    def on_message_complete(self) -> None:
        if self.body and not self.events:
            self.messages.append(orjson.loads(self.body))
        self.front.answered(self.parser.get_status_code(), self.headers, self.messages)


class Front(asyncio.Protocol):
    """One client connection: its requests parsed, checked and sent on; its answers written."""

    sessions: dict[bytes, dict[bytes, bytes]] = {}  # client session id -> what goes upstream

    def __init__(self, target: Target, authority: bytes) -> None:
        self.target = target
        self.authority = authority
        self.transport: asyncio.Transport | None = None
        self.upstream: Upstream | None = None
        self.connecting = False
        self.parser = httptools.HttpRequestParser(self)
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.waiting: Any = None  # the id of the request in flight
        self.outgoing: bytes | None = None  # a request written once the upstream is connected
        self.connecting_task: asyncio.Task[Any] | None = None  # held while it runs (weak in the loop)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.respond(400, b"{}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self.headers = {}
        self.body.clear()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        headers = self.headers
        if self.parser.get_method() != b"POST":
            return self.respond(405, b"{}")
        if headers.get(b"host") != self.authority or b"origin" in headers:
            return self.respond(403, b"{}")
        accept = headers.get(b"accept", b"")
        if b"application/json" not in accept or b"text/event-stream" not in accept:
            return self.respond(406, b"{}")
        if not headers.get(b"content-type", b"").startswith(b"application/json"):
            return self.respond(415, b"{}")
        session = headers.get(SESSION)
        if session is not None and session not in self.sessions:
            return self.respond(404, b"{}")
        try:
            message = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return self.respond(400, b"{}")
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return self.respond(400, b"{}")
        self.waiting = message.get("id")
        self.send_upstream(session, bytes(self.body))

    def send_upstream(self, session: bytes | None, body: bytes) -> None:
        if session is None:
            head = b"accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
        else:
            fields = self.sessions[session]
            head = fields.get(b"head") or b""
            if not head:
                head = b"accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
                head += b"mcp-session-id: %s\r\n" % fields[SESSION]
                if VERSION in self.headers:
                    head += b"mcp-protocol-version: %s\r\n" % self.headers[VERSION]
                fields[b"head"] = head
        target = self.target
        request = b"POST %s HTTP/1.1\r\nhost: %s\r\n%scontent-length: %d\r\n\r\n%s" % (
            target.path,
            target.authority,
            head,
            len(body),
            body,
        )
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.write(request)
            return
        self.outgoing = request
        if not self.connecting:
            self.connecting = True
            loop = asyncio.get_running_loop()
            connect = loop.create_connection(lambda: Upstream(self), target.host, target.port)
            self.connecting_task = loop.create_task(connect)
            self.connecting_task.add_done_callback(self.connected)

    def connected(self, task: asyncio.Task[tuple[asyncio.BaseTransport, Upstream]]) -> None:
        self.connecting, self.connecting_task = False, None
        if task.cancelled() or task.exception() is not None:
            self.respond(502, b"{}")
            return
        _, self.upstream = task.result()
        if self.outgoing is not None and self.upstream.transport is not None:
            self.upstream.transport.write(self.outgoing)
            self.outgoing = None

    def upstream_lost(self) -> None:
        self.upstream = None

    def answered(self, status: int, headers: dict[bytes, bytes], messages: list[Any]) -> None:
        session = headers.get(SESSION)
        if session is not None and session not in self.sessions:
            self.sessions[session] = {SESSION: session}
        extra = b"mcp-session-id: %s\r\n" % session if session is not None else b""
        for message in messages:
            if isinstance(message, dict) and "method" not in message and message.get("id") == self.waiting:
                self.waiting = None
                return self.respond(status, orjson.dumps(message), extra)
        self.respond(status, b"", extra)

    def respond(self, status: int, body: bytes, extra: bytes = b"") -> None:
        if self.transport is None:
            return
        kind = b"content-type: application/json\r\n" if body else b""
        self.transport.write(
            b"HTTP/1.1 %d %s\r\n%s%scontent-length: %d\r\n\r\n%s"
            % (status, REASONS.get(status, b"OK"), kind, extra, len(body), body)
        )


REASONS = {200: b"OK", 202: b"Accepted", 400: b"Bad Request", 403: b"Forbidden", 404: b"Not Found"}


async def serve(url: str) -> None:
    loop = asyncio.get_running_loop()
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    target = Target(host, port, f"{host}:{port}".encode(), (parts.path or "/").encode())
    own: list[bytes] = []  # this server's authority, once it listens
    server = await loop.create_server(lambda: Front(target, own[0]), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    own.append(b"127.0.0.1:%d" % port)
    print(f"listening on {urlunsplit(parts._replace(netloc=f'127.0.0.1:{port}'))}", flush=True)
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
