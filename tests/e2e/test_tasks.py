"""Task-augmented sampling (MCP 2025-11-25) answered by the real proxy.

A handshake-era SDK client without sampling talks to a server through `python -m mcp_backfill`;
the server sends `sampling/createMessage` with `params.task`, gets a task at once, and polls the
proxy with `tasks/get`, `tasks/result`, `tasks/list` and `tasks/cancel` (the SDK server's
`client_request` tool sends each one verbatim). npm's server-everything shows the same through
the stdio wrapper and the sidecar: its `trigger-sampling-request-async` is only listed for a client
that declares task-augmented sampling.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types

from tests.fake_claude import FakeClaude, error_reply, hang_reply, text_reply
from tests.harness import (
    initialize_params,
    proxy_argv,
    proxy_env,
    proxy_url_argv,
    python_http_server,
    python_server,
    raw_proxy,
    stdio_params,
    tool_json,
)
from tests.sidecar_harness import run_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")
HELLO = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 20}
RELATED = "io.modelcontextprotocol/related-task"
TERMINAL = {"completed", "failed", "cancelled"}


def client_for(fake: FakeClaude, *options: str) -> Client:
    argv = proxy_argv(*options, upstream=SAMPLING_SERVER)
    return Client(stdio_params(argv, proxy_env(fake.url)), mode="legacy")


async def ask(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Have the server send `method` to its client (the proxy) and report what came back."""
    outcome = tool_json(
        await client.call_tool("client_request", {"method": method, "params_json": json.dumps(params)})
    )
    assert isinstance(outcome, dict)
    return outcome


async def create_task(client: Client, ttl: int | None = 60_000) -> dict[str, Any]:
    task: dict[str, Any] = {} if ttl is None else {"ttl": ttl}
    outcome = await ask(client, "sampling/createMessage", {**HELLO, "task": task})
    task = outcome["result"]["task"]
    assert isinstance(task, dict)
    return task


async def poll_until_terminal(client: Client, task_id: str) -> dict[str, Any]:
    with anyio.fail_after(30):
        while True:
            task = (await ask(client, "tasks/get", {"taskId": task_id}))["result"]
            assert isinstance(task, dict)
            if task["status"] in TERMINAL:
                return task
            await anyio.sleep(0.05)


async def test_a_task_completes_and_its_result_is_the_sampling_answer(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("Answered as a task."))
    async with client_for(fake_claude) as client:
        created = await create_task(client, ttl=60_000)
        assert created["status"] == "working"
        assert created["taskId"].startswith("mcp-backfill-task-")
        assert created["ttl"] == 60_000
        assert created["pollInterval"] > 0
        assert created["createdAt"].endswith("Z")
        assert created["lastUpdatedAt"]

        payload = await ask(client, "tasks/result", {"taskId": created["taskId"]})  # waits for the end
        task = (await ask(client, "tasks/get", {"taskId": created["taskId"]}))["result"]
        listed = (await ask(client, "tasks/list", {}))["result"]

    result = payload["result"]
    assert result["content"] == {"type": "text", "text": "Answered as a task."}
    assert result["role"] == "assistant"
    assert result["stopReason"] == "endTurn"
    assert result["_meta"][RELATED] == {"taskId": created["taskId"]}
    assert task["status"] == "completed"
    assert task["createdAt"] == created["createdAt"]
    assert [t["taskId"] for t in listed["tasks"]] == [created["taskId"]]
    assert "nextCursor" not in listed
    [request] = fake_claude.message_requests
    assert request.body["max_tokens"] == 20


async def test_a_failed_call_becomes_a_failed_task_whose_result_is_the_error(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(error_reply(400, "invalid_request_error", "prompt is too long"))
    async with client_for(fake_claude) as client:
        created = await create_task(client)
        task = await poll_until_terminal(client, created["taskId"])
        payload = await ask(client, "tasks/result", {"taskId": created["taskId"]})

    assert task["status"] == "failed"
    assert "prompt is too long" in task["statusMessage"]
    assert payload["error"]["code"] == -32602
    assert "prompt is too long" in payload["error"]["message"]


async def test_cancelling_a_task_stops_the_claude_call_and_charges_it(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(hang_reply("Partial"))
    async with client_for(fake_claude, "--audit-log", str(audit)) as client:
        created = await create_task(client)
        assert await anyio.to_thread.run_sync(fake_claude.wait_for_requests, 1, 15.0)
        waiting = (await ask(client, "tasks/get", {"taskId": created["taskId"]}))["result"]
        cancelled = (await ask(client, "tasks/cancel", {"taskId": created["taskId"]}))["result"]
        again = await ask(client, "tasks/cancel", {"taskId": created["taskId"]})
        payload = await ask(client, "tasks/result", {"taskId": created["taskId"]})
        assert await anyio.to_thread.run_sync(fake_claude.wait_for_disconnects, 1, 15.0)

    assert waiting["status"] == "working"
    assert cancelled["status"] == "cancelled"
    assert again["error"]["code"] == -32602
    assert "terminal status 'cancelled'" in again["error"]["message"]
    assert payload["error"]["code"] == -32800
    [line] = [json.loads(text) for text in audit.read_text().splitlines()]
    assert line["outcome"] == "cancelled"  # charged like any cancelled call: Claude may have written it all
    assert line["charged"]["output_tokens"] == 20
    assert line["charged"]["input_tokens"] > 0


async def test_unknown_tasks_and_cursors_get_the_spec_error(fake_claude: FakeClaude) -> None:
    async with client_for(fake_claude) as client:
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            outcome = await ask(client, method, {"taskId": "no-such-task"})
            assert outcome["error"]["code"] == -32602, method
            assert "Task not found" in outcome["error"]["message"]
        bad_cursor = await ask(client, "tasks/list", {"cursor": "nonsense"})
    assert bad_cursor["error"]["code"] == -32602
    assert fake_claude.message_requests == []


async def test_ttl_is_capped_and_an_expired_task_is_forgotten(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("Soon forgotten."))
    async with client_for(fake_claude, "--task-ttl-max", "1") as client:
        created = await create_task(client, ttl=600_000)
        unasked = await create_task(client, ttl=None)
        await ask(client, "tasks/result", {"taskId": created["taskId"]})
        await ask(client, "tasks/result", {"taskId": unasked["taskId"]})
        await anyio.sleep(3.2)  # past its TTL, and past the time an ended task is kept after it ended
        gone = await ask(client, "tasks/get", {"taskId": created["taskId"]})
        listed = (await ask(client, "tasks/list", {}))["result"]
    assert created["ttl"] == 1000
    assert unasked["ttl"] == 1000
    assert gone["error"]["code"] == -32602
    assert listed["tasks"] == []


async def test_a_new_session_of_the_client_ends_the_tasks_of_the_one_before(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A client that sends `initialize` again starts a new session (over `--upstream-url`, a new
    upstream session; the old one is deleted). The old session's tasks were listed to the new
    one, and their Claude calls ran on, billed, for a session nobody could fetch them from any
    more. They are cancelled (their calls stopped and charged) and forgotten."""
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(hang_reply("Partial"))
    async with python_http_server(python_server("sampling_server.py", "--http", "127.0.0.1:0")) as server:
        argv = proxy_url_argv("--audit-log", str(audit), url=server.url)
        async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:

            async def server_asks(call_id: int, method: str, params: dict[str, Any]) -> Any:
                arguments = {"method": method, "params_json": json.dumps(params)}
                call = {"name": "client_request", "arguments": arguments}
                response = await session.request(call_id, "tools/call", call)
                return json.loads(response["result"]["content"][0]["text"])

            for initialize_id in (0, 2):
                if initialize_id == 2:  # the second session, once the first one's task is working
                    assert await anyio.to_thread.run_sync(fake_claude.wait_for_requests, 1, 15.0)
                assert "result" in await session.request(initialize_id, "initialize", initialize_params({}))
                await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
                if initialize_id == 0:
                    await server_asks(1, "sampling/createMessage", {**HELLO, "task": {"ttl": 600_000}})
            listed = await server_asks(3, "tasks/list", {})
            assert await anyio.to_thread.run_sync(fake_claude.wait_for_disconnects, 1, 15.0)
    assert listed["result"]["tasks"] == []
    [line] = [json.loads(text) for text in audit.read_text().splitlines()]
    assert line["outcome"] == "cancelled"
    assert line["charged"]["output_tokens"] == 20


# -- server-everything ---------------------------------------------------------------------------


def everything_text(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def call_async_sampling(client: Client) -> str:
    tools = {tool.name for tool in (await client.list_tools()).tools}
    assert "trigger-sampling-request-async" in tools
    result = await client.call_tool("trigger-sampling-request-async", {"prompt": "Say hi", "maxTokens": 30})
    return everything_text(result)


@pytest.mark.npm
async def test_server_everything_async_sampling_through_the_stdio_wrapper(
    everything: str, fake_claude: FakeClaude
) -> None:
    fake_claude.enqueue(text_reply("Sampled as a task by the fake Claude."))
    argv = proxy_argv(upstream=[everything, "stdio"])
    async with Client(stdio_params(argv, proxy_env(fake_claude.url)), mode="legacy") as client:
        text = await call_async_sampling(client)
    assert "Sampled as a task by the fake Claude." in text
    assert "[SYNC]" not in text


@pytest.mark.npm
async def test_server_everything_async_sampling_through_the_sidecar(
    everything: str, fake_claude: FakeClaude
) -> None:
    fake_claude.enqueue(text_reply("Sampled as a task behind the sidecar."))
    async with (
        run_sidecar(upstream=[everything, "stdio"], env=proxy_env(fake_claude.url)) as sidecar,
        Client(sidecar.url, mode="legacy") as client,
    ):
        text = await call_async_sampling(client)
    assert "Sampled as a task behind the sidecar." in text
    assert "[SYNC]" not in text


async def test_in_the_sidecar_a_task_belongs_to_its_session(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("Only for the first session."))
    async with (
        run_sidecar(upstream=SAMPLING_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        Client(sidecar.url, mode="legacy") as first,
        Client(sidecar.url, mode="legacy") as second,
    ):
        created = await create_task(first)
        theirs = await ask(second, "tasks/get", {"taskId": created["taskId"]})
        mine = await ask(first, "tasks/result", {"taskId": created["taskId"]})
        listed = (await ask(second, "tasks/list", {}))["result"]
    assert theirs["error"]["code"] == -32602
    assert mine["result"]["content"]["text"] == "Only for the first session."
    assert listed["tasks"] == []


async def test_the_clients_own_tasks_are_routed_to_it_by_id(fake_claude: FakeClaude) -> None:
    """A client that runs tasks itself (for elicitation) answers requests about its tasks; a
    `tasks/list` it declared gets the proxy's tasks added to its last page."""
    fake_claude.enqueue(text_reply("Proxy task."))
    capabilities: dict[str, Any] = {"tasks": {"list": {}, "requests": {"elicitation": {"create": {}}}}}
    own = {
        "taskId": "client-task-1",
        "status": "working",
        "createdAt": "2026-01-01T00:00:00Z",
        "lastUpdatedAt": "2026-01-01T00:00:00Z",
        "ttl": None,
    }
    argv = proxy_argv("--provider", "anthropic", upstream=SAMPLING_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await session.request(0, "initialize", initialize_params(capabilities))
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

        async def server_asks(call_id: int, method: str, params: dict[str, Any], reply: Any) -> Any:
            arguments = {"method": method, "params_json": json.dumps(params)}
            await session.send(
                {
                    "jsonrpc": "2.0",
                    "id": call_id,
                    "method": "tools/call",
                    "params": {"name": "client_request", "arguments": arguments},
                }
            )
            if reply is not None:
                asked, _ = await session.recv_until(lambda m: m.get("method") == method)
                assert asked.get("params", {}) == params  # forwarded untouched
                await session.send({"jsonrpc": "2.0", "id": asked["id"], "result": reply})
            response, _ = await session.recv_until(lambda m: m.get("id") == call_id and "method" not in m)
            return json.loads(response["result"]["content"][0]["text"])

        created = await server_asks(1, "sampling/createMessage", {**HELLO, "task": {"ttl": 60_000}}, None)
        task_id = created["result"]["task"]["taskId"]
        theirs = await server_asks(2, "tasks/get", {"taskId": "client-task-1"}, own)
        mine = await server_asks(3, "tasks/result", {"taskId": task_id}, None)
        listed = await server_asks(4, "tasks/list", {}, {"tasks": [own]})

    assert theirs["result"] == own
    assert mine["result"]["content"]["text"] == "Proxy task."
    assert [task["taskId"] for task in listed["result"]["tasks"]] == ["client-task-1", task_id]
