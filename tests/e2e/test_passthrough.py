"""Pass-through fidelity: what the proxy does not intercept arrives with the same JSON content.

The upstream is a raw echo server (tests/servers/echo_server.py) that reports exactly what it
received, so every assertion compares what the client sent with what the server saw.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.harness import initialize_params, proxy_argv, proxy_env, python_server, raw_proxy

pytestmark = pytest.mark.anyio

ECHO = python_server("echo_server.py")


def mock_proxy(*options: str) -> list[str]:
    return proxy_argv("--provider", "mock", *options, upstream=ECHO)


async def test_initialize_gets_sampling_tools_and_keeps_everything_else() -> None:
    capabilities = {
        "roots": {"listChanged": True},
        "elicitation": {"form": {}},
        "sampling": {"context": {}},
        "experimental": {"x-custom": {"a": 1}},
        "tasks": {"requests": {"elicitation": {"create": {}}}, "list": {}},
    }
    params = initialize_params(capabilities) | {"_meta": {"trace": "abc"}, "unknownField": [1, 2]}
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        response = await session.request(0, "initialize", params)
    assert response["id"] == 0
    seen = response["result"]["echo"]
    expected = json.loads(json.dumps(params))
    expected["capabilities"]["sampling"] = {"context": {}, "tools": {}}
    # The proxy's sampling tasks join the client's own (elicitation) tasks.
    expected["capabilities"]["tasks"] = {
        "requests": {"elicitation": {"create": {}}, "sampling": {"createMessage": {}}},
        "list": {},
        "cancel": {},
    }
    assert seen == expected


@pytest.mark.parametrize(
    ("mode", "declared", "expected_sampling", "tasks"),
    [
        ("fallback", None, {"tools": {}}, True),
        ("fallback", {"tools": {}}, {"tools": {}}, False),  # the client samples: its own choice
        ("always", {}, {"tools": {}}, True),
        ("always", {"tools": {}}, {"tools": {}}, True),
        ("off", None, None, False),
        ("off", {}, {}, False),
    ],
)
async def test_capability_backfill_per_mode(
    mode: str, declared: dict[str, Any] | None, expected_sampling: dict[str, Any] | None, tasks: bool
) -> None:
    capabilities: dict[str, Any] = {} if declared is None else {"sampling": declared}
    async with raw_proxy(mock_proxy("--mode", mode), proxy_env()) as session:
        response = await session.request(1, "initialize", initialize_params(capabilities))
    seen = response["result"]["echo"]["capabilities"]
    assert seen.get("sampling") == expected_sampling
    sampling_tasks: dict[str, Any] = {
        "requests": {"sampling": {"createMessage": {}}},
        "list": {},
        "cancel": {},
    }
    assert seen.get("tasks") == (sampling_tasks if tasks else None)


@pytest.mark.parametrize(
    ("version", "tasks"),
    [
        ("2024-11-05", False),
        ("2025-03-26", False),
        ("2025-06-18", False),
        ("2025-11-25", True),
        ("2099-01-01", True),
    ],
)
async def test_sampling_tasks_are_declared_only_to_a_revision_that_has_tasks(
    version: str, tasks: bool
) -> None:
    """Tasks arrived in 2025-11-25. The client's `initialize` is rewritten before the server has
    chosen the revision: the one the client asks for decides (a server that answers with an older
    one does not use tasks); the client's own `tasks`, if any, pass as it wrote them."""
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        response = await session.request(1, "initialize", initialize_params({}, version=version))
        theirs: dict[str, Any] = {"tasks": {"list": {}}}
        again = await session.request(2, "initialize", initialize_params(theirs, version=version))
    seen = response["result"]["echo"]["capabilities"]
    assert seen["sampling"] == {"tools": {}}
    assert ("tasks" in seen) is tasks, seen
    tasks_seen = again["result"]["echo"]["capabilities"]["tasks"]
    assert (tasks_seen == {"list": {}}) is not tasks


async def test_unknown_methods_fields_meta_and_ids_pass_unchanged() -> None:
    requests: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": 0, "method": "tools/list", "params": {"_meta": {"progressToken": 0}}},
        {"jsonrpc": "2.0", "id": "0", "method": "x/unknown", "params": {"deep": {"a": [1, None, True]}}},
        {"jsonrpc": "2.0", "id": "req-ü-☃", "method": "tools/call", "params": {"name": "t", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 7, "method": "no/params", "extraTopLevel": {"kept": True}},
    ]
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        for request in requests:
            await session.send(request)
        answers: dict[str, Any] = {}
        while len(answers) < len(requests):
            message = await session.recv()
            answers[json.dumps(message["id"])] = message
    for request in requests:
        answer = answers[json.dumps(request["id"])]
        assert type(answer["id"]) is type(request["id"])
        assert answer["result"]["echo"] == request


async def test_notifications_flow_both_ways() -> None:
    notification = {
        "jsonrpc": "2.0",
        "method": "notifications/custom",
        "params": {"_meta": {"k": "v"}, "n": 0},
    }
    to_client = {"method": "notifications/message", "params": {"level": "info", "data": {"x": 1}}}
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        await session.send(notification)
        echoed, _ = await session.recv_until(lambda m: m.get("method") == "notifications/echo")
        assert echoed["params"]["received"] == notification
        response = await session.request(2, "test/notify_client", to_client)
        assert response["result"] == {"sent": True}
    # The notification reached the client before the response that followed it.


async def test_notification_from_server_reaches_client() -> None:
    to_client = {"method": "notifications/progress", "params": {"progressToken": "p", "progress": 1}}
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/notify_client", "params": to_client})
        response, before = await session.recv_until(lambda m: m.get("id") == 2)
    assert {"jsonrpc": "2.0", **to_client} in before
    assert response["result"] == {"sent": True}


@pytest.mark.parametrize(
    ("method", "params", "server_id", "client_result"),
    [
        ("roots/list", {}, 0, {"roots": [{"uri": "file:///tmp", "name": "tmp"}]}),
        (
            "elicitation/create",
            {"mode": "form", "message": "Name?", "requestedSchema": {"type": "object"}},
            "s-1",
            {"action": "accept", "content": {"name": "Ada"}},
        ),
        ("ping", None, 5, {}),
    ],
)
async def test_server_requests_other_than_sampling_reach_the_client(
    method: str, params: dict[str, Any] | None, server_id: Any, client_result: dict[str, Any]
) -> None:
    ask: dict[str, Any] = {"method": method, "id": server_id}
    if params is not None:
        ask["params"] = params
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params({"roots": {}, "elicitation": {}}))
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/ask_client", "params": ask})
        server_request, _ = await session.recv_until(lambda m: m.get("method") == method)
        assert server_request["id"] == server_id
        assert type(server_request["id"]) is type(server_id)
        assert server_request.get("params") == params
        client_response = {"jsonrpc": "2.0", "id": server_id, "result": client_result}
        await session.send(client_response)
        final, _ = await session.recv_until(lambda m: m.get("id") == 2)
    assert final["result"]["client_response"] == client_response


async def test_batches_pass_through() -> None:
    batch = [
        {"jsonrpc": "2.0", "id": 10, "method": "a/b", "params": {"x": 1}},
        {"jsonrpc": "2.0", "method": "notifications/custom"},
    ]
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        await session.send(batch)
        response = await session.recv()
    # The echo server answers a batch with a batch (or the single request's answer).
    answers = response if isinstance(response, list) else [response]
    assert any(a.get("id") == 10 and a["result"]["echo"] == batch[0] for a in answers)


async def test_sampling_is_answered_by_the_proxy_even_when_ids_collide() -> None:
    """The server's request id 2 is also the client's pending request id 2: two separate id spaces."""
    sampling = {
        "method": "sampling/createMessage",
        "id": 2,
        "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
            "maxTokens": 20,
        },
    }
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/ask_client", "params": sampling})
        response, before = await session.recv_until(lambda m: m.get("id") == 2)
    assert not any(m.get("method") == "sampling/createMessage" for m in before)
    answer = response["result"]["client_response"]
    assert answer["id"] == 2
    assert answer["result"]["role"] == "assistant"
    assert answer["result"]["content"]["type"] == "text"
    assert answer["result"]["model"].startswith("mock/")


async def test_cancellations_for_requests_the_proxy_does_not_own_pass_through() -> None:
    cancelled = {"method": "notifications/cancelled", "params": {"requestId": 42, "reason": "user"}}
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/notify_client", "params": cancelled})
        _, before = await session.recv_until(lambda m: m.get("id") == 2)
    assert {"jsonrpc": "2.0", **cancelled} in before


@pytest.mark.parametrize(
    "absent", [{"tools": None}, {"toolChoice": None}, {"tools": None, "toolChoice": None}]
)
async def test_tools_written_as_null_are_no_tools_for_a_client_that_samples(absent: dict[str, Any]) -> None:
    """`"tools": null` is a request without tools, as the SDK reads it (its server shapes the answer
    by `tools is not None`, and so does the proxy's answer): a client that declared sampling without
    tools answers it. The proxy answered it instead, calling (and billing) Claude in fallback mode."""
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 20}
    sampling = {"method": "sampling/createMessage", "id": "s1", "params": {**params, **absent}}
    client_answer = {"role": "assistant", "content": {"type": "text", "text": "mine"}, "model": "client"}
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params({"sampling": {}}))
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/ask_client", "params": sampling})
        forwarded, _ = await session.recv_until(lambda m: "method" in m or m.get("id") == 2)
        assert forwarded == {"jsonrpc": "2.0", **sampling}
        await session.send({"jsonrpc": "2.0", "id": "s1", "result": client_answer})
        response, _ = await session.recv_until(lambda m: m.get("id") == 2)
    assert response["result"]["client_response"]["result"] == client_answer


async def test_client_that_samples_gets_sampling_requests_in_fallback_mode() -> None:
    sampling = {
        "method": "sampling/createMessage",
        "id": "s1",
        "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
            "maxTokens": 20,
        },
    }
    client_answer = {"role": "assistant", "content": {"type": "text", "text": "mine"}, "model": "client"}
    async with raw_proxy(mock_proxy(), proxy_env()) as session:
        await session.request(1, "initialize", initialize_params({"sampling": {}}))
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "test/ask_client", "params": sampling})
        forwarded, _ = await session.recv_until(lambda m: m.get("method") == "sampling/createMessage")
        assert forwarded == {"jsonrpc": "2.0", **sampling}
        await session.send({"jsonrpc": "2.0", "id": "s1", "result": client_answer})
        response, _ = await session.recv_until(lambda m: m.get("id") == 2)
    assert response["result"]["client_response"]["result"] == client_answer
