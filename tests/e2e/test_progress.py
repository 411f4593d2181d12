"""Progress while Claude streams: `notifications/progress` reach the server that asked for them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tests.e2e.faults_support import PLAIN_PARAMS, ask_sampling, echo_session
from tests.fake_claude import FakeClaude, error_reply, stream_error_reply, text_reply
from tests.harness import (
    SERVERS,
    proxy_argv,
    proxy_env,
    proxy_url_argv,
    python_http_server,
    python_server,
    stdio_params,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ANSWER = "Progress is reported while this answer streams, one piece at a time. " * 4


async def test_an_sdk_server_hears_progress_until_the_answer_is_complete(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(text_reply(ANSWER, chunks=24, event_delay=0.05))  # about 1.3 s of streaming
    argv = proxy_argv(upstream=python_server("sampling_server.py"))
    async with Client(stdio_params(argv, proxy_env(fake_claude.url)), mode="legacy") as client:
        result = await client.call_tool("progress_sample", {"prompt": "tell me"})
    outcome = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert outcome["text"] == ANSWER
    progress = outcome["progress"]
    values = [p[0] for p in progress]
    assert len(progress) >= 3  # several while streaming (throttled), then the final one
    assert values == sorted(set(values))  # strictly increasing, as the spec requires
    # At most one per delta plus the final one; the throttle's rate (4 a second) is a unit test with
    # a fake clock (tests/unit/test_progress.py): here a loaded machine may stretch the stream.
    assert len(progress) <= 24 + 1
    *streaming, final = progress
    assert all(total is None and message.startswith("Claude is writing") for _, total, message in streaming)
    assert final[1] == final[0] == len(ANSWER) + 1
    assert final[2].startswith("Claude finished (")


def progress_of(notifications: list[Any]) -> list[dict[str, Any]]:
    return [n["params"] for n in notifications if n["method"] == "notifications/progress"]


async def test_progress_only_when_asked_and_monotonic_across_a_retry(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        text_reply("no token, no progress"),
        stream_error_reply("overloaded_error", "Overloaded", partial_text="a first attempt that fails"),
        text_reply("second attempt"),
    )
    async with echo_session(fake_claude, "--retry-base-delay", "0.01") as session:
        await ask_sampling(session)
        silent = (await session.request("n1", "test/notifications"))["result"]["notifications"]
        params = {**PLAIN_PARAMS, "_meta": {"progressToken": "tok-7"}}
        answer = await ask_sampling(session, params)
        heard = (await session.request("n2", "test/notifications"))["result"]["notifications"]
    assert progress_of(silent) == []
    assert answer["result"]["content"]["text"] == "second attempt"
    progress = progress_of(heard)
    assert {p["progressToken"] for p in progress} == {"tok-7"}
    values = [p["progress"] for p in progress]
    assert values == sorted(set(values))
    assert progress[-1]["total"] == progress[-1]["progress"]
    # The final count covers both attempts: the failed one's characters are not taken back.
    assert progress[-1]["progress"] > len("a first attempt that fails") + len("second attempt")


async def test_a_server_slow_to_take_progress_does_not_hold_up_claudes_stream(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """Each progress notification to an HTTP upstream is a POST: the Claude stream was read only
    once the upstream had acknowledged it, so a server (or a gateway before it) taking 3 s to
    acknowledge stretched a 1 s answer past `--sampling-timeout`, which failed it and charged its
    whole reservation. Progress now goes out beside the stream, the latest value when the
    previous one was taken, the final one last, before the answer."""
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(text_reply(ANSWER, chunks=24, event_delay=0.05))
    server = [sys.executable, str(SERVERS / "sampling_server.py"), "--http", "127.0.0.1:0"]
    async with python_http_server(server, env=proxy_env(TEST_SLOW_PROGRESS_ACK="3")) as upstream:
        argv = proxy_url_argv("--sampling-timeout", "10", "--audit-log", str(audit), url=upstream.url)
        async with Client(stdio_params(argv, proxy_env(fake_claude.url)), mode="legacy") as client:
            result = await client.call_tool("progress_sample", {"prompt": "tell me"})
    outcome = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert outcome["text"] == ANSWER
    values = [p[0] for p in outcome["progress"]]
    assert values == sorted(set(values))
    assert outcome["progress"][-1][1] == values[-1] == len(ANSWER) + 1  # the final one, last
    [line] = [json.loads(text) for text in audit.read_text().splitlines()]
    assert line["outcome"] == "answered"
    assert len(fake_claude.message_requests) == 1


@pytest.mark.parametrize(
    ("version", "has_message"),
    [("2024-11-05", False), ("2025-03-26", True), ("2025-11-25", True), ("2099-01-01", True)],
)
async def test_progress_has_a_message_only_from_the_revision_that_defines_it(
    fake_claude: FakeClaude, version: str, has_message: bool
) -> None:
    """`message` in `notifications/progress` arrived in 2025-03-26: a server whose session negotiated
    2024-11-05 gets the fields its revision defines; a revision newer than the proxy knows, the newest."""
    fake_claude.enqueue(text_reply(ANSWER, chunks=4))
    async with echo_session(fake_claude, version=version) as session:
        params = {**PLAIN_PARAMS, "_meta": {"progressToken": 3}}
        answer = await ask_sampling(session, params)
        heard = (await session.request("n", "test/notifications"))["result"]["notifications"]
    assert answer["result"]["content"]["text"] == ANSWER
    progress = progress_of(heard)
    assert progress
    assert progress[-1]["total"] == progress[-1]["progress"]
    assert all(("message" in p) is has_message for p in progress), progress


async def test_a_failed_answer_with_progress_asked_is_an_error_to_the_server_and_the_session_goes_on(
    fake_claude: FakeClaude,
) -> None:
    """The notifications go out from a task beside the sampling: the failure of a sampling request
    that asked for progress reached the server as its JSON-RPC error, not as a crash of the relay."""
    fake_claude.enqueue(
        error_reply(400, "invalid_request_error", "prompt is too long"),
        text_reply("still here"),
    )
    async with echo_session(fake_claude) as session:
        params = {**PLAIN_PARAMS, "_meta": {"progressToken": "tok-9"}}
        failed = await ask_sampling(session, params)
        answered = await ask_sampling(session, params)
    assert failed["error"]["code"] != 0
    assert "prompt is too long" in failed["error"]["message"]
    assert answered["result"]["content"]["text"] == "still here"
