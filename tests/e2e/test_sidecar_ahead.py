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
