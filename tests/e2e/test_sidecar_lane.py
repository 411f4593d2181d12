"""The sidecar's fast lane and an HTTP upstream's answers read from the callback (`sidecar/lane.py`,
`transports/http_upstream/early.py`), through a real sidecar in front of real HTTP servers.

The lane answers a session's lone request from the connection's callbacks when its answer is quick,
and hands anything else to the ASGI app; an upstream's plain answer is read without a task. These
tests hold both to what the sidecar did without them: the same answers, headers and metrics, one
upstream connection for a session's calls, every message once, and the slow, failing and
unfinished cases still answered.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from mcp_backfill.sidecar.http_io import CLOSED_BEFORE_ANSWER
from tests.e2e.test_sidecar_http_upstream import recorder
from tests.harness import (
    SERVERS,
    initialize_params,
    proxy_env,
    proxy_url_argv,
    python_http_server,
    raw_proxy,
)
from tests.sidecar_harness import (
    HANDSHAKE_HEADERS,
    HTTP_TIMEOUT,
    Sidecar,
    in_front_of,
    open_session,
    response_messages,
    run_sidecar,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
CHATTY_HTTP = [sys.executable, str(SERVERS / "chatty_server.py"), "--http", "127.0.0.1:0"]


def request(request_id: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


def tool_call(
    request_id: int, name: str, arguments: dict[str, Any], token: str | None = None
) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return request(request_id, "tools/call", params)


@asynccontextmanager
async def chatty_session(
    *options: str,
) -> AsyncIterator[tuple[Sidecar, httpx2.AsyncClient, str, dict[str, str]]]:
    """A sidecar (with `options`) in front of the chatty server, a client, one session open and the
    headers of its requests."""
    async with (
        python_http_server(CHATTY_HTTP) as upstream,
        in_front_of(upstream, *options) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        yield sidecar, http, session, {**HANDSHAKE_HEADERS, "mcp-session-id": session}


async def posts_counted(http: httpx2.AsyncClient, sidecar: Sidecar, status: str) -> float:
    """`mcp_backfill_http_requests_total` for POSTs answered with `status`."""
    text = (await http.get(f"{sidecar.base}/metrics")).text
    pattern = rf'^mcp_backfill_http_requests_total\{{method="POST",status="{status}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_quick_answers_come_as_json_over_one_upstream_connection_and_are_counted() -> None:
    async with (
        recorder() as (upstream, recorded),
        in_front_of(upstream) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session}
        before = await posts_counted(http, sidecar, "200")
        for n in range(2, 42):
            response = await http.post(sidecar.url, json=request(n, "echo/this"), headers=headers)
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == "application/json"
            assert response.headers["mcp-session-id"] == session
            assert int(response.headers["content-length"]) == len(response.content)
            assert response.json() == {"jsonrpc": "2.0", "id": n, "result": {"method": "echo/this"}}
        assert await posts_counted(http, sidecar, "200") == before + 40
        echoed = [r for r in recorded() if r["verb"] == "POST" and "echo/this" in json.dumps(r["body"])]
    assert len(echoed) == 40
    assert len({r["peer"] for r in echoed}) == 1, "a session's calls opened more than one connection"


async def test_an_answer_still_streaming_past_the_patience_brings_every_message_once() -> None:
    # Progress first: the lane hands the POST to the app (SSE). The answer takes 0.8 s, past the
    # half second the upstream's answer is read without a task: the task takes over mid-stream.
    async with chatty_session() as (sidecar, http, _, headers):
        body = tool_call(2, "chatter", {"tag": "slow", "count": 2, "delay": 0.4}, token="tok")
        response = await http.post(sidecar.url, json=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        messages = response_messages(response)
        progress = [m["params"]["message"] for m in messages if m.get("method") == "notifications/progress"]
        answers = [m for m in messages if m.get("id") == 2]
        assert progress == ["slow 0", "slow 1"]
        assert len(answers) == 1
        assert json.loads(answers[0]["result"]["content"][0]["text"])["tag"] == "slow"
        # The session goes on, and a quick call after it is JSON again.
        again = await http.post(sidecar.url, json=tool_call(3, "pid", {}), headers=headers)
        assert again.headers["content-type"] == "application/json"
        assert again.json()["id"] == 3


async def test_a_slow_answer_is_written_by_the_app_once_the_quick_window_has_passed() -> None:
    async with chatty_session() as (sidecar, http, _, headers):
        before = await posts_counted(http, sidecar, "200")
        response = await http.post(sidecar.url, json=tool_call(2, "sleep", {"seconds": 0.3}), headers=headers)
        assert response.status_code == 200, response.text
        replies = [m for m in response_messages(response) if m.get("id") == 2]
        assert len(replies) == 1
        assert json.loads(replies[0]["result"]["content"][0]["text"]) == {"slept": 0.3}
        with anyio.fail_after(10):  # (the app counts a request once its handler has ended)
            while await posts_counted(http, sidecar, "200") < before + 1:
                await anyio.sleep(0.05)
        assert await posts_counted(http, sidecar, "200") == before + 1


async def test_upstream_failures_under_the_lane_are_answered_and_the_session_goes_on() -> None:
    async with (
        recorder() as (upstream, _),
        in_front_of(upstream) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session}
        for n, method, said in [(2, "fail/500", "database on fire"), (3, "fail/hang-up", "")]:
            response = await http.post(sidecar.url, json=request(n, method), headers=headers)
            assert response.status_code == 200, response.text
            (reply,) = [m for m in response_messages(response) if m.get("id") == n]
            assert said in reply["error"]["message"], reply
        ok = await http.post(sidecar.url, json=request(4, "echo/this"), headers=headers)
        assert ok.json() == {"jsonrpc": "2.0", "id": 4, "result": {"method": "echo/this"}}


async def raw_exchange(
    sidecar: Sidecar, data: bytes, *, until: bytes, close_after: float | None = None
) -> bytes:
    """Write `data` on a new connection and read until `until` has come as often as it occurs in
    `data`'s requests (one per answer), or the connection ends; with `close_after`, close it after
    that many seconds instead, reading nothing."""
    async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
        await stream.send(data)
        if close_after is not None:
            await anyio.sleep(close_after)
            return b""
        received = b""
        with anyio.fail_after(HTTP_TIMEOUT):
            while received.count(until) < data.count(b"POST "):
                try:
                    received += await stream.receive()
                except anyio.EndOfStream:
                    break
        return received


async def json_answer(stream: anyio.abc.ByteStream) -> tuple[bytes, bytes]:
    """The head and body of the next answer on `stream`, a JSON one (the lane's), read whole."""
    received = b""
    with anyio.fail_after(HTTP_TIMEOUT):
        while b"\r\n\r\n" not in received or not received.endswith(b"}"):
            received += await stream.receive()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), received
    return head, body


def raw_post(
    sidecar: Sidecar,
    session: str,
    body: dict[str, Any],
    *extra: str,
    accept: str = HANDSHAKE_HEADERS["accept"],
) -> bytes:
    payload = json.dumps(body).encode()
    lines = [
        "POST /mcp HTTP/1.1",
        f"Host: 127.0.0.1:{sidecar.port}",
        f"Accept: {accept}",
        "Content-Type: application/json",
        f"Mcp-Session-Id: {session}",
        *extra,
        f"Content-Length: {len(payload)}",  # last, as httpx writes it
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


async def test_pipelined_posts_and_a_connection_close_are_answered_as_http_has_it() -> None:
    async with (
        recorder() as (upstream, _),
        in_front_of(upstream) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        two = raw_post(sidecar, session, request(2, "echo/one")) + raw_post(
            sidecar, session, request(3, "echo/two")
        )
        answers = await raw_exchange(sidecar, two, until=b"}}")
        assert answers.count(b"HTTP/1.1 200 OK") == 2, answers
        assert answers.index(b'"id": 2') < answers.index(b'"id": 3') or answers.index(
            b'"id":2'
        ) < answers.index(b'"id":3')
        closing = raw_post(sidecar, session, request(4, "echo/last"), "Connection: close")
        answer = await raw_exchange(sidecar, closing, until=b"\0")  # read to the connection's end
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK"), answer
        assert b"connection: close" in head.lower(), answer
        assert json.loads(payload) == {"jsonrpc": "2.0", "id": 4, "result": {"method": "echo/last"}}


async def keep_alive_answers(sidecar: Sidecar, requests: list[bytes]) -> list[tuple[int, bytes]]:
    """Each request written on one connection after the answer to the one before it was read
    whole (by its `Content-Length`): each answer's status and body."""
    answers: list[tuple[int, bytes]] = []
    async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
        buffered = BufferedByteReceiveStream(stream)
        with anyio.fail_after(HTTP_TIMEOUT):
            for data in requests:
                await stream.send(data)
                head = await buffered.receive_until(b"\r\n\r\n", 65536)
                length = re.search(rb"(?im)^content-length: *(\d+)", head)
                assert length is not None, head
                body = await buffered.receive_exactly(int(length.group(1)))
                answers.append((int(head.split(b" ")[1]), body))
    return answers


async def test_each_request_on_a_connection_is_checked_by_its_own_headers() -> None:
    # The lane keeps a connection's last verdict on its headers; a request whose headers differ
    # in anything but their length is judged anew, the identical ones that follow included. (The
    # lane reads a head it saw last from what it read then: another token of the same length, in
    # the same place, is another head.)
    alice, bob = "alice-token-0123456789", "bobby-token-0123456789"
    env = proxy_env(MCP_BACKFILL_CLIENT_TOKENS=f"alice={alice},bob={bob}")
    async with (
        recorder() as (upstream, recorded),
        run_sidecar("--upstream-url", upstream.url, "--provider", "mock", env=env) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url, {"authorization": f"Bearer {alice}"})
        as_alice = f"Authorization: Bearer {alice}"
        cases: list[tuple[int, tuple[str, ...]]] = [
            (200, (as_alice,)),
            (403, (f"Authorization: Bearer {bob}",)),  # another client's session
            (200, (as_alice,)),
            (401, ("Authorization: Bearer not-a-token",)),
            (401, ()),
            (200, (as_alice,)),
            (403, (as_alice, "Origin: http://elsewhere.example")),
            (200, (as_alice,)),
            (400, (as_alice, "Mcp-Protocol-Version: 1999-01-01")),
            (200, (as_alice, "Mcp-Protocol-Version: 2025-11-25")),
            (406, (as_alice, "Accept: application/json")),
            (200, (as_alice,)),
        ]
        requests = [
            raw_post(
                sidecar,
                session,
                request(n, f"echo/{n}"),
                *(line for line in extra if not line.startswith("Accept")),
                accept=next(
                    (line[8:] for line in extra if line.startswith("Accept")), HANDSHAKE_HEADERS["accept"]
                ),
            )
            for n, (_, extra) in enumerate(cases, start=2)
        ]
        answers = await keep_alive_answers(sidecar, requests)
        echoed = {r["body"]["method"] for r in recorded() if r["verb"] == "POST" and "id" in r["body"]}
    assert [status for status, _ in answers] == [status for status, _ in cases], answers
    for n, ((status, _), (_, body)) in enumerate(zip(cases, answers, strict=True), start=2):
        if status == 200:
            assert json.loads(body) == {"jsonrpc": "2.0", "id": n, "result": {"method": f"echo/{n}"}}
    relayed = {f"echo/{n}" for n, (status, _) in enumerate(cases, start=2) if status == 200}
    assert echoed - {"initialize"} == relayed


async def leave_a_quick_call(sidecar: Sidecar, http: httpx2.AsyncClient, session: str) -> None:
    """A call whose client closes its connection 10 ms in, before the answer: once counted (499)."""
    await raw_exchange(
        sidecar,
        raw_post(sidecar, session, tool_call(2, "sleep", {"seconds": 0.2})),
        until=b"",
        close_after=0.01,
    )
    with anyio.fail_after(10):
        while await posts_counted(http, sidecar, "499") < 1:
            await anyio.sleep(0.05)


async def test_a_client_gone_before_its_quick_answer_is_counted_and_holds_nothing() -> None:
    async with chatty_session("--session-idle-timeout", "1") as (sidecar, http, session, _):
        await leave_a_quick_call(sidecar, http, session)
        # Not held by the request its client left: the idle session is closed after its timeout.
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session}
        with anyio.fail_after(15):
            while (await http.post(sidecar.url, json=request(3, "ping"), headers=headers)).status_code != 404:
                await anyio.sleep(1.5)


async def test_a_client_gone_before_its_quick_answer_is_logged_as_the_app_logs_it() -> None:
    """The lane's POST whose client left within the quick window is logged as the app's POST is,
    with the same line: what the sidecar says of a request does not depend on which of them served
    it (a test counting the app's lines waited for ever for one the lane had taken)."""
    async with chatty_session("--log-level", "debug") as (sidecar, http, session, _):
        await leave_a_quick_call(sidecar, http, session)
        assert sidecar.stderr().count(CLOSED_BEFORE_ANSWER) == 1, sidecar.stderr()


async def test_a_body_sent_apart_from_its_head_is_answered_by_the_app_as_the_lane_answers() -> None:
    async with (
        recorder() as (upstream, _),
        in_front_of(upstream) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        data = raw_post(sidecar, session, request(2, "echo/same"))
        head, _, body = data.partition(b"\r\n\r\n")
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(head + b"\r\n\r\n")
            await anyio.sleep(0.1)  # the lane takes only a body that came with its head
            await stream.send(body)
            by_app = b""
            with anyio.fail_after(HTTP_TIMEOUT):
                while b"}}" not in by_app:
                    by_app += await stream.receive()
        by_lane = await raw_exchange(sidecar, data, until=b"}}")
    assert json.loads(by_app.partition(b"\r\n\r\n")[2]) == {
        "jsonrpc": "2.0",
        "id": 2,
        "result": {"method": "echo/same"},
    }
    undated = re.compile(rb"^date: .*$", re.MULTILINE | re.IGNORECASE)
    assert undated.sub(b"date", by_lane) == undated.sub(b"date", by_app)


async def test_a_notification_and_the_request_written_right_after_it_reach_the_upstream_in_order() -> None:
    # The stdio wrapper hands a client's lines to the HTTP upstream from its read callback: a
    # notification's POST is still waiting for its acknowledgement when the request after it is
    # read, and the request must not overtake it (`initialized`, then the first call).
    async with recorder() as (upstream, recorded):
        argv = proxy_url_argv("--provider", "mock", url=upstream.url)
        async with raw_proxy(argv, proxy_env()) as session:
            response = await session.request(1, "initialize", initialize_params())
            assert "result" in response, response
            for n in range(2, 7):
                initialized = {"jsonrpc": "2.0", "method": f"notifications/slow-ack-{n}"}
                call = request(n, f"echo/after-{n}")
                await session.send(initialized)
                await anyio.sleep(0.02)  # apart: each read at once from the read callback
                await session.send(call)
                answer, _ = await session.recv_until(lambda m, n=n: m.get("id") == n)
                assert answer["result"] == {"method": f"echo/after-{n}"}, answer
            methods = [
                r["body"]["method"] for r in recorded() if r["verb"] == "POST" and isinstance(r["body"], dict)
            ]
    sent = [m for m in methods if m.startswith(("notifications/slow-ack-", "echo/after-"))]
    expected = [m for n in range(2, 7) for m in (f"notifications/slow-ack-{n}", f"echo/after-{n}")]
    assert sent == expected


async def test_an_expect_100_continue_post_is_answered_as_the_app_answers_it() -> None:
    # The app's answer to a POST with `Expect: 100-continue` begins with an interim 100 Continue
    # (uvicorn writes it when the body is read), whether or not the body came with the head.
    async with (
        recorder() as (upstream, _),
        in_front_of(upstream) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        data = raw_post(sidecar, session, request(2, "echo/expect"), "Expect: 100-continue")
        head, _, body = data.partition(b"\r\n\r\n")
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(head + b"\r\n\r\n")
            await anyio.sleep(0.1)
            await stream.send(body)
            by_app = b""
            with anyio.fail_after(HTTP_TIMEOUT):
                while b"}}" not in by_app:
                    by_app += await stream.receive()
        together = await raw_exchange(sidecar, data, until=b"}}")
    undated = re.compile(rb"^date: .*$", re.MULTILINE | re.IGNORECASE)
    assert by_app.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), by_app
    assert undated.sub(b"date", together) == undated.sub(b"date", by_app)
