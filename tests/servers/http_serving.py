"""Serving a test MCPServer over streamable HTTP (uvicorn), for the HTTP-upstream tests.

`serve_http(server, "127.0.0.1:0")` binds the address (port 0 picks a free one), prints
`listening on http://HOST:PORT/mcp` as the first stdout line, and serves until killed. Sessions are
resumable: an in-memory event store keeps every SSE event, and priming events say `retry: 100`.
"""

from __future__ import annotations

import itertools
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


def serve_http(server: MCPServer[Any], address: str) -> None:
    import uvicorn

    host, _, port = address.rpartition(":")
    # IPPROTO_TCP, not 0: asyncio turns on TCP_NODELAY only for sockets that say TCP; without it
    # an answer on a kept-alive connection can wait 40 ms for the peer's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(64)
    app = server.streamable_http_app(host=host, event_store=MemoryEventStore(), retry_interval=100)
    uvicorn_server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))

    async def run() -> None:
        print(f"listening on http://{host}:{sock.getsockname()[1]}/mcp", flush=True)
        await uvicorn_server.serve(sockets=[sock])

    anyio.run(run)
