"""The HTTP upstream channel driven directly, as an HTTP front will drive one per client session.

The upstream is the real SDK server (tests/servers/sampling_server.py over uvicorn, in its own
process); the test plays the relay: it writes JSON-RPC bytes with `send()` and reads with
`receive_with_origin()`, which must name the request whose POST stream carried each message.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import anyio
import pytest

from mcp_backfill import jsonrpc
from mcp_backfill.transports.http_upstream import HttpUpstream, HttpUpstreamSettings, open_http_upstream
from tests.defaults import CONFIG
from tests.e2e.test_http_upstream import sampling_upstream
from tests.harness import initialize_params

pytestmark = pytest.mark.anyio


def request(request_id: Any, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return jsonrpc.encode(message)


async def until_response(channel: HttpUpstream, request_id: Any) -> list[tuple[Any, Any]]:
    """Every (message, origin) received up to and including the response to `request_id`."""
    seen: list[tuple[Any, Any]] = []
    with anyio.fail_after(20):
        while True:
            raw, origin = await channel.receive_with_origin()
            message = json.loads(raw)
            seen.append((message, origin))
            if message.get("id") == request_id and "method" not in message:
                return seen


async def drain(channel: HttpUpstream) -> list[tuple[Any, Any]]:
    """(origin, log data) of every message left, once the channel has stopped; raises if its stream
    does not end after them."""
    left: list[tuple[Any, Any]] = []
    with anyio.fail_after(5):
        while True:
            try:
                raw, origin = await channel.receive_with_origin()
            except anyio.EndOfStream:
                return left
            left.append((origin, json.loads(raw).get("params", {}).get("data")))


async def test_messages_are_attributed_to_the_stream_that_carried_them() -> None:
    async with (
        sampling_upstream() as upstream,
        open_http_upstream(HttpUpstreamSettings(upstream.url, CONFIG.max_message_bytes)) as channel,
    ):
        capabilities: dict[str, Any] = {"sampling": {}}
        await channel.send(request("init", "initialize", initialize_params(capabilities)))
        [(initialized, origin)] = await until_response(channel, "init")
        assert origin == "init"
        assert initialized["result"]["protocolVersion"] == "2025-11-25"
        assert channel.session_id is not None
        await channel.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

        await channel.send(request(2, "tools/call", {"name": "plain", "arguments": {"prompt": "hi"}}))
        sampling, origin = await channel.receive_with_origin()
        question = json.loads(sampling)
        assert question["method"] == "sampling/createMessage"
        assert origin == 2  # it came on the tools/call's own stream
        answer = {"role": "assistant", "content": {"type": "text", "text": "hello"}, "model": "m"}
        await channel.send(jsonrpc.encode(jsonrpc.result_response(question["id"], answer)))
        [(result, origin)] = await until_response(channel, 2)
        assert origin == 2
        assert json.loads(result["result"]["content"][0]["text"])["text"] == "hello"

        # The GET stream opens in the background; call until its broadcast shows up there.
        broadcast_origins: list[Any] = []
        for call_id in itertools.count(3):
            await channel.send(
                request(call_id, "tools/call", {"name": "announce", "arguments": {"text": "x"}})
            )
            seen = await until_response(channel, call_id)
            logs = {m["params"]["data"]: o for m, o in seen if m.get("method") == "notifications/message"}
            assert logs["on-request: x"] == call_id
            broadcast_origins += [o for data, o in logs.items() if data.startswith("broadcast")]
            if broadcast_origins:
                break
        assert broadcast_origins == [None]

        assert await channel.stop(1.0) == 0
        assert channel.session_id is None  # ended with a DELETE
        # What is left is drained, then the stream ends: at most the last call's broadcast, which
        # the GET stream may have carried after the call's own stream had answered.
        assert await drain(channel) in ([], [(None, "broadcast: x")])
        with pytest.raises(anyio.ClosedResourceError):
            await channel.send(request(99, "ping"))
