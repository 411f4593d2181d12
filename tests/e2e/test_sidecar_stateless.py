"""`mcp-backfill serve` for 2026-07-28 clients: sessionless POSTs sharing one upstream child.

client (mcp SDK in its default auto mode, or raw HTTP) --HTTP--> `python -m mcp_backfill serve`
    --stdio--> one child for every 2026-07-28 request          \\-> fake Claude
"""

from __future__ import annotations

import json
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, types

from mcp_backfill.relay.progress import ROUND_PROGRESS_INTERVAL
from tests.fake_claude import FakeClaude, hang_reply, text_reply, tool_use_reply
from tests.harness import (
    ProgressHeard,
    assert_kept_informed_while_sampling,
    proxy_env,
    python_server,
    tool_json,
)
from tests.sidecar_harness import (
    HANDSHAKE_HEADERS,
    HTTP_TIMEOUT,
    Sidecar,
    health,
    initialize_body,
    open_session,
    response_messages,
    response_to,
    run_sidecar,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

RESOLVE_SERVER = python_server("resolve_server.py")
CHATTY_SERVER = python_server("chatty_server.py")
INPUT_REQUIRED_SERVER = python_server("input_required_server.py")
VERSION = "2026-07-28"


def stateless_request(request_id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw-2026", "version": "0"},
    }
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**(params or {}), "_meta": meta}}


def stateless_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {**HANDSHAKE_HEADERS, "mcp-protocol-version": VERSION, "mcp-method": method}
    if name is not None:
        headers["mcp-name"] = name
    return headers


NAMED_TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}
NAMED_CLIENTS = ",".join(f"{name}={token}" for name, token in NAMED_TOKENS.items())
"""Two clients told apart by their tokens, as `--client-tokens` takes them."""


async def post_as(http: httpx2.AsyncClient, url: str, who: str, body: dict[str, Any]) -> httpx2.Response:
    """A 2026-07-28 request of the client `who` of `NAMED_TOKENS`, its headers from its body."""
    method, params = body["method"], body.get("params") or {}
    headers = {
        **stateless_headers(method, params.get("name")),
        "authorization": f"Bearer {NAMED_TOKENS[who]}",
    }
    return await http.post(url, json=body, headers=headers)


async def call_tool(
    http: httpx2.AsyncClient, sidecar: Sidecar, request_id: Any, name: str, **arguments: Any
) -> Any:
    body = stateless_request(request_id, "tools/call", {"name": name, "arguments": arguments})
    response = await http.post(sidecar.url, json=body, headers=stateless_headers("tools/call", name))
    assert "mcp-session-id" not in response.headers
    [reply] = response_messages(response)
    return reply


async def test_resolve_tool_loop_for_a_2026_client_without_sampling(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        tool_use_reply("get_weather", {"city": "Paris"}, id="toolu_w1"),
        text_reply("Sunny in Paris."),
    )
    async with (
        run_sidecar(upstream=RESOLVE_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        Client(sidecar.url) as client,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        outcome = tool_json(await client.call_tool("weather", {"city": "Paris"}))
        assert (await health(http, sidecar))["sessions"] == 0  # no handshake session was opened
    assert outcome["rounds"] == 2
    assert outcome["first"]["toolUseIds"] == ["toolu_w1"]
    assert outcome["final"]["text"] == "Sunny in Paris."
    bodies = [request.body for request in fake_claude.message_requests]
    assert len(bodies) == 2
    second = bodies[1]["messages"]
    assert second[1]["content"][0] == {
        "type": "tool_use",
        "id": "toolu_w1",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    assert second[2]["content"][0]["tool_use_id"] == "toolu_w1"


async def test_handshake_sessions_and_2026_requests_side_by_side(fake_claude: FakeClaude) -> None:
    async with run_sidecar(upstream=RESOLVE_SERVER, env=proxy_env(fake_claude.url)) as sidecar:
        results: dict[str, Any] = {}

        async def use(mode: str) -> None:
            async with Client(sidecar.url, mode=mode) as client:
                results[mode] = tool_json(await client.call_tool("summarize", {"text": f"text for {mode}"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(use, "legacy")
            tg.start_soon(use, "auto")
    assert set(results) == {"legacy", "auto"}
    prompts = sorted(
        request.body["messages"][0]["content"][0]["text"] for request in fake_claude.message_requests
    )
    assert prompts == ["Summarize: text for auto", "Summarize: text for legacy"]
    stderr = sidecar.stderr()
    assert "session opened" in stderr
    assert 'for="2026-07-28 requests"' in stderr


async def test_concurrent_2026_clients_only_see_their_own_notifications() -> None:
    seen: dict[str, list[str]] = {}

    async def chat(sidecar: Sidecar, tag: str) -> None:
        notes: list[str] = []
        logs: list[str] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            notes.append(str(message))

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            logs.append(str(params.data))

        async with Client(sidecar.url, logging_callback=on_log, log_level="info") as client:
            for _ in range(2):
                outcome = tool_json(
                    await client.call_tool(
                        "chatter", {"tag": tag, "count": 4, "delay": 0.03}, progress_callback=on_progress
                    )
                )
                assert outcome["tag"] == tag
        seen[tag] = notes
        seen[f"{tag}-logs"] = logs

    async with (
        run_sidecar("--provider", "mock", upstream=CHATTY_SERVER, env=proxy_env()) as sidecar,
        anyio.create_task_group() as tg,
    ):
        for tag in ("red", "blue", "green"):
            tg.start_soon(chat, sidecar, tag)
    for tag in ("red", "blue", "green"):
        assert seen[tag] == [f"{tag} {i}" for i in range(4)] * 2  # tokens rewritten and restored
        # Log lines carry no token: those that cannot be attributed are dropped, never misdelivered.
        assert all(line.startswith(f"{tag} log") for line in seen[f"{tag}-logs"]), seen


async def test_the_2026_path_checks_headers_like_the_sdk_server() -> None:
    async with (
        run_sidecar("--provider", "mock", upstream=CHATTY_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        body = stateless_request(1, "tools/call", {"name": "pid", "arguments": {}})
        mismatched = await http.post(sidecar.url, json=body, headers=stateless_headers("tools/call", "sleep"))
        assert mismatched.status_code == 400
        assert mismatched.json()["error"]["code"] == -32020
        assert mismatched.json()["id"] == 1
        wrong_method = await http.post(sidecar.url, json=body, headers=stateless_headers("tools/list"))
        assert wrong_method.json()["error"]["code"] == -32020
        no_envelope = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        missing = await http.post(sidecar.url, json=no_envelope, headers=stateless_headers("tools/list"))
        assert (missing.status_code, missing.json()["error"]["code"]) == (400, -32602)
        batch = await http.post(sidecar.url, json=[body], headers=stateless_headers("tools/call", "pid"))
        assert (batch.status_code, batch.json()["error"]["code"]) == (400, -32600)
        future = {**stateless_headers("tools/list"), "mcp-protocol-version": "2099-01-01"}
        future_body = stateless_request(3, "tools/list")
        future_body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2099-01-01"
        unsupported = await http.post(sidecar.url, json=future_body, headers=future)
        assert unsupported.status_code == 400
        assert unsupported.json()["error"]["code"] == -32022
        assert unsupported.json()["error"]["data"]["supported"] == [VERSION]
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
        assert (await http.post(sidecar.url, json=note, headers=stateless_headers("x"))).status_code == 202
        for method in ("GET", "DELETE"):
            refused = await http.request(method, sidecar.url, headers=stateless_headers("x"))
            assert refused.status_code == 405
            assert refused.headers["allow"] == "POST"
        assert "upstream process started" not in sidecar.stderr()  # nothing reached the upstream

        good = await call_tool(http, sidecar, "same-id", "pid")
        again = await call_tool(http, sidecar, "same-id", "pid")
        assert good["id"] == again["id"] == "same-id"
        assert json.loads(good["result"]["content"][0]["text"]) == json.loads(
            again["result"]["content"][0]["text"]
        )


async def test_a_message_that_is_not_jsonrpc_2_0_is_refused_not_left_hanging() -> None:
    """Without `"jsonrpc": "2.0"` a request was relayed, the stdio upstream dropped the invalid line,
    and the POST stayed open for ever (SSE keep-alives defeat any read timeout), keeping its hub busy
    so it was never reaped. Now it is refused as the SDK's server refuses it: 400, -32600."""
    async with (
        run_sidecar("--provider", "mock", upstream=CHATTY_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        request = stateless_request(1, "tools/list")
        note: dict[str, Any] = {"method": "notifications/cancelled", "params": {"requestId": 1}}
        body: dict[str, Any]
        for body in (
            {**request, "jsonrpc": "1.0"},
            {k: v for k, v in request.items() if k != "jsonrpc"},
            note,
        ):
            response = None
            with anyio.move_on_after(8):
                headers = stateless_headers(str(body["method"]))
                response = await http.post(sidecar.url, json=body, headers=headers)
            assert response is not None, f"no answer within 8 s to {body}"
            assert (response.status_code, response.json()["error"]["code"]) == (400, -32600), response.text
        assert (await health(http, sidecar))["requests_in_flight_2026"] == 0


async def test_closing_a_post_cancels_the_request_upstream(tmp_path: Path) -> None:
    async with (
        run_sidecar(
            "--provider", "mock", upstream=[*CHATTY_SERVER, str(tmp_path)], env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        body = stateless_request(
            7, "tools/call", {"name": "sleep", "arguments": {"seconds": 30, "note": "closed"}}
        )
        headers = stateless_headers("tools/call", "sleep")
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(http.post, sidecar.url, json=body, headers=headers))
            with anyio.fail_after(HTTP_TIMEOUT):  # the tool is running upstream (cold starts included)
                while not (tmp_path / "sleeping-closed").exists():
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()  # the client closes its POST
        with anyio.fail_after(HTTP_TIMEOUT):
            while not (tmp_path / "cancelled-closed").exists():
                await anyio.sleep(0.05)
        assert "client closed its request; cancelling it" in sidecar.stderr()
        with anyio.fail_after(HTTP_TIMEOUT):
            while (await health(http, sidecar))["requests_in_flight_2026"]:
                await anyio.sleep(0.05)


async def test_closing_a_post_cancels_the_claude_call(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(hang_reply("thinking..."))
    async with (
        run_sidecar(upstream=RESOLVE_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        body = stateless_request(1, "tools/call", {"name": "summarize", "arguments": {"text": "x"}})
        headers = stateless_headers("tools/call", "summarize")
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(http.post, sidecar.url, json=body, headers=headers))
            assert await fake_claude.await_requests(1, timeout=30)  # Claude is streaming
            tg.cancel_scope.cancel()  # the client closes its POST
        assert await fake_claude.await_disconnects(1, timeout=10)


async def test_a_crashed_2026_upstream_fails_its_requests_and_is_restarted(tmp_path: Path) -> None:
    async with (
        run_sidecar(
            "--provider", "mock", upstream=[*CHATTY_SERVER, str(tmp_path)], env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        first = json.loads((await call_tool(http, sidecar, 1, "pid"))["result"]["content"][0]["text"])["pid"]
        crashed = await call_tool(http, sidecar, 2, "crash")
        assert crashed["error"]["code"] == -32603
        assert crashed["id"] == 2
        second = json.loads((await call_tool(http, sidecar, 3, "pid"))["result"]["content"][0]["text"])["pid"]
        assert second != first
        assert len(list(tmp_path.glob("started-*"))) == 2


async def test_a_2026_clients_upstream_starts_count_against_its_session_rate(tmp_path: Path) -> None:
    """A 2026-07-28 client's upstream was started again on its next request with no limit: an
    upstream exiting after each request cost a process start per request, as fast as the client
    could post. Its starts now count against `--client-session-rate`, one budget with the client's
    handshake sessions: the 4th start in the minute gets 429 (its own requests to the upstream
    running are served, and other clients are not held to its rate)."""
    options = ("--provider", "mock", "--client-tokens", NAMED_CLIENTS, "--client-session-rate", "3")

    async def call(who: str, request_id: int, name: str) -> httpx2.Response:
        params = {"name": name, "arguments": {}}
        return await post_as(http, sidecar.url, who, stateless_request(request_id, "tools/call", params))

    async with (
        run_sidecar(*options, upstream=[*CHATTY_SERVER, str(tmp_path)], env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        for start in range(3):  # each start serves a request, then the upstream exits on the next
            assert "result" in (await call("alice", 10 * start, "pid")).json()
            assert "result" in (await call("alice", 10 * start + 1, "pid")).json()  # the same run
            assert (await call("alice", 10 * start + 2, "crash")).json()["error"]["code"] == -32603
        refused = await call("alice", 100, "pid")
        assert refused.status_code == 429, refused.text
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        error = refused.json()
        assert error["id"] == 100
        rate = "(--client-session-rate / MCP_BACKFILL_CLIENT_SESSION_RATE)"
        assert f"at most 3 a minute for client 'alice' {rate}" in error["error"]["message"]
        session = await http.post(
            sidecar.url,
            json=initialize_body(),
            headers={**HANDSHAKE_HEADERS, "authorization": f"Bearer {NAMED_TOKENS['alice']}"},
        )
        assert session.status_code == 429, session.text  # one budget for both eras
        assert "result" in (await call("bob", 1, "pid")).json()  # not held to Alice's rate
        assert len(list(tmp_path.glob("started-*"))) == 4


async def test_a_client_past_its_start_rate_does_not_stop_another_clients_upstream(tmp_path: Path) -> None:
    """One upstream allowed (`--max-sessions 1`), one start a minute each. Alice, past her rate, was
    refused only once her hub had been made: with every upstream taken, Bob's idle one was stopped
    first to make room for it. Each of her refused requests killed Bob's running upstream, whose next
    request then started it again, on Bob's rate: Bob was refused (429) for Alice's requests. Now
    Alice is refused before any room is made, and Bob's upstream serves on."""
    options = ("--provider", "mock", "--client-tokens", NAMED_CLIENTS, "--client-session-rate", "1")

    async def call(who: str, request_id: int, name: str) -> httpx2.Response:
        params = {"name": name, "arguments": {}}
        return await post_as(http, sidecar.url, who, stateless_request(request_id, "tools/call", params))

    async with (
        run_sidecar(
            *options, "--max-sessions", "1", upstream=[*CHATTY_SERVER, str(tmp_path)], env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        assert "result" in (await call("alice", 1, "pid")).json()  # Alice's one start
        first = await call("bob", 2, "pid")  # Alice's idle upstream stopped for Bob's
        assert "result" in first.json(), first.text
        for attempt in range(3):
            refused = await call("alice", 10 + attempt, "pid")
            assert refused.status_code == 429, refused.text
        again = await call("bob", 3, "pid")
        assert again.status_code == 200, again.text
        assert again.json()["result"] == first.json()["result"]  # the same process
        assert len(list(tmp_path.glob("started-*"))) == 2


async def test_a_client_arriving_while_anothers_upstream_starts_waits_its_turn() -> None:
    """Two named clients, one hub allowed (`--max-sessions 1`). Bob's first request, sent while
    Alice's upstream was still starting, used to stop her hub as idle: Alice got a bare 500, and the
    cancelled start closed a descriptor that by then was Bob's upstream's pipe, which made libuv abort
    the whole sidecar (SIGABRT). Now Alice is served, Bob is served or told to come back, and the
    sidecar lives on."""
    answers: dict[str, httpx2.Response] = {}

    async def list_tools(http: httpx2.AsyncClient, sidecar: Sidecar, who: str, request_id: int) -> None:
        answers[who] = await post_as(http, sidecar.url, who, stateless_request(request_id, "tools/list"))

    async with (
        run_sidecar(
            "--provider",
            "mock",
            "--client-tokens",
            NAMED_CLIENTS,
            "--max-sessions",
            "1",
            upstream=RESOLVE_SERVER,
            env=proxy_env(),
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(list_tools, http, sidecar, "alice", 1)
            await anyio.sleep(0.2)  # Alice's first 2026-07-28 request is still setting up
            tg.start_soon(list_tools, http, sidecar, "bob", 2)
        assert answers["alice"].status_code == 200, answers["alice"].text
        assert answers["alice"].json()["result"]["tools"]
        assert answers["bob"].status_code in (200, 503), answers["bob"].text
        if answers["bob"].status_code == 503:
            assert "--max-sessions" in answers["bob"].json()["error"]["message"]
        assert (await health(http, sidecar))["status"] == "ok"
        assert sidecar.process.returncode is None
        assert "Exception in ASGI application" not in sidecar.stderr()


async def test_sigterm_ends_open_listen_streams_instead_of_waiting_out_the_drain() -> None:
    """A `subscriptions/listen` POST never ends by itself, like a handshake session's GET stream,
    which the drain ends. It was left open: the sidecar waited the whole `--drain-timeout`, then
    uvicorn cancelled the handler (a traceback in the log) and cut the client's response mid-body."""
    async with (
        run_sidecar(
            "--provider", "mock", "--drain-timeout", "20", upstream=RESOLVE_SERVER, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=60) as http,
    ):
        body = stateless_request("L1", "subscriptions/listen", {"notifications": {"toolsListChanged": True}})
        lines: list[str] = []
        outcome: list[Any] = []

        async def listen() -> None:
            headers = stateless_headers("subscriptions/listen")
            try:
                async with http.stream("POST", sidecar.url, json=body, headers=headers) as response:
                    async for line in response.aiter_lines():
                        lines.append(line)
                outcome.append("ended")
            except httpx2.HTTPError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            with anyio.fail_after(HTTP_TIMEOUT):
                while not any("subscriptions/acknowledged" in line for line in lines):
                    await anyio.sleep(0.05)
            started = time.monotonic()
            sidecar.signal(signal.SIGTERM)
            assert await sidecar.wait(40) == 0
            took = time.monotonic() - started
        assert took < 8, f"the sidecar took {took:.1f} s to stop (waited out --drain-timeout 20)"
        assert outcome == ["ended"], outcome
        assert "Exception in ASGI application" not in sidecar.stderr()


def round_request(request_id: Any, question: str, **params: Any) -> dict[str, Any]:
    """`confirm_and_ask` from a client that can elicit (not sample): a mixed round."""
    body = stateless_request(
        request_id, "tools/call", {"name": "confirm_and_ask", "arguments": {"question": question}, **params}
    )
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = {"elicitation": {"form": {}}}
    return body


async def test_a_retry_answering_a_round_is_served_during_the_drain(fake_claude: FakeClaude) -> None:
    """A 2026-07-28 retry carrying `inputResponses` and the proxy's `requestState` completes a round
    whose sampling the proxy already did (and paid for). During the drain it got 503 like a new
    request; without a shared --request-state-key no other replica knows the state ("requestState
    expired or unknown"), so that Claude call was wasted. Now it is served while the drain lasts;
    a new request still gets 503."""
    fake_claude.enqueue(text_reply("Proceeding."), hang_reply())
    async with (
        run_sidecar(
            "--drain-timeout", "15", upstream=RESOLVE_SERVER, env=proxy_env(fake_claude.url)
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = stateless_headers("tools/call", "confirm_and_ask")
        first = await http.post(sidecar.url, json=round_request(1, "Proceed?"), headers=headers)
        result = response_to(first, 1)["result"]
        assert result["resultType"] == "input_required"
        [key] = result["inputRequests"]
        async with anyio.create_task_group() as tg:
            # A request whose Claude call hangs keeps the drain going.
            tg.start_soon(partial(call_tool, http, sidecar, 2, "summarize", text="slow"))
            with anyio.fail_after(HTTP_TIMEOUT):
                while len(fake_claude.message_requests) < 2:
                    await anyio.sleep(0.05)
            sidecar.signal(signal.SIGTERM)
            with anyio.fail_after(HTTP_TIMEOUT):
                while "draining" not in sidecar.stderr():
                    await anyio.sleep(0.05)
            retry = round_request(
                3,
                "Proceed?",
                inputResponses={key: {"action": "accept", "content": {"ok": True}}},
                requestState=result["requestState"],
            )
            answer = await http.post(sidecar.url, json=retry, headers=headers)
            assert answer.status_code == 200, answer.text
            final = response_to(answer, 3)["result"]
            assert json.loads(final["content"][0]["text"]) == {"ok": True, "text": "Proceeding."}
            fresh = await http.post(sidecar.url, json=round_request(4, "Again?"), headers=headers)
            assert fresh.status_code == 503, fresh.text
            tg.cancel_scope.cancel()  # the hanging call's client leaves: the drain ends with it
        assert len(fake_claude.message_requests) == 2  # the retry did not sample again
        assert await sidecar.wait(40) == 0


async def test_2026_upstreams_and_handshake_sessions_share_max_sessions(tmp_path: Path) -> None:
    """`--max-sessions` counts upstreams: handshake sessions and 2026-07-28 hubs used to get it each,
    so `--max-sessions 1` ran two upstream processes. Now a 2026-07-28 client finding the one slot
    taken by a session gets 503, and an idle hub makes room for a new session."""
    upstream = [*CHATTY_SERVER, str(tmp_path)]
    async with (
        run_sidecar(
            "--provider", "mock", "--max-sessions", "1", upstream=upstream, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)  # the one slot, with its upstream
        body = stateless_request(1, "tools/call", {"name": "pid", "arguments": {}})
        refused = await http.post(sidecar.url, json=body, headers=stateless_headers("tools/call", "pid"))
        assert refused.status_code == 503, refused.text
        assert "--max-sessions" in refused.json()["error"]["message"]
        assert len(list(tmp_path.glob("started-*"))) == 1

        assert (await http.delete(sidecar.url, headers={"mcp-session-id": session})).status_code == 200
        assert "result" in await call_tool(http, sidecar, 2, "pid")  # the slot is the hub's now
        assert await open_session(http, sidecar.url)  # the idle hub makes room
        assert "closed to make room" in sidecar.stderr()


SAMPLING_SERVER = python_server("sampling_server.py")


async def test_mcp_param_headers_must_match_the_body_whatever_the_upstream() -> None:
    """`Mcp-Param-*` headers were left for the upstream to check, but a stdio upstream never sees
    them (and an HTTP upstream gets headers the proxy derives from the body): a gateway in front of
    the sidecar routing on `Mcp-Param-Region: eu` let through a body calling for `us`. The front now
    checks them as the SDK's server does (400, -32020), listing the tools itself when it must."""
    async with (
        run_sidecar("--provider", "mock", upstream=SAMPLING_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        body = stateless_request(
            1, "tools/call", {"name": "regional", "arguments": {"region": "us", "city": "Reno"}}
        )
        headers = stateless_headers("tools/call", "regional")
        # Before any client listed the tools: the proxy finds the tool's `x-mcp-header` itself.
        for param_headers, why in (
            ({"mcp-param-region": "eu"}, "does not match"),
            ({}, "is missing"),
        ):
            refused = await http.post(sidecar.url, json=body, headers={**headers, **param_headers})
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert (refused.json()["id"], error["code"]) == (1, -32020)
            assert "Mcp-Param-Region" in error["message"]
            assert why in error["message"]
        good = await http.post(sidecar.url, json=body, headers={**headers, "mcp-param-region": "us"})
        assert json.loads(response_to(good, 1)["result"]["content"][0]["text"]) == {
            "region": "us",
            "city": "Reno",
        }
        absent = stateless_request(2, "tools/call", {"name": "regional", "arguments": {"city": "Reno"}})
        claimed = await http.post(sidecar.url, json=absent, headers={**headers, "mcp-param-region": "us"})
        assert (claimed.status_code, claimed.json()["error"]["code"]) == (400, -32020)
        # A tool without annotations, and one the server does not have, pass to the upstream as before.
        echoed = await call_tool(http, sidecar, 3, "echo", text="hi")
        assert json.loads(echoed["result"]["content"][0]["text"]) == {"text": "hi"}
        unknown = await call_tool(http, sidecar, 4, "no-such-tool", x=1)
        assert unknown["id"] == 4
        assert "error" in unknown or unknown["result"].get("isError")


PAGED_TOOLS_SERVER = python_server("paged_tools_server.py")


async def test_a_tools_listing_seen_from_its_second_page_leaves_no_tool_unchecked() -> None:
    """The front took any last page of a tools listing it carried for the end of a whole listing:
    a client that listed only the second page (with a cursor it had kept) had every tool of the
    first taken for one the server does not have, and its calls went on unchecked, `Mcp-Param-*`
    headers contradicting the body and all. Only a listing followed from its first page is whole;
    until one is, the front lists the tools itself."""
    async with (
        run_sidecar("--provider", "mock", upstream=PAGED_TOOLS_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        page = stateless_request(1, "tools/list", {"cursor": "page-2"})
        listed = await http.post(sidecar.url, json=page, headers=stateless_headers("tools/list"))
        assert [tool["name"] for tool in response_to(listed, 1)["result"]["tools"]] == ["echo"]
        body = stateless_request(
            2, "tools/call", {"name": "regional", "arguments": {"region": "us", "city": "Reno"}}
        )
        headers = {**stateless_headers("tools/call", "regional"), "mcp-param-region": "eu"}
        refused = await http.post(sidecar.url, json=body, headers=headers)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == -32020
        assert "Mcp-Param-Region" in refused.json()["error"]["message"]


@pytest.mark.parametrize("ending", ["room", "idle"])
async def test_a_round_paid_for_outlives_the_upstream_that_asked_it(
    fake_claude: FakeClaude, ending: str
) -> None:
    """A mixed round's sampling answers wait in the proxy for the client's retry. They were kept by
    the relay of the client's upstream: when that upstream was stopped (to make room for another
    under `--max-sessions`, or for idleness) before the client answered its part, the retry got
    "requestState expired or unknown" seconds later, though the server (sealing its state under a
    key it keeps across restarts) would have taken it, and the Claude call made for the round was
    wasted. Now the client's next upstream takes them over, and the retry is served unsampled."""
    fake_claude.enqueue(text_reply("Proceeding."))
    options = ("--max-sessions", "1") if ending == "room" else ("--session-idle-timeout", "1")
    env = proxy_env(fake_claude.url, RESOLVE_STATE_KEY="a-key-the-server-keeps-32-bytes!")
    async with (
        run_sidecar(*options, upstream=RESOLVE_SERVER, env=env) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = stateless_headers("tools/call", "confirm_and_ask")
        first = await http.post(sidecar.url, json=round_request(1, "Proceed?"), headers=headers)
        result = response_to(first, 1)["result"]
        assert result["resultType"] == "input_required"
        [key] = result["inputRequests"]
        if ending == "room":  # a session takes the one upstream: the client's idle one makes room
            session = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
            assert (await http.delete(sidecar.url, headers=session)).status_code in (200, 204)
        else:
            with anyio.fail_after(HTTP_TIMEOUT):
                while "idle upstream for 2026-07-28 requests closed" not in sidecar.stderr():
                    await anyio.sleep(0.05)
        retry = round_request(
            2,
            "Proceed?",
            inputResponses={key: {"action": "accept", "content": {"ok": True}}},
            requestState=result["requestState"],
        )
        with anyio.fail_after(HTTP_TIMEOUT):
            while (answer := await http.post(sidecar.url, json=retry, headers=headers)).status_code == 503:
                await anyio.sleep(0.05)  # the session's upstream is still stopping
        assert answer.status_code == 200, answer.text
        final = response_to(answer, 2)["result"]
        assert json.loads(final["content"][0]["text"]) == {"ok": True, "text": "Proceeding."}
    assert len(fake_claude.message_requests) == 1  # the retry did not sample again


async def test_progress_of_a_request_whose_rounds_the_proxy_drives_reaches_the_client(
    fake_claude: FakeClaude,
) -> None:
    """The server reports progress for the request the proxy re-sent with its answers to a round:
    the client hears it on its POST, under its own progress token."""
    fake_claude.enqueue(text_reply("sampled"))
    heard = ProgressHeard()

    upstream = python_server("input_required_server.py")
    async with (
        run_sidecar(upstream=upstream, env=proxy_env(fake_claude.url)) as sidecar,
        Client(sidecar.url) as client,
    ):
        result = await client.call_tool("progress", {"prompt": "go"}, progress_callback=heard)
    assert tool_json(result) == {"text": "sampled"}
    assert heard == [(1, 2, "half way"), (2, 2, "done")]


async def test_a_2026_client_hears_monotonic_progress_while_the_proxy_samples_for_a_round(
    fake_claude: FakeClaude,
) -> None:
    """As through the stdio wrapper (tests/e2e/test_stateless_era.py): while Claude answers a round
    the client hears progress under its own token at a bounded interval, and the server's progress
    of the request the proxy re-sent, counted from the start again, is lifted above it."""
    fake_claude.enqueue(text_reply("sampled", delay=ROUND_PROGRESS_INTERVAL + 3))
    heard = ProgressHeard()

    async with (
        run_sidecar(upstream=INPUT_REQUIRED_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        Client(sidecar.url) as client,
    ):
        result = await client.call_tool("progress_each_round", {"prompt": "go"}, progress_callback=heard)
    assert tool_json(result) == {"text": "sampled"}
    assert_kept_informed_while_sampling(heard)
    assert len(fake_claude.message_requests) == 1
