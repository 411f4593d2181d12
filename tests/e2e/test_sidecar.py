"""`mcp-backfill serve` in the handshake era: real processes, real HTTP on loopback, the fake Claude.

client (mcp SDK or raw HTTP) --HTTP--> `python -m mcp_backfill serve` --stdio--> one child per session
                                                 \\-> fake Claude (loopback HTTP, ANTHROPIC_BASE_URL)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, types

from tests.fake_claude import FakeClaude, text_reply, tool_use_reply
from tests.harness import pid_alive, proxy_env, python_server, tool_json
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
    sse_messages,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")
CHATTY_SERVER = python_server("chatty_server.py")
ECHO_SERVER = python_server("echo_server.py")
TOKEN = "test-token-0123456789abcdef"


async def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)


def call(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


async def test_sampling_tool_loop_for_an_http_client_without_sampling(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        tool_use_reply("lookup", {"key": "alpha"}, id="toolu_http1", text="Let me look."),
        text_reply("alpha is 1."),
    )
    async with (
        run_sidecar(
            "--log-level", "debug", upstream=SAMPLING_SERVER, env=proxy_env(fake_claude.url)
        ) as sidecar,
        Client(sidecar.url, mode="legacy") as client,
    ):
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert "loop" in tools
        outcome = tool_json(
            await client.call_tool(
                "loop", {"question": "What is alpha?", "rounds": 3, "tool_choice": "required"}
            )
        )
    assert outcome["completed"] is True
    assert outcome["finalText"] == "alpha is 1."
    first, second = outcome["rounds"]
    assert first["toolCalls"] == [{"id": "toolu_http1", "name": "lookup", "input": {"key": "alpha"}}]
    assert second["stopReason"] == "endTurn"
    bodies = [request.body for request in fake_claude.message_requests]
    assert len(bodies) == 2
    assert all(body["tool_choice"] == {"type": "any"} for body in bodies)
    follow_up = bodies[1]["messages"]
    assert [m["role"] for m in follow_up] == ["user", "assistant", "user"]
    [tool_result] = follow_up[2]["content"]
    assert (tool_result["type"], tool_result["tool_use_id"]) == ("tool_result", "toolu_http1")


async def test_auth_token_guards_mcp_and_metrics_but_not_healthz(tmp_path: Path) -> None:
    upstream = [*CHATTY_SERVER, str(tmp_path)]
    env = proxy_env(MCP_BACKFILL_AUTH_TOKEN=TOKEN)
    async with (
        run_sidecar("--provider", "mock", upstream=upstream, env=env) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        missing = await http.post(sidecar.url, json=initialize_body(), headers=HANDSHAKE_HEADERS)
        wrong = await http.post(
            sidecar.url, json=initialize_body(), headers={**HANDSHAKE_HEADERS, "authorization": "Bearer nope"}
        )
        for response in (missing, wrong):
            assert response.status_code == 401
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert "mcp-session-id" not in response.headers
        assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
        assert (await http.get(f"{sidecar.base}/metrics")).status_code == 401
        assert (await health(http, sidecar))["sessions"] == 0
        assert list(tmp_path.iterdir()) == []  # no upstream was ever started

        good = {"authorization": f"Bearer {TOKEN}"}
        session_id = await open_session(http, sidecar.url, good)
        assert session_id
        assert (await health(http, sidecar))["sessions"] == 1
        assert (await http.get(f"{sidecar.base}/metrics", headers=good)).status_code == 200
        await wait_until(lambda: len(list(tmp_path.iterdir())) == 1)
    assert TOKEN not in sidecar.stderr()


def serve_until_exit(*args: str) -> subprocess.CompletedProcess[str]:
    """`mcp-backfill serve ARGS`, for a configuration that must refuse to start."""
    argv = [sys.executable, "-m", "mcp_backfill", "serve", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=proxy_env(), timeout=30)


def test_non_loopback_host_needs_a_token() -> None:
    result = serve_until_exit("--host", "0.0.0.0", "--provider", "mock", "--", "true")
    assert result.returncode == 2
    assert "--allow-unauthenticated" in result.stderr
    assert "MCP_BACKFILL_AUTH_TOKEN" in result.stderr


def test_unknown_upstream_command_fails_at_startup() -> None:
    result = serve_until_exit("--port", "0", "--provider", "mock", "--", "/nonexistent/srv")
    assert result.returncode == 127
    assert "/nonexistent/srv" in result.stderr
    assert "command not found" in result.stderr


async def test_host_and_origin_are_checked_against_dns_rebinding() -> None:
    upstream = ECHO_SERVER
    async with (
        run_sidecar("--provider", "mock", upstream=upstream, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        for headers in (
            {"host": "evil.example.com"},
            {"host": f"evil.example.com:{sidecar.port}"},
            {"origin": "https://evil.example.com"},
            {"origin": "http://localhost.evil.example.com:80"},
        ):
            response = await http.post(
                sidecar.url, json=initialize_body(), headers={**HANDSHAKE_HEADERS, **headers}
            )
            assert response.status_code == 403, headers
        assert (await health(http, sidecar))["sessions"] == 0
        for headers in ({"host": f"localhost:{sidecar.port}"}, {"origin": "http://localhost:5173"}):
            response = await http.post(
                sidecar.url, json=initialize_body(), headers={**HANDSHAKE_HEADERS, **headers}
            )
            assert response.status_code == 200, headers

    options = (
        "--provider",
        "mock",
        "--allowed-hosts",
        "sidecar.internal:*",
        "--allowed-origins",
        "https://app.example",
    )
    async with (
        run_sidecar(*options, upstream=upstream, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        allowed = {"host": "sidecar.internal:8080", "origin": "https://app.example"}
        response = await http.post(
            sidecar.url, json=initialize_body(), headers={**HANDSHAKE_HEADERS, **allowed}
        )
        assert response.status_code == 200
        refused = await http.post(sidecar.url, json=initialize_body(), headers=HANDSHAKE_HEADERS)
        assert refused.status_code == 403  # 127.0.0.1:<port> is no longer in the list


@asynccontextmanager
async def session_with_limit(limit: int) -> AsyncIterator[tuple[httpx2.AsyncClient, str, dict[str, str]]]:
    """A session through a sidecar started with `--max-message-bytes limit`: the HTTP client, the
    URL, and the session's headers."""
    options = ("--provider", "mock", "--max-message-bytes", str(limit))
    async with (
        run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        yield http, sidecar.url, {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}


def assert_too_large(response: httpx2.Response) -> None:
    assert response.status_code == 413
    assert "--max-message-bytes" in response.json()["error"]["message"]


async def assert_session_goes_on(http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> None:
    small = await http.post(url, json=call(99, "ping/echo", {"n": 1}), headers=headers)
    assert small.status_code == 200
    reply = response_to(small, 99)
    assert reply["id"] == 99
    assert reply["result"]["echo"]["params"] == {"n": 1}


async def test_body_limit_gives_413_and_the_session_goes_on() -> None:
    async with session_with_limit(2048) as (http, url, headers):
        big = await http.post(url, json=call(2, "tools/call", {"pad": "x" * 4096}), headers=headers)
        assert_too_large(big)
        await assert_session_goes_on(http, url, headers)


async def test_a_body_too_large_for_the_socket_buffers_still_gets_its_413() -> None:
    # Refused while the client was still sending, and the connection closed with the rest unread:
    # the client's kernel took the reset for the answer, and the client saw a broken connection
    # instead of the 413 (49 times in 50 for 2 MB against a 1 MiB limit).
    async with session_with_limit(1024 * 1024) as (http, url, headers):
        for attempt in range(5):
            body = call(attempt, "tools/call", {"pad": "x" * 4_000_000})
            assert_too_large(await http.post(url, json=body, headers=headers))
        await assert_session_goes_on(http, url, headers)


async def test_a_body_of_undeclared_length_over_the_limit_gives_413_too() -> None:
    async with session_with_limit(2048) as (http, url, headers):
        body = json.dumps(call(2, "tools/call", {"pad": "x" * 4096})).encode()

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: sent chunked
            for start in range(0, len(body), 1024):
                yield body[start : start + 1024]

        big = await http.post(url, content=chunks(), headers=headers)
        assert "content-length" not in big.request.headers
        assert_too_large(big)
        await assert_session_goes_on(http, url, headers)


async def test_a_batch_whose_answer_is_too_large_gets_an_error_for_each_request() -> None:
    """The upstream's answer to a batch (one array) over the limit was answered for none of its
    requests (at most one): the POST stayed open for ever, and its requests stayed in the session."""
    async with session_with_limit(4096) as (http, url, headers):
        # The echo server answers test/lines with every line it read, this batch's among them.
        batch = [call(1, "ping/echo", {"pad": "x" * 1800}), call(2, "test/lines"), call("three", "ping/echo")]
        with anyio.fail_after(20):
            answer = await http.post(url, json=batch, headers=headers)
        assert answer.status_code == 200
        for request_id in (1, 2, "three"):
            error = response_to(answer, request_id)["error"]
            assert "--max-message-bytes" in error["message"], error
        await assert_session_goes_on(http, url, headers)


async def test_a_batch_of_more_messages_than_the_limit_gets_400_and_the_session_goes_on() -> None:
    """A POST of 300,000 pings held the event loop for seconds (every session waited, /healthz too)."""
    options = ("--provider", "mock", "--max-batch-messages", "3")
    async with (
        run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        refused = await http.post(sidecar.url, json=[call(n, "ping") for n in range(4)], headers=headers)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == -32600
        assert "--max-batch-messages" in error["message"], error
        answer = await http.post(sidecar.url, json=[call(n, "ping") for n in range(3)], headers=headers)
        assert [reply["id"] for reply in response_messages(answer)[-1]] == [0, 1, 2]  # one array


@pytest.mark.parametrize("version", ["2025-03-26", "2025-11-25"])
async def test_an_upstream_batch_whose_answer_follows_other_messages_answers_its_post(version: str) -> None:
    """An upstream array holding a log line (or a request of the server's) before the answer was
    routed as a notification: the POST never ended, and the client's next request under the id it
    had been answered for got 409 (a request under that id still in flight). A client of 2025-06-18
    or later, which cannot read an array (batches were removed then), got it as one all the same:
    it now gets the array's messages one by one."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url, version=version)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}
        log = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
        ping = {"jsonrpc": "2.0", "id": 7, "method": "ping"}  # the server's id: not the client's 7
        body = call(7, "test/answer_in_batch", {"before": [log, ping]})
        with anyio.fail_after(20):
            answered = await http.post(sidecar.url, json=body, headers=headers)
        assert answered.status_code == 200, answered.text
        received = response_messages(answered)
        batches = [m for m in received if isinstance(m, list)]
        if version == "2025-03-26":
            [batch] = batches
        else:
            assert batches == [], received
            batch = received[-3:]
        assert batch[:2] == [log, ping]
        assert batch[2]["result"]["echo"]["method"] == "test/answer_in_batch"
        with anyio.fail_after(20):
            again = await http.post(sidecar.url, json=call(7, "ping/echo"), headers=headers)
        assert again.status_code == 200, again.text
        assert response_to(again, 7)["result"]["echo"]["method"] == "ping/echo"


async def test_max_sessions_gives_503_and_a_refused_opening_does_not_count_as_one() -> None:
    """An opening refused for want of a slot used to count against `--client-session-rate`: a client
    retrying while the sidecar was full was shut out for a minute (429) once a slot came free."""
    options = ("--provider", "mock", "--max-sessions", "1", "--client-session-rate", "3")
    async with (
        run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        first = await open_session(http, sidecar.url)
        for _ in range(3):
            refused = await http.post(sidecar.url, json=initialize_body(), headers=HANDSHAKE_HEADERS)
            assert refused.status_code == 503
            assert "--max-sessions" in refused.json()["error"]["message"]
        deleted = await http.delete(sidecar.url, headers={"mcp-session-id": first})
        assert deleted.status_code == 200
        assert await open_session(http, sidecar.url)  # the second opening of the minute, of three


async def test_a_client_reading_its_stream_gets_every_message_of_a_burst() -> None:
    """A burst from the upstream used to be routed faster than the POST's stream was written: past
    the replay limit (1,024 events) the oldest unwritten ones were dropped, from a client reading all
    along (5,000 notifications: 2,921 lost)."""
    count = 5000
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=60) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        flood = {"jsonrpc": "2.0", "id": 1, "method": "test/flood", "params": {"count": count}}
        response = await http.post(sidecar.url, json=flood, headers=headers)
        messages = [message for _, message in sse_messages(response.text)]
        assert messages[-1] == {"jsonrpc": "2.0", "id": 1, "result": {"flooded": count}}
        notes = [m["params"]["seq"] for m in messages if m.get("method") == "notifications/message"]
        assert notes == list(range(count))
        assert "replay buffer full" not in sidecar.stderr()


@pytest.mark.parametrize("seq", [b"\xb2", b"1" * 5000], ids=["superscript-two", "5000-digits"])
async def test_a_forged_last_event_id_gets_400(seq: bytes) -> None:
    """A sequence `isdigit` takes but `int` refuses ("²" as latin-1, or 5,000 digits) gave a 500."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        head = b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: text/event-stream\r\n" % sidecar.port
        head += b"Mcp-Session-Id: %s\r\nLast-Event-ID: g.%s\r\n\r\n" % (session_id.encode(), seq)
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(head)
            with anyio.fail_after(10):
                answer = await stream.receive()
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert "Exception in ASGI application" not in sidecar.stderr()


async def test_a_last_event_id_beyond_the_stream_gets_400() -> None:
    """An id past the last event of a stream (`g.1000` where 1 was sent) was taken: the GET got 200
    and then silently skipped every message until the stream reached that number."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}
        note = {"jsonrpc": "2.0", "method": "notifications/for-the-get-stream"}
        assert (await http.post(sidecar.url, json=note, headers=headers)).status_code == 202
        get_headers = {"accept": "text/event-stream", "mcp-session-id": session_id}
        for bogus in ("g.1000", "s1.1000"):
            response = None
            with anyio.move_on_after(8):
                response = await http.get(sidecar.url, headers={**get_headers, "last-event-id": bogus})
            assert response is not None, f"no answer within 8 s to Last-Event-ID {bogus}"
            assert response.status_code == 400, response.text
        async with http.stream("GET", sidecar.url, headers=get_headers) as get:
            assert get.status_code == 200
            text = ""
            chunks = get.aiter_text()
            with anyio.fail_after(10):
                while "notifications/for-the-get-stream" not in text:
                    text += await anext(chunks)


async def test_accept_sent_on_two_lines_is_one_list() -> None:
    """`Accept: application/json` and `Accept: text/event-stream` on two lines (as Go's `Header.Add`
    sends them) are one list in HTTP (RFC 9110, 5.3); only the first line was read, and every
    request of such a client got 406."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        two_lines = [
            ("content-type", "application/json"),
            ("accept", "application/json"),
            ("accept", "text/event-stream"),
        ]
        opened = await http.post(sidecar.url, json=initialize_body(), headers=two_lines)
        assert opened.status_code == 200, opened.text
        session = [("mcp-session-id", opened.headers["mcp-session-id"])]
        listed = await http.post(sidecar.url, json=call(2, "x"), headers=two_lines + session)
        assert response_to(listed, 2)["result"]["echo"]["method"] == "x"
        one_kind = [("content-type", "application/json"), ("accept", "application/json"), *session]
        assert (await http.post(sidecar.url, json=call(3, "x"), headers=one_kind)).status_code == 406


async def test_idle_sessions_are_reaped(tmp_path: Path) -> None:
    upstream = [*CHATTY_SERVER, str(tmp_path)]
    async with (
        run_sidecar(
            "--provider", "mock", "--session-idle-timeout", "1", upstream=upstream, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}
        # A request in flight is not idleness: a call longer than the timeout completes.
        slow = await http.post(
            sidecar.url,
            json=call(2, "tools/call", {"name": "sleep", "arguments": {"seconds": 1.5}}),
            headers=headers,
        )
        reply = response_to(slow, 2)
        assert json.loads(reply["result"]["content"][0]["text"]) == {"slept": 1.5}
        [marker] = list(tmp_path.glob("started-*"))
        pid = int(marker.name.removeprefix("started-"))
        assert pid_alive(pid)
        await wait_until(lambda: not pid_alive(pid), timeout=10)
        # The session leaves the table once its upstream has stopped, a moment after the process.
        with anyio.fail_after(10):
            while (await health(http, sidecar))["sessions"] != 0:
                await anyio.sleep(0.05)
        gone = await http.post(sidecar.url, json=call(3, "tools/list"), headers=headers)
        assert gone.status_code == 404
    assert "idle session closed" in sidecar.stderr()


async def test_a_session_used_more_often_than_its_idle_timeout_stays_open(tmp_path: Path) -> None:
    """The idle clock starts again at each request's end: a session whose requests come closer
    together than `--session-idle-timeout` lives on however long it is used (its one idle timer,
    firing early, moves itself on), and is reaped once they stop."""
    upstream = [*CHATTY_SERVER, str(tmp_path)]
    async with (
        run_sidecar(
            "--provider", "mock", "--session-idle-timeout", "2", upstream=upstream, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        [marker] = list(tmp_path.glob("started-*"))
        pid = int(marker.name.removeprefix("started-"))
        used_until = anyio.current_time() + 6  # three timeouts' worth
        request_id = 10
        while anyio.current_time() < used_until:
            request_id += 1
            listed = await http.post(sidecar.url, json=call(request_id, "tools/list"), headers=headers)
            assert listed.status_code == 200, listed.text
            assert "tools" in response_to(listed, request_id)["result"]
            await anyio.sleep(0.25)
        assert pid_alive(pid)
        await wait_until(lambda: not pid_alive(pid), timeout=15)
    assert "idle session closed" in sidecar.stderr()


async def test_a_session_whose_client_left_mid_request_is_still_closed_for_idleness() -> None:
    """A client that dropped its POST while the upstream had not answered (and never will: here it
    waits for an answer from the client that left) and never sent DELETE (it crashed, or timed out)
    left a session whose request stayed in flight: never idle, its upstream process, pipes and
    watcher thread were kept until the sidecar stopped, and each such session held a place under
    `--max-sessions`."""
    options = ("--provider", "mock", "--session-idle-timeout", "1", "--shutdown-grace", "1")
    async with (
        run_sidecar(*options, upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        ask = call(2, "test/ask_client", {"method": "test/never_answered", "id": "ask-1"})
        async with http.stream("POST", sidecar.url, json=ask, headers=headers) as stream:
            async for line in stream.aiter_lines():
                if "test/never_answered" in line:  # the upstream is waiting: leave without a word
                    break
        assert (await health(http, sidecar))["sessions"] == 1
        with anyio.fail_after(15):  # an idle timeout of 1 s, a grace of 1 s: generous
            while (await health(http, sidecar))["sessions"] != 0:
                await anyio.sleep(0.1)
        gone = await http.post(sidecar.url, json=call(3, "tools/list"), headers=headers)
        assert gone.status_code == 404
    assert "idle session closed" in sidecar.stderr()


async def test_a_session_ended_for_idleness_answers_404_while_its_upstream_stops() -> None:
    """Once the idle timeout ended a session, a request naming it waited for the upstream to stop
    (seconds, for a server slow to exit) and got a JSON-RPC error, not the 404 that tells a client
    to open a new session (the spec's MUST for a terminated session)."""
    linger = (
        "import runpy, sys, time\n"
        "try:\n"
        f"    sys.argv = [{ECHO_SERVER[1]!r}]; runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "finally:\n"
        "    time.sleep(6)\n"  # exits 6 s after its stdin closes
    )
    options = ("--provider", "mock", "--session-idle-timeout", "1", "--shutdown-grace", "10")
    async with (
        run_sidecar(*options, upstream=[sys.executable, "-c", linger], env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        await wait_until(lambda: "stopping upstream process" in sidecar.stderr())
        with anyio.fail_after(3):  # well before the upstream has stopped
            late = await http.post(sidecar.url, json=call(2, "x"), headers=headers)
        assert late.status_code == 404, late.text
        assert "idle session closed" not in sidecar.stderr()  # the upstream was still stopping


async def test_concurrent_sessions_only_see_their_own_messages() -> None:
    async def chat(sidecar: Sidecar, tag: str, seen: dict[str, list[str]]) -> Any:
        logs: list[str] = []
        notes: list[str] = []

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            logs.append(str(params.data))

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            notes.append(str(message))

        async with Client(sidecar.url, mode="legacy", logging_callback=on_log) as client:
            results = []
            for _ in range(2):
                results.append(
                    tool_json(
                        await client.call_tool(
                            "chatter", {"tag": tag, "count": 4, "delay": 0.02}, progress_callback=on_progress
                        )
                    )
                )
        seen[f"{tag}-logs"] = logs
        seen[f"{tag}-progress"] = notes
        assert [result["tag"] for result in results] == [tag, tag]
        return results

    seen: dict[str, list[str]] = {}
    async with (
        run_sidecar("--provider", "mock", upstream=CHATTY_SERVER, env=proxy_env()) as sidecar,
        anyio.create_task_group() as tg,
    ):
        for tag in ("red", "blue", "green"):
            tg.start_soon(chat, sidecar, tag, seen)
    for tag in ("red", "blue", "green"):
        assert seen[f"{tag}-progress"], seen
        assert all(message.startswith(f"{tag} ") for message in seen[f"{tag}-progress"]), seen
        assert len(seen[f"{tag}-progress"]) == 8
        assert seen[f"{tag}-logs"], seen
        assert all(message.startswith(f"{tag} log") for message in seen[f"{tag}-logs"]), seen


async def test_delete_ends_the_session_and_its_child() -> None:
    async with (
        run_sidecar("--provider", "mock", upstream=CHATTY_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}
        answer = await http.post(
            sidecar.url, json=call(2, "tools/call", {"name": "pid", "arguments": {}}), headers=headers
        )
        reply = response_to(answer, 2)
        pid = json.loads(reply["result"]["content"][0]["text"])["pid"]
        assert pid_alive(pid)
        deleted = await http.delete(sidecar.url, headers={"mcp-session-id": session_id})
        assert deleted.status_code == 200
        assert not pid_alive(pid)
        again = await http.post(sidecar.url, json=call(3, "tools/list"), headers=headers)
        assert again.status_code == 404
        assert (await health(http, sidecar))["sessions"] == 0


async def test_upstream_exit_fails_pending_requests_and_ends_the_session(tmp_path: Path) -> None:
    async with (
        run_sidecar(
            "--provider", "mock", upstream=[*CHATTY_SERVER, str(tmp_path)], env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}
        bystander = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        async with anyio.create_task_group() as tg:
            replies: list[Any] = []

            async def slow() -> None:
                response = await http.post(
                    sidecar.url,
                    json=call(2, "tools/call", {"name": "sleep", "arguments": {"seconds": 30, "note": "s"}}),
                    headers=headers,
                )
                replies.extend(response_messages(response))

            tg.start_soon(slow)
            await wait_until(lambda: (tmp_path / "sleeping-s").exists())
            crashed = await http.post(
                sidecar.url, json=call(3, "tools/call", {"name": "crash", "arguments": {}}), headers=headers
            )
            replies.extend(response_messages(crashed))
        by_id = {reply["id"]: reply for reply in replies}
        assert by_id[2]["error"]["code"] == -32603
        assert by_id[3]["error"]["code"] == -32603
        assert "Upstream MCP server" in by_id[2]["error"]["message"]
        later = await http.post(sidecar.url, json=call(4, "tools/list"), headers=headers)
        assert later.status_code == 404
        # The other client session, with its own upstream process, is untouched.
        other = await http.post(sidecar.url, json=call(5, "tools/list"), headers=bystander)
        assert other.status_code == 200
        listed = response_to(other, 5)
        assert listed["id"] == 5
        assert "tools" in listed["result"]


async def test_protocol_version_header_accepts_handshake_revisions_only() -> None:
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}
        # As the SDK's server does, an older handshake revision than the negotiated one is accepted
        # (the conformance suite's server-sse-multiple-streams sends 2025-03-26 on a 2025-11-25 session).
        older = await http.post(
            sidecar.url, json=call(2, "x"), headers={**headers, "mcp-protocol-version": "2025-03-26"}
        )
        assert older.status_code == 200
        right = await http.post(
            sidecar.url, json=call(3, "x"), headers={**headers, "mcp-protocol-version": "2025-11-25"}
        )
        assert right.status_code == 200
        unknown = await http.post(
            sidecar.url, json=call(5, "x"), headers={**headers, "mcp-protocol-version": "1999-01-01"}
        )
        assert unknown.status_code == 400
        missing = await http.post(sidecar.url, json=call(4, "x"), headers=HANDSHAKE_HEADERS)
        assert missing.status_code == 400
        unknown = await http.post(
            sidecar.url, json=call(5, "x"), headers={**headers, "mcp-session-id": "nope"}
        )
        assert unknown.status_code == 404


async def test_a_session_negotiated_at_an_unknown_revision_is_served_under_its_header() -> None:
    """A revision this proxy does not know passes through with a warning, in `serve` as in the
    stdio wrapper: the session's requests carry the negotiated revision in `MCP-Protocol-Version`,
    as the spec has clients do, and must reach the upstream that negotiated it. They were taken for
    2026-07-28 requests and refused with a `_meta` envelope error, the session dead on arrival."""
    future = "2027-01-01"
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        opened = await http.post(sidecar.url, json=initialize_body(1, future), headers=HANDSHAKE_HEADERS)
        assert opened.status_code == 200, opened.text
        assert response_to(opened, 1)["result"]["protocolVersion"] == future  # the echo server's choice
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": opened.headers["mcp-session-id"]}
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        ack = await http.post(
            sidecar.url, json=initialized, headers={**headers, "mcp-protocol-version": future}
        )
        assert ack.status_code == 202, ack.text
        listed = await http.post(
            sidecar.url, json=call(2, "tools/list"), headers={**headers, "mcp-protocol-version": future}
        )
        assert listed.status_code == 200, listed.text
        assert response_to(listed, 2)["result"]["echo"]["method"] == "tools/list"
        # Another revision the session did not negotiate is refused as such, naming the header.
        other = await http.post(
            sidecar.url, json=call(3, "tools/list"), headers={**headers, "mcp-protocol-version": "2028-01-01"}
        )
        assert other.status_code == 400
        refusal = other.json()["error"]["message"]
        assert "Unsupported protocol version: 2028-01-01" in refusal
        assert f"{future})" in refusal  # named among those the session accepts
    assert "protocol revision not known to this proxy version" in sidecar.stderr()


async def test_batches_and_server_requests_on_the_get_stream() -> None:
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}
        batch = [call(10, "a"), {"jsonrpc": "2.0", "method": "notifications/x"}, call("10", "b")]
        response = await http.post(sidecar.url, json=batch, headers=headers)
        assert response.headers["content-type"].startswith("text/event-stream")
        messages = response_messages(response)
        answered = [m for m in messages if isinstance(m, list)]
        assert answered
        assert {(r["id"], r["result"]["echo"]["method"]) for r in answered[0]} == {
            (10, "a"),
            ("10", "b"),
        }

        # What belongs to no request in flight waits for the GET stream, then arrives on it.
        note = {"jsonrpc": "2.0", "method": "notifications/for-the-get-stream"}
        assert (await http.post(sidecar.url, json=note, headers=headers)).status_code == 202
        get_headers = {"accept": "text/event-stream", "mcp-session-id": session_id}
        async with http.stream("GET", sidecar.url, headers=get_headers) as get:
            assert get.status_code == 200
            text = ""
            chunks = get.aiter_text()  # kept open: leaving an `async for` would close the stream
            while "notifications/for-the-get-stream" not in text:
                text += await anext(chunks)
            async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as other:
                second = await other.get(sidecar.url, headers=get_headers)
            assert second.status_code == 409  # one GET stream per session
        echoes = [m["params"] for _, m in sse_messages(text) if m.get("method") == "notifications/echo"]
        assert {"received": note} in echoes
        assert {"received": batch[1]} in echoes


async def test_a_dropped_stream_resumes_with_last_event_id() -> None:
    async with (
        run_sidecar("--provider", "mock", upstream=CHATTY_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id, "mcp-protocol-version": "2025-11-25"}
        request = call(
            2,
            "tools/call",
            {
                "name": "chatter",
                "arguments": {"tag": "t", "count": 6, "delay": 0.2},
                "_meta": {"progressToken": "p"},
            },
        )
        seen: list[tuple[str | None, Any]] = []
        async with http.stream("POST", sidecar.url, json=request, headers=headers) as first:
            assert first.headers["content-type"].startswith("text/event-stream")
            text = ""
            async for chunk in first.aiter_text():
                text += chunk
                seen = sse_messages(text)
                if len(seen) >= 2:
                    break  # drop the connection mid-stream
        last_id = seen[-1][0]
        assert last_id is not None
        resumed = await http.get(
            sidecar.url,
            headers={"accept": "text/event-stream", "mcp-session-id": session_id, "last-event-id": last_id},
        )
        rest = sse_messages(resumed.text)
        ids = [event_id for event_id, _ in seen + rest]
        assert len(ids) == len(set(ids))  # nothing twice
        messages = [m for _, m in seen + rest]
        progress = [m["params"]["message"] for m in messages if m.get("method") == "notifications/progress"]
        assert progress == [f"t {i}" for i in range(6)]
        assert messages[-1]["id"] == 2
        assert json.loads(messages[-1]["result"]["content"][0]["text"])["tag"] == "t"


async def test_healthz_and_metrics_after_a_sampling_exchange(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply("hello there", usage={"input_tokens": 11, "output_tokens": 7}))
    async with (
        run_sidecar(upstream=SAMPLING_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        Client(sidecar.url, mode="legacy") as client,
    ):
        outcome = tool_json(await client.call_tool("plain", {"prompt": "hi"}))
        assert outcome["text"] == "hello there"
        status = await health(http, sidecar)
        assert status["status"] == "ok"
        assert status["sessions"] == 1
        metrics = (await http.get(f"{sidecar.base}/metrics")).text
    model = fake_claude.message_requests[0].body["model"]
    # Without authentication every caller is the "anonymous" client.
    assert (
        f'mcp_backfill_sampling_requests_total{{client="anonymous",model="{model}",outcome="answered"}} 1'
        in metrics
    )
    assert (
        f'mcp_backfill_sampling_tokens_total{{client="anonymous",counter="input_tokens",model="{model}"}} 11'
        in metrics
    )
    assert (
        f'mcp_backfill_sampling_tokens_total{{client="anonymous",counter="output_tokens",model="{model}"}} 7'
        in metrics
    )
    assert f'mcp_backfill_claude_latency_seconds_count{{model="{model}"}} 1' in metrics
    assert "mcp_backfill_active_sessions 1" in metrics
    counts = dict(re.findall(r'mcp_backfill_messages_total\{direction="(\w+)"\} (\d+)', metrics))
    assert int(counts["from_client"]) >= 3  # initialize, initialized, tools/call
    assert int(counts["from_upstream"]) >= 3  # two responses and the sampling request
    assert int(counts["to_upstream"]) >= int(counts["from_client"])  # plus the sampling answer


async def test_sigterm_drains_requests_in_flight(tmp_path: Path) -> None:
    upstream = [*CHATTY_SERVER, str(tmp_path)]
    async with (
        run_sidecar("--provider", "mock", upstream=upstream, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}
        [marker] = list(tmp_path.glob("started-*"))
        pid = int(marker.name.removeprefix("started-"))
        replies: list[Any] = []

        async def slow() -> None:
            response = await http.post(
                sidecar.url,
                json=call(2, "tools/call", {"name": "sleep", "arguments": {"seconds": 2, "note": "drain"}}),
                headers=headers,
            )
            replies.extend(response_messages(response))

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await wait_until(lambda: (tmp_path / "sleeping-drain").exists())
            sidecar.signal(signal.SIGTERM)
            # New sessions are refused at once (503), and soon nothing is accepted at all.
            with anyio.fail_after(10):
                while True:
                    try:
                        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as fresh:
                            refused = await fresh.post(
                                sidecar.url, json=initialize_body(), headers=HANDSHAKE_HEADERS
                            )
                    except (httpx2.ConnectError, httpx2.ReadError, httpx2.RemoteProtocolError):
                        # Refused, or (on a busy machine) taken into the backlog just before the
                        # listening socket closed and then dropped unanswered: nothing is served.
                        break
                    assert refused.status_code == 503
                    await anyio.sleep(0.05)
        assert json.loads(replies[0]["result"]["content"][0]["text"]) == {"slept": 2}
        assert await sidecar.wait() == 0
        assert not pid_alive(pid)
    assert "draining" in sidecar.stderr()


async def test_a_get_resuming_the_standalone_stream_during_the_drain_is_refused(tmp_path: Path) -> None:
    """The drain ends each session's standalone GET stream; a GET resuming it (`Last-Event-ID`)
    was still taken, and answered at once with an empty 200: a client (the MCP SDK's resets its
    attempts after a stream that ended normally) reconnects again and again while the drain lasts.
    Now it gets 503 with `Retry-After`, as a new GET stream does, and gives up on this replica."""
    upstream = [*CHATTY_SERVER, str(tmp_path)]
    async with (
        run_sidecar("--provider", "mock", upstream=upstream, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_id = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_id}
        sleep = {"name": "sleep", "arguments": {"seconds": 6, "note": "drain"}}
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(http.post, sidecar.url, json=call(2, "tools/call", sleep), headers=headers))
            await wait_until(lambda: (tmp_path / "sleeping-drain").exists())
            sidecar.signal(signal.SIGTERM)
            await wait_until(lambda: "draining" in sidecar.stderr())
            for resume in ({}, {"last-event-id": "g.0"}):
                answer = await http.get(sidecar.url, headers={**headers, **resume})
                assert answer.status_code == 503, (resume, answer.status_code, answer.text)
                assert answer.headers.get("retry-after"), resume
        assert await sidecar.wait() == 0


async def test_a_request_in_flight_that_waits_for_the_client_finishes_during_the_drain() -> None:
    """A request in flight may need the client's answer (sampling the client does itself, an
    elicitation): the client POSTs it on a new connection. The listening socket closed at the
    first signal, so that answer was refused and the request, which the drain was meant to let
    finish, failed; it stays open now while requests are in flight (new sessions get 503)."""
    capabilities: dict[str, Any] = {"sampling": {}}
    async with (
        run_sidecar(
            "--provider", "mock", "--mode", "fallback", upstream=SAMPLING_SERVER, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        opened = await http.post(
            sidecar.url, json=initialize_body(capabilities=capabilities), headers=HANDSHAKE_HEADERS
        )
        assert opened.status_code == 200, opened.text
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": opened.headers["mcp-session-id"]}
        ack = await http.post(
            sidecar.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
        )
        assert ack.status_code == 202, ack.text
        params = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5}
        tool_call = call(
            2, "tools/call", {"name": "sample_raw", "arguments": {"params_json": json.dumps(params)}}
        )
        messages: list[Any] = []
        async with http.stream("POST", sidecar.url, json=tool_call, headers=headers) as stream:
            assert stream.status_code == 200
            data: list[str] = []
            async for line in stream.aiter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data and "".join(data):
                    message = json.loads("\n".join(data))
                    data = []
                    messages.append(message)
                    if message.get("method") == "sampling/createMessage":
                        sidecar.signal(signal.SIGTERM)
                        await wait_until(lambda: "draining" in sidecar.stderr())
                        await anyio.sleep(1)  # (the socket used to close within 0.1 s)
                        answer = {
                            "role": "assistant",
                            "content": {"type": "text", "text": "the client's own answer"},
                            "model": "client-model",
                        }
                        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as fresh:  # a new connection
                            refused = await fresh.post(
                                sidecar.url, json=initialize_body(), headers=HANDSHAKE_HEADERS
                            )
                            assert refused.status_code == 503
                            answered = await fresh.post(
                                sidecar.url,
                                json={"jsonrpc": "2.0", "id": message["id"], "result": answer},
                                headers=headers,
                            )
                            assert answered.status_code == 202, answered.text
                    if message.get("id") == 2 and "method" not in message:
                        break
        assert await sidecar.wait() == 0
    [result] = [m for m in messages if m.get("id") == 2 and "method" not in m]
    sampled = json.loads(result["result"]["content"][0]["text"])
    assert sampled["result"]["content"]["text"] == "the client's own answer"


async def test_a_second_signal_stops_waiting_for_requests_in_flight(tmp_path: Path) -> None:
    upstream = [*CHATTY_SERVER, str(tmp_path)]
    async with (
        run_sidecar(
            "--provider", "mock", "--drain-timeout", "120", upstream=upstream, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        long_call = call(2, "tools/call", {"name": "sleep", "arguments": {"seconds": 600, "note": "long"}})

        ended: list[Any] = []

        async def long() -> None:
            try:
                response = await http.post(sidecar.url, json=long_call, headers=headers)
                ended.append(response_to(response, 2))
            except httpx2.HTTPError as exc:  # cut off
                ended.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long)
            await wait_until(lambda: (tmp_path / "sleeping-long").exists())
            sidecar.signal(signal.SIGTERM)
            await wait_until(lambda: "draining" in sidecar.stderr())
            # Draining, and still accepting connections for the request in flight.
            assert (await http.get(f"{sidecar.base}/readyz")).status_code == 503
            sidecar.signal(signal.SIGTERM)
            assert await sidecar.wait() == 0
        [outcome] = ended
        assert not isinstance(outcome, dict) or "error" in outcome, outcome  # not answered by the tool
    assert "second signal" in sidecar.stderr()


async def test_ids_json_rpc_does_not_allow_neither_fail_a_request_nor_end_the_session() -> None:
    """An object or array id used to be unhashable: a request with one got a 500, and a response
    POSTed with one ended the session (its next request got 404). Such a request now gets 400 (see
    the test below); a cancellation or a response naming such an id is relayed."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        odd = await http.post(sidecar.url, json={"jsonrpc": "2.0", "id": [1], "method": "x"}, headers=headers)
        assert (odd.status_code, odd.json()["error"]["code"]) == (400, -32600), odd.text
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": {"a": 1}}}
        assert (await http.post(sidecar.url, json=cancel, headers=headers)).status_code == 202
        answer = {"jsonrpc": "2.0", "id": {"a": 1}, "result": {}}
        assert (await http.post(sidecar.url, json=answer, headers=headers)).status_code == 202
        after = await http.post(sidecar.url, json={"jsonrpc": "2.0", "id": 2, "method": "x"}, headers=headers)
        assert after.status_code == 200, after.text
        assert response_to(after, 2)["result"]["echo"]["method"] == "x"
        assert "Exception in ASGI application" not in sidecar.stderr()


async def test_a_message_that_is_not_jsonrpc_2_0_is_refused_not_left_hanging(tmp_path: Path) -> None:
    """A request without `"jsonrpc": "2.0"` (or whose method is no string) was relayed; the SDK's
    stdio upstream dropped the invalid line, and the POST was never answered (SSE keep-alives defeat
    any read timeout) while the request, in flight for ever, kept the session from being reaped.
    Now every such message is refused as the SDK's own HTTP server refuses it: 400, nothing relayed."""
    upstream = [*CHATTY_SERVER, str(tmp_path)]
    options = ("--provider", "mock", "--session-idle-timeout", "2")
    async with (
        run_sidecar(*options, upstream=upstream, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        request = call(5, "tools/list")
        for body in (
            {k: v for k, v in request.items() if k != "jsonrpc"},
            {**request, "jsonrpc": "1.0"},
            {**request, "method": 7},
            [call(6, "tools/list"), {"id": 7, "method": "tools/list"}],
            {"method": "notifications/roots/list_changed"},
            {"jsonrpc": "2.0", "id": 8},
            call(10, "tools/list", [1]),  # MCP's params are an object: the SDK drops the line
            {"jsonrpc": "2.0", "method": "notifications/roots/list_changed", "params": "all"},
        ):
            response = None
            with anyio.move_on_after(8):
                response = await http.post(sidecar.url, json=body, headers=headers)
            assert response is not None, f"no answer within 8 s to {body}"
            assert (response.status_code, response.json()["error"]["code"]) == (400, -32600), response.text
        listed = await http.post(sidecar.url, json=call(9, "tools/list"), headers=headers)
        assert "tools" in response_to(listed, 9)["result"]  # the session goes on
        [marker] = list(tmp_path.glob("started-*"))
        pid = int(marker.name.removeprefix("started-"))
        await wait_until(lambda: not pid_alive(pid), timeout=15)  # and, idle, is reaped


async def test_a_request_whose_id_is_no_string_or_integer_is_refused_not_left_hanging() -> None:
    """MCP ids are strings or integers. The SDK's server takes a request with any other id (null, a
    float, a boolean, an array, an object) for a notification: relayed, it was never answered, its
    POST stayed open for ever and kept the session busy. Now it gets 400, -32600."""
    async with (
        run_sidecar("--provider", "mock", upstream=CHATTY_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        for request_id in (None, 1.5, 2.0, True, [1], {"a": 1}):
            for body in (call(request_id, "tools/list"), [call(request_id, "tools/list"), call(3, "ping")]):
                response = None
                with anyio.move_on_after(8):
                    response = await http.post(sidecar.url, json=body, headers=headers)
                assert response is not None, f"no answer within 8 s to {body}"
                error = response.json()["error"]
                assert (response.status_code, error["code"]) == (400, -32600), response.text
        listed = await http.post(sidecar.url, json=call("4", "tools/list"), headers=headers)
        assert "tools" in response_to(listed, "4")["result"]


async def test_an_upstream_that_cannot_start_is_explained_to_the_operator_not_to_the_client(
    tmp_path: Path,
) -> None:
    """A session whose upstream could not be started told the client why, in the words meant for
    the operator: the command's path on the sidecar's machine and the reason the system gave. The
    client is told that the upstream could not be started; the log says why."""
    server = tmp_path / "secret-dir" / "server.sh"
    server.parent.mkdir()
    server.write_text("#!/bin/sh\nexec cat\n")
    server.chmod(0o755)
    async with (
        run_sidecar("--provider", "mock", upstream=[str(server)], env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        server.unlink()  # found at startup, gone when the first session starts it
        response = await http.post(sidecar.url, json=initialize_body(), headers=HANDSHAKE_HEADERS)
        text = response.text
        assert "could not be started" in text, text
        assert "secret-dir" not in text
        assert "No such file" not in text
        assert "secret-dir" in sidecar.stderr()  # the operator's log says which command, and why


async def test_a_page_the_allowed_origins_admit_can_call_the_sidecar_from_a_browser() -> None:
    """`--allowed-origins` admitted local pages, but a browser asks first (an `OPTIONS` preflight)
    before a JSON POST or one with `Authorization`, and that got 405; nor did any response name the
    page's origin or expose `Mcp-Session-Id`. A server that serves browsers stopped doing so once
    the sidecar was put in front of it."""
    page = "http://localhost:5173"
    async with (
        run_sidecar(
            "--provider", "mock", "--auth-token", TOKEN, upstream=ECHO_SERVER, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        asking = {
            "origin": page,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type, mcp-session-id",
        }
        preflight = await http.options(sidecar.url, headers=asking)  # no token: a browser sends none
        assert preflight.status_code == 204, preflight.text
        assert preflight.headers["access-control-allow-origin"] == page
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "DELETE" in preflight.headers["access-control-allow-methods"]
        assert "mcp-session-id" in preflight.headers["access-control-allow-headers"]

        bearer = {"authorization": f"Bearer {TOKEN}"}
        opened = await http.post(
            sidecar.url, json=initialize_body(), headers={**HANDSHAKE_HEADERS, **bearer, "origin": page}
        )
        assert opened.status_code == 200, opened.text
        assert opened.headers["access-control-allow-origin"] == page
        assert "mcp-session-id" in opened.headers["access-control-expose-headers"]
        refused = await http.post(
            sidecar.url, json=initialize_body(), headers={**HANDSHAKE_HEADERS, "origin": page}
        )
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == page  # the page can read why

        plain = await http.post(sidecar.url, json=initialize_body(), headers={**HANDSHAKE_HEADERS, **bearer})
        assert "access-control-allow-origin" not in plain.headers  # not from a browser: no CORS
        evil = await http.options(sidecar.url, headers={**asking, "origin": "https://evil.example.com"})
        assert evil.status_code == 403
        assert "access-control-allow-origin" not in evil.headers


async def test_the_upstreams_credentials_on_its_command_line_are_not_logged() -> None:
    """`serve` logged the upstream command with every argument as given, credentials included."""
    secrets = ["--token", "tok-SECRET-1", "--url=https://user:pw-SECRET-2@example.com/x"]
    async with (
        run_sidecar("--provider", "mock", upstream=[*ECHO_SERVER, *secrets], env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        await open_session(http, sidecar.url)
        log = sidecar.stderr()
    assert "serving streamable HTTP" in log
    assert "--token" in log
    assert "SECRET" not in log


async def test_a_sessions_upstream_and_its_helpers_do_not_outlive_a_sigkill_of_serve() -> None:
    """SIGKILL leaves `serve` no chance to stop its sessions' upstreams: a helper one of them left in
    its process group (one that ignores SIGTERM and holds none of its pipes) is stopped all the same
    instead of running on as an orphan."""
    from tests.e2e.test_process import gone_within, leaving_a_helper

    upstream = leaving_a_helper(stubborn=True)
    async with (
        run_sidecar(
            "--provider", "mock", "--shutdown-grace", "0.5", upstream=upstream, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        await open_session(http, sidecar.url)
        found = re.search(r"helper (\d+)", sidecar.stderr())
        assert found is not None, sidecar.stderr()
        helper = int(found.group(1))
        try:
            sidecar.signal(signal.SIGKILL)
            assert await sidecar.wait() == -signal.SIGKILL
            assert await gone_within(helper, 20), "still running after serve was killed"
        finally:
            if pid_alive(helper):
                os.kill(helper, signal.SIGKILL)
