"""Stopping either kind of upstream (`assembly.UpstreamLeg`): a child process or an HTTP session.

The order is the same for both: a stop first lets what is in flight elsewhere finish (the rounds of
requests the proxy answers itself, whose request is sent again upstream), all within one
`--shutdown-grace`, then ends the upstream; and `stop_reason` says what the requests the stop cut
short are told (None: the upstream's exit is what they are told about).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import httpx2
import orjson
import pytest

from mcp_backfill import jsonrpc
from mcp_backfill.assembly import UpstreamLeg
from mcp_backfill.transports.http_upstream import HttpUpstreamSettings, open_http_upstream
from mcp_backfill.transports.stdio import spawn_upstream
from tests.defaults import CONFIG

pytestmark = pytest.mark.anyio

URL = "http://upstream.test/mcp"
PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}
GRACE_FLAG = "--shutdown-grace / MCP_BACKFILL_SHUTDOWN_GRACE"


class Elsewhere:
    """What the relay's `drives_rounds` says: a round is under way until `done()`."""

    def __init__(self) -> None:
        self.busy = True
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.busy

    def done(self) -> None:
        self.busy = False


@asynccontextmanager
async def child() -> AsyncIterator[UpstreamLeg]:
    async with spawn_upstream(["cat"], os.environ, CONFIG.max_message_bytes, grace=5.0) as upstream:
        yield upstream


class SessionServer:
    """An HTTP upstream that opens session "s1" and answers at once; records each HTTP verb."""

    def __init__(self) -> None:
        self.verbs: list[str] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.verbs.append(request.method)
        if request.method == "DELETE":
            return httpx2.Response(200)
        message = orjson.loads(request.content)
        result = {"protocolVersion": "2025-11-25", "capabilities": {}}
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        return httpx2.Response(200, headers={"mcp-session-id": "s1"}, json=answer)


@asynccontextmanager
async def http_session(server: SessionServer) -> AsyncIterator[UpstreamLeg]:
    settings = HttpUpstreamSettings(URL, CONFIG.max_message_bytes)
    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(server.handle)) as http,
        open_http_upstream(settings, http) as upstream,
    ):
        await upstream.send(jsonrpc.encode(INITIALIZE))
        with anyio.fail_after(10):
            await upstream.receive()
        yield upstream


async def stopped_once_done(
    upstream: UpstreamLeg, grace: float, while_waiting: Callable[[], Awaitable[None]]
) -> int:
    """Stop `upstream` while something is in flight elsewhere; once the stop has asked about it,
    `while_waiting` runs, and then that something is done: the stop's exit status."""
    elsewhere = Elsewhere()
    status: list[int] = []

    async def stop() -> None:
        status.append(await upstream.stop(grace, in_flight_elsewhere=elsewhere))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop)
            while not elsewhere.asked:
                await anyio.sleep(0.01)
            await while_waiting()
            assert not status  # the stop still waits
            elsewhere.done()
    return status[0]


async def test_a_child_is_stopped_once_nothing_is_in_flight_elsewhere() -> None:
    async with child() as upstream:

        async def stdin_still_open() -> None:  # a request sent again from a round still reaches it
            await upstream.channel.send(PING)
            assert await upstream.channel.receive() == PING

        assert await stopped_once_done(upstream, 30, stdin_still_open) == 0  # `cat` saw its stdin end
        assert upstream.stop_reason is None  # requests it left are told it exited


async def test_a_child_waits_for_what_is_in_flight_elsewhere_at_most_the_grace() -> None:
    async with child() as upstream:
        with anyio.fail_after(30):
            assert await upstream.stop(0.3, in_flight_elsewhere=lambda: True) == 0
        assert upstream.stop_reason is None


async def test_an_http_session_ends_once_nothing_is_in_flight_elsewhere() -> None:
    server = SessionServer()
    async with http_session(server) as upstream:

        async def not_ended_yet() -> None:
            assert "DELETE" not in server.verbs

        assert await stopped_once_done(upstream, 30, not_ended_yet) == 0
        assert server.verbs[-1] == "DELETE"
        reason = upstream.stop_reason
        assert reason is not None
        assert f"{GRACE_FLAG} (30s)" in reason


async def test_an_http_session_waits_for_what_is_in_flight_elsewhere_at_most_the_grace() -> None:
    server = SessionServer()
    async with http_session(server) as upstream:
        with anyio.fail_after(30):
            assert await upstream.stop(0.3, in_flight_elsewhere=lambda: True) == 0
        assert server.verbs[-1] == "DELETE"
        reason = upstream.stop_reason
        assert reason is not None
        assert "shutting down" in reason
        assert f"{GRACE_FLAG} (0.3s)" in reason
