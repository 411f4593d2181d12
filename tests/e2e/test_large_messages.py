"""Large messages through the real proxy.

Responses of 64 KiB or more are routed by the id in their first bytes, without decoding the whole
message (the relay's fast path for big tool results). These tests pin down what must not change
with it: such a response reaches the client byte for byte under the right id, whatever the id's
type; the request it answers is finished with (its id can be reused); and a large result that the
proxy has to act on, a 2026-07-28 `input_required` round, is still driven by the proxy instead of
being passed through.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.e2e.test_stateless_era import LOWLEVEL_SERVER, MODERN
from tests.fake_claude import FakeClaude, text_reply
from tests.harness import (
    initialize_params,
    proxy_argv,
    proxy_env,
    python_server,
    raw_proxy,
    stdio_params,
    tool_json,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ECHO = python_server("echo_server.py")
# Quotes, backslashes, newlines and non-ASCII text: what a JSON document returned as text holds.
BIG_TEXT = ('{"row": "caf\u00e9 \\u00e9 \\"quoted\\"", "emoji": "\U0001f600"}\n' * 6000)[:300_000]


def first_difference(actual: bytes, expected: bytes) -> str | None:
    """Where two long lines part, with a little context (pytest's own diff of them is unreadable)."""
    if actual == expected:
        return None
    at = next((i for i, (a, b) in enumerate(zip(actual, expected, strict=False)) if a != b), None)
    at = min(len(actual), len(expected)) if at is None else at
    around = slice(max(at - 40, 0), at + 40)
    return f"lengths {len(actual)}/{len(expected)}, at {at}: {actual[around]!r} vs {expected[around]!r}"


@pytest.mark.parametrize("request_id", [7, "str-id-\u00e9", 0, 2**53 + 1])
async def test_a_large_response_arrives_byte_for_byte_under_its_id(request_id: Any) -> None:
    argv = proxy_argv("--provider", "mock", upstream=ECHO)
    async with raw_proxy(argv, proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        request = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": BIG_TEXT}},
        }
        await session.send(request)
        line = await session.read_line()
        while json.loads(line).get("method") == "notifications/echo":  # the echo of `initialized`
            line = await session.read_line()
        # The echo server answers {"echo": <the request as received>} in compact JSON, unescaped.
        expected = json.dumps(
            {"jsonrpc": "2.0", "id": request_id, "result": {"echo": request}},
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
        assert len(line) > 64 * 1024
        assert first_difference(line, expected) is None
        # The request is finished with: the same id works again, for a small answer this time.
        again = await session.request(request_id, "ping")
        assert again["result"]["echo"]["method"] == "ping"
        assert "too large" not in session.stderr()


async def test_many_requests_in_flight_each_arrive_whole_and_in_order() -> None:
    """Sixty pipelined calls, large and small, keep the proxy's pipes crowded and slow to write (its
    writer threads take over then: `transports/pipe_writer.py`); every answer arrives whole, in the
    order the upstream gave them."""
    argv = proxy_argv("--provider", "mock", upstream=ECHO)
    requests = [
        {
            "jsonrpc": "2.0",
            "id": n,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": BIG_TEXT if n % 4 == 0 else f"small {n}"}},
        }
        for n in range(100, 160)
    ]
    async with raw_proxy(argv, proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        lines: list[bytes] = []

        async def read_answers() -> None:
            while len(lines) < len(requests):
                line = await session.read_line(timeout=60)
                if json.loads(line).get("method") != "notifications/echo":
                    lines.append(line)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_answers)
            for request in requests:
                await session.send(request)
    for line, request in zip(lines, requests, strict=True):
        expected = json.dumps(
            {"jsonrpc": "2.0", "id": request["id"], "result": {"echo": request}},
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
        assert first_difference(line, expected) is None


async def test_a_large_input_required_round_is_driven_by_the_proxy(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply(BIG_TEXT))  # a large final result, too
    argv = proxy_argv(upstream=LOWLEVEL_SERVER)
    async with Client(stdio_params(argv, proxy_env(fake_claude.url))) as client:
        assert client.protocol_version == MODERN
        outcome = tool_json(await client.call_tool("plain", {"prompt": BIG_TEXT}))
    assert outcome["text"] == BIG_TEXT
    (request,) = fake_claude.message_requests
    assert request.body["messages"][0]["content"][0]["text"] == BIG_TEXT
