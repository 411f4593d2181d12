"""npm's reference server (stdio) behind `mcp-backfill serve`, reached by SDK clients over HTTP."""

from __future__ import annotations

import pytest
from mcp import Client, types
from mcp.client.context import ClientRequestContext

from tests.fake_claude import FakeClaude, text_reply
from tests.harness import proxy_env
from tests.sidecar_harness import run_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.npm]


async def test_sampling_for_http_clients_with_and_without_sampling(
    everything: str, fake_claude: FakeClaude
) -> None:
    fake_claude.enqueue(text_reply("Sampled by the fake Claude."))
    asked: list[types.CreateMessageRequestParams] = []

    async def sample(
        context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(text="Sampled by the client."), model="client-model"
        )

    async with run_sidecar(upstream=[everything, "stdio"], env=proxy_env(fake_claude.url)) as sidecar:
        async with Client(sidecar.url, mode="legacy") as without:
            tools = {tool.name for tool in (await without.list_tools()).tools}
            assert "trigger-sampling-request" in tools
            result = await without.call_tool(
                "trigger-sampling-request", {"prompt": "Say hi", "maxTokens": 50}
            )
        [block] = result.content
        assert isinstance(block, types.TextContent)
        assert "Sampled by the fake Claude." in block.text

        # A client that samples gets the request itself (fallback mode), on its tools/call stream.
        async with Client(sidecar.url, mode="legacy", sampling_callback=sample) as with_sampling:
            result = await with_sampling.call_tool(
                "trigger-sampling-request", {"prompt": "Say hey", "maxTokens": 20}
            )
        [block] = result.content
        assert isinstance(block, types.TextContent)
        assert "Sampled by the client." in block.text
    [request] = fake_claude.message_requests
    assert request.body["max_tokens"] == 50
    [params] = asked
    assert params.max_tokens == 20
