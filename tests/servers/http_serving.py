"""Serving a test MCPServer over streamable HTTP (uvicorn), for the HTTP-upstream tests.

`serve_http(server, "127.0.0.1:0")` binds the address (port 0 picks a free one), prints
`listening on http://HOST:PORT/mcp` as the first stdout line, and serves until killed. Sessions are
resumable: an in-memory event store keeps every SSE event, and priming events say `retry: 100`.

With `TEST_SLOW_PROGRESS_ACK=SECONDS` in the environment, a POSTed `notifications/progress` is
acknowledged only after that many seconds (a server, or a gateway in front of it, slow to take
notifications).
"""

from __future__ import annotations

import itertools
import os
import socket
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage


class MemoryEventStore(EventStore):
    """Every event of every stream, in order, so a stream can be replayed after any of its ids."""

    def __init__(self) -> None:
        self._events: list[tuple[EventId, StreamId, JSONRPCMessage | None]] = []
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = f"e{next(self._ids)}"
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        positions = [n for n, (event_id, _, _) in enumerate(self._events) if event_id == last_event_id]
        if not positions:
            return None
        stream_id = self._events[positions[0]][1]
        for event_id, stream, message in self._events[positions[0] + 1 :]:
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


class _SlowProgressAck:
    """ASGI middleware: a POST whose body is a `notifications/progress` waits `seconds` first."""

    def __init__(self, app: Any, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        body = b"".join(m.get("body", b"") for m in messages)
        if b'"notifications/progress"' in body:
            await anyio.sleep(self.seconds)
        replay = iter(messages)

        async def replayed() -> Any:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)


def serve_http(server: MCPServer[Any], address: str) -> None:
    import uvicorn

    host, _, port = address.rpartition(":")
    # IPPROTO_TCP, not 0: asyncio turns on TCP_NODELAY only for sockets that say TCP; without it
    # an answer on a kept-alive connection can wait 40 ms for the peer's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(64)
    app: Any = server.streamable_http_app(host=host, event_store=MemoryEventStore(), retry_interval=100)
    slow_ack = float(os.environ.get("TEST_SLOW_PROGRESS_ACK", "0"))
    if slow_ack > 0:
        app = _SlowProgressAck(app, slow_ack)
    uvicorn_server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))

    async def run() -> None:
        print(f"listening on http://{host}:{sock.getsockname()[1]}/mcp", flush=True)
        await uvicorn_server.serve(sockets=[sock])

    anyio.run(run)
