"""Each request an HTTP upstream is sent gets one answer, wherever on the upstream's streams it comes.

The spec lets a server send a response on the standalone GET stream or on another request's stream
(streamable HTTP: "the server MAY ... on any stream"); the request's own stream may then end
without it. Against an in-process fake server whose streams are released by the test, step by step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import orjson
import pytest

from mcp_backfill import jsonrpc
from mcp_backfill.transports.http_upstream import HttpUpstream, HttpUpstreamSettings, open_http_upstream
from tests.defaults import CONFIG

pytestmark = pytest.mark.anyio

URL = "http://upstream.test/mcp"


def event(message: dict[str, Any]) -> bytes:
    return b"event: message\ndata: " + orjson.dumps(message) + b"\n\n"


def result(request_id: Any, **fields: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": fields}


class HeldStream(httpx2.AsyncByteStream):
    """An SSE body that gives what is `release`d to it, and ends when told to (`end`)."""

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[bytes | None](16)
        self.closed = anyio.Event()  # its reader let go of it

    def release(self, data: bytes | None) -> None:
        """`data` as the next chunk; None ends the body."""
        self._send.send_nowait(data)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._receive:
            if chunk is None:
                return
            yield chunk

    async def aclose(self) -> None:
        self._send.close()
        self.closed.set()


class FakeServer:
    """A handshake session "s1"; every other request's and the GET's SSE stream is held (`streams`)."""

    def __init__(self) -> None:
        self.streams: dict[Any, HeldStream] = {}  # by request id; "GET" for the standalone stream
        self.opened = anyio.Event()
        self.posted: list[Any] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        sse = {"content-type": "text/event-stream"}
        if request.method == "GET":
            return self._held("GET", sse)
        if request.method != "POST":
            return httpx2.Response(405)
        message = orjson.loads(request.content)
        self.posted.append(message)
        if isinstance(message, list):  # a batch: held under its first request's id
            requests = [item for item in message if "id" in item and "method" in item]
            return self._held(requests[0]["id"], sse) if requests else httpx2.Response(202)
        if "id" not in message or "method" not in message:
            return httpx2.Response(202)
        if message["method"] == "initialize":
            answer = result(message["id"], protocolVersion="2025-11-25", capabilities={})
            return httpx2.Response(200, headers={"mcp-session-id": "s1"}, json=answer)
        return self._held(message["id"], sse)

    def _held(self, key: Any, headers: dict[str, str]) -> httpx2.Response:
        stream = self.streams[key] = HeldStream()
        self.opened.set()
        self.opened = anyio.Event()
        return httpx2.Response(200, headers=headers, stream=stream)

    async def stream(self, key: Any) -> HeldStream:
        with anyio.fail_after(5):
            while key not in self.streams:
                await self.opened.wait()
        return self.streams[key]


def request(request_id: Any, method: str = "tools/call") -> bytes:
    return jsonrpc.encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": {}})


async def receive(channel: HttpUpstream) -> dict[str, Any]:
    with anyio.fail_after(5):
        raw, _ = await channel.receive_with_origin()
    message: dict[str, Any] = orjson.loads(raw)
    return message


async def everything_left(channel: HttpUpstream) -> list[dict[str, Any]]:
    """Stop the channel (its streams have ended) and take what it still had for the relay."""
    with anyio.fail_after(10):
        await channel.stop(5)
    left: list[dict[str, Any]] = []
    while True:
        try:
            raw, _ = await channel.receive_with_origin()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return left
        left.append(orjson.loads(raw))


@asynccontextmanager
async def initialized(*, finish_timeout: float) -> AsyncIterator[tuple[FakeServer, HttpUpstream, HeldStream]]:
    """An HTTP upstream channel to a `FakeServer`, its handshake done, with the GET stream the
    channel opens then (held by the server)."""
    server = FakeServer()
    settings = HttpUpstreamSettings(URL, CONFIG.max_message_bytes, finish_timeout=finish_timeout)
    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(server.handle)) as http,
        open_http_upstream(settings, http) as channel,
    ):
        await channel.send(request(1, "initialize"))
        assert (await receive(channel))["id"] == 1
        await channel.send(jsonrpc.encode({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        yield server, channel, await server.stream("GET")


@pytest.mark.parametrize("where", ["the GET stream", "another request's stream"])
async def test_an_answer_that_came_on_another_stream_is_the_requests_only_answer(where: str) -> None:
    """The answer was passed on but did not settle its request: when the request's own stream ended,
    the client got a second answer under the same id, an error saying the upstream never answered."""
    async with initialized(finish_timeout=30.0) as (server, channel, standalone):
        await channel.send(request(2))
        own = await server.stream(2)
        if where == "the GET stream":
            standalone.release(event(result(2, by="get")))
        else:
            await channel.send(request(3))
            other = await server.stream(3)
            other.release(event(result(2, by="other")) + event(result(3)))
            assert (await receive(channel))["id"] == 2
            assert (await receive(channel))["id"] == 3
            other.release(None)
        if where == "the GET stream":
            assert (await receive(channel))["id"] == 2
        own.release(None)  # the request's own stream ends without its answer
        standalone.release(None)
        assert await everything_left(channel) == []  # no second answer (an error) under id 2


async def test_an_answer_that_came_on_another_stream_lets_go_of_the_requests_own() -> None:
    """A request answered elsewhere owes nothing more on its own stream: a server that keeps that
    stream open is not waited for (its answer came, its task and connection are let go)."""
    async with initialized(finish_timeout=0.1) as (server, channel, standalone):
        await channel.send(request(2))
        own = await server.stream(2)  # never ended by the server
        standalone.release(event(result(2, by="get")))
        assert (await receive(channel))["id"] == 2
        with anyio.fail_after(5):
            await own.closed.wait()
        standalone.release(None)
        assert await everything_left(channel) == []


async def test_only_the_first_answer_to_a_request_reaches_the_client() -> None:
    """An answer that came on the GET stream, then again on the request's own stream: the client
    gets the first, once."""
    async with initialized(finish_timeout=30.0) as (server, channel, standalone):
        await channel.send(request(2))
        own = await server.stream(2)
        standalone.release(event(result(2, by="get")))
        assert await receive(channel) == result(2, by="get")
        own.release(event(result(2, by="own")))
        own.release(None)
        standalone.release(None)
        assert await everything_left(channel) == []


@pytest.mark.parametrize("with_request", [False, True])
async def test_a_cancel_in_a_client_batch_lets_go_of_the_cancelled_request(with_request: bool) -> None:
    """A `notifications/cancelled` was acted on only as a message of its own: inside a batch
    (2025-03-26 has them) the cancelled request's stream was kept for as long as the server kept it
    open, and when it ended the client was sent an error for the request it had given up on."""
    async with initialized(finish_timeout=0.1) as (server, channel, standalone):
        await channel.send(request(2))
        own = await server.stream(2)  # never ended by the server
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
        other = {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}}
        batch = [cancel, other if with_request else {"jsonrpc": "2.0", "method": "notifications/x"}]
        await channel.send(jsonrpc.encode(batch))
        with anyio.fail_after(5):
            await own.closed.wait()
        if with_request:
            third = await server.stream(3)
        assert batch in server.posted  # the server is told as well, in the batch as it came
        if with_request:
            third.release(event(result(3)))
            assert (await receive(channel))["id"] == 3
            third.release(None)
        standalone.release(None)
        assert await everything_left(channel) == []  # nothing for the cancelled request 2
