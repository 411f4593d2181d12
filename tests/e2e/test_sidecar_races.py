"""`mcp-backfill serve` when requests overlap: a session's requests against its own ending (idle
reaping, DELETE), bursts of one client against its limits. Moments are held open with events in the
test (a body held back, a Claude answer that hangs), never with sleeps that assume a timing."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.e2e.test_sidecar_stateless import stateless_headers, stateless_request
from tests.fake_claude import FakeClaude, hang_reply
from tests.harness import proxy_env, python_server
from tests.sidecar_harness import (
    HANDSHAKE_HEADERS,
    HTTP_TIMEOUT,
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
RESOLVE_SERVER = python_server("resolve_server.py")
ECHO_SERVER = python_server("echo_server.py")


async def test_a_session_is_not_reaped_while_a_post_body_of_it_is_arriving() -> None:
    """A POST holds its session only once its body was read: a session whose next request was still
    uploading its body when `--session-idle-timeout` came was closed under it (404). Session A's POST
    sends its head and holds its body back until session B, opened after it, has been reaped."""
    async with (
        run_sidecar(
            "--provider", "mock", "--session-idle-timeout", "4", upstream=SAMPLING_SERVER, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session_a = await open_session(http, sidecar.url)
        release, started = anyio.Event(), anyio.Event()
        body = b'{"jsonrpc": "2.0", "id": 5, "method": "tools/list"}'

        async def held_body() -> AsyncIterator[bytes]:
            yield body[:10]
            started.set()
            await release.wait()
            yield body[10:]

        answer: dict[str, httpx2.Response] = {}

        async def post_a() -> None:
            headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session_a, "content-length": str(len(body))}
            answer["a"] = await http.post(sidecar.url, content=held_body(), headers=headers)

        async with anyio.create_task_group() as tg:
            tg.start_soon(post_a)
            await started.wait()
            await open_session(http, sidecar.url)  # B: idle from now on, and A's POST is older
            with anyio.fail_after(60):
                while (await health(http, sidecar))["sessions"] == 2:  # until one was reaped
                    await anyio.sleep(0.1)
            release.set()
        response = answer["a"]
        assert response.status_code == 200, response.text
        assert "tools" in response_to(response, 5)["result"]


# An upstream slow to stop: once its input is closed it stays until the test creates `release`.
LINGERING_SERVER = r"""
import json, os, sys, time
from pathlib import Path
here = Path(sys.argv[1])
(here / f"started-{os.getpid()}").touch()
for line in sys.stdin:
    message = json.loads(line)
    if "id" in message and "method" in message:
        info = {"name": "linger", "version": "0"}
        result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": info}
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
(here / f"eof-{os.getpid()}").touch()
while not (here / "release").exists():
    time.sleep(0.05)
"""


async def test_a_deleted_session_counts_against_max_sessions_until_its_upstream_stopped(
    tmp_path: Path,
) -> None:
    """DELETE took its session off `--max-sessions` at once, while its upstream process was still
    stopping (up to 3 x `--shutdown-grace`): a client deleting and reopening sessions ran more
    upstream processes than the limit. Now the slot is free once the process is gone."""
    script = tmp_path / "linger.py"
    script.write_text(LINGERING_SERVER)
    options = ("--provider", "mock", "--max-sessions", "1", "--shutdown-grace", "60")
    async with (
        run_sidecar(
            *options, upstream=[sys.executable, str(script), str(tmp_path)], env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        first = await open_session(http, sidecar.url)
        deleted: dict[str, httpx2.Response] = {}

        async def delete() -> None:
            deleted["first"] = await http.delete(
                sidecar.url, headers={**HANDSHAKE_HEADERS, "mcp-session-id": first}
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(delete)
            with anyio.fail_after(HTTP_TIMEOUT):
                while not list(tmp_path.glob("eof-*")):  # its upstream is stopping
                    await anyio.sleep(0.05)
            meanwhile = await http.post(sidecar.url, json=initialize_body(), headers=HANDSHAKE_HEADERS)
            (tmp_path / "release").touch()
        after = await http.post(sidecar.url, json=initialize_body(), headers=HANDSHAKE_HEADERS)
    assert deleted["first"].status_code == 200
    assert meanwhile.status_code == 503, meanwhile.text
    assert "--max-sessions" in meanwhile.text
    assert after.status_code == 200, after.text
    assert len(list(tmp_path.glob("started-*"))) == 2


@pytest.mark.parametrize("era", ["handshake", "2026-07-28"])
async def test_a_request_still_running_when_the_drain_ends_is_answered(
    fake_claude: FakeClaude, era: str
) -> None:
    """A request still in flight when `--drain-timeout` was up was cancelled by uvicorn in its
    handler: its client got a bare `500 Internal Server Error` (no JSON-RPC answer, and one for the
    5xx alert) and the log an "Exception in ASGI application" traceback. Now it is answered with a
    JSON-RPC error saying the sidecar is shutting down and naming the option that gives requests
    longer, and its Claude call is cancelled and charged."""
    fake_claude.enqueue(hang_reply("thinking..."))
    upstream = SAMPLING_SERVER if era == "handshake" else RESOLVE_SERVER
    answer: dict[str, httpx2.Response] = {}
    async with (
        run_sidecar("--drain-timeout", "1", upstream=upstream, env=proxy_env(fake_claude.url)) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        request: dict[str, Any]
        if era == "handshake":
            headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
            arguments = {"prompt": "a long essay", "max_tokens": 50}
            request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
            request["params"] = {"name": "plain", "arguments": arguments}
        else:
            headers = stateless_headers("tools/call", "summarize")
            request = stateless_request(7, "tools/call", {"name": "summarize", "arguments": {"text": "x"}})

        async def post() -> None:
            answer["post"] = await http.post(sidecar.url, json=request, headers=headers)

        async with anyio.create_task_group() as tg:
            tg.start_soon(post)
            assert await fake_claude.await_requests(1, timeout=30)  # Claude is streaming
            sidecar.signal(signal.SIGTERM)
            assert await sidecar.wait() == 0
        stderr = sidecar.stderr()
    response = answer["post"]
    assert response.status_code == 200, response.text
    replies = [m for m in response_messages(response) if m.get("id") == 7]
    assert [reply["error"]["message"] for reply in replies] == [
        "mcp-backfill is shutting down and the request was not answered within "
        "--drain-timeout / MCP_BACKFILL_DRAIN_TIMEOUT (1s)"
    ]
    assert "Exception in ASGI application" not in stderr
    assert "Traceback" not in stderr
    assert "charged_tokens=" in stderr
    assert await fake_claude.await_disconnects(1, timeout=10)


async def test_a_dropped_post_stream_outlives_answers_already_read(tmp_path: Path) -> None:
    """A POST's SSE stream whose client dropped the connection is kept for it to resume
    (`Last-Event-ID`), but only the last 8 finished streams of a session were kept, oldest out: 8
    other requests of the session answered meanwhile pushed it out, and its answer was lost (400),
    though every one of theirs had been read whole. Now the streams read whole go first."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        ask = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "test/ask_client",
            "params": {"method": "ping", "id": "q"},
        }
        async with http.stream("POST", sidecar.url, json=ask, headers=headers) as response:
            seen = ""
            async for chunk in response.aiter_text():  # until the server's question has come
                seen += chunk
                if '"q"' in seen and seen.endswith("\n\n"):
                    break
        # The client dropped the stream; it answers the question, which lets request 1 finish unread.
        [(last_id, question)] = [(i, m) for i, m in sse_messages(seen) if m.get("id") == "q"]
        assert last_id is not None
        assert question["method"] == "ping"
        answered = await http.post(
            sidecar.url, json={"jsonrpc": "2.0", "id": "q", "result": {}}, headers=headers
        )
        assert answered.status_code == 202
        for n in range(2, 11):  # nine more requests, each answer read whole
            echo = {"jsonrpc": "2.0", "id": n, "method": "test/echo"}
            assert "result" in response_to(await http.post(sidecar.url, json=echo, headers=headers), n)
        resumed = await http.get(sidecar.url, headers={**headers, "last-event-id": last_id})
    assert resumed.status_code == 200, resumed.text
    assert [m.get("id") for _, m in sse_messages(resumed.text)] == [1]
    assert "client_response" in sse_messages(resumed.text)[0][1]["result"]


async def test_a_hub_is_not_evicted_while_a_request_body_of_its_client_is_arriving() -> None:
    """A 2026-07-28 POST held its client's hub only once its body was read: with `--max-sessions`
    full, a newcomer's request had the hub stopped as idle while a request of its client was still
    uploading, and that request then got 503. Alice's POST sends its head and holds its body back
    while Bob's request arrives: Bob, finding no idle hub, is told to come back; Alice is served."""
    tokens = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}
    entries = ",".join(f"{name}={token}" for name, token in tokens.items())

    def headers_of(who: str, method: str) -> dict[str, str]:
        return {**stateless_headers(method), "authorization": f"Bearer {tokens[who]}"}

    options = ("--provider", "mock", "--client-tokens", entries, "--max-sessions", "1")
    async with (
        run_sidecar(*options, upstream=RESOLVE_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        first = await http.post(
            sidecar.url, json=stateless_request(1, "tools/list"), headers=headers_of("alice", "tools/list")
        )
        assert first.status_code == 200, first.text  # Alice's hub: the one slot, idle from now on
        body = json.dumps(stateless_request(2, "tools/list")).encode()
        release, started = anyio.Event(), anyio.Event()

        async def held_body() -> AsyncIterator[bytes]:
            yield body[:10]
            started.set()
            await release.wait()
            yield body[10:]

        answers: dict[str, Any] = {}

        async def post_alice() -> None:
            headers = {**headers_of("alice", "tools/list"), "content-length": str(len(body))}
            answers["alice"] = await http.post(sidecar.url, content=held_body(), headers=headers)

        async def listen_bob(bob_ready: anyio.Event, done: anyio.Event) -> None:
            # A request that stays in flight once it has its hub, until Alice's answer is in.
            params = {"notifications": {"toolsListChanged": True}}
            listen = stateless_request("L", "subscriptions/listen", params)
            headers = headers_of("bob", "subscriptions/listen")
            async with http.stream("POST", sidecar.url, json=listen, headers=headers) as response:
                answers["bob"] = response.status_code
                if response.status_code == 200:
                    async for line in response.aiter_lines():
                        if "subscriptions/acknowledged" in line:
                            break  # Bob holds the slot: Alice's body may come now
                else:
                    await response.aread()
                    answers["bob_text"] = response.text
                bob_ready.set()
                await done.wait()

        bob_ready, done = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(post_alice)
            await started.wait()
            tg.start_soon(listen_bob, bob_ready, done)
            with anyio.fail_after(HTTP_TIMEOUT):
                await bob_ready.wait()
                release.set()
                while "alice" not in answers:
                    await anyio.sleep(0.05)
            done.set()
    assert answers["bob"] == 503, answers
    assert "--max-sessions" in answers["bob_text"]
    alice = answers["alice"]
    assert alice.status_code == 200, alice.text
    assert alice.json()["result"]["tools"]


# A 2026-07-28 upstream slow to stop: answers every request with an empty tools list; once its
# input is closed it stays until the test creates `release`.
LINGERING_2026_SERVER = r"""
import json, os, sys, time
from pathlib import Path
here = Path(sys.argv[1])
(here / f"started-{os.getpid()}").touch()
for line in sys.stdin:
    message = json.loads(line)
    if "id" in message and "method" in message:
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": []}}), flush=True)
(here / f"eof-{os.getpid()}").touch()
while not (here / "release").exists():
    time.sleep(0.05)
(here / f"gone-{os.getpid()}").touch()
"""


@pytest.mark.parametrize("newcomer", ["2026-07-28", "handshake"])
async def test_an_evicted_hub_counts_against_max_sessions_until_its_upstream_stopped(
    tmp_path: Path, newcomer: str
) -> None:
    """An idle 2026-07-28 hub stopped to make room (or for idleness) left `--max-sessions` at once,
    while its upstream process was still stopping (up to 3 x `--shutdown-grace`): the newcomer's
    upstream started beside it, more upstream processes than the limit. Now the newcomer waits for
    the evicted upstream to be gone before its own starts."""
    script = tmp_path / "linger.py"
    script.write_text(LINGERING_2026_SERVER)
    tokens = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}
    entries = ",".join(f"{name}={token}" for name, token in tokens.items())
    options = (
        "--provider",
        "mock",
        "--client-tokens",
        entries,
        "--max-sessions",
        "1",
        "--shutdown-grace",
        "60",
    )

    def headers_of(who: str, method: str) -> dict[str, str]:
        return {**stateless_headers(method), "authorization": f"Bearer {tokens[who]}"}

    async with (
        run_sidecar(
            *options, upstream=[sys.executable, str(script), str(tmp_path)], env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        first = await http.post(
            sidecar.url, json=stateless_request(1, "tools/list"), headers=headers_of("alice", "tools/list")
        )
        assert first.status_code == 200, first.text  # Alice's hub: the one slot, idle from now on
        answer: dict[str, httpx2.Response] = {}

        async def bob() -> None:
            if newcomer == "2026-07-28":
                body = stateless_request(2, "tools/list")
                answer["bob"] = await http.post(
                    sidecar.url, json=body, headers=headers_of("bob", "tools/list")
                )
            else:
                headers = {**HANDSHAKE_HEADERS, "authorization": f"Bearer {tokens['bob']}"}
                answer["bob"] = await http.post(sidecar.url, json=initialize_body(), headers=headers)

        async with anyio.create_task_group() as tg:
            tg.start_soon(bob)
            with anyio.fail_after(HTTP_TIMEOUT):
                while not list(tmp_path.glob("eof-*")):  # Alice's upstream is stopping
                    await anyio.sleep(0.05)
            for _ in range(20):  # a while for a second upstream to start, if it is going to
                await anyio.sleep(0.1)
            started_while_stopping = len(list(tmp_path.glob("started-*")))
            assert "bob" not in answer  # waiting for the slot, neither served nor refused
            (tmp_path / "release").touch()
        assert started_while_stopping == 1
        assert answer["bob"].status_code == 200, answer["bob"].text
        assert len(list(tmp_path.glob("started-*"))) == 2


async def test_a_resumed_stream_whose_answer_the_session_let_go_is_refused_not_held_open() -> None:
    """A session keeps at most 32 MiB of events for replay, its oldest going first whichever stream
    they are on: the answer of a POST whose client dropped the stream can go too, after 35 MiB of
    other streams read whole. Resuming that stream then got `200` and pings for ever (nothing more
    would come, yet it was never done), holding the session busy, so never reaped: it gets `400`
    now, as an id whose events are gone, and the client knows its answer is lost."""
    async with (
        run_sidecar("--provider", "mock", upstream=ECHO_SERVER, env=proxy_env()) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": await open_session(http, sidecar.url)}
        ask = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "test/ask_client",
            "params": {"method": "ping", "id": "q"},
        }
        async with http.stream("POST", sidecar.url, json=ask, headers=headers) as response:
            seen = ""
            async for chunk in response.aiter_text():  # until the server's question has come
                seen += chunk
                if '"q"' in seen and seen.endswith("\n\n"):
                    break
        [last_id] = [i for i, m in sse_messages(seen) if m.get("id") == "q"]
        assert last_id is not None
        answered = await http.post(
            sidecar.url, json={"jsonrpc": "2.0", "id": "q", "result": {}}, headers=headers
        )
        assert answered.status_code == 202  # request 1 is answered, on the stream nobody reads
        padding = "x" * (5 * 1024 * 1024)
        for n in range(2, 9):  # seven SSE answers of 5 MiB, each read whole
            params = {"method": "notifications/message", "params": {"padding": padding}}
            big = {"jsonrpc": "2.0", "id": n, "method": "test/notify_client", "params": params}
            assert "result" in response_to(await http.post(sidecar.url, json=big, headers=headers), n)
        resumed = None
        with anyio.move_on_after(20):
            resumed = await http.get(sidecar.url, headers={**headers, "last-event-id": last_id})
    assert resumed is not None, "the resumed stream was held open with nothing more to come"
    assert resumed.status_code == 400, resumed.text
