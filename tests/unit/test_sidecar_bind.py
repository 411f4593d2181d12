"""The sidecar's listening socket: TCP by name, and a clear error when the port is taken.

asyncio turns on TCP_NODELAY for accepted connections only when the listening socket's protocol
is IPPROTO_TCP; a socket made with protocol 0 would leave Nagle on, and an SSE event sent after
the response headers could then wait 40 ms for the client's delayed ACK.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from mcp_backfill.errors import BindError
from mcp_backfill.sidecar.server import bind


def test_accepted_connections_have_nodelay() -> None:
    async def main() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            raw = writer.get_extra_info("socket")
            accepted.set_result(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_client, sock=bind("127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(accepted, 10)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(main()) != 0


def test_a_taken_port_is_a_clear_error() -> None:
    first = bind("127.0.0.1", 0)
    try:
        port = first.getsockname()[1]
        with pytest.raises(BindError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind("127.0.0.1", port)
    finally:
        first.close()
