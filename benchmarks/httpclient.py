"""Lean streamable-HTTP MCP clients for the HTTP scenarios: raw HTTP/1.1, minimal parsing.

`HttpSession` is a handshake-era session (initialize, then calls carrying its `Mcp-Session-Id`);
`StatelessClient` is a 2026-07-28 client (no session: every request carries the protocol version
and the client's capabilities in `params._meta`, and the routing headers that mirror its body).

The client shares the machine's two cores with the servers it measures, so it must cost little per
call. The mcp SDK's client costs milliseconds, and even `httpx2.AsyncClient` costs about 1 ms of CPU
per POST here (measured: 0.94 ms user time per `tools/call`, against servers that need 1-3 ms), which
would make the client the bottleneck of every arm. This one keeps one keep-alive connection per
session (asyncio streams: TCP_NODELAY, one write per request), writes prebuilt requests, and reads
an answer only as far as it must: the status line and headers, then a `Content-Length` or chunked
body, whose JSON (or SSE `data:` lines) is decoded to check the response's id and that it is a
success. It speaks what the servers measured here send (uvicorn via h11) and nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any
from urllib.parse import urlsplit

import orjson

PROTOCOL_VERSION = "2025-11-25"
STATELESS_VERSION = "2026-07-28"
# Far longer than any answer takes, even while 64 upstream processes start on 2 cores.
TIMEOUT = 120.0
# The longest status line and header block accepted.
HEAD_LIMIT = 1 << 16


class CallFailed(Exception):
    """The server's answer was not the success the benchmark expects."""


class Connection:
    """One HTTP/1.1 keep-alive connection; one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self._reader = reader
        self._writer = writer
        self._host = host.encode()

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port, limit=HEAD_LIMIT)
        return cls(reader, writer, f"{host}:{port}")

    async def request(
        self, method: bytes, path: bytes, headers: bytes, body: bytes = b""
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        """(status, headers with lowercase names, body); `headers`: rendered `name: value\\r\\n` lines."""
        self._writer.write(
            b"%s %s HTTP/1.1\r\nhost: %s\r\n%scontent-length: %d\r\n\r\n%s"
            % (method, path, self._host, headers, len(body), body)
        )
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        fields: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        if status in (204, 304) or method == b"HEAD":
            return status, fields, b""
        if b"content-length" in fields:
            return status, fields, await self._reader.readexactly(int(fields[b"content-length"]))
        if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            return status, fields, await self._chunked()
        return status, fields, await self._reader.read()  # delimited by the connection's end

    async def _chunked(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await self._reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailer fields
                return b"".join(chunks)
            chunks.append((await self._reader.readexactly(size + 2))[:-2])

    def closed_by_server(self) -> bool:
        """Has the server ended this connection (uvicorn closes idle keep-alive connections)?"""
        return self._reader.at_eof() or self._writer.is_closing()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


def answer(status: int, headers: dict[bytes, bytes], body: bytes, request_id: int) -> dict[str, Any]:
    """The result of the JSON-RPC response with `request_id` in a POST's answer (JSON or SSE)."""
    if status != 200:
        raise CallFailed(f"HTTP {status}: {body[:300]!r}")
    if headers.get(b"content-type", b"").startswith(b"text/event-stream"):
        candidates = [line[5:] for line in body.split(b"\n") if line.startswith(b"data:")]
    else:
        candidates = [body]
    for data in reversed(candidates):
        if not data.strip():
            continue
        message = orjson.loads(data)
        if isinstance(message, dict) and message.get("id") == request_id:
            if "result" not in message:
                raise CallFailed(f"error answer: {body[:300]!r}")
            result: dict[str, Any] = message["result"]
            return result
    raise CallFailed(f"no response with id {request_id}: {body[:300]!r}")


class _Client:
    """POSTs to one MCP endpoint on one keep-alive connection, reopened when the server drops it."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"expected http://HOST:PORT/PATH, got {url!r}")
        self.host = parts.hostname
        self.port = parts.port
        self.path = (parts.path or "/").encode()
        self.connections_opened = 0
        self._connection: Connection | None = None
        self._headers = b"accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
        self._next_id = 0

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def _open(self) -> Connection:
        self._connection = await Connection.open(self.host, self.port)
        self.connections_opened += 1
        return self._connection

    async def _post(self, body: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        connection = self._connection
        if connection is not None and connection.closed_by_server():
            await connection.close()
            connection = None
        fresh = connection is None
        async with asyncio.timeout(TIMEOUT):
            if connection is None:
                connection = await self._open()
            try:
                return await connection.request(b"POST", self.path, self._headers, body)
            except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
                # A kept-alive connection the server closed as we wrote (uvicorn drops idle ones
                # after 5 s): nothing was read, so nothing was processed; try once more on a new one.
                if fresh or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                    raise
                await connection.close()
                connection = await self._open()
                return await connection.request(b"POST", self.path, self._headers, body)

    async def drop_connection(self) -> None:
        """Close the connection (after a failed call, whose answer may still be on its way); the
        next call opens a new one."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()


class HttpSession(_Client):
    """One handshake-era MCP session over streamable HTTP on its own connection."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.session_id: str | None = None

    async def open(self) -> None:
        """initialize, then notifications/initialized."""
        request_id = self._id()
        initialize = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "mcp-backfill-bench", "version": "0"},
            },
        }
        status, headers, body = await self._post(orjson.dumps(initialize))
        result = answer(status, headers, body, request_id)
        session_id = headers.get(b"mcp-session-id")
        if session_id is None:
            raise CallFailed("initialize answered without an Mcp-Session-Id")
        self.session_id = session_id.decode()
        version = str(result.get("protocolVersion", PROTOCOL_VERSION)).encode()
        self._headers += b"mcp-session-id: %s\r\nmcp-protocol-version: %s\r\n" % (session_id, version)
        status, _, body = await self._post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        if status != 202:
            raise CallFailed(f"notifications/initialized: HTTP {status}: {body[:300]!r}")

    async def call_echo(self, text: bytes = b"hello") -> float:
        """One `tools/call echo`; seconds from sending to holding the checked answer."""
        request_id = self._id()
        body = (
            b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":'
            b'{"text":"%s"}}}' % (request_id, text)
        )
        started = time.perf_counter()
        status, headers, raw = await self._post(body)
        result = answer(status, headers, raw, request_id)
        elapsed = time.perf_counter() - started
        if result.get("isError"):
            raise CallFailed(f"echo failed: {result}")
        return elapsed

    async def close(self) -> None:
        """DELETE the session and close the connection (errors ignored: the server may be gone)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            if self.session_id is not None:
                async with asyncio.timeout(10):
                    await connection.request(b"DELETE", self.path, self._headers)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            pass
        finally:
            self.session_id = None
            await connection.close()


class StatelessClient(_Client):
    """One 2026-07-28 MCP client on its own keep-alive connection: sessionless `tools/call`s.

    Each request carries `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers matching its
    body, and `params._meta` with the protocol version, the client's capabilities (none: it cannot
    sample) and its clientInfo, as the SDK's inbound checks (`mcp.shared.inbound`) require.
    """

    def __init__(self, url: str, name: str = "mcp-backfill-bench") -> None:
        super().__init__(url)
        self._headers += b"mcp-protocol-version: %s\r\nmcp-method: tools/call\r\nmcp-name: echo\r\n" % (
            STATELESS_VERSION.encode()
        )
        meta = orjson.dumps(
            {
                "io.modelcontextprotocol/protocolVersion": STATELESS_VERSION,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": name, "version": "0"},
            }
        )
        self._body = (
            b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":'
            b'{"text":"%s"},"_meta":' + meta.replace(b"%", b"%%") + b"}}"
        )

    async def connect(self) -> None:
        """Open the connection now (else the first call opens it)."""
        async with asyncio.timeout(TIMEOUT):
            await self._open()

    async def call_echo(self, text: bytes = b"hello") -> float:
        """One `tools/call echo`; seconds from sending to holding the checked answer."""
        request_id = self._id()
        body = self._body % (request_id, text)
        started = time.perf_counter()
        status, headers, raw = await self._post(body)
        result = answer(status, headers, raw, request_id)
        elapsed = time.perf_counter() - started
        if result.get("isError") or result.get("content") != [{"type": "text", "text": text.decode()}]:
            raise CallFailed(f"echo failed: {result}")
        return elapsed

    async def close(self) -> None:
        await self.drop_connection()
