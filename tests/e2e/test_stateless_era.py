"""Protocol 2026-07-28 through the real proxy: per-request capabilities and `input_required` sampling.

client (mcp SDK, default auto mode -> 2026-07-28) -> `python -m mcp_backfill` -> an SDK server that
asks for sampling inside `input_required` results -> the proxy answers with the fake Claude API.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types
from mcp.shared.exceptions import MCPError

from mcp_backfill.relay.progress import ROUND_PROGRESS_INTERVAL
from tests.fake_claude import FakeClaude, error_reply, hang_reply, text_reply, tool_use_reply
from tests.harness import (
    ProgressHeard,
    assert_kept_informed_while_sampling,
    proxy_argv,
    proxy_env,
    python_server,
    raw_proxy,
    stdio_params,
    tool_json,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

MODERN = "2026-07-28"
RESOLVE_SERVER = python_server("resolve_server.py")
LOWLEVEL_SERVER = python_server("input_required_server.py")


def client_for(fake: FakeClaude, upstream: list[str], *options: str, **client_kwargs: Any) -> Client:
    argv = proxy_argv("--log-level", "debug", *options, upstream=upstream)
    return Client(stdio_params(argv, proxy_env(fake.url)), **client_kwargs)


def tool_use_ids(body: dict[str, Any], kind: str) -> list[str]:
    key = "id" if kind == "tool_use" else "tool_use_id"
    return [
        block[key]
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == kind
    ]


async def test_resolve_tool_loop_for_a_2026_client_without_sampling(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        tool_use_reply("get_weather", {"city": "Paris"}, id="toolu_paris", text="Checking."),
        text_reply("Sunny and 21C in Paris."),
    )
    async with client_for(fake_claude, RESOLVE_SERVER) as client:
        assert client.protocol_version == MODERN
        outcome = tool_json(await client.call_tool("weather", {"city": "Paris"}))

    assert outcome == {
        "first": {"stopReason": "toolUse", "toolUseIds": ["toolu_paris"]},
        "final": {
            "stopReason": "endTurn",
            "text": "Sunny and 21C in Paris.",
            "model": outcome["final"]["model"],
        },
        "rounds": 2,
    }
    first, second = (request.body for request in fake_claude.message_requests)
    for body in (first, second):
        system = body["system"]
        assert [block["text"] for block in system] == ["You are a weather assistant. Use get_weather."]
        assert [tool["name"] for tool in body["tools"]] == ["get_weather"]
        assert body.get("tool_choice", {"type": "auto"}) == {"type": "auto"}
    assert tool_use_ids(first, "tool_use") == []
    # Round 2 carries round 1's tool call and its result, paired by id.
    assert tool_use_ids(second, "tool_use") == ["toolu_paris"]
    assert tool_use_ids(second, "tool_result") == ["toolu_paris"]


async def test_plain_sampling_returns_a_single_block(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("A short summary."))
    async with client_for(fake_claude, RESOLVE_SERVER) as client:
        outcome = tool_json(await client.call_tool("summarize", {"text": "a long text"}))
    assert outcome["text"] == "A short summary."
    assert outcome["contentType"] == "text"
    assert "tools" not in fake_claude.message_requests[0].body


async def test_lowlevel_rounds_echo_state_exactly(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        tool_use_reply("lookup", {"key": "a"}, id="toolu_1"),
        tool_use_reply("lookup", {"key": "b"}, id="toolu_2"),
        text_reply("done: a and b"),
    )
    async with client_for(fake_claude, LOWLEVEL_SERVER) as client:
        outcome = tool_json(await client.call_tool("loop", {"question": "a then b", "rounds": 5}))

    assert outcome["finalText"] == "done: a and b"
    assert [r["toolUseIds"] for r in outcome["rounds"]] == [["toolu_1"], ["toolu_2"], []]
    # The server refuses any state it did not issue, so three states mean three exact echoes.
    assert len(outcome["states"]) == 3
    bodies = [request.body for request in fake_claude.message_requests]
    assert [tool_use_ids(body, "tool_result") for body in bodies] == [[], ["toolu_1"], ["toolu_1", "toolu_2"]]


async def test_prompts_and_resources_can_ask_for_sampling(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("prompt text"), text_reply("note text"))
    async with client_for(fake_claude, LOWLEVEL_SERVER) as client:
        prompt = await client.get_prompt("ask")
        resource = await client.read_resource("ir://note")
    assert isinstance(prompt.messages[0].content, types.TextContent)
    assert prompt.messages[0].content.text == "prompt text"
    assert isinstance(resource.contents[0], types.TextResourceContents)
    assert resource.contents[0].text == "note text"


async def test_state_only_round_is_retried_by_the_proxy(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("after the wait"))
    async with client_for(fake_claude, LOWLEVEL_SERVER) as client:
        outcome = tool_json(await client.call_tool("wait_then_sample", {"prompt": "go"}))
    assert outcome == {"text": "after the wait", "waited": True}
    assert len(fake_claude.message_requests) == 1


@pytest.mark.parametrize(
    ("upstream", "tool"), [(RESOLVE_SERVER, "confirm_and_ask"), (LOWLEVEL_SERVER, "mixed")]
)
async def test_mixed_round_elicitation_goes_to_the_client(
    fake_claude: FakeClaude, upstream: list[str], tool: str
) -> None:
    elicited: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        elicited.append(params.message)
        return types.ElicitResult(action="accept", content={"ok": True})

    fake_claude.enqueue(text_reply("model answer"))
    async with client_for(fake_claude, upstream, elicitation_callback=elicit) as client:
        outcome = tool_json(await client.call_tool(tool, {"question": "q?", "prompt": "q?"}))

    assert len(elicited) == 1
    assert len(fake_claude.message_requests) == 1
    if tool == "mixed":
        assert outcome == {
            "confirmed": {"ok": True},
            "answerText": "model answer",
            "keys": ["ask", "confirm"],
        }
    else:
        assert outcome == {"ok": True, "text": "model answer"}


async def test_client_with_sampling_tools_answers_every_round_itself(fake_claude: FakeClaude) -> None:
    asked: list[types.CreateMessageRequestParams] = []

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(text="from the client"), model="client-model"
        )

    capabilities = types.SamplingCapability(tools=types.SamplingToolsCapability())
    async with client_for(
        fake_claude, LOWLEVEL_SERVER, sampling_callback=sample, sampling_capabilities=capabilities
    ) as client:
        outcome = tool_json(await client.call_tool("loop", {"question": "q", "rounds": 1}))
    assert outcome["finalText"] == "from the client"
    assert len(asked) == 1
    assert fake_claude.message_requests == []


async def test_client_sampling_without_tools_keeps_plain_rounds(fake_claude: FakeClaude) -> None:
    asked: list[types.CreateMessageRequestParams] = []

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(text="client text"), model="client-model"
        )

    fake_claude.enqueue(text_reply("proxy text"))
    async with client_for(fake_claude, LOWLEVEL_SERVER, sampling_callback=sample) as client:
        plain = tool_json(await client.call_tool("plain", {"prompt": "p"}))
        looped = tool_json(await client.call_tool("loop", {"question": "q", "rounds": 1}))
    assert plain["text"] == "client text"
    assert looped["finalText"] == "proxy text"
    assert len(asked) == 1
    assert len(fake_claude.message_requests) == 1


async def test_round_cap_gives_a_clear_error(fake_claude: FakeClaude) -> None:
    async with client_for(
        fake_claude, LOWLEVEL_SERVER, "--max-input-rounds", "3", "--provider", "mock"
    ) as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("endless", {})
        # The proxy stays usable.
        assert tool_json(await client.call_tool("plain", {"prompt": "still there?"}))["contentType"] == "text"
    assert raised.value.error.code == -32603
    assert "--max-input-rounds" in raised.value.error.message
    assert raised.value.error.data == {"rounds": 3}


async def test_sampling_failure_mid_loop_fails_the_original_request(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        tool_use_reply("lookup", {"key": "a"}, id="toolu_1"),
        error_reply(400, "invalid_request_error", "messages: bad request"),
        text_reply("fine again"),
    )
    async with client_for(fake_claude, LOWLEVEL_SERVER) as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("loop", {"question": "q", "rounds": 3})
        assert tool_json(await client.call_tool("plain", {"prompt": "p"}))["text"] == "fine again"
    assert raised.value.error.code == -32602
    assert raised.value.error.data is not None
    assert raised.value.error.data["status"] == 400


async def test_cancel_while_the_proxy_samples_closes_the_claude_stream(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(hang_reply("partial"), text_reply("after the cancel"))
    async with client_for(fake_claude, LOWLEVEL_SERVER) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "plain", {"prompt": "slow"})
            assert await anyio.to_thread.run_sync(fake_claude.wait_for_requests, 1, 20.0)
            tg.cancel_scope.cancel()  # the client gives up while Claude is streaming
        assert await anyio.to_thread.run_sync(fake_claude.wait_for_disconnects, 1, 10.0)
        assert tool_json(await client.call_tool("plain", {"prompt": "p"}))["text"] == "after the cancel"


async def test_cancel_during_an_upstream_round_cancels_the_proxy_request(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled.json"
    started = tmp_path / "cancelled.json.started"
    fake_claude.enqueue(text_reply("round one"))
    async with client_for(fake_claude, LOWLEVEL_SERVER) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "hold", {"prompt": "p", "marker": str(marker)})
            with anyio.fail_after(20):
                while not started.exists():  # round 2 is in flight upstream
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        with anyio.fail_after(10):
            while not marker.exists():
                await anyio.sleep(0.05)
    # The server's handler for the proxy's re-sent request (not the client's id) was cancelled.
    assert json.loads(marker.read_text()).startswith("mcp-backfill:")
    assert json.loads(started.read_text()) == json.loads(marker.read_text())


async def test_era_handshake_lets_back_channel_servers_sample_for_2026_clients(
    fake_claude: FakeClaude,
) -> None:
    legacy_server = python_server("sampling_server.py")
    fake_claude.enqueue(text_reply("plain answer"), text_reply("plain answer"))
    async with client_for(fake_claude, legacy_server) as client:
        assert client.protocol_version == MODERN
        with pytest.raises(MCPError) as raised:
            await client.call_tool("plain", {"prompt": "hi"})
        assert raised.value.error.code == -32600  # no back-channel in 2026: a server-side limitation
    async with client_for(fake_claude, legacy_server, "--era", "handshake") as client:
        assert client.protocol_version == "2025-11-25"
        outcome = tool_json(await client.call_tool("plain", {"prompt": "hi"}))
    assert outcome["text"] == "plain answer"


def envelope(capabilities: dict[str, Any]) -> dict[str, Any]:
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }


async def test_every_2026_request_declares_sampling_but_discover_is_untouched() -> None:
    argv = proxy_argv("--provider", "mock", upstream=python_server("echo_server.py"))
    async with raw_proxy(argv, proxy_env()) as session:
        caps = {"elicitation": {"form": {}}, "x-custom": {"a": 1}}
        discover = await session.request(1, "server/discover", {"_meta": envelope(caps)})
        assert discover["result"]["echo"]["params"]["_meta"] == envelope(caps)
        listed = await session.request(2, "tools/list", {"_meta": envelope(caps)})
        sent_caps = listed["result"]["echo"]["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
        assert sent_caps == {**caps, "sampling": {"tools": {}}}
        call = await session.request(
            "c", "tools/call", {"name": "t", "arguments": {}, "_meta": envelope(caps)}
        )
        assert call["id"] == "c"
        assert call["result"]["echo"]["id"] == "c"  # the first round keeps the client's own id


async def test_era_handshake_answers_discover_itself() -> None:
    argv = proxy_argv("--provider", "mock", "--era", "handshake", upstream=python_server("echo_server.py"))
    async with raw_proxy(argv, proxy_env()) as session:
        reply = await session.request(7, "server/discover", {"_meta": envelope({})})
        assert reply["error"]["code"] == -32601
        notifications = await session.request(8, "test/notifications")
        assert notifications["result"] == {"notifications": []}
        # Nothing but test/notifications reached the upstream.
        echoed = await session.request(9, "ping")
        assert echoed["result"]["echo"]["id"] == 9


async def test_unknown_stash_token_is_refused() -> None:
    argv = proxy_argv("--provider", "mock", upstream=python_server("echo_server.py"))
    async with raw_proxy(argv, proxy_env()) as session:
        params = {
            "name": "t",
            "arguments": {},
            "requestState": "mcp-backfill.v1.0.nope",
            "_meta": envelope({}),
        }
        reply = await session.request(3, "tools/call", params)
        assert reply["error"]["code"] == -32602
        assert "requestState expired or unknown" in reply["error"]["message"]


async def test_subscriptions_listen_keeps_the_clients_subscription_id() -> None:
    argv = proxy_argv("--provider", "mock", upstream=RESOLVE_SERVER)
    async with raw_proxy(argv, proxy_env()) as session:
        listen = {"notifications": {"toolsListChanged": True}, "_meta": envelope({})}
        await session.send({"jsonrpc": "2.0", "id": "L1", "method": "subscriptions/listen", "params": listen})
        acknowledged = await session.recv()
        assert acknowledged["method"] == "notifications/subscriptions/acknowledged"
        assert acknowledged["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L1"
        await session.send(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "L1"}}
        )
        listed = await session.request(2, "tools/list", {"_meta": envelope({})})
        assert {tool["name"] for tool in listed["result"]["tools"]} >= {"weather", "summarize"}


def tools_call(request_id: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments, "_meta": envelope({})}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


async def test_client_eof_lets_a_round_the_proxy_answers_finish_before_the_child_is_stopped(
    fake_claude: FakeClaude,
) -> None:
    """`echo REQUEST | mcp-backfill -- server` for a tool that samples: the child's stdin was closed
    while the proxy sampled the request's round, so the child exited before the request could be
    sent again, the Claude call was cancelled (and charged) and the client told the upstream had
    exited. The round now gets up to `--shutdown-grace`, as with an HTTP upstream."""
    fake_claude.enqueue(
        tool_use_reply("get_weather", {"city": "Oslo"}, id="toolu_oslo", text="Checking.", delay=1.0),
        text_reply("Snow in Oslo."),
    )
    argv = proxy_argv("--shutdown-grace", "30", upstream=RESOLVE_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await session.send(tools_call(5, "weather", {"city": "Oslo"}))
        assert await fake_claude.await_requests(1, timeout=60)
        await session.close_stdin()
        answer = await session.recv(timeout=60)
        status = await session.wait(60)
    assert "result" in answer, answer
    assert json.loads(answer["result"]["content"][0]["text"])["final"]["text"] == "Snow in Oslo."
    assert status == 0


async def test_a_round_still_driven_when_the_grace_period_ends_is_told_so(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        tool_use_reply("get_weather", {"city": "Oslo"}, id="toolu_oslo", text="Checking.", delay=30.0),
    )
    argv = proxy_argv("--shutdown-grace", "0.5", upstream=RESOLVE_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await session.send(tools_call(5, "weather", {"city": "Oslo"}))
        assert await fake_claude.await_requests(1, timeout=60)
        await session.close_stdin()
        answer = await session.recv(timeout=60)
        await session.wait(60)
    message = answer["error"]["message"]
    assert "exited" not in message
    assert "shutting down" in message
    assert "--shutdown-grace / MCP_BACKFILL_SHUTDOWN_GRACE (0.5s)" in message


async def test_progress_of_a_request_whose_rounds_the_proxy_drives_reaches_the_client(
    fake_claude: FakeClaude,
) -> None:
    """The server reports progress for the request the proxy re-sent with its answers: the client
    hears it under its own progress token, as it would have without the proxy's rounds."""
    fake_claude.enqueue(text_reply("sampled"))
    heard = ProgressHeard()

    async with client_for(fake_claude, LOWLEVEL_SERVER) as client:
        result = await client.call_tool("progress", {"prompt": "go"}, progress_callback=heard)
    assert tool_json(result) == {"text": "sampled"}
    assert heard == [(1, 2, "half way"), (2, 2, "done")]


def strictly_increasing(values: list[float]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


async def test_progress_stays_monotonic_when_the_server_counts_again_in_a_round_the_proxy_drives(
    fake_claude: FakeClaude,
) -> None:
    """Each round the proxy re-sends is a new request to the server, which may count its progress
    from the start again (an SDK handler runs again on each round); the client sees one request,
    whose progress MUST increase: a value that would not is lifted above the last one, with its
    `total` by as much, and its message kept."""
    fake_claude.enqueue(text_reply("sampled"))
    heard = ProgressHeard()

    async with client_for(fake_claude, LOWLEVEL_SERVER) as client:
        result = await client.call_tool("progress_each_round", {"prompt": "go"}, progress_callback=heard)
    assert tool_json(result) == {"text": "sampled"}
    assert [message for _, _, message in heard] == ["started", "started", "sampled"]
    assert heard[0] == (1, 3, "started")  # the first request's, as the server sent it
    assert strictly_increasing([progress for progress, _, _ in heard]), heard
    assert all(progress <= total for progress, total, _ in heard if total is not None), heard


async def test_the_client_hears_progress_while_the_proxy_samples_for_a_round(fake_claude: FakeClaude) -> None:
    """Claude may take minutes to answer a round's sampling; a client that asked for progress hears
    some meanwhile, at a bounded interval (one that resets its timeout on progress keeps waiting,
    and the Claude call is not wasted), above what the server reported and below what it reports next."""
    fake_claude.enqueue(text_reply("sampled", delay=ROUND_PROGRESS_INTERVAL + 3))
    heard = ProgressHeard()

    async with client_for(fake_claude, LOWLEVEL_SERVER) as client:
        result = await client.call_tool("progress_each_round", {"prompt": "go"}, progress_callback=heard)
    assert tool_json(result) == {"text": "sampled"}
    assert_kept_informed_while_sampling(heard)
    assert len(fake_claude.message_requests) == 1
