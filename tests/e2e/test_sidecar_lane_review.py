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
from tests.e2e.test_sidecar_lane import raw_post
from tests.harness import SERVERS, proxy_env, python_http_server
from tests.sidecar_harness import HTTP_TIMEOUT, open_session, run_sidecar

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
