"""`python -m benchmarks.http_clients`: CPU per POST of the candidate clients for the HTTP upstream leg.

How the client of the sidecar's upstream leg was chosen (benchmarks/README.md, "the HTTP upstream
leg"). A lean keep-alive server in its own process answers every POST at once, with a JSON body
(`Content-Length`) or a one-event SSE stream (chunked), as the MCP SDK's server does; each client
sends sequential POSTs with an MCP request's headers and body and reads each answer to its end. The
figure is this process's CPU time per request (user + system), after a warm-up. Clients not
installed are skipped (`pip install aiohttp` adds that one).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from benchmarks.httpclient import Connection

BODY = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}'
ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}]}}'
HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-session-id": "bench",
    "mcp-protocol-version": "2025-11-25",
}
Post = Callable[[], Awaitable[None]]
T = TypeVar("T")
CLEANUPS: list[Callable[[], Awaitable[None]]] = []  # closes what a client opened, after its run


async def serve(port: int, sse: bool) -> None:
    """The server process: answer every POST at once, keep-alive."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.partition(b":")[2])
                await reader.readexactly(length)
                if sse:
                    event = b"event: message\r\ndata: " + ANSWER + b"\r\n\r\n"
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(event), event)
                    )
                else:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                        % (len(ANSWER), ANSWER)
                    )
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    for sock in server.sockets:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await server.serve_forever()


async def make_post(kind: str, url: str, port: int) -> Post:
    if kind == "raw asyncio (the floor)":
        connection = await Connection.open("127.0.0.1", port)
        rendered = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in HEADERS.items())

        async def raw() -> None:
            await connection.request(b"POST", b"/mcp", rendered, BODY)

        return raw
    if kind == "aiohttp":
        aiohttp = importlib.import_module("aiohttp")  # not a dependency: typed loosely
        session = aiohttp.ClientSession()
        CLEANUPS.append(session.close)

        async def via_aiohttp() -> None:
            async with session.post(url, data=BODY, headers=HEADERS) as response:
                async for _ in response.content.iter_any():
                    pass

        return via_aiohttp
    if kind == "httpcore2 pool":
        import httpcore2

        pool = httpcore2.AsyncConnectionPool()
        headers = [(k.encode(), v.encode()) for k, v in HEADERS.items()]

        async def via_httpcore() -> None:
            async with pool.stream("POST", url, headers=headers, content=BODY) as response:
                async for _ in response.aiter_stream():
                    pass

        return via_httpcore
    import httpx2

    from mcp_backfill.transports.http_upstream.http11 import Http11Transport

    lean = kind == "httpx2 + Http11Transport (the proxy's)"
    client = httpx2.AsyncClient(transport=Http11Transport() if lean else None)
    parsed = httpx2.URL(url)

    async def via_httpx() -> None:
        request = client.build_request("POST", parsed, content=BODY, headers=HEADERS)
        response = await client.send(request, stream=True)
        async for _ in response.aiter_bytes():
            pass
        await response.aclose()

    return via_httpx


CLIENTS = (
    "raw asyncio (the floor)",
    "httpx2 (httpcore2 transport)",
    "httpcore2 pool",
    "aiohttp",
    "httpx2 + Http11Transport (the proxy's)",
)


async def cpu_per_post(kind: str, port: int, count: int) -> float:
    post = await make_post(kind, f"http://127.0.0.1:{port}/mcp", port)
    for _ in range(200):
        await post()
    cpu = time.process_time()
    for _ in range(count):
        await post()
    spent = (time.process_time() - cpu) / count * 1e6
    while CLEANUPS:
        await CLEANUPS.pop()()
    return spent


def run(main: Coroutine[Any, Any, T]) -> T:
    """On uvloop where the proxy uses it (as `mcp_backfill.cli` does), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_clients", description=__doc__)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run(serve(int(args.serve[0]), args.serve[1] == "sse"))
        return 0
    print("| client | CPU per POST, JSON answer | CPU per POST, SSE answer |\n|---|---|---|")
    results: dict[str, list[str]] = {kind: [] for kind in CLIENTS}
    for answer in ("json", "sse"):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.http_clients", "--serve", str(port), answer]
        )
        try:
            time.sleep(1.0)
            for kind in CLIENTS:
                if kind == "aiohttp" and importlib.util.find_spec("aiohttp") is None:
                    results[kind].append("not installed")
                    continue
                spent = run(cpu_per_post(kind, port, args.requests))
                results[kind].append(f"{spent:.0f} µs")
        finally:
            server.terminate()
            server.wait()
    for kind, cells in results.items():
        print(f"| {kind} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
