"""The example and test upstream servers, driven in-process by an SDK client that samples itself.

No proxy here: the client declares `sampling.tools` and answers with canned results, which checks
the servers on their own (the proxy's end-to-end tests rely on them behaving as documented).
"""

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ErrorData,
    SamplingCapability,
    SamplingToolsCapability,
    TextContent,
    ToolResultContent,
    ToolUseContent,
)

from tests.servers.sampling_server import server as sampling_server

SamplingResult = CreateMessageResult | CreateMessageResultWithTools | ErrorData


def load_example_server(name: str) -> MCPServer:
    """examples/ is a folder of scripts, not a package: load the module from its path."""
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    server = module.server
    assert isinstance(server, MCPServer)
    return server


weather_server = load_example_server("weather_server")

# The servers silence this warning at import, but pytest restores the warning filters after
# collection, so repeat it here.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The sampling capability is deprecated:mcp.shared.exceptions.MCPDeprecationWarning"
)


class CannedModel:
    """A sampling callback: tool_use for each of `calls` on the first round, then a text answer."""

    def __init__(self, calls: list[dict[str, Any]], answer: str = "All done.") -> None:
        self.calls = calls
        self.answer = answer
        self.requests: list[CreateMessageRequestParams] = []

    async def __call__(
        self, context: ClientRequestContext, params: CreateMessageRequestParams
    ) -> SamplingResult:
        self.requests.append(params)
        if not params.tools:
            return CreateMessageResult(
                role="assistant", model="canned", content=TextContent(text=self.answer)
            )
        last = params.messages[-1].content_as_list
        if any(isinstance(block, ToolResultContent) for block in last) or not self.calls:
            return CreateMessageResultWithTools(
                role="assistant",
                model="canned",
                stop_reason="endTurn",
                content=[TextContent(text=self.answer)],
            )
        tool = params.tools[0].name
        uses = [ToolUseContent(id=f"toolu_{i}", name=tool, input=args) for i, args in enumerate(self.calls)]
        return CreateMessageResultWithTools(
            role="assistant",
            model="canned",
            stop_reason="toolUse",
            content=[TextContent(text="Let me look that up."), *uses],
        )


def sampling_client(server: MCPServer, callback: Any) -> Client:
    return Client(
        server,
        mode="legacy",
        sampling_callback=callback,
        sampling_capabilities=SamplingCapability(tools=SamplingToolsCapability()),
    )


def text(result: CallToolResult) -> str:
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def dumped(params: CreateMessageRequestParams) -> dict[str, Any]:
    return params.model_dump(by_alias=True, exclude_none=True, mode="json")


# -- examples/weather_server.py ----------------------------------------------------------------


@pytest.mark.anyio
async def test_weather_assistant_runs_the_tool_loop() -> None:
    model = CannedModel(
        [{"city": "Paris"}, {"city": "Oslo"}, {"city": "Atlantis"}], answer="Umbrella for Paris."
    )
    async with sampling_client(weather_server, model) as client:
        result = await client.call_tool("weather_assistant", {"question": "Umbrella in Paris and Oslo?"})
    answer = text(result)
    assert answer.startswith("Umbrella for Paris.")
    assert "[2 sampling round(s); tools called: get_weather" in answer
    assert 'get_weather({"city": "Atlantis"})' in answer

    first, second = (dumped(request) for request in model.requests)
    assert first["toolChoice"] == {"mode": "auto"}
    assert first["systemPrompt"]
    assert first["tools"][0]["name"] == "get_weather"
    assert first["tools"][0]["inputSchema"]["required"] == ["city"]
    assert first["messages"] == [
        {"role": "user", "content": {"type": "text", "text": "Umbrella in Paris and Oslo?"}}
    ]

    assistant, user = second["messages"][1:]
    assert assistant["role"] == "assistant"
    assert [block["type"] for block in assistant["content"]] == ["text", "tool_use", "tool_use", "tool_use"]
    assert user["role"] == "user"
    results = user["content"]
    assert [block["toolUseId"] for block in results] == ["toolu_0", "toolu_1", "toolu_2"]
    assert all(block["type"] == "tool_result" and block["isError"] is False for block in results)
    assert results[0]["structuredContent"] == {
        "city": "Paris",
        "sky": "light rain",
        "temp_c": 14,
        "rain_chance": 80,
    }
    assert results[0]["content"] == [{"type": "text", "text": "Paris: light rain, 14°C, 80% chance of rain"}]
    assert results[2]["structuredContent"]["city"] == "Atlantis"  # unknown city: deterministic fake value


@pytest.mark.anyio
async def test_weather_assistant_stops_at_the_round_cap() -> None:
    async def always_tools(
        context: ClientRequestContext, params: CreateMessageRequestParams
    ) -> SamplingResult:
        return CreateMessageResultWithTools(
            role="assistant",
            model="canned",
            stop_reason="toolUse",
            content=ToolUseContent(
                id=f"toolu_{len(params.messages)}", name="get_weather", input={"city": "Oslo"}
            ),
        )

    async with sampling_client(weather_server, always_tools) as client:
        answer = text(await client.call_tool("weather_assistant", {"question": "Oslo?"}))
    assert answer.startswith("(no final answer after 5 rounds)")


@pytest.mark.anyio
async def test_weather_assistant_forces_text_on_the_last_round() -> None:
    modes: list[str | None] = []

    async def stubborn(context: ClientRequestContext, params: CreateMessageRequestParams) -> SamplingResult:
        modes.append(params.tool_choice.mode if params.tool_choice else None)
        if params.tool_choice is not None and params.tool_choice.mode == "none":
            return CreateMessageResultWithTools(
                role="assistant", model="canned", content=TextContent(text="Fine.")
            )
        call = ToolUseContent(id=f"toolu_{len(modes)}", name="get_weather", input={"town": "Oslo"})
        return CreateMessageResultWithTools(
            role="assistant", model="canned", stop_reason="toolUse", content=[call]
        )

    async with sampling_client(weather_server, stubborn) as client:
        answer = text(await client.call_tool("weather_assistant", {"question": "Oslo?"}))
    assert modes == ["auto", "auto", "auto", "auto", "none"]
    assert answer.startswith("Fine.")


@pytest.mark.anyio
async def test_weather_bad_tool_input_is_reported_as_a_tool_error() -> None:
    model = CannedModel([{"town": "Oslo"}])
    async with sampling_client(weather_server, model) as client:
        text(await client.call_tool("weather_assistant", {"question": "Oslo?"}))
    tool_result = dumped(model.requests[1])["messages"][-1]["content"][0]
    assert tool_result["isError"] is True
    assert "structuredContent" not in tool_result


@pytest.mark.anyio
async def test_summarize_is_plain_sampling() -> None:
    model = CannedModel([], answer="A proxy that samples.")
    async with sampling_client(weather_server, model) as client:
        assert text(await client.call_tool("summarize", {"text": "long text"})) == "A proxy that samples."
    (request,) = model.requests
    assert request.tools is None
    assert request.tool_choice is None
    assert dumped(request)["messages"][0]["content"]["text"].endswith("long text")


@pytest.mark.anyio
async def test_weather_needs_a_client_with_sampling_tools() -> None:
    """What a client without sampling sees when there is no mcp-backfill in between."""
    async with Client(weather_server, mode="legacy") as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("weather_assistant", {"question": "Oslo?"})
    assert caught.value.code == -32602


# -- tests/servers/sampling_server.py ------------------------------------------------------------


@pytest.mark.anyio
async def test_loop_reports_every_round() -> None:
    model = CannedModel([{"key": "alpha"}, {"key": "fail"}, {"key": "zeta"}], answer="alpha is 1")
    async with sampling_client(sampling_server, model) as client:
        tool_names = {tool.name for tool in (await client.list_tools()).tools}
        report = json.loads(text(await client.call_tool("loop", {"question": "What is alpha?"})))
    assert {"loop", "plain", "sample_raw", "slow_sample"} <= tool_names
    assert report["completed"] is True
    assert report["finalText"] == "alpha is 1"
    first, second = report["rounds"]
    assert first["stopReason"] == "toolUse"
    assert first["model"] == "canned"
    assert first["blockTypes"] == ["text", "tool_use", "tool_use", "tool_use"]
    assert first["toolUseIds"] == ["toolu_0", "toolu_1", "toolu_2"]
    assert first["toolCalls"][0] == {"id": "toolu_0", "name": "lookup", "input": {"key": "alpha"}}
    assert second["blockTypes"] == ["text"]
    assert second["toolUseIds"] == []

    results = dumped(model.requests[1])["messages"][-1]["content"]
    assert results[0]["structuredContent"] == {"key": "alpha", "value": "1", "found": True}
    assert results[0]["isError"] is False
    assert results[1]["isError"] is True
    assert results[2]["structuredContent"] == {"key": "zeta", "value": "value-of-zeta", "found": False}


@pytest.mark.anyio
async def test_loop_round_cap_and_tool_choice() -> None:
    model = CannedModel([{"key": "beta"}])
    async with sampling_client(sampling_server, model) as client:
        capped = json.loads(text(await client.call_tool("loop", {"question": "beta?", "rounds": 1})))
        await client.call_tool("loop", {"question": "beta?", "tool_choice": "required"})
    assert len(capped["rounds"]) == 1
    assert capped["rounds"][0]["stopReason"] == "toolUse"
    assert capped["finalText"] is None
    assert capped["completed"] is False
    assert model.requests[-1].tool_choice is not None
    assert model.requests[-1].tool_choice.mode == "required"


@pytest.mark.anyio
async def test_plain_returns_text_model_and_stop_reason() -> None:
    async def model(context: ClientRequestContext, params: CreateMessageRequestParams) -> SamplingResult:
        assert params.max_tokens == 7
        return CreateMessageResult(
            role="assistant",
            model="canned-1",
            stop_reason="maxTokens",
            content=TextContent(text="Hello"),
            _meta={"usage": {"output_tokens": 7}},
        )

    async with sampling_client(sampling_server, model) as client:
        reply = json.loads(text(await client.call_tool("plain", {"prompt": "Hi", "max_tokens": 7})))
    assert reply == {
        "text": "Hello",
        "contentType": "text",
        "model": "canned-1",
        "stopReason": "maxTokens",
        "meta": {"usage": {"output_tokens": 7}},
    }


@pytest.mark.anyio
async def test_sample_raw_sends_params_verbatim_and_returns_the_raw_result() -> None:
    model = CannedModel([], answer="raw answer")
    params = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "maxTokens": 5,
        "metadata": {"user_id": "u1"},
    }
    async with sampling_client(sampling_server, model) as client:
        reply = json.loads(text(await client.call_tool("sample_raw", {"params_json": json.dumps(params)})))
    assert reply == {
        "result": {"role": "assistant", "model": "canned", "content": {"type": "text", "text": "raw answer"}}
    }
    assert dumped(model.requests[0]) == params


@pytest.mark.anyio
async def test_sample_raw_returns_client_errors() -> None:
    async def refuse(context: ClientRequestContext, params: CreateMessageRequestParams) -> SamplingResult:
        return ErrorData(code=-32602, message="maxTokens too large", data={"limit": "max_tokens"})

    async with sampling_client(sampling_server, refuse) as client:
        refused = json.loads(
            text(await client.call_tool("sample_raw", {"params_json": '{"messages": [], "maxTokens": 9}'}))
        )
        invalid = json.loads(
            text(await client.call_tool("sample_raw", {"params_json": '{"maxTokens": "x"}'}))
        )
    assert refused == {
        "error": {"code": -32602, "message": "maxTokens too large", "data": {"limit": "max_tokens"}}
    }
    assert invalid["error"]["code"] == -32602  # rejected by the SDK client's own params validation


def slow_model(cancelled: anyio.Event, started: anyio.Event | None = None) -> Callable[..., Any]:
    async def model(context: ClientRequestContext, params: CreateMessageRequestParams) -> SamplingResult:
        if started is not None:
            started.set()
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        raise AssertionError("the sampling request should have been cancelled")

    return model


@pytest.mark.anyio
async def test_slow_sample_times_out_and_cancels_the_sampling_request() -> None:
    cancelled = anyio.Event()
    async with sampling_client(sampling_server, slow_model(cancelled)) as client:
        with anyio.fail_after(10):
            reply = json.loads(text(await client.call_tool("slow_sample", {"cancel_after": 0.2})))
            await cancelled.wait()  # notifications/cancelled reached the client and stopped its callback
    assert reply["outcome"] == "timed_out"
    assert reply["error"]["code"] == -32001
    assert reply["samplingRequestId"].startswith("slow-sample-")
    assert reply["cancelAfter"] == 0.2
    assert 0.2 <= reply["elapsed"] < 5


@pytest.mark.anyio
async def test_slow_sample_completes_when_the_answer_is_fast() -> None:
    async with sampling_client(sampling_server, CannedModel([], answer="quick")) as client:
        reply = json.loads(text(await client.call_tool("slow_sample", {"cancel_after": 5})))
    assert reply["outcome"] == "completed"
    assert reply["result"]["content"] == {"type": "text", "text": "quick"}


@pytest.mark.anyio
async def test_cancelling_the_tool_call_cancels_the_sampling_request() -> None:
    cancelled, started = anyio.Event(), anyio.Event()
    async with sampling_client(sampling_server, slow_model(cancelled, started)) as client:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "slow_sample", {"cancel_after": 60})
                await started.wait()
                tg.cancel_scope.cancel()  # the client abandons tools/call and sends notifications/cancelled
            await cancelled.wait()
