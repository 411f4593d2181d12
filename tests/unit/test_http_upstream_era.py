"""Which era's headers each POST of the HTTP upstream carries, against an in-process fake server.

The first request that can tell picks the era; a stdio client that falls back from a refused
`server/discover` to `initialize` must end up with an ordinary handshake session.
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
STATELESS = "2026-07-28"
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": STATELESS}


class FakeServer:
    """Answers every request at once (an `initialize` opens session "s1"); records each HTTP request."""

    def __init__(self) -> None:
        self.seen: list[httpx2.Request] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.seen.append(request)
        if request.method != "POST":
            return httpx2.Response(405)
        message = orjson.loads(request.content)
        if "id" not in message or "method" not in message:
            return httpx2.Response(202)
        method = message["method"]
        headers = {}
        if method == "initialize":
            result: dict[str, Any] = {"protocolVersion": "2025-11-25", "capabilities": {}}
            headers["mcp-session-id"] = "s1"
        elif method == "server/discover":
            error = {"code": -32601, "message": "Method not found"}
            return httpx2.Response(200, json={"jsonrpc": "2.0", "id": message["id"], "error": error})
        else:
            result = {"tools": []}
        return httpx2.Response(
            200, headers=headers, json={"jsonrpc": "2.0", "id": message["id"], "result": result}
        )

    def posts(self) -> list[tuple[str, httpx2.Headers]]:
        """(JSON-RPC method, or "response", and headers) of each POST so far."""
        found = []
        for request in self.seen:
            if request.method == "POST":
                message = orjson.loads(request.content)
                found.append((message.get("method", "response"), request.headers))
        return found


@asynccontextmanager
async def upstream(server: FakeServer) -> AsyncIterator[HttpUpstream]:
    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(server.handle)) as http,
        open_http_upstream(HttpUpstreamSettings(URL, CONFIG.max_message_bytes), http) as channel,
    ):
        yield channel


def request(request_id: Any, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return jsonrpc.encode(message)


def notification(method: str, params: dict[str, Any] | None = None) -> bytes:
    return jsonrpc.encode({"jsonrpc": "2.0", "method": method, "params": params or {}})


async def answer(channel: HttpUpstream) -> dict[str, Any]:
    with anyio.fail_after(5):
        raw, _ = await channel.receive_with_origin()
    message: dict[str, Any] = orjson.loads(raw)
    return message


async def test_a_refused_discover_falls_back_to_an_ordinary_handshake_session() -> None:
    server = FakeServer()
    async with upstream(server) as channel:
        await channel.send(request(1, "server/discover", {"_meta": ENVELOPE}))
        assert (await answer(channel))["error"]["code"] == -32601
        await channel.send(request(2, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}}))
        assert (await answer(channel))["result"]["protocolVersion"] == "2025-11-25"
        assert channel.session_id == "s1"
        await channel.send(notification("notifications/initialized"))
        with anyio.fail_after(5):
            while not any(r.method == "GET" for r in server.seen):  # the standalone stream
                await anyio.sleep(0.01)
        await channel.send(request(3, "tools/list"))
        assert (await answer(channel))["id"] == 3
        await channel.send(notification("notifications/cancelled", {"requestId": 99}))
        await channel.stop(0)

    (_, discover), (_, initialize), (_, initialized), (_, listing), (cancel, cancelled) = server.posts()
    assert discover["mcp-protocol-version"] == STATELESS
    assert discover["mcp-method"] == "server/discover"
    assert "mcp-session-id" not in discover
    assert "mcp-session-id" not in initialize
    assert "mcp-protocol-version" not in initialize
    for headers in (initialized, listing, cancelled):
        assert headers["mcp-session-id"] == "s1"
        assert headers["mcp-protocol-version"] == "2025-11-25"
        assert "mcp-method" not in headers
    assert cancel == "notifications/cancelled"  # the handshake era tells the server
    assert [r.method for r in server.seen if r.method != "POST"] == ["GET", "DELETE"]
    assert server.seen[-1].headers["mcp-session-id"] == "s1"


async def test_the_stateless_era_stamps_every_post_and_never_posts_a_cancel() -> None:
    server = FakeServer()
    async with upstream(server) as channel:
        await channel.send(request(1, "tools/list", {"_meta": ENVELOPE}))
        assert (await answer(channel))["id"] == 1
        await channel.send(notification("notifications/roots/list_changed"))
        await channel.send(notification("notifications/cancelled", {"requestId": 1}))
        await channel.send(request(2, "ping"))  # declares no version: a plain POST
        assert (await answer(channel))["id"] == 2
        await channel.stop(0)

    (_, listing), (_, changed), (_, ping) = server.posts()
    assert listing["mcp-protocol-version"] == STATELESS
    assert listing["mcp-method"] == "tools/list"
    assert changed["mcp-protocol-version"] == STATELESS
    assert changed["mcp-method"] == "notifications/roots/list_changed"
    assert "mcp-protocol-version" not in ping
    assert "mcp-method" not in ping
    assert [r.method for r in server.seen] == ["POST"] * 3  # no GET stream, no DELETE


def test_the_standalone_streams_reopening_has_a_floor_and_backs_off_when_it_ends_at_once() -> None:
    from mcp_backfill.transports.http_upstream.handshake import QUICK_END_BACKOFF_LIMIT, standalone_delay

    assert standalone_delay(0.001, 0) == 0.1  # `retry: 1` is not obeyed to the millisecond
    assert standalone_delay(2.0, 0) == 2.0  # a longer one is
    assert [standalone_delay(0.1, n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.4, 0.8]
    assert standalone_delay(0.1, 16) == QUICK_END_BACKOFF_LIMIT
    assert standalone_delay(60.0, 16) == 60.0  # the server may ask for more than the limit


def test_a_retry_of_zero_is_taken_as_asked_not_as_nothing_said() -> None:
    """`retry: 0` asks for a reconnection at once: it fell back to the 1 s default (read as "no
    `retry:`"), so a server polled with it waited a second on every poll instead of the 0.1 s floor."""
    from mcp_backfill.transports.http_upstream.exchange import RETRY_FLOOR, Cursor
    from mcp_backfill.transports.http_upstream.handshake import standalone_delay

    assert Cursor().wait(1.0) == 1.0  # nothing said: the default
    assert Cursor(retry=0.0).wait(1.0) == 0.0
    assert Cursor(retry=2.5).wait(1.0) == 2.5
    assert standalone_delay(Cursor(retry=0.0).wait(1.0), 0) == RETRY_FLOOR


def test_the_standalone_streams_reopenings_are_counted_in_a_row() -> None:
    """What each count of `Reopening` means, and what starts it over."""
    from mcp_backfill.transports.http_upstream.handshake import EMPTY_RESUMPTIONS, Reopening

    reopening = Reopening(3)
    assert [reopening.failed_for_now() for _ in range(4)] == [False, False, True, False]  # said once
    assert not reopening.given_up  # an outage never gives the stream up
    assert reopening.settled(opened=True)  # open again after an outage the log named
    assert (reopening.outage, reopening.attempts) == (0, 0)
    assert [reopening.settled(opened=False) for _ in range(2)] == [False, False]
    assert not reopening.given_up
    reopening.failed_for_now()  # neither counts nor resets the attempts
    reopening.settled(opened=False)
    assert reopening.given_up
    assert [reopening.resumed_empty(True) for _ in range(EMPTY_RESUMPTIONS)][-1]
    assert reopening.empty_resumptions == 0  # the id dropped: the count starts over
    reopening.resumed_empty(True)
    assert not reopening.resumed_empty(False)
    assert reopening.empty_resumptions == 0
    assert [reopening.delay(0.1, quiet=True) for _ in range(3)] == [0.1, 0.2, 0.4]
    assert reopening.delay(0.1, quiet=False) == 0.1
    assert reopening.quick_ends == 0


def test_a_batch_of_server_requests_a_stream_brought_before_is_known_again() -> None:
    """A replayed event holding a batch (a JSON array) of the server's requests was taken again whole:
    each sampling request of it answered twice, or refused under its id while the first was answered."""
    from mcp_backfill.transports.http_upstream.exchange import SeenRequests

    def sample(request_id: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": request_id, "method": "sampling/createMessage", "params": {}}

    seen = SeenRequests()
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {}}
    assert not seen.again([sample("a"), note, sample("b")])
    assert seen.again([sample("a"), note, sample("b")])
    assert seen.again(sample("b"))
    assert not seen.again([sample("a"), sample("c")])  # one not seen yet: taken (and remembered)
    assert seen.again([sample("c")])
    assert not seen.again([note])  # no request in it: nothing to know again
    assert not seen.again([])
