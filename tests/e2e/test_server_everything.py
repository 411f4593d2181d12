"""npm's reference server (`@modelcontextprotocol/server-everything`, stdio) behind the proxy.

It only offers `trigger-sampling-request` to clients that declare sampling, so a client without
sampling sees the tool only through the proxy, and calling it returns what Claude (the fake) said.
"""

from __future__ import annotations

import pytest
from mcp import Client, types

from tests.fake_claude import FakeClaude, text_reply
from tests.harness import proxy_argv, proxy_env, stdio_params

pytestmark = [pytest.mark.anyio, pytest.mark.npm]


async def tool_names(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


async def test_sampling_tool_is_offered_only_through_the_proxy(
    everything: str, fake_claude: FakeClaude
) -> None:
    async with Client(stdio_params([everything, "stdio"], proxy_env()), mode="legacy") as direct:
        assert "trigger-sampling-request" not in await tool_names(direct)

    fake_claude.enqueue(text_reply("Sampled by the fake Claude."))
    argv = proxy_argv(upstream=[everything, "stdio"])
    async with Client(stdio_params(argv, proxy_env(fake_claude.url)), mode="legacy") as proxied:
        assert "trigger-sampling-request" in await tool_names(proxied)
        result = await proxied.call_tool("trigger-sampling-request", {"prompt": "Say hi", "maxTokens": 50})

    assert not result.is_error
    [block] = result.content
    assert isinstance(block, types.TextContent)
    assert "Sampled by the fake Claude." in block.text
    assert '"model": "claude-sonnet-5-5"' in block.text
    [request] = fake_claude.message_requests
    [system] = request.body["system"]  # a block, marked for prompt caching
    assert system["text"] == "You are a helpful test server."
    assert request.body["max_tokens"] == 50
    assert "temperature" not in request.body  # anthropic 2.x cannot honour it; noted in _meta instead
