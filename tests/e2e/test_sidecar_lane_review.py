"""The sidecar's fast lane (`sidecar/lane.py`) held to what the ASGI app does, in the cases a review
found it did not: through a real sidecar in front of a real HTTP server."""

from __future__ import annotations

import json
import re
import socket
import sys
import time

import anyio
import httpx2
import pytest

from tests.e2e.test_sidecar_http_upstream import NO_COMMAND, recorder
from tests.e2e.test_sidecar_lane import (
    chatty_session,
    posts_counted,
    raw_exchange,
    raw_post,
    tool_call,
)
from tests.harness import SERVERS, proxy_env, python_http_server
from tests.sidecar_harness import (
    HTTP_TIMEOUT,
    Sidecar,
    in_front_of,
    open_session,
    run_sidecar,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _send_without_reading(client: socket.socket, requests: list[bytes], spacing: float) -> int:
    """Send the requests on `client`, `spacing` seconds apart (each after the one before it was
    answered, not pipelined), reading nothing; returns how many bytes went before the sidecar read
    no more for two seconds (all of them, when it never stopped)."""
    client.settimeout(2.0)
    data = b"".join(requests)
    sent = 0
    for request in requests:
        end = sent + len(request)
        try:
            while sent < end:
                sent += client.send(data[sent:end])
        except TimeoutError:
            return sent  # the sidecar stopped reading: what the test wants to see
        time.sleep(spacing)
    return sent


def _send_rest(client: socket.socket, data: bytes) -> None:
    client.sendall(data)


async def test_a_client_that_reads_no_answers_holds_up_its_requests_and_no_memory_piles_up() -> None:
    # The app's handler waits for a client's connection to take its answer before the next request
    # on it is read; the lane wrote each answer at once into the connection's buffer, however much
    # of it the client had left unread, and read the next: a client sending requests one by one and
    # reading nothing made the sidecar hold every answer in memory (here 12 MB, and on without end).
    count, size = 120, 100_000
    async with (
        recorder() as (upstream, recorded),
        run_sidecar(
            "--upstream-url", upstream.url, "--provider", "mock", upstream=NO_COMMAND, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        big = {"size": size}
        requests = [
            raw_post(sidecar, session, {"jsonrpc": "2.0", "id": n + 2, "method": "big/json", "params": big})
            for n in range(count)
        ]
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the client reads nothing
        client.connect(("127.0.0.1", sidecar.port))
        try:
            sent = await anyio.to_thread.run_sync(_send_without_reading, client, requests, 0.1)
            await anyio.sleep(0.5)
            reached = sum(
                1 for r in recorded() if r["verb"] == "POST" and "big/json" in json.dumps(r.get("body"))
            )
            assert reached < count, "the sidecar answered every request into a connection nobody read"
            # The client reads now (and sends the rest): every answer comes, once, in order.
            client.settimeout(HTTP_TIMEOUT)
            received = bytearray()
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, _send_rest, client, b"".join(requests)[sent:])
                while received.count(b"HTTP/1.1 200 OK") < count or not received.endswith(b"}}"):
                    chunk = await anyio.to_thread.run_sync(client.recv, 1 << 20)
                    assert chunk, "the connection ended before every answer"
                    received += chunk
        finally:
            client.close()
        ids = [int(found) for found in re.findall(rb'"id":\s*(\d+)', bytes(received))]
        assert ids == list(range(2, count + 2))


async def test_a_request_pipelined_behind_one_the_lane_hands_over_is_answered_after_it() -> None:
    # The first request's answer is not quick: the lane hands it to the app (`LanePost._hand_over`),
    # whose response must start the request pipelined behind it, once, and in order.
    chatty = [sys.executable, str(SERVERS / "chatty_server.py"), "--http", "127.0.0.1:0"]
    async with (
        python_http_server(chatty) as upstream,
        run_sidecar(
            "--upstream-url", upstream.url, "--provider", "mock", upstream=NO_COMMAND, env=proxy_env()
        ) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        slow = {"name": "sleep", "arguments": {"seconds": 0.3}}
        data = raw_post(sidecar, session, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": slow})
        data += raw_post(sidecar, session, {"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {}})
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            await stream.send(data)
            received = b""
            with anyio.fail_after(HTTP_TIMEOUT):
                while not re.search(rb'"id":\s*3', received):
                    received += await stream.receive()
            with anyio.move_on_after(0.3):  # nothing more comes
                received += await stream.receive()
    assert received.count(b"HTTP/1.1 200 OK") == 2, received
    assert re.search(rb'"id":\s*2', received), received
    found = [int(n) for n in re.findall(rb'"id":\s*(\d+)', received)]
    assert found == [2, 3], received


async def _replay_bytes(http: httpx2.AsyncClient, sidecar: Sidecar) -> float:
    """`mcp_backfill_replay_buffer_bytes`: what every session keeps for SSE resumption."""
    text = (await http.get(f"{sidecar.base}/metrics")).text
    found = re.search(r"^mcp_backfill_replay_buffer_bytes (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


async def test_answers_the_lane_wrote_as_json_are_not_kept_for_replay() -> None:
    # A JSON answer has no event id: nobody can resume its stream. The lane let the session keep
    # the last eight of them (`FINISHED_STREAMS_KEPT`), however large, after they were read.
    count, size = 12, 50_000
    async with (
        recorder() as (upstream, _),
        in_front_of(upstream) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
    ):
        session = await open_session(http, sidecar.url)
        before = await posts_counted(http, sidecar, "200")
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            for n in range(2, count + 2):
                big = {"jsonrpc": "2.0", "id": n, "method": "big/json", "params": {"size": size}}
                await stream.send(raw_post(sidecar, session, big))  # head and body in one write
                received = b""
                with anyio.fail_after(HTTP_TIMEOUT):
                    while not received.endswith(b"}}"):
                        received += await stream.receive()
                head, _, payload = received.partition(b"\r\n\r\n")
                assert b"content-type: application/json" in head.lower(), head
                assert json.loads(payload)["id"] == n
        assert await posts_counted(http, sidecar, "200") == before + count
        assert await _replay_bytes(http, sidecar) < size, "the session kept answers read as JSON"


async def test_a_request_whose_client_left_the_lane_is_not_kept_for_replay_once_answered() -> None:
    # Its client left before any event of it went out: it has no event id to resume the stream with.
    async with chatty_session() as (sidecar, http, session, headers):
        slow = tool_call(2, "sleep", {"seconds": 0.3})
        await raw_exchange(sidecar, raw_post(sidecar, session, slow), until=b"", close_after=0.01)
        with anyio.fail_after(10):
            while await posts_counted(http, sidecar, "499") < 1:
                await anyio.sleep(0.05)
        await anyio.sleep(1.0)  # its answer (0.3 s) has come from the upstream meanwhile
        assert await _replay_bytes(http, sidecar) == 0, "the session kept an answer nobody can resume"
        after = await http.post(sidecar.url, json=tool_call(3, "pid", {}), headers=headers)
        assert after.json()["id"] == 3  # and the session goes on
