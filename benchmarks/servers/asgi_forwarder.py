"""A floor for an ASGI front: `python -m benchmarks.servers.asgi_forwarder URL PORT`.

uvicorn, set up as the sidecar sets it up (httptools, uvloop, no access log, no lifespan, no
websockets, no server header), runs a bare ASGI app that forwards each request to URL's host and
port over a keep-alive connection of its own (asyncio streams, the answer parsed by httptools) and
streams the answer back, decoding every JSON-RPC message on the way as `tcp_forwarder.py --parse`
does. No sessions, no relay, no task of its own per request. Listens on 127.0.0.1:PORT until it
is stopped. Scenario 3b times it at one session, so that what uvicorn and ASGI cost can be told
apart from what the sidecar does above them.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import orjson
import uvicorn

from benchmarks.servers.tcp_forwarder import MessageReader

# Headers that describe one hop's framing, not the message: each hop sets its own.
HOP_BY_HOP = {b"content-length", b"transfer-encoding", b"connection"}
# An idle upstream connection older than this is closed rather than reused (uvicorn drops them at 5 s).
KEEPALIVE = 4.0


class AnswerReader(MessageReader):
    """A `MessageReader` for answers that also keeps what the ASGI app forwards: the status and
    headers, each piece of the body, and whether the answer is complete."""

    def __init__(self) -> None:
        super().__init__(httptools.HttpResponseParser)
        self.parts: deque[tuple[str, Any]] = deque()
        self.headers: list[tuple[bytes, bytes]] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        if name.lower() not in HOP_BY_HOP:
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = cast(httptools.HttpResponseParser, self.parser).get_status_code()
        self.parts.append(("head", (status, self.headers)))
        self.headers = []

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self.parts.append(("body", body))

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.parts.append(("end", None))


class Upstream:
    """One keep-alive connection to the upstream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.answer = AnswerReader()
        self.idle_since = time.monotonic()

    async def next_part(self) -> tuple[str, Any]:
        while not self.answer.parts:
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionResetError("the upstream closed the connection")
            self.answer.feed(data)
        return self.answer.parts.popleft()


class Forwarder:
    """The ASGI app."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[Upstream] = []

    async def connection(self) -> Upstream:
        while self.idle:
            upstream = self.idle.pop()
            if time.monotonic() - upstream.idle_since < KEEPALIVE and not upstream.reader.at_eof():
                return upstream
            upstream.writer.close()
        return Upstream(*await asyncio.open_connection(self.host, self.port))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if body:
            orjson.loads(body)
        upstream = await self.connection()
        target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        lines = [scope["method"].encode() + b" " + target + b" HTTP/1.1\r\n"]
        headers = [(name, value) for name, value in scope["headers"] if name not in HOP_BY_HOP]
        lines += [name + b": " + value + b"\r\n" for name, value in headers]
        lines.append(b"content-length: %d\r\n\r\n" % len(body))
        upstream.writer.write(b"".join(lines) + body)
        while True:
            kind, value = await upstream.next_part()
            if kind == "head":
                status, headers = value
                await send({"type": "http.response.start", "status": status, "headers": headers})
            elif kind == "body":
                await send({"type": "http.response.body", "body": value, "more_body": True})
            else:
                await send({"type": "http.response.body", "body": b""})
                upstream.idle_since = time.monotonic()
                self.idle.append(upstream)
                return


def main() -> int:
    parts, port = urlsplit(sys.argv[1]), int(sys.argv[2])
    app = Forwarder(parts.hostname or "127.0.0.1", parts.port or 80)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        log_config=None,
        access_log=False,
        ws="none",
        server_header=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
