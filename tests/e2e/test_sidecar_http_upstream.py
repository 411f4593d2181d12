"""HTTP -> HTTP: `mcp-backfill serve --upstream-url` as a sidecar in front of a streamable-HTTP server.

client (mcp SDK over streamable HTTP, no sampling callback) --HTTP--> `python -m mcp_backfill serve
    --upstream-url` --HTTP--> an SDK server (its own process, uvicorn)        \\-> fake Claude
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcp_backfill.relay.progress import ROUND_PROGRESS_INTERVAL
from tests.e2e.test_sidecar_stateless import stateless_headers, stateless_request
from tests.fake_claude import FakeClaude, hang_reply, text_reply, tool_use_reply
from tests.harness import (
    SERVERS,
    TEST_API_KEY,
    HttpServer,
    ProgressHeard,
    assert_kept_informed_while_sampling,
    proxy_env,
    python_http_server,
    tool_json,
)
from tests.sidecar_harness import (
    HANDSHAKE_HEADERS,
    HTTP_TIMEOUT,
    Sidecar,
    in_front_of,
    initialize_body,
    open_session,
    response_messages,
    response_to,
    run_sidecar,
    sidecar_argv,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = [sys.executable, str(SERVERS / "sampling_server.py"), "--http", "127.0.0.1:0"]
RESOLVE_SERVER = [sys.executable, str(SERVERS / "resolve_server.py"), "--http", "127.0.0.1:0"]
NO_COMMAND: list[str] = []


async def test_handshake_tool_loop_through_an_http_sidecar(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        tool_use_reply("lookup", {"key": "alpha"}, id="toolu_h2h"),
        text_reply("alpha is 1."),
    )
    async with (
        python_http_server(SAMPLING_SERVER) as upstream,
        run_sidecar(
            "--upstream-url", upstream.url, upstream=NO_COMMAND, env=proxy_env(fake_claude.url)
        ) as sidecar,
        Client(sidecar.url, mode="legacy") as client,
    ):
        outcome = tool_json(await client.call_tool("loop", {"question": "What is alpha?", "rounds": 3}))
    assert outcome["finalText"] == "alpha is 1."
    assert [r["stopReason"] for r in outcome["rounds"]] == ["toolUse", "endTurn"]
    second = fake_claude.message_requests[1].body
    results = [b for m in second["messages"] if isinstance(m["content"], list) for b in m["content"]]
    assert [b["tool_use_id"] for b in results if b["type"] == "tool_result"] == ["toolu_h2h"]


async def test_2026_tool_loop_through_an_http_sidecar(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        tool_use_reply("get_weather", {"city": "Oslo"}, id="toolu_oslo"),
        text_reply("Clear in Oslo."),
    )
    async with (
        python_http_server(RESOLVE_SERVER) as upstream,
        run_sidecar(
            "--upstream-url", upstream.url, upstream=NO_COMMAND, env=proxy_env(fake_claude.url)
        ) as sidecar,
        Client(sidecar.url) as client,
    ):
        assert client.protocol_version == "2026-07-28"
        outcome = tool_json(await client.call_tool("weather", {"city": "Oslo"}))
    assert outcome["first"] == {"stopReason": "toolUse", "toolUseIds": ["toolu_oslo"]}
    assert outcome["final"]["text"] == "Clear in Oslo."
    assert len(fake_claude.message_requests) == 2


async def test_the_same_client_fails_without_the_sidecar(fake_claude: FakeClaude) -> None:
    async with python_http_server(SAMPLING_SERVER) as upstream, Client(upstream.url, mode="legacy") as client:
        with pytest.raises(MCPError):
            await client.call_tool("plain", {"prompt": "hi"})
    assert fake_claude.message_requests == []


@asynccontextmanager
async def recorder() -> AsyncIterator[tuple[HttpServer, Callable[[], list[dict[str, Any]]]]]:
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "requests.jsonl"
        record.touch()
        async with python_http_server(
            [sys.executable, str(SERVERS / "http_recorder.py"), str(record)]
        ) as server:
            yield server, lambda: [json.loads(line) for line in record.read_text().splitlines()]


@pytest.mark.parametrize("forward", [False, True])
async def test_client_authorization_reaches_the_upstream_only_when_asked(forward: bool) -> None:
    options = ["--upstream-header", "X-Upstream-Key: upstream-secret-1"]
    if forward:
        options.append("--forward-authorization")
    async with recorder() as (upstream, recorded):
        async with (
            in_front_of(upstream, *options) as sidecar,
            httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        ):
            headers = {**HANDSHAKE_HEADERS, "authorization": "Bearer client-own-token"}
            response = await http.post(sidecar.url, json=initialize_body(1), headers=headers)
            assert response.status_code == 200
        requests = recorded()
    assert requests, "the upstream saw nothing"
    for request in requests:
        assert request["headers"]["x-upstream-key"] == "upstream-secret-1"
        assert TEST_API_KEY not in json.dumps(request)
        if forward:
            assert request["headers"]["authorization"] == "Bearer client-own-token"
        else:
            assert "authorization" not in request["headers"]


async def list_tools_as(http: httpx2.AsyncClient, url: str, who: str, request_id: int) -> httpx2.Response:
    """A 2026-07-28 `tools/list` with the client's own `Authorization: Bearer <who>`; the cursor
    names the client too, so the upstream's record shows whose request each POST carried."""
    body = stateless_request(request_id, "tools/list", {"cursor": who})
    headers = {**stateless_headers("tools/list"), "authorization": f"Bearer {who}"}
    return await http.post(url, json=body, headers=headers)


def forwarding_sidecar(upstream: HttpServer, *options: str) -> AbstractAsyncContextManager[Sidecar]:
    """The sidecar in front of `upstream`, passing each client's own `Authorization` on."""
    return in_front_of(upstream, "--forward-authorization", *options)


async def test_2026_requests_carry_their_own_clients_authorization() -> None:
    async with recorder() as (upstream, recorded):
        async with (
            forwarding_sidecar(upstream) as sidecar,
            httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        ):
            for request_id, who in enumerate(["alpha", "beta", "alpha", "gamma", "beta"], start=1):
                response = await list_tools_as(http, sidecar.url, who, request_id)
                assert response.status_code == 200, response.text
        requests = [
            r for r in recorded() if isinstance(r["body"], dict) and "cursor" in r["body"].get("params", {})
        ]
    assert sorted(r["body"]["params"]["cursor"] for r in requests) == [
        "alpha",
        "alpha",
        "beta",
        "beta",
        "gamma",
    ]
    for request in requests:
        assert request["headers"]["authorization"] == f"Bearer {request['body']['params']['cursor']}"


async def test_junk_credentials_cannot_lock_a_real_client_out_of_2026_hubs() -> None:
    """Each distinct forwarded credential gets a hub (an upstream) of its own, up to --max-sessions;
    junk values used to fill them until they idled out. Now an idle hub makes room at once."""
    async with (
        recorder() as (upstream, _),
        forwarding_sidecar(upstream, "--max-sessions", "2") as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        for n in range(6):
            assert (await list_tools_as(http, sidecar.url, f"junk-{n}", n)).status_code == 200
        assert (await list_tools_as(http, sidecar.url, "real-client", 10)).status_code == 200
        log = sidecar.stderr()
    assert log.count("closed to make room") >= 5
    assert "Bearer" not in log


async def test_a_forwarded_session_is_bound_to_the_credential_that_opened_it() -> None:
    """Alice opens a session with her token; a request naming her session with Bob's token, or with
    no Authorization at all, used to reach the upstream as Alice. Now both get 403, and the upstream
    only ever sees Alice's credential on her session."""
    async with recorder() as (upstream, recorded):
        async with (
            forwarding_sidecar(upstream) as sidecar,
            httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        ):
            alice = {"authorization": "Bearer alice-token"}
            session = await open_session(http, sidecar.url, alice)
            headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session}
            as_bob = await http.post(
                sidecar.url,
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"cursor": "bob"}},
                headers={**headers, "authorization": "Bearer bob-token"},
            )
            anonymous = await http.post(
                sidecar.url,
                json={"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"cursor": "nobody"}},
                headers=headers,
            )
            deleted_by_bob = await http.delete(
                sidecar.url, headers={**headers, "authorization": "Bearer bob-token"}
            )
            as_alice = await http.post(
                sidecar.url,
                json={"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {"cursor": "alice"}},
                headers={**headers, **alice},
            )
        authorizations = {r["headers"].get("authorization") for r in recorded()}
        cursors = [r["body"]["params"]["cursor"] for r in recorded() if "cursor" in str(r["body"])]
    assert (as_bob.status_code, anonymous.status_code, deleted_by_bob.status_code) == (403, 403, 403)
    assert "another credential" in as_bob.json()["error"]["message"]
    assert as_alice.status_code == 200
    assert authorizations == {"Bearer alice-token"}
    assert cursors == ["alice"]


async def test_forward_authorization_beside_a_sidecar_token_is_refused_at_startup() -> None:
    env = proxy_env(MCP_BACKFILL_AUTH_TOKEN="sidecar-token-0123456789")
    argv = sidecar_argv(
        "--upstream-url", "http://127.0.0.1:9/mcp", "--provider", "mock", "--forward-authorization"
    )
    with anyio.fail_after(60):  # it used to start (and serve, ignoring the flag)
        done = await anyio.run_process(argv, env=env, check=False)
    assert done.returncode == 2
    assert b"--forward-authorization" in done.stderr
    assert b"--auth-token" in done.stderr


async def test_progress_of_a_request_whose_rounds_the_proxy_drives_reaches_the_client(
    fake_claude: FakeClaude,
) -> None:
    """The server reports progress on the stream of the POST the proxy re-sent with its answer to
    a round: the client hears it on its own POST, under its own progress token."""
    fake_claude.enqueue(text_reply("sampled"))
    heard = ProgressHeard()

    async with (
        python_http_server(RESOLVE_SERVER) as upstream,
        run_sidecar(
            "--upstream-url", upstream.url, upstream=NO_COMMAND, env=proxy_env(fake_claude.url)
        ) as sidecar,
        Client(sidecar.url) as client,
    ):
        result = await client.call_tool("summarize_with_progress", {"text": "go"}, progress_callback=heard)
    assert tool_json(result) == {"text": "sampled"}
    assert heard == [(1, 2, "half way"), (2, 2, "done")]


async def test_progress_while_the_proxy_samples_for_a_round_through_an_http_sidecar(
    fake_claude: FakeClaude,
) -> None:
    """`serve --upstream-url` in front of an SDK server whose resolver reports progress each time it
    runs: the client hears the proxy's progress while Claude answers, and the values keep rising
    when the re-sent request's resolver counts from the start again."""
    fake_claude.enqueue(text_reply("sampled", delay=ROUND_PROGRESS_INTERVAL + 3))
    heard = ProgressHeard()

    async with (
        python_http_server(RESOLVE_SERVER) as upstream,
        run_sidecar(
            "--upstream-url", upstream.url, upstream=NO_COMMAND, env=proxy_env(fake_claude.url)
        ) as sidecar,
        Client(sidecar.url) as client,
    ):
        result = await client.call_tool("summarize_counting", {"text": "go"}, progress_callback=heard)
    assert tool_json(result) == {"text": "sampled"}
    assert_kept_informed_while_sampling(heard)


async def test_an_expired_upstream_session_ends_the_client_session_and_stops_its_sampling(
    fake_claude: FakeClaude,
) -> None:
    """The upstream forgets the session (it restarts) while the proxy samples for it: the Claude call,
    whose answer nobody can receive, is stopped, and the client's session ends with the upstream's
    (404 to its session id, as the spec has a server answer, so that it initializes again)."""
    fake_claude.enqueue(hang_reply())
    async with python_http_server(SAMPLING_SERVER) as upstream:
        address = upstream.url.removeprefix("http://").removesuffix("/mcp")
        async with (
            run_sidecar(
                "--upstream-url", upstream.url, upstream=NO_COMMAND, env=proxy_env(fake_claude.url)
            ) as sidecar,
            httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        ):
            session_id = await open_session(http, sidecar.url)
            headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}

            def call(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
                return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}

            async with anyio.create_task_group() as tg:
                tool = call(2, "tools/call", {"name": "plain", "arguments": {"prompt": "hi"}})

                async def call_tool() -> None:
                    await http.post(sidecar.url, json=tool, headers=headers)

                tg.start_soon(call_tool)
                assert await fake_claude.await_requests(1, timeout=30)
                upstream.process.terminate()
                await upstream.process.wait()
                async with python_http_server([*SAMPLING_SERVER[:-1], address]):
                    ping = await http.post(sidecar.url, json=call(3, "ping", {}), headers=headers)
                    assert await fake_claude.await_disconnects(1, timeout=30), "the Claude call ran on"
                    with anyio.fail_after(30):
                        while True:
                            later = await http.post(sidecar.url, json=call(4, "ping", {}), headers=headers)
                            if later.status_code == 404:
                                break
                            await anyio.sleep(0.1)
                tg.cancel_scope.cancel()
    assert ping.status_code == 404 or "Upstream session expired" in str(response_to(ping, 3))
    assert "upstream session expired" in (sidecar.captured or "")


async def no_cookie_session(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    """A session with the recorder that sets no cookie (its answers can be read from the upstream
    connection's callback), initialized; the headers of its requests."""
    body = initialize_body(1)
    body["params"]["clientInfo"]["name"] = "no-cookie"
    response = await http.post(url, json=body, headers=HANDSHAKE_HEADERS)
    assert response.status_code == 200, response.text
    headers = {**HANDSHAKE_HEADERS, "mcp-session-id": response.headers["mcp-session-id"]}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=initialized, headers=headers)).status_code == 202
    return headers


async def test_a_stream_reset_while_its_answer_is_read_early_is_resumed_not_failed() -> None:
    """A POST's SSE stream is read as it arrives (no cookie: the answer is read from the connection's
    callback), brings an event with an id, and then the connection is reset: the bytes that came
    before the reset are the stream's all the same, so the request is resumed from that id and
    answered, as when its task read it. The buffered bytes were dropped with the reset, and the
    request failed as if the upstream were unreachable."""
    async with (
        recorder() as (upstream, _),
        in_front_of(upstream) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = await no_cookie_session(http, sidecar.url)
        warm = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        assert (await http.post(sidecar.url, json=warm, headers=headers)).status_code == 200
        call = {"jsonrpc": "2.0", "id": 3, "method": "reset/mid-stream", "params": {}}
        answer = await http.post(sidecar.url, json=call, headers=headers)
    messages = response_messages(answer)
    notes = [m for m in messages if m.get("method") == "notifications/message"]
    assert len(notes) == 1, answer.text
    assert response_to(answer, 3) == {"jsonrpc": "2.0", "id": 3, "result": {"resumed": True}}


async def test_after_a_large_answer_read_early_the_next_answer_on_its_connection_is_not_held_back() -> None:
    """An answer larger than the connection's reader pauses (past twice its limit) arrives in one
    read and is read whole from the callback: the connection goes back to the pool reading again.
    It went back paused, and the next answer on it was read only when its exchange's task took
    over, `PATIENCE` (0.5 s) later."""
    async with (
        recorder() as (upstream, _),
        in_front_of(upstream) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = await no_cookie_session(http, sidecar.url)
        slowest = 0.0
        for n in range(2, 8):
            big = {"jsonrpc": "2.0", "id": n * 2, "method": "big/json", "params": {"size": 150_000}}
            assert (await http.post(sidecar.url, json=big, headers=headers)).status_code == 200
            call = {"jsonrpc": "2.0", "id": n * 2 + 1, "method": "tools/list", "params": {}}
            started = anyio.current_time()
            answer = await http.post(sidecar.url, json=call, headers=headers)
            if n > 2:  # the first is a connection's first reuse
                slowest = max(slowest, anyio.current_time() - started)
            assert response_to(answer, n * 2 + 1)["result"] == {"method": "tools/list"}
    assert slowest < 0.4
