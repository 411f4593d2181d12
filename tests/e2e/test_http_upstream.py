"""stdio client -> `python -m mcp_backfill --upstream-url URL` -> a streamable-HTTP MCP server.

Everything runs as real processes talking real HTTP on 127.0.0.1 (ephemeral ports): the upstream
is tests/servers/sampling_server.py served by uvicorn, npm's server-everything, or
tests/servers/http_recorder.py (scriptable failures, and a record of every HTTP request it got).
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, types

from mcp_backfill.relay.progress import ROUND_PROGRESS_INTERVAL
from tests.e2e.test_process import wait_for_log
from tests.fake_claude import FakeClaude, hang_reply, text_reply, tool_use_reply
from tests.harness import (
    SERVERS,
    TEST_API_KEY,
    HttpServer,
    ProgressHeard,
    RawSession,
    assert_kept_informed_while_sampling,
    free_port,
    initialize_params,
    npm_http_server,
    proxy_env,
    proxy_url_argv,
    python_http_server,
    raw_proxy,
    stdio_params,
    tool_json,
)
from tests.sidecar_harness import HTTP_TIMEOUT

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = [sys.executable, str(SERVERS / "sampling_server.py"), "--http"]
RESOLVE_SERVER = [sys.executable, str(SERVERS / "resolve_server.py"), "--http", "127.0.0.1:0"]
MODERN = "2026-07-28"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "raw-test-client", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


@asynccontextmanager
async def sampling_upstream(address: str = "127.0.0.1:0") -> AsyncIterator[HttpServer]:
    async with python_http_server([*SAMPLING_SERVER, address]) as server:
        yield server


@asynccontextmanager
async def recorder() -> AsyncIterator[tuple[HttpServer, Callable[[], list[dict[str, Any]]]]]:
    """The recording upstream, and a function returning what it recorded so far."""
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "requests.jsonl"
        record.touch()
        argv = [sys.executable, str(SERVERS / "http_recorder.py"), str(record)]
        async with python_http_server(argv) as server:

            def recorded() -> list[dict[str, Any]]:
                return [json.loads(line) for line in record.read_text().splitlines()]

            yield server, recorded


def result_json(response: dict[str, Any]) -> Any:
    assert "result" in response, response
    return json.loads(response["result"]["content"][0]["text"])


async def handshake(session: RawSession) -> None:
    response = await session.request(1, "initialize", initialize_params())
    assert "result" in response, response
    await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


def stateless_call(request_id: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments, "_meta": ENVELOPE}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


# -- sampling through the HTTP upstream --------------------------------------------------------------


async def test_sampling_tool_loop_through_an_http_upstream(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        tool_use_reply("lookup", {"key": "beta"}, id="toolu_http_1", text="Let me check."),
        text_reply("beta is 2."),
    )
    async with sampling_upstream() as upstream:
        async with Client(upstream.url, mode="legacy") as direct:  # the same client, without the proxy
            with pytest.raises(Exception, match="sampling tools capability"):
                tool_json(await direct.call_tool("loop", {"question": "What is beta?"}))

        argv = proxy_url_argv("--log-level", "debug", url=upstream.url)
        async with Client(stdio_params(argv, proxy_env(fake_claude.url)), mode="legacy") as client:
            outcome = tool_json(
                await client.call_tool(
                    "loop", {"question": "What is beta?", "rounds": 3, "tool_choice": "required"}
                )
            )

    assert outcome["completed"] is True
    assert outcome["finalText"] == "beta is 2."
    first, second = outcome["rounds"]
    assert first["toolCalls"] == [{"id": "toolu_http_1", "name": "lookup", "input": {"key": "beta"}}]
    assert (first["stopReason"], second["stopReason"]) == ("toolUse", "endTurn")
    bodies = [request.body for request in fake_claude.message_requests]
    assert len(bodies) == 2
    assert all(body["tool_choice"] == {"type": "any"} for body in bodies)
    assert [tool["name"] for tool in bodies[0]["tools"]] == ["lookup"]
    follow_up = bodies[1]["messages"]
    assert follow_up[1]["content"][1]["id"] == "toolu_http_1"
    [tool_result] = follow_up[2]["content"]
    assert tool_result["tool_use_id"] == "toolu_http_1"
    assert any("beta = 2" in block["text"] for block in tool_result["content"])


async def test_a_dropped_response_stream_is_resumed(fake_claude: FakeClaude) -> None:
    """The server closes the tools/call stream at once; sampling request and result come on resumption."""
    fake_claude.enqueue(text_reply("answered after resuming"))
    async with sampling_upstream() as upstream:
        argv = proxy_url_argv("--log-level", "debug", url=upstream.url)
        async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
            await handshake(session)
            await session.send(
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "resumable_plain", "arguments": {"prompt": "hi"}},
                }
            )
            response, before = await session.recv_until(lambda m: m.get("id") == 2)
            log = session.stderr()
    assert result_json(response)["text"] == "answered after resuming"
    assert not [m for m in before if m.get("method") == "sampling/createMessage"]
    assert "resuming an upstream stream" in log
    assert len(fake_claude.message_requests) == 1


async def test_server_everything_over_http_samples_for_a_client_without_sampling(
    everything: str, fake_claude: FakeClaude
) -> None:
    fake_claude.enqueue(text_reply("Sampled over HTTP by the fake Claude."))
    async with npm_http_server([everything, "streamableHttp"]) as upstream:
        async with Client(upstream.url, mode="legacy") as direct:
            assert "trigger-sampling-request" not in {t.name for t in (await direct.list_tools()).tools}
        argv = proxy_url_argv(url=upstream.url)
        async with Client(stdio_params(argv, proxy_env(fake_claude.url)), mode="legacy") as client:
            assert "trigger-sampling-request" in {t.name for t in (await client.list_tools()).tools}
            result = await client.call_tool("trigger-sampling-request", {"prompt": "Say hi", "maxTokens": 40})
    assert not result.is_error
    [block] = result.content
    assert isinstance(block, types.TextContent)
    assert "Sampled over HTTP by the fake Claude." in block.text
    [request] = fake_claude.message_requests
    assert request.body["max_tokens"] == 40
    [system] = request.body["system"]  # a block, marked for prompt caching
    assert system["text"] == "You are a helpful test server."


# -- 2026-07-28 pass-through -----------------------------------------------------------------------


async def test_stateless_client_calls_tools_through_the_http_upstream() -> None:
    async with sampling_upstream() as upstream:
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with Client(stdio_params(argv, proxy_env()), mode="auto") as client:
            assert client.protocol_version == MODERN
            # Called before any tools/list: the proxy lists the tools itself to find Mcp-Param-Region.
            regional = tool_json(await client.call_tool("regional", {"region": "eu-west", "city": "Paris"}))
            echoed = tool_json(await client.call_tool("echo", {"text": "hello 2026"}))
            names = {tool.name for tool in (await client.list_tools()).tools}
    assert regional == {"region": "eu-west", "city": "Paris"}
    assert echoed == {"text": "hello 2026"}
    assert {"regional", "echo"} <= names


async def test_stateless_input_required_sampling_through_the_http_upstream(fake_claude: FakeClaude) -> None:
    """2026-07-28: each round is its own POST (the proxy's retries under its own ids), no session."""
    fake_claude.enqueue(
        tool_use_reply("get_weather", {"city": "Oslo"}, id="toolu_oslo", text="Checking."),
        text_reply("Snow in Oslo."),
    )
    async with python_http_server(RESOLVE_SERVER) as upstream:
        argv = proxy_url_argv(url=upstream.url)
        async with Client(stdio_params(argv, proxy_env(fake_claude.url)), mode="auto") as client:
            assert client.protocol_version == MODERN
            outcome = tool_json(await client.call_tool("weather", {"city": "Oslo"}))
    assert outcome["rounds"] == 2
    assert outcome["first"] == {"stopReason": "toolUse", "toolUseIds": ["toolu_oslo"]}
    assert outcome["final"]["text"] == "Snow in Oslo."
    assert len(fake_claude.message_requests) == 2


async def test_param_headers_are_derived_and_the_proxys_own_listing_stays_private() -> None:
    async with sampling_upstream() as upstream:
        # The server really insists on the header: without it the call is refused.
        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
            bare = await http.post(
                upstream.url,
                json=stateless_call(1, "regional", {"region": "eu", "city": "Oslo"}),
                headers={
                    "accept": "application/json, text/event-stream",
                    "mcp-protocol-version": MODERN,
                    "mcp-method": "tools/call",
                    "mcp-name": "regional",
                },
            )
        assert bare.json()["error"]["code"] == -32020

        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await session.send(stateless_call(7, "regional", {"region": "ap-south", "city": "Pune"}))
            first = await session.recv()
            await session.send(stateless_call(8, "echo", {"text": "next"}))
            second = await session.recv()
    assert first["id"] == 7
    assert result_json(first) == {"region": "ap-south", "city": "Pune"}
    assert second["id"] == 8  # nothing of the proxy's own tools/list came in between
    assert result_json(second) == {"text": "next"}


async def test_stateless_cancellation_closes_the_request_stream() -> None:
    async with sampling_upstream() as upstream:
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await session.send(stateless_call(5, "wait_forever", {"label": "w1"}))
            await wait_for_log(upstream.log, "wait_forever w1 started", timeout=30)
            await session.send(
                {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}
            )
            await wait_for_log(upstream.log, "wait_forever w1 cancelled", timeout=30)
            await session.send(stateless_call(6, "echo", {"text": "still here"}))
            response = await session.recv()
    assert response["id"] == 6  # the cancelled request got no answer
    assert result_json(response) == {"text": "still here"}


async def test_client_eof_lets_requests_in_flight_finish_within_the_grace_period() -> None:
    async with sampling_upstream() as upstream:
        argv = proxy_url_argv("--provider", "mock", "--shutdown-grace", "0.5", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            await session.send(
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": "last"}},
                }
            )
            await session.send(
                {
                    "jsonrpc": "2.0",
                    "id": 3,
                    "method": "tools/call",
                    "params": {"name": "wait_forever", "arguments": {"label": "w2"}},
                }
            )
            await wait_for_log(upstream.log, "wait_forever w2 started")
            await session.close_stdin()
            answers = {message["id"]: message for message in [await session.recv(), await session.recv()]}
            status = await session.wait()
            log = session.stderr()
    assert result_json(answers[2]) == {"text": "last"}
    assert answers[3]["error"]["code"] == -32603
    assert "shutting down" in answers[3]["error"]["message"]
    assert status == 0
    assert "upstream session ended" in log  # DELETE


# -- upstream failures -------------------------------------------------------------------------------


async def test_unreachable_upstream_answers_every_request_with_an_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    async with raw_proxy(proxy_url_argv("--provider", "mock", url=url), proxy_env()) as session:
        init = await session.request(1, "initialize", initialize_params())
        ping = await session.request(2, "ping")
        await session.close_stdin()
        status = await session.wait()
        log = session.stderr()
    for response in (init, ping):
        assert response["error"]["code"] == -32603
        assert response["error"]["message"].startswith("Upstream unreachable: cannot connect")
        assert url in response["error"]["message"]
    assert status == 1
    assert "upstream unreachable" in log


async def test_restarted_upstream_reports_the_expired_session_and_does_not_reconnect() -> None:
    """The server forgot the session: the request that found out is answered with an error saying
    so, and the wrapper ends (status 1) as for an upstream that exited, without a new session behind
    the client's back; a stdio client starts anew by starting the server again."""
    async with sampling_upstream() as upstream:
        address = upstream.url.removeprefix("http://").removesuffix("/mcp")
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            ok = await session.request(2, "tools/call", {"name": "echo", "arguments": {"text": "before"}})
            assert result_json(ok) == {"text": "before"}
            upstream.process.terminate()
            await upstream.process.wait()
            async with sampling_upstream(address):
                after = {"name": "echo", "arguments": {"text": "after"}}
                first = await session.request(3, "tools/call", after)
                status = await session.wait()
            log = session.stderr()
    assert first["error"]["code"] == -32603
    assert first["error"]["message"].startswith("Upstream session expired")
    assert status == 1
    assert log.count("upstream session expired") == 1


async def test_an_expired_session_stops_the_sampling_done_for_it(fake_claude: FakeClaude) -> None:
    """The server forgets the session while the proxy samples for one of its requests: nobody can
    take that answer any more, so the Claude call is stopped, and the wrapper ends (status 1)."""
    fake_claude.enqueue(hang_reply())
    async with sampling_upstream() as upstream:
        address = upstream.url.removeprefix("http://").removesuffix("/mcp")
        argv = proxy_url_argv(url=upstream.url)
        async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
            await handshake(session)
            tool = {"name": "plain", "arguments": {"prompt": "hi"}}
            await session.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": tool})
            assert await fake_claude.await_requests(1, timeout=30)
            upstream.process.terminate()
            await upstream.process.wait()
            async with sampling_upstream(address):
                await session.send({"jsonrpc": "2.0", "id": 3, "method": "ping"})
                assert await fake_claude.await_disconnects(1, timeout=30), "the Claude call ran on"
                status = await session.wait(timeout=30)
    assert status == 1


async def test_http_errors_become_json_rpc_errors_and_the_session_goes_on() -> None:
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            server_error = await session.request(2, "fail/500")
            teapot = await session.request(3, "fail/teapot")
            answered = await session.request(4, "fail/jsonrpc-400")
            hung_up = await session.request(5, "fail/hang-up")
            after = await session.request(6, "anything/else")
            forgotten = await session.request(7, "session/forget")
            expired = await session.request(8, "anything/else")
            status = await session.wait()  # the session is gone: so is the wrapper
        posts = [entry["body"] for entry in recorded() if entry["verb"] == "POST"]
    assert server_error["error"]["code"] == -32603
    assert "HTTP 500" in server_error["error"]["message"]
    assert "database on fire" in server_error["error"]["message"]
    assert teapot["error"]["code"] == -32603
    assert "HTTP 418" in teapot["error"]["message"]
    assert "short and stout" in teapot["error"]["message"]
    assert answered["error"] == {"code": -32602, "message": "bad params from server"}  # the server's own
    assert hung_up["error"]["code"] == -32603
    assert after["result"] == {"method": "anything/else"}
    assert forgotten["result"] == {}
    assert expired["error"]["code"] == -32603
    assert "session expired" in expired["error"]["message"]
    assert status == 1
    assert [body["method"] for body in posts].count("initialize") == 1  # no silent re-initialize


async def test_an_error_whose_body_never_ends_is_answered_from_its_start() -> None:
    """An HTTP 500 whose body streams on for good: the error is made from its first bytes (it was
    read to its end, which never came, and the request waited for good)."""
    async with recorder() as (upstream, _):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            with anyio.fail_after(60):
                failed = await session.request(2, "fail/endless-500")
            after = await session.request(3, "anything/else")
    assert failed["error"]["code"] == -32603
    assert "HTTP 500" in failed["error"]["message"]
    assert "on fire" in failed["error"]["message"]
    assert after["result"] == {"method": "anything/else"}


async def test_an_upstream_error_quoting_the_credential_reaches_the_client_redacted() -> None:
    """A text error page, and a 4xx answer shaped as a JSON-RPC error (which was relayed as the
    upstream sent it, handing the operator's `--upstream-header` credential to the client)."""
    secret = "upstream-credential-0123456789"
    async with recorder() as (upstream, _):
        header = f"Authorization: Bearer {secret}"
        argv = proxy_url_argv("--provider", "mock", "--upstream-header", header, url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            refused = await session.request(2, "fail/echo-auth")
            as_jsonrpc = await session.request(3, "fail/echo-auth-jsonrpc")
            plain = await session.request(4, "fail/jsonrpc-400")
            await session.close_stdin()
            await session.wait()
            stderr = session.stderr()
    message = refused["error"]["message"]
    assert "HTTP 401" in message
    assert "bad credentials: ***" in message
    assert secret not in message
    assert secret not in stderr
    assert as_jsonrpc["error"] == {"code": -32001, "message": "bad credentials: ***"}
    assert plain["error"] == {"code": -32602, "message": "bad params from server"}  # as sent


async def test_oversized_upstream_answers_become_errors_for_their_requests() -> None:
    async with recorder() as (upstream, _):
        argv = proxy_url_argv("--provider", "mock", "--max-message-bytes", "4096", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            as_json = await session.request(2, "big/json", {"size": 20000})
            as_sse = await session.request(3, "big/sse", {"size": 20000})
            small = await session.request(4, "big/sse", {"size": 10})
    for response in (as_json, as_sse):
        assert response["error"]["code"] == -32603
        assert "--max-message-bytes" in response["error"]["message"]
    assert small["result"] == {"padding": "x" * 10}


async def test_an_upstream_answer_that_is_not_json_gets_its_request_one_error() -> None:
    """The relay answers for an event it cannot parse, from the id it reads; the exchange, still
    owing that answer when the stream ended, answered it a second time."""
    async with recorder() as (upstream, _):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            bad = await session.request(2, "bad/sse", {})
            await session.send({"jsonrpc": "2.0", "id": 3, "method": "x/y"})
            after, seen = await session.recv_until(lambda m: m.get("id") == 3)
    assert bad["error"]["code"] == -32603
    assert "not valid JSON" in bad["error"]["message"]
    assert after["result"] == {"method": "x/y"}
    assert [m for m in seen if m.get("id") == 2] == []


async def test_sse_answers_leave_the_upstream_connection_reusable() -> None:
    """After a request's answer the proxy reads its SSE stream to the end, which hands the connection
    back to the pool: SSE-answered requests in a row reach the upstream over one TCP connection
    (closing each stream midway cost a new connection per request)."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            answers = [await session.request(n, "big/sse", {"size": 10}) for n in range(2, 6)]
        posts = [
            entry for entry in recorded() if entry["verb"] == "POST" and entry["body"]["method"] == "big/sse"
        ]
    assert [answer["result"] for answer in answers] == [{"padding": "x" * 10}] * 4
    assert len(posts) == 4
    assert len({entry["peer"] for entry in posts}) == 1, posts


# -- headers and credentials -------------------------------------------------------------------------


def ended_with_delete(entries: list[dict[str, Any]]) -> bool:
    """The session ended with its DELETE, after every POST. The standalone GET, opened by a task once
    `notifications/initialized` is acknowledged and cancelled before the DELETE, may reach the
    recorder (a thread per connection) just after it: its place says nothing of the proxy's order."""
    verbs: list[str] = [entry["verb"] for entry in entries if entry["verb"] != "GET"]
    return verbs[-1] == "DELETE"


async def test_upstream_headers_arrive_and_the_api_key_never_does(fake_claude: FakeClaude) -> None:
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv(
            "--log-level",
            "debug",
            "--upstream-header",
            "Authorization: Bearer upstream-tok-42",
            "--upstream-header",
            "X-Team: blue",
            url=upstream.url,
        )
        env = proxy_env(fake_claude.url)
        async with raw_proxy(argv, env) as session:
            await handshake(session)
            assert (await session.request(2, "tools/list"))["result"] == {"method": "tools/list"}
            await session.close_stdin()
            status = await session.wait()
            log = session.stderr()
        entries = recorded()
    assert env["ANTHROPIC_API_KEY"] == TEST_API_KEY
    # The GET (answered 405: no standalone stream) races the tools/list POST.
    assert sorted(entry["verb"] for entry in entries) == ["DELETE", "GET", "POST", "POST", "POST"]
    assert ended_with_delete(entries)
    for entry in entries:
        assert entry["headers"]["authorization"] == "Bearer upstream-tok-42"
        assert entry["headers"]["x-team"] == "blue"
        assert entry["headers"]["user-agent"].startswith("mcp-backfill/")
        assert TEST_API_KEY not in json.dumps(entry)
    for entry in entries[1:]:
        assert entry["headers"]["mcp-session-id"] == "rec-session-1"
        assert entry["headers"]["mcp-protocol-version"] == "2025-11-25"
        assert entry["headers"]["cookie"] == "lb=replica-7"  # the cookie the initialize answer set
    assert "mcp-protocol-version" not in entries[0]["headers"]
    assert "cookie" not in entries[0]["headers"]
    assert status == 0
    assert "upstream-tok-42" not in log
    assert TEST_API_KEY not in log


async def test_credentials_in_the_upstream_url_go_with_every_request() -> None:
    """`--upstream-url http://user:password@host/mcp` is sent as Basic authentication on every request,
    the message POSTs too (the lean transport's POSTs went without it: every one got a 401), and the
    password reaches neither the log nor the client."""
    async with recorder() as (upstream, recorded):
        url = upstream.url.replace("http://", "http://alice:url-pass-0123456789@")
        argv = proxy_url_argv("--provider", "mock", "--log-level", "debug", url=url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            answer = await session.request(2, "tools/list")
            await session.close_stdin()
            await session.wait()
            log = session.stderr()
        entries = recorded()
    assert answer["result"] == {"method": "tools/list"}
    expected = "Basic " + base64.b64encode(b"alice:url-pass-0123456789").decode()
    assert sorted(entry["verb"] for entry in entries) == ["DELETE", "GET", "POST", "POST", "POST"]
    assert [entry["headers"].get("authorization") for entry in entries] == [expected] * len(entries)
    assert "url-pass-0123456789" not in log


async def test_an_upstream_error_quoting_the_urls_basic_credentials_reaches_the_client_redacted() -> None:
    """The password of `--upstream-url http://user:password@host` goes as `Authorization: Basic
    base64(user:password)`: an error page quoting that header handed the client (and the log) the
    password, one base64 decoding away; only the password as written was redacted."""
    basic = base64.b64encode(b"alice:url-pass-0123456789").decode()
    async with recorder() as (upstream, _):
        url = upstream.url.replace("http://", "http://alice:url-pass-0123456789@")
        argv = proxy_url_argv("--provider", "mock", url=url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            refused = await session.request(2, "fail/echo-auth")
            as_jsonrpc = await session.request(3, "fail/echo-auth-jsonrpc")
            await session.close_stdin()
            await session.wait()
            log = session.stderr()
    assert "HTTP 401" in refused["error"]["message"]
    for text in (refused["error"]["message"], as_jsonrpc["error"]["message"], log):
        assert basic not in text, text
    assert as_jsonrpc["error"]["message"] == "bad credentials: Basic ***"


async def test_an_upstream_urls_signature_or_function_key_is_kept_out_of_errors_and_the_log() -> None:
    """An upstream URL that carries its credential in a query parameter not named like one (an Azure
    SAS signature `sig=`, an Azure Functions key `code=`, a presigned URL's `X-Amz-Credential=`):
    a redirect (which keeps the query), or an error page quoting the URL, handed it to the client and
    the log, as only parameters named like a key, token or password were credentials."""
    found = {
        "sig": "sas-signature-0123456789",
        "code": "function-key-0123456789",
        "X-Amz-Credential": "AKIDFAKE/x",
    }
    query = "&".join(f"{name}={value}" for name, value in found.items())
    async with recorder() as (upstream, _):
        argv = proxy_url_argv("--provider", "mock", url=f"{upstream.url}?region=eu&{query}")
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            redirected = await session.request(2, "fail/redirect")
            await session.close_stdin()
            await session.wait()
            log = session.stderr()
    message = redirected["error"]["message"]
    assert "HTTP 307" in message
    assert "region=eu" in message
    for leaked in found.values():
        assert leaked not in message + log, leaked


async def test_a_redirect_names_its_target_without_the_urls_credentials() -> None:
    """A redirect keeps the request's query (Starlette's `/mcp` -> `/mcp/`): the error the client gets
    names where it points without the token given in the query, or a password."""
    secret = "query-secret-0123456789"
    async with recorder() as (upstream, _):
        url = upstream.url.replace("http://", "http://alice:url-pass-0123456789@") + f"?api_key={secret}"
        argv = proxy_url_argv("--provider", "mock", url=url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            redirected = await session.request(2, "fail/redirect")
            await session.close_stdin()
            await session.wait()
            log = session.stderr()
    message = redirected["error"]["message"]
    assert "HTTP 307" in message
    assert upstream.url + "/" in message
    assert "--upstream-url" in message
    for leaked in (secret, "url-pass-0123456789"):
        assert leaked not in message
        assert leaked not in log


async def test_a_request_the_upstream_has_polled_for_is_answered_however_many_polls_it_takes() -> None:
    """A server may close a request's stream after a priming event and have the client poll with
    `Last-Event-ID`, each poll another priming event (2025-11-25, as the SDK's `close_sse_stream`):
    every poll that reopens the stream counts as one that worked, so a long request is not given up
    after three of them (`reconnect_attempts` counts failed reconnections)."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            answer = await session.request(2, "poll/answer", {"polls": 6})
        polls = [
            entry for entry in recorded() if entry["headers"].get("last-event-id", "").startswith("poll-")
        ]
    assert answer.get("result") == {"polls": 6}, answer
    assert len(polls) == 6


async def test_a_garbled_compressed_answer_to_the_sessions_end_is_a_warning_not_a_crash() -> None:
    """An answer whose `Content-Encoding` does not decode is the upstream's failure like a broken
    connection (httpx2 raises it as no transport error): the DELETE ending the session only warns,
    and the proxy exits cleanly instead of with a traceback."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            assert (await session.request(2, "session/garble-close"))["result"] == {}
            await session.close_stdin()
            status = await session.wait()
            log = session.stderr()
        verbs = [entry["verb"] for entry in recorded()]
    assert verbs[-1] == "DELETE"
    assert "Traceback" not in log
    assert "could not end the upstream session" in log
    assert status == 0


async def test_an_answer_to_the_sessions_end_that_never_ends_does_not_hold_the_exit() -> None:
    """The DELETE ending the session is answered with a body that streams on for good: the proxy
    waits for it as long as for any ending (it waited for its end, which never came, for good)."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            assert (await session.request(2, "session/endless-close"))["result"] == {}
            await session.close_stdin()
            status = await session.wait(timeout=60)
        verbs = [entry["verb"] for entry in recorded()]
    assert verbs[-1] == "DELETE"
    assert status == 0


async def test_a_session_id_mcp_does_not_allow_fails_the_initialize_with_a_clear_error() -> None:
    """A session id must be visible ASCII (0x21-0x7E); one that is not cannot be sent back (every
    later request failed as an internal error, and the DELETE ending the session ended the proxy
    with a traceback): the `initialize` gets an error naming it, and the proxy exits cleanly."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            params = initialize_params()
            params["clientInfo"]["name"] = "bad-session-id"
            refused = await session.request(1, "initialize", params)
            await session.close_stdin()
            status = await session.wait()
            log = session.stderr()
        verbs = [entry["verb"] for entry in recorded()]
    assert refused["error"]["code"] == -32603
    assert "Mcp-Session-Id" in refused["error"]["message"]
    assert "Traceback" not in log
    assert verbs == ["POST"]
    assert status == 0


async def test_a_stream_whose_event_ids_are_not_ascii_is_resumed() -> None:
    """An SSE event id is any text; resuming sends it back in `Last-Event-ID` as UTF-8 (as browsers
    do) instead of failing the request with an internal error (a header cannot hold it as text)."""
    async with recorder() as (upstream, _):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            answer = await session.request(2, "poll/answer", {"polls": 2, "label": "poll\u00e9\u2603"})
            await session.close_stdin()
            await session.wait()
            log = session.stderr()
    assert answer.get("result") == {"polls": 2}, answer
    assert "Traceback" not in log


async def test_a_notification_answered_with_an_endless_stream_does_not_hold_up_what_follows() -> None:
    """A notification is acknowledged by its answer's head: a server answering one with an SSE stream
    that never ends (pings keep it within the read timeout) held every later client message back
    for as long as it lasted, the body being read to its end."""
    async with recorder() as (upstream, _):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            await session.send({"jsonrpc": "2.0", "method": "notifications/stream-forever"})
            after = await session.request(2, "anything/else")
    assert after["result"] == {"method": "anything/else"}


async def test_a_cancelled_request_is_no_longer_polled_for() -> None:
    """Once the client cancels a request, nothing is owed for it: a server having the proxy poll for
    it (a new priming event on every reconnection) is not polled any more."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            await session.send(
                {"jsonrpc": "2.0", "id": 2, "method": "poll/answer", "params": {"polls": 100000}}
            )

            def polls() -> int:
                resumed = [entry["headers"].get("last-event-id", "") for entry in recorded()]
                return sum(1 for event_id in resumed if event_id.startswith("poll"))

            with anyio.fail_after(15):
                while polls() < 3:
                    await anyio.sleep(0.05)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
            await session.send(cancel)
            assert (await session.request(3, "anything/else"))["result"] == {"method": "anything/else"}
            await anyio.sleep(0.5)  # a poll under way when the cancellation came ends
            settled = polls()
            await anyio.sleep(0.5)  # 25 more polls, were they still made (`retry: 20`)
            assert polls() == settled


@pytest.mark.parametrize("digits", [400, 5000])
async def test_an_sse_retry_of_any_size_is_taken(digits: int) -> None:
    """`retry:` is any run of digits: one too large for a float (400 of them), or for Python to read
    as a number (5,000), is taken as the longest wait the proxy allows, not an internal error for
    the request whose stream carried it."""
    async with recorder() as (upstream, _):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            answer = await session.request(2, "sse/retry", {"retry": "9" * digits})
            await session.close_stdin()
            await session.wait()
            log = session.stderr()
    assert answer.get("result") == {}, answer
    assert "Traceback" not in log


async def test_a_protocol_version_that_cannot_be_a_header_is_not_sent_back() -> None:
    """The version `initialize` negotiated goes back in `MCP-Protocol-Version`: one that cannot be a
    header (not visible ASCII) is relayed for the client to judge but not sent back, instead of
    failing every later request as an internal error and ending the proxy with a traceback."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            params = initialize_params()
            params["clientInfo"]["name"] = "bad-version"
            init = await session.request(1, "initialize", params)
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            after = await session.request(2, "anything/else")
            await session.close_stdin()
            status = await session.wait()
            log = session.stderr()
        entries = recorded()
    assert init["result"]["protocolVersion"] == "2025-11-25\u00e9"
    assert after["result"] == {"method": "anything/else"}
    assert "Traceback" not in log
    assert status == 0
    assert ended_with_delete(entries)
    assert all("mcp-protocol-version" not in entry["headers"] for entry in entries)


async def test_client_eof_lets_a_round_the_proxy_answers_finish_within_the_grace_period(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """`echo REQUEST | mcp-backfill --upstream-url URL`: a 2026-07-28 request whose round the proxy
    answers with Claude is in flight as much as one the upstream is working on, and gets up to
    `--shutdown-grace` too. While the proxy sampled, no POST was open upstream, so the stop came at
    once: the Claude call was cancelled (and charged) and the request failed as though the upstream
    had exited."""
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(
        tool_use_reply("get_weather", {"city": "Oslo"}, id="toolu_oslo", text="Checking.", delay=1.0),
        text_reply("Snow in Oslo."),
    )
    async with python_http_server(RESOLVE_SERVER) as upstream:
        argv = proxy_url_argv("--shutdown-grace", "30", "--audit-log", str(audit), url=upstream.url)
        async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
            await session.send(stateless_call(5, "weather", {"city": "Oslo"}))
            await session.close_stdin()
            answer = await session.recv(timeout=60)
            status = await session.wait(60)
    assert result_json(answer)["final"]["text"] == "Snow in Oslo."
    assert status == 0
    assert [json.loads(line)["outcome"] for line in audit.read_text().splitlines()] == ["answered"] * 2


async def test_a_round_still_driven_when_the_grace_period_ends_is_told_so(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A 2026-07-28 request whose round the proxy is still answering when `--shutdown-grace` ends
    is answered with what happened and the option that gives it longer, not as though the upstream
    (which did not exit) had exited."""
    fake_claude.enqueue(
        tool_use_reply("get_weather", {"city": "Oslo"}, id="toolu_oslo", text="Checking.", delay=30.0),
    )
    async with python_http_server(RESOLVE_SERVER) as upstream:
        argv = proxy_url_argv("--shutdown-grace", "0.5", url=upstream.url)
        async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
            await session.send(stateless_call(5, "weather", {"city": "Oslo"}))
            assert await fake_claude.await_requests(1, timeout=60)
            await session.close_stdin()
            answer = await session.recv(timeout=60)
            status = await session.wait(60)
    message = answer["error"]["message"]
    assert "exited" not in message
    assert "shutting down" in message
    assert "--shutdown-grace / MCP_BACKFILL_SHUTDOWN_GRACE (0.5s)" in message
    assert status == 0


async def test_a_server_request_replayed_on_a_resumed_stream_is_answered_once(
    fake_claude: FakeClaude,
) -> None:
    """An SSE event without an `id:` keeps the stream's last id: a server that ids only its priming
    event replays, on the resumed stream, a sampling request the proxy already took. It was taken
    again: answered (and billed) a second time, or, while the first was still answered, refused
    with `-32600` under its id, which the server took for its answer. The stream's requests are
    remembered: one the proxy saw on it before is not taken again."""
    fake_claude.enqueue(text_reply("once", delay=0.5), text_reply("twice"))
    async with recorder() as (upstream, _):
        argv = proxy_url_argv(url=upstream.url)
        async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
            await handshake(session)
            answer = await session.request(2, "poll/replay-sample")
            await session.close_stdin()
            await session.wait()
            log = session.stderr()
    answers = answer["result"]["answers"]
    assert len(answers) == 1, answers
    assert answers[0].get("result", {}).get("content", {}).get("text") == "once", answers
    assert len(fake_claude.message_requests) == 1
    assert "Traceback" not in log


@pytest.mark.parametrize("client", ["standalone-replay", "standalone-replay-batch"])
async def test_a_server_request_replayed_on_a_reopened_standalone_stream_is_answered_once(
    fake_claude: FakeClaude, client: str
) -> None:
    """The standalone GET stream is reopened from its last event id too: a request it brings again
    (a server that ids only its priming event replays what followed it) is the one it brought
    before, not taken (answered, billed, or refused under its id) a second time; in a batch too
    (a JSON array), which was taken again, and its sampling request answered and billed twice."""
    fake_claude.enqueue(text_reply("once", delay=0.5), text_reply("twice"))
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv(url=upstream.url)
        async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
            params = initialize_params()
            params["clientInfo"]["name"] = client
            assert "result" in await session.request(1, "initialize", params)
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            with anyio.fail_after(30):  # until the third GET: the second has ended
                while sum(1 for entry in recorded() if entry["verb"] == "GET") < 3:
                    await anyio.sleep(0.05)
            await session.close_stdin()
            await session.wait()
            log = session.stderr()
        bodies = [entry["body"] for entry in recorded() if entry["verb"] == "POST"]
    items = [item for body in bodies for item in (body if isinstance(body, list) else [body])]
    answers = [b for b in items if isinstance(b, dict) and "method" not in b and b.get("id") == "dup-g"]
    assert len(answers) == 1, answers
    assert answers[0].get("result", {}).get("content", {}).get("text") == "once", answers
    assert len(fake_claude.message_requests) == 1
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("client", "resumptions", "log_line"),
    [
        (
            "standalone-stale",
            1,
            "refused to resume its standalone stream from Last-Event-ID; opening it afresh",
        ),
        ("standalone-stale-empty", 2, "brought nothing twice; opening it afresh"),
    ],
)
async def test_a_standalone_stream_whose_resumption_is_refused_is_opened_afresh(
    client: str, resumptions: int, log_line: str
) -> None:
    """A server that no longer knows the standalone stream's last event id (restarted, another
    replica) refuses its resumption (HTTP 400): the same id was sent again at each reconnection until
    the attempts ran out, and the stream was lost for the rest of the session. The MCP SDK's server
    answers such an id with a stream that ends at once: the same id went back for ever, every 30 s at
    last, and no server message outside a request arrived again. It is opened afresh, without
    `Last-Event-ID`, and the log says so."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            params = initialize_params()
            params["clientInfo"]["name"] = client
            assert "result" in await session.request(1, "initialize", params)
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            fresh, _ = await session.recv_until(
                lambda m: m.get("method") == "notifications/fresh", timeout=30
            )
            log = session.stderr()
        gets = [entry["headers"].get("last-event-id") for entry in recorded() if entry["verb"] == "GET"]
    assert fresh["method"] == "notifications/fresh"
    assert gets == [None, *["stale-0"] * resumptions, None], gets
    assert log_line in log, log


async def test_a_standalone_stream_the_server_cannot_reopen_for_a_moment_is_not_given_up() -> None:
    """Three reopenings of the standalone stream answered 503 in a row (a server restarting behind
    its load balancer) lost it for the rest of the session, and with it every server message outside
    a request. The leg keeps trying (less and less often) and gets them again."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            params = initialize_params()
            params["clientInfo"]["name"] = "standalone-flaky"
            assert "result" in await session.request(1, "initialize", params)
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            fresh, _ = await session.recv_until(lambda m: m.get("method") == "notifications/fresh", 40)
            log = session.stderr()
        gets = sum(1 for entry in recorded() if entry["verb"] == "GET")
    assert fresh["method"] == "notifications/fresh"
    assert gets == 4
    assert "cannot be reopened; still trying" in log, log
    assert "lost the upstream's standalone stream" not in log, log


async def test_a_retry_with_no_event_after_it_sets_the_standalone_streams_reconnection_time() -> None:
    """A `retry:` line sets the reconnection time as it is read (the spec), not when an event after
    it is dispatched: a stream that ended (or broke off) before the end of the event holding it lost
    it, and the proxy reopened its standalone stream after its own 1 s instead of the server's 60 s."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            params = initialize_params()
            params["clientInfo"]["name"] = "standalone-retry"
            assert "result" in await session.request(1, "initialize", params)
            await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            with anyio.fail_after(30):
                while not any(entry["verb"] == "GET" for entry in recorded()):
                    await anyio.sleep(0.05)
            await anyio.sleep(3)  # the default reconnection time (1 s) three times over
            gets = sum(1 for entry in recorded() if entry["verb"] == "GET")
            await session.close_stdin()
            await session.wait()
    assert gets == 1


async def test_a_second_answer_to_a_finished_request_does_not_reach_the_client() -> None:
    """A server that answers a request again, on another request's stream once the first answer
    came: the client got a response for an id it no longer waited for."""
    async with recorder() as (upstream, _):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            assert (await session.request(2, "tools/list"))["result"] == {"method": "tools/list"}
            await session.send({"jsonrpc": "2.0", "id": 3, "method": "sse/answer-again", "params": {"id": 2}})
            answer, before = await session.recv_until(lambda m: m.get("id") == 3)
            log = session.stderr()
    assert answer["result"] == {}
    assert not [m for m in before if m.get("id") == 2], before
    assert "no request waiting for one" in log


async def test_a_poll_at_retry_zero_is_made_at_once_not_after_the_default_second() -> None:
    """`retry: 0` asks the client to reconnect at once; it was taken for no `retry:` at all, so each
    poll of a server asking for it waited the 1 s default (12 polls: 12 s), not the 0.1 s floor."""
    async with recorder() as (upstream, _):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            started = anyio.current_time()
            answer = await session.request(2, "poll/answer", {"polls": 12, "label": "pollnow"})
            elapsed = anyio.current_time() - started
    assert answer.get("result") == {"polls": 12}, answer
    assert elapsed < 8, f"12 polls at retry: 0 took {elapsed:.1f} s"


async def test_a_resumption_the_server_refuses_is_named_in_the_error() -> None:
    """A request whose stream the server closed after a priming event, and whose resumption it then
    refused (HTTP 400) each time, failed with "the upstream ended the response stream without
    answering", as if nothing had been tried: the error says the resumption was refused, and how."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            answer = await session.request(2, "poll/refused", {})
            with anyio.fail_after(30):  # not a minute a refusal: only its first second is read
                endless = await session.request(3, "poll/refused", {"endless": True})
        resumptions = [e for e in recorded() if e["headers"].get("last-event-id") == "refuse-0"]
    assert len(resumptions) == 3
    for refused in (answer, endless):
        message = refused["error"]["message"]
        assert "Last-Event-ID" in message, message
        assert "HTTP 400" in message, message
        assert "unknown event id" in message, message


async def test_progress_of_a_request_whose_rounds_the_proxy_drives_reaches_the_client(
    fake_claude: FakeClaude,
) -> None:
    """The server reports progress on the stream of the POST the proxy re-sent with its answer to
    a round: the stdio client hears it under its own progress token."""
    fake_claude.enqueue(text_reply("sampled"))
    heard = ProgressHeard()

    async with python_http_server(RESOLVE_SERVER) as upstream:
        argv = proxy_url_argv(url=upstream.url)
        async with Client(stdio_params(argv, proxy_env(fake_claude.url)), mode="auto") as client:
            result = await client.call_tool(
                "summarize_with_progress", {"text": "go"}, progress_callback=heard
            )
    assert tool_json(result) == {"text": "sampled"}
    assert heard == [(1, 2, "half way"), (2, 2, "done")]


async def test_progress_through_an_http_upstream_while_the_proxy_samples_for_a_round(
    fake_claude: FakeClaude,
) -> None:
    """The stdio wrapper in front of an HTTP 2026-07-28 server whose SDK resolver reports progress
    each time it runs, on every round: the client hears the proxy's progress while Claude answers,
    and every value above the one before (tests/e2e/test_stateless_era.py has the stdio child)."""
    fake_claude.enqueue(text_reply("A summary.", delay=ROUND_PROGRESS_INTERVAL + 3))
    heard = ProgressHeard()

    async with python_http_server(RESOLVE_SERVER) as upstream:
        argv = proxy_url_argv(url=upstream.url)
        async with Client(stdio_params(argv, proxy_env(fake_claude.url)), mode="auto") as client:
            result = await client.call_tool("summarize_counting", {"text": "long"}, progress_callback=heard)
    assert tool_json(result) == {"text": "A summary."}
    assert_kept_informed_while_sampling(heard)
    assert len(fake_claude.message_requests) == 1


async def test_a_notification_sent_just_before_the_client_leaves_reaches_the_upstream_before_the_end() -> (
    None
):
    """The client sends a notification and closes its input at once: the notification is POSTed
    (and acknowledged) before the DELETE that ends the session. Sent at once (`send_now`, from a
    task of its own), nothing waited for it: the session was ended while it was on its way."""
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            await handshake(session)
            assert (await session.request(2, "tools/list"))["result"] == {"method": "tools/list"}
            await session.send({"jsonrpc": "2.0", "method": "notifications/slow-ack-last"})
            await session.close_stdin()
            status = await session.wait()
        sent = [
            entry["verb"] if entry["verb"] != "POST" else entry["body"].get("method") for entry in recorded()
        ]
    assert "notifications/slow-ack-last" in sent, sent
    assert sent.index("notifications/slow-ack-last") < sent.index("DELETE"), sent
    assert status == 0
