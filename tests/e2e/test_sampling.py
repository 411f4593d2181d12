"""Sampling answered by the proxy, end to end through real processes and the fake Claude API.

client (mcp SDK, no sampling callback) -> `python -m mcp_backfill` -> tests/servers/sampling_server.py
                                                 \\-> fake Claude (loopback HTTP, ANTHROPIC_BASE_URL)
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from mcp import Client, types

from tests.fake_claude import (
    FakeClaude,
    error_reply,
    hang_reply,
    stream_error_reply,
    text_reply,
    tool_use_reply,
)
from tests.harness import (
    TEST_API_KEY,
    initialize_params,
    proxy_argv,
    proxy_env,
    python_server,
    raw_proxy,
    stdio_params,
    tool_json,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")


def client_for(fake: FakeClaude, *options: str, **client_kwargs: Any) -> Client:
    argv = proxy_argv("--log-level", "debug", *options, upstream=SAMPLING_SERVER)
    return Client(stdio_params(argv, proxy_env(fake.url)), mode="legacy", **client_kwargs)


async def test_two_round_tool_loop(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        tool_use_reply("lookup", {"key": "alpha"}, id="toolu_round1", text="Let me look that up."),
        text_reply("alpha is the first letter."),
    )
    async with client_for(fake_claude) as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert "loop" in tools
        outcome = tool_json(
            await client.call_tool(
                "loop", {"question": "What is alpha?", "rounds": 3, "tool_choice": "required"}
            )
        )

    assert outcome["completed"] is True
    assert outcome["finalText"] == "alpha is the first letter."
    first, second = outcome["rounds"]
    assert first["stopReason"] == "toolUse"
    assert first["blockTypes"] == ["text", "tool_use"]
    assert first["toolCalls"] == [{"id": "toolu_round1", "name": "lookup", "input": {"key": "alpha"}}]
    assert second["stopReason"] == "endTurn"
    usage = second["meta"]["io.github.mcp-backfill/claude"]["usage"]
    assert usage["output_tokens"] > 0

    bodies = [request.body for request in fake_claude.message_requests]
    assert len(bodies) == 2
    for body in bodies:
        assert body["stream"] is True
        # Prompt caching (on by default) sends the system prompt as a block marked cache_control.
        assert body["system"] == [
            {
                "type": "text",
                "text": "Answer using the lookup tool when a key is mentioned.",
                "cache_control": {"type": "ephemeral"},
            }
        ]
        assert body["max_tokens"] == 500
        assert body["tool_choice"] == {"type": "any"}
        [tool] = body["tools"]
        assert tool["name"] == "lookup"
        assert tool["cache_control"] == {"type": "ephemeral"}
        assert tool["input_schema"]["properties"]["key"]["type"] == "string"
        assert "inputSchema" not in tool
    follow_up = bodies[1]["messages"]
    assert [m["role"] for m in follow_up] == ["user", "assistant", "user"]
    assert follow_up[1]["content"][1] == {
        "type": "tool_use",
        "id": "toolu_round1",
        "name": "lookup",
        "input": {"key": "alpha"},
    }
    [tool_result] = follow_up[2]["content"]
    assert tool_result["type"] == "tool_result"
    assert tool_result["tool_use_id"] == "toolu_round1"
    assert tool_result.get("is_error", False) is False
    texts = [block["text"] for block in tool_result["content"] if block["type"] == "text"]
    assert any('"found"' in text for text in texts)  # structuredContent travelled as JSON text


async def test_key_is_sent_as_bearer_and_nowhere_else(fake_claude: FakeClaude) -> None:
    async with client_for(fake_claude) as client:
        outcome = tool_json(await client.call_tool("plain", {"prompt": "hello"}))
    assert outcome["contentType"] == "text"
    assert outcome["text"].startswith("fake-claude says")
    [request] = fake_claude.message_requests
    assert request.headers["authorization"] == f"Bearer {TEST_API_KEY}"
    assert TEST_API_KEY not in json.dumps(outcome)


@pytest.mark.parametrize("api_keep_alive", [60.0, 2.0])
async def test_sampling_requests_seconds_apart_reuse_the_api_connection(api_keep_alive: float) -> None:
    """Two sampling requests 6 s apart, past httpx2's own 5 s keep-alive: the second goes over a
    connection already open while the API keeps it open; a connection the API closed meanwhile is
    replaced, without an error."""
    with FakeClaude(api_key=TEST_API_KEY, keep_alive=api_keep_alive) as fake:
        async with client_for(fake) as client:
            for prompt in ("one", "two"):
                if prompt == "two":
                    await anyio.sleep(6)
                outcome = tool_json(await client.call_tool("plain", {"prompt": prompt}))
                assert outcome["text"].startswith("fake-claude says"), outcome
        *earlier, second = fake.requests  # the warm-up's HEAD that opened a connection among them
    assert second == fake.message_requests[1]
    assert second.peer is not None
    assert (second.peer in {r.peer for r in earlier}) is (api_keep_alive > 6)


async def test_plain_sampling_returns_a_single_block(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("one"), text_reply("two"))
    async with client_for(fake_claude) as client:
        first = tool_json(await client.call_tool("plain", {"prompt": "say one", "max_tokens": 1_000_000}))
        second = tool_json(await client.call_tool("plain", {"prompt": "say two"}))
    assert (first["text"], first["stopReason"]) == ("one", "endTurn")
    assert second["text"] == "two"
    bodies = [r.body for r in fake_claude.message_requests]
    assert bodies[0]["max_tokens"] == 16384  # clamped by --max-tokens-cap's default
    assert "tools" not in bodies[0]
    assert first["meta"]["io.github.mcp-backfill/claude"]["warnings"]


async def test_model_preferences_choose_among_allowed_models(fake_claude: FakeClaude) -> None:
    params = {
        "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
        "maxTokens": 10,
        "modelPreferences": {"hints": [{"name": "haiku"}]},
    }
    async with client_for(fake_claude, "--allowed-models", "claude-sonnet-5-5,claude-haiku-5-5") as client:
        outcome = tool_json(await client.call_tool("sample_raw", {"params_json": json.dumps(params)}))
    assert outcome["result"]["model"] == "claude-haiku-5-5"
    assert fake_claude.message_requests[0].body["model"] == "claude-haiku-5-5"


INVALID_REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    ("empty messages", {"messages": [], "maxTokens": 10}, "messages"),
    (
        "maxTokens zero",
        {"messages": [{"role": "user", "content": {"type": "text", "text": "x"}}], "maxTokens": 0},
        "maxTokens",
    ),
    (
        "tool result mixed with text",
        {
            "messages": [
                {"role": "user", "content": {"type": "text", "text": "q"}},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "toolUseId": "t1", "content": []},
                        {"type": "text", "text": "and more"},
                    ],
                },
            ],
            "maxTokens": 10,
            "tools": [{"name": "f", "inputSchema": {"type": "object"}}],
        },
        "mixed",
    ),
    (
        "tool result missing",
        {
            "messages": [
                {"role": "user", "content": {"type": "text", "text": "q"}},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {"role": "user", "content": {"type": "text", "text": "no result"}},
            ],
            "maxTokens": 10,
            "tools": [{"name": "f", "inputSchema": {"type": "object"}}],
        },
        "missing",
    ),
    (
        "unknown tool_use id",
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "toolUseId": "nope", "content": []}]},
            ],
            "maxTokens": 10,
            "tools": [{"name": "f", "inputSchema": {"type": "object"}}],
        },
        "nope",
    ),
    (
        "required without tools",
        {
            "messages": [{"role": "user", "content": {"type": "text", "text": "x"}}],
            "maxTokens": 10,
            "toolChoice": {"mode": "required"},
        },
        "required",
    ),
    (
        "audio rejected by default",
        {
            "messages": [
                {"role": "user", "content": {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}}
            ],
            "maxTokens": 10,
        },
        "--audio placeholder",
    ),
]


@pytest.mark.parametrize(("case", "params", "needle"), INVALID_REQUESTS, ids=[c[0] for c in INVALID_REQUESTS])
async def test_invalid_requests_get_32602_without_an_api_call(
    fake_claude: FakeClaude, case: str, params: dict[str, Any], needle: str
) -> None:
    async with client_for(fake_claude) as client:
        outcome = tool_json(await client.call_tool("sample_raw", {"params_json": json.dumps(params)}))
    assert "error" in outcome, outcome
    assert outcome["error"]["code"] == -32602
    assert needle.lower() in outcome["error"]["message"].lower()
    assert fake_claude.message_requests == []


@pytest.mark.parametrize(
    ("replies", "code", "status", "error_type"),
    [
        (
            [error_reply(400, "invalid_request_error", "prompt is too long")],
            -32602,
            400,
            "invalid_request_error",
        ),
        (
            [error_reply(401, "authentication_error", "invalid x-api-key")],
            -32603,
            401,
            "authentication_error",
        ),
        (
            [error_reply(429, "rate_limit_error", "Rate limited", retry_after=0)] * 3,
            -32603,
            429,
            "rate_limit_error",
        ),
        ([error_reply(529, "overloaded_error", "Overloaded")] * 3, -32603, 529, "overloaded_error"),
        ([stream_error_reply("overloaded_error", "Overloaded")] * 3, -32603, 200, "overloaded_error"),
    ],
    ids=["400", "401", "429-after-retries", "529-after-retries", "mid-stream"],
)
async def test_api_errors_are_mapped(
    fake_claude: FakeClaude, replies: list[Any], code: int, status: int, error_type: str
) -> None:
    fake_claude.enqueue(*replies)
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "x"}}], "maxTokens": 10}
    async with client_for(fake_claude, "--retry-max-attempts", "3", "--retry-base-delay", "0") as client:
        outcome = tool_json(await client.call_tool("sample_raw", {"params_json": json.dumps(params)}))
        # The relay keeps working after an API failure.
        fine = tool_json(await client.call_tool("plain", {"prompt": "still there?"}))
    error = outcome["error"]
    assert error["code"] == code
    assert error["data"]["status"] == status
    assert error["data"]["type"] == error_type
    assert error["data"]["attempts"] == len(replies)  # retryable ones were retried up to the limit
    assert TEST_API_KEY not in json.dumps(error)
    assert fine["text"].startswith("fake-claude says")


async def test_server_cancellation_closes_the_claude_stream(fake_claude: FakeClaude) -> None:
    """The server gives up on a sampling request: the Claude stream closes, the client sees nothing."""
    argv = proxy_argv("--log-level", "debug", upstream=SAMPLING_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await session.request(1, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        # Warm up first: the server's 5 s must not also cover building the Claude client.
        warm = await session.request(9, "tools/call", {"name": "plain", "arguments": {"prompt": "warm"}})
        assert "result" in warm
        fake_claude.reset()
        fake_claude.enqueue(hang_reply())
        call = {"name": "slow_sample", "arguments": {"cancel_after": 5.0}}
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        response, seen = await session.recv_until(lambda m: m.get("id") == 2, timeout=30)
        assert await fake_claude.await_disconnects(1, timeout=10)
        after = await session.request(3, "tools/call", {"name": "plain", "arguments": {"prompt": "next"}})
    outcome = json.loads(response["result"]["content"][0]["text"])
    assert outcome["outcome"] == "timed_out"
    assert [m.get("method") for m in seen if "method" in m] == []  # neither the request nor its cancel
    assert json.loads(after["result"]["content"][0]["text"])["text"].startswith("fake-claude says")


async def test_fallback_client_with_sampling_tools_answers_itself(fake_claude: FakeClaude) -> None:
    asked: list[types.CreateMessageRequestParams] = []

    async def sampling_callback(context: Any, params: types.CreateMessageRequestParams) -> Any:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(text="from the client"), model="client-model"
        )

    capabilities = types.SamplingCapability(tools=types.SamplingToolsCapability())
    async with client_for(
        fake_claude, sampling_callback=sampling_callback, sampling_capabilities=capabilities
    ) as client:
        outcome = tool_json(await client.call_tool("loop", {"question": "q", "rounds": 1}))
    assert outcome["finalText"] == "from the client"
    assert len(asked) == 1
    assert asked[0].tools is not None
    assert fake_claude.message_requests == []


async def test_fallback_client_without_tools_support_gets_only_plain_requests(
    fake_claude: FakeClaude,
) -> None:
    asked: list[types.CreateMessageRequestParams] = []

    async def sampling_callback(context: Any, params: types.CreateMessageRequestParams) -> Any:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(text="plain from client"), model="client-model"
        )

    async with client_for(fake_claude, sampling_callback=sampling_callback) as client:
        plain = tool_json(await client.call_tool("plain", {"prompt": "p"}))
        looped = tool_json(await client.call_tool("loop", {"question": "q", "rounds": 1}))
    assert plain["text"] == "plain from client"
    assert len(asked) == 1  # the tools request went to Claude instead
    assert looped["rounds"][0]["model"] == "claude-sonnet-5-5"
    assert len(fake_claude.message_requests) == 1


async def test_always_mode_never_asks_the_client(fake_claude: FakeClaude) -> None:
    asked: list[Any] = []

    async def sampling_callback(context: Any, params: types.CreateMessageRequestParams) -> Any:
        asked.append(params)
        raise AssertionError("the client must not be asked in --mode always")

    capabilities = types.SamplingCapability(tools=types.SamplingToolsCapability())
    fake_claude.enqueue(text_reply("from claude"))
    async with client_for(
        fake_claude,
        "--mode",
        "always",
        sampling_callback=sampling_callback,
        sampling_capabilities=capabilities,
    ) as client:
        outcome = tool_json(await client.call_tool("plain", {"prompt": "p"}))
    assert outcome["text"] == "from claude"
    assert asked == []


# A tool the request offers (`kept`) and one only its history names (`gone`: a placeholder for Claude).
ONE_TOOL_BESIDE_A_PLACEHOLDER = {
    "messages": [
        {"role": "user", "content": {"type": "text", "text": "weather?"}},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "gone", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "toolUseId": "a", "content": []}]},
    ],
    "maxTokens": 10,
    "tools": [{"name": "kept", "inputSchema": {"type": "object"}}],
    "toolChoice": {"mode": "required"},
}


async def test_claude_calling_a_tool_only_the_history_names_is_an_error_naming_it(
    fake_claude: FakeClaude,
) -> None:
    """The request offers `kept`; `gone` is only in the history, so Claude gets a placeholder for it.
    A call of it is not handed to the server (a tool call MUST name one of the request's tools)."""
    fake_claude.enqueue(tool_use_reply("gone", {"city": "Rome"}, id="toolu_again"))
    params = ONE_TOOL_BESIDE_A_PLACEHOLDER
    async with client_for(fake_claude) as client:
        outcome = tool_json(await client.call_tool("sample_raw", {"params_json": json.dumps(params)}))
    assert "result" not in outcome
    error = outcome["error"]
    assert error["code"] == -32603
    assert '"gone"' in error["message"]
    assert error["data"] == {"tool": "gone", "reason": "tool_not_offered"}
    sent = fake_claude.message_requests[-1].body
    assert [tool["name"] for tool in sent["tools"]] == ["kept", "gone"]


async def test_required_with_one_tool_offered_beside_a_placeholder_asks_claude_for_that_tool(
    fake_claude: FakeClaude,
) -> None:
    """`required` became `{"type": "any"}`, which let Claude pick the placeholder of a tool only the
    history names, an answer refused after it was charged: with one tool offered, Claude is told to
    call that one."""
    fake_claude.enqueue(tool_use_reply("kept", {"city": "Rome"}, id="toolu_kept"))
    params = ONE_TOOL_BESIDE_A_PLACEHOLDER
    async with client_for(fake_claude) as client:
        outcome = tool_json(await client.call_tool("sample_raw", {"params_json": json.dumps(params)}))
    sent = fake_claude.message_requests[-1].body
    assert [tool["name"] for tool in sent["tools"]] == ["kept", "gone"]
    assert sent["tool_choice"] == {"type": "tool", "name": "kept"}
    assert outcome["result"]["content"][0]["name"] == "kept", outcome


ECHO_SERVER = python_server("echo_server.py")


async def test_a_lone_surrogate_in_the_request_reaches_claude_as_a_replacement_character(
    fake_claude: FakeClaude,
) -> None:
    """JSON lets a string hold half a surrogate pair as an escape (`"\\ud83d"`): a JavaScript server
    that cuts a tool's output at a length, splitting an emoji, sends one. Claude's body is UTF-8,
    which has no form for it: the whole request failed with -32603 (`UnicodeEncodeError` in the
    client). Each is sent as U+FFFD, said in the log, and the rest goes as written."""
    tool = {"name": "t", "description": "pick \ud83d", "inputSchema": {"type": "object"}}
    loop = [
        {"role": "user", "content": {"type": "text", "text": "cut \ud83d here, whole \U0001f600"}},
        {
            "role": "assistant",
            "content": {"type": "tool_use", "id": "c1", "name": "t", "input": {"q": "\udc00"}},
        },
        {
            "role": "user",
            "content": {
                "type": "tool_result",
                "toolUseId": "c1",
                "content": [{"type": "text", "text": "r\ud83d"}],
            },
        },
    ]
    sampling = {
        "method": "sampling/createMessage",
        "id": "s1",
        "params": {"messages": loop, "maxTokens": 20, "tools": [tool], "systemPrompt": "sys \udfff"},
    }
    async with raw_proxy(proxy_argv(upstream=ECHO_SERVER), proxy_env(fake_claude.url)) as session:
        await session.request(1, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/ask_client", "params": sampling})
        response, _ = await session.recv_until(lambda m: m.get("id") == 2, timeout=30)
        logged = session.stderr()
    answer = response["result"]["client_response"]
    assert "result" in answer, answer
    assert "lone surrogates in a sampling request sent to Claude as U+FFFD" in logged
    [request] = fake_claude.message_requests
    sent = request.body
    assert sent["messages"][0]["content"][0]["text"] == "cut \ufffd here, whole \U0001f600"
    assert sent["messages"][1]["content"][0]["input"] == {"q": "\ufffd"}
    assert sent["messages"][2]["content"][0]["content"][0]["text"] == "r\ufffd"
    assert sent["tools"][0]["description"] == "pick \ufffd"
    assert "sys \ufffd" in json.dumps(sent["system"], ensure_ascii=False)
    assert answer["result"]["content"][0]["type"] == "text"
