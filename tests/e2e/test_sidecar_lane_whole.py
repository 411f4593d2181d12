"""Requests the lane reads whole itself, without uvicorn (`sidecar/whole_request.py`), through a real
sidecar in front of a real HTTP server.

Such a request has no uvicorn cycle while the lane holds it. What comes behind it on its connection
before its answer, and its hand-over to the app when its answer is slow, make one
(`LanePost.adopt`): the request behind it must then wait for its answer, as HTTP/1.1 has it.
"""

from __future__ import annotations

import json
import re

import anyio
import pytest

from tests.e2e.test_sidecar_lane import (
    chatty_session,
    json_answer,
    posts_counted,
    raw_post,
    request,
    tool_call,
)
from tests.sidecar_harness import HTTP_TIMEOUT, Sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


async def answers_in_order(sidecar: Sidecar, first: bytes, second: bytes, gap: float) -> list[int]:
    """Write `first`, then `second` `gap` seconds later on the same connection, each in one write;
    the ids of the answers, in the order they came."""
    async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
        await stream.send(first)
        await anyio.sleep(gap)
        await stream.send(second)
        received = b""
        with anyio.fail_after(HTTP_TIMEOUT):
            while len(re.findall(rb'"id":\s*\d+', received)) < 2:
                received += await stream.receive()
        with anyio.move_on_after(0.2):  # nothing more comes
            received += await stream.receive()
    assert received.count(b"HTTP/1.1 200 OK") == 2, received
    return [int(found) for found in re.findall(rb'"id":\s*(\d+)', received)]


@pytest.mark.parametrize(
    ("seconds", "gap"),
    [
        (0.03, 0.005),  # answered by the lane; the second came while the first was in flight
        (0.3, 0.01),  # the second came first, then the first was handed to the app
        (0.3, 0.15),  # the first was handed to the app, then the second came
    ],
)
async def test_a_request_behind_one_the_lane_read_whole_is_answered_after_it(
    seconds: float, gap: float
) -> None:
    async with chatty_session() as (sidecar, _, session, _):
        first = raw_post(sidecar, session, tool_call(2, "sleep", {"seconds": seconds}))
        second = raw_post(sidecar, session, request(3, "ping"))
        assert await answers_in_order(sidecar, first, second, gap) == [2, 3]


async def test_requests_read_whole_are_answered_and_counted_as_the_app_answers_them() -> None:
    async with chatty_session() as (sidecar, http, session, _):
        before = await posts_counted(http, sidecar, "200")
        async with await anyio.connect_tcp("127.0.0.1", sidecar.port) as stream:
            for n in range(2, 12):
                await stream.send(raw_post(sidecar, session, tool_call(n, "pid", {})))
                head, body = await json_answer(stream)
                assert f"mcp-session-id: {session}".encode() in head, head
                assert f"content-length: {len(body)}".encode() in head, head
                assert json.loads(body)["id"] == n
        with anyio.fail_after(10):
            while await posts_counted(http, sidecar, "200") < before + 10:
                await anyio.sleep(0.02)
