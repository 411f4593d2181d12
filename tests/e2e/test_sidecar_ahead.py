"""Written first, booked after (`relay/ahead.py`), through a real sidecar in front of real HTTP servers.

The lane writes a quick answer to the client before the relay has routed it, and POSTs the client's
next request before the relay's books of the last answer and of itself. The client must not be able
to tell: what comes right after an answer sees a session that has routed it, and one that nothing
comes after still has it routed, its session let go of, and counted.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.abc
import pytest

from tests.e2e.test_sidecar_lane import chatty_session, json_answer, posts_counted, raw_post, tool_call
from tests.sidecar_harness import Sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


async def lane_calls(sidecar: Sidecar, session: str, calls: list[tuple[int, dict[str, Any]]]) -> list[Any]:
    """`tools/call`s of the chatty server's `sleep`, (id, arguments) each, one after the other on one
    connection, each written whole (as the lane takes them): each answer's id and result."""
    answers = []
    async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
        for request_id, arguments in calls:
            await stream.send(raw_post(sidecar, session, tool_call(request_id, "sleep", arguments)))
            _, body = await json_answer(stream)
            answer = json.loads(body)
            answers.append((answer["id"], json.loads(answer["result"]["content"][0]["text"])))
    return answers


async def test_a_request_reusing_the_id_just_answered_gets_its_own_answer() -> None:
    """The id of the answer written last is still the relay's (its books are owed) when the next
    request, under the same id, comes: it is routed first, and the request is not refused."""
    async with chatty_session() as (sidecar, http, session, _):
        before = await posts_counted(http, sidecar, "200")
        calls = [(7, {"seconds": n / 1000}) for n in range(12)]
        assert await lane_calls(sidecar, session, calls) == [(7, {"slept": n / 1000}) for n in range(12)]
        assert await posts_counted(http, sidecar, "200") == before + 12


async def test_the_last_answers_books_are_kept_though_nothing_comes_after_it() -> None:
    """Nothing follows the last answer: its books are kept all the same (`AHEAD_SECONDS` after it),
    so its session, idle since, is closed after `--session-idle-timeout`."""
    async with chatty_session("--session-idle-timeout", "0.5") as (sidecar, http, session, headers):
        calls = [(n, {"seconds": 0}) for n in range(2, 6)]
        assert await lane_calls(sidecar, session, calls) == [(n, {"slept": 0}) for n in range(2, 6)]
        await anyio.sleep(1.5)
        late = await http.post(sidecar.url, json=tool_call(9, "pid", {}), headers=headers)
        assert late.status_code == 404, late.text


KEEP_ALIVE = 5.0
"""uvicorn's keep-alive timeout, which the sidecar keeps: it closes a connection idle that long."""


async def answered_connection(sidecar: Sidecar, session: str) -> anyio.abc.SocketStream:
    """A connection on which a few quick `tools/call`s, each written whole, were answered (ahead),
    the last just now."""
    stream = await anyio.connect_tcp("127.0.0.1", sidecar.port)
    for request_id in range(1, 4):
        await stream.send(raw_post(sidecar, session, tool_call(request_id, "sleep", {"seconds": 0})))
        await json_answer(stream)
    return stream


async def test_a_stream_opened_before_the_last_answers_books_keeps_its_connection() -> None:
    """The connection's books of an answer written ahead are kept once the relay has routed it,
    which the next request on the connection may come before: a GET stream, whose session is
    looked up (and the answer routed) after uvicorn began it. uvicorn's keep-alive timer, armed with
    those books, would then close the stream `KEEP_ALIVE` seconds later; it is not armed."""
    async with chatty_session() as (sidecar, _, session, _):
        stream = await answered_connection(sidecar, session)
        get = [
            "GET /mcp HTTP/1.1",
            f"Host: 127.0.0.1:{sidecar.port}",
            "Accept: text/event-stream",
            f"Mcp-Session-Id: {session}",
        ]
        received = b""
        try:
            await stream.send(("\r\n".join(get) + "\r\n\r\n").encode())
            with anyio.move_on_after(KEEP_ALIVE + 1.5):
                while True:
                    received += await stream.receive()  # EndOfStream: closed under the stream
        finally:
            await stream.aclose()
        assert received.startswith(b"HTTP/1.1 200 OK"), received


async def test_a_connection_idle_after_an_answer_written_ahead_is_closed_as_any() -> None:
    """Nothing follows the last answer on the connection: its books are kept all the same
    (`AHEAD_SECONDS` after it), uvicorn's keep-alive timer with them, which closes it."""
    async with chatty_session() as (sidecar, _, session, _):
        stream = await answered_connection(sidecar, session)
        try:
            with anyio.fail_after(KEEP_ALIVE + 3), pytest.raises(anyio.EndOfStream):
                await stream.receive()
        finally:
            await stream.aclose()
