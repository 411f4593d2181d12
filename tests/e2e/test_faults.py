"""Faults around the proxy, through the real process: what the client and the server receive, and
that the proxy goes on serving (or, when its upstream is gone, ends the session cleanly).

client (raw JSON-RPC) -> `python -m mcp_backfill` -> tests/servers/echo_server.py (raw, scriptable)
                                 \\-> fake Claude (loopback HTTP, fault modes)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.e2e.faults_support import PLAIN_PARAMS, ask_sampling, echo_session, rss_kib
from tests.fake_claude import (
    FakeClaude,
    RecordedRequest,
    Reply,
    error_reply,
    garbage_stream_reply,
    hang_reply,
    raw_reply,
    sse_event,
    stream_frames,
    text_reply,
    truncated_stream_reply,
)
from tests.harness import TEST_API_KEY

pytestmark = pytest.mark.anyio

FAST_RETRIES = ("--retry-base-delay", "0.02", "--retry-max-delay", "0.1")


def is_response(request_id: Any) -> Any:
    return lambda m: m.get("id") == request_id and "method" not in m


# --------------------------------------------------------------------------------------------------
# The upstream misbehaves
# --------------------------------------------------------------------------------------------------


async def test_upstream_crash_mid_request(fake_claude: FakeClaude) -> None:
    """The server asks for a sample, then dies: the Claude call is cancelled, every request the
    client is still waiting for is answered with an error, and the proxy exits with the status."""
    async with echo_session(fake_claude, warm=True) as session:  # its 5 s must not cover the import
        fake_claude.enqueue(hang_reply("thinking..."))
        await session.send({"jsonrpc": "2.0", "id": 10, "method": "test/ignore"})
        crash = {"method": "sampling/createMessage", "params": PLAIN_PARAMS, "code": 3, "delay": 5.0}
        await session.send({"jsonrpc": "2.0", "id": 11, "method": "test/ask_and_exit", "params": crash})
        assert await fake_claude.await_requests(1, timeout=10)  # Claude is streaming when it dies
        answers: dict[Any, Any] = {}
        while len(answers) < 2:
            message = await session.recv(timeout=15)
            if "method" not in message:
                answers[message["id"]] = message
        assert await fake_claude.await_disconnects(1, timeout=10)  # the Claude stream was closed
        status = await session.wait()
    assert status == 3
    for request_id in (10, 11):
        error = answers[request_id]["error"]
        assert error["code"] == -32603
        assert "Upstream MCP server exited (status 3)" in error["message"]
    assert len(fake_claude.message_requests) == 1


async def test_upstream_that_never_answers(fake_claude: FakeClaude) -> None:
    """Requests the server never answers: the client's cancellations reach the server, other
    requests keep flowing, and nothing is left behind (only the uncancelled one is still pending
    when the server finally exits)."""
    async with echo_session(fake_claude) as session:
        await session.send({"jsonrpc": "2.0", "id": "kept", "method": "test/ignore"})
        for n in range(200):
            await session.send({"jsonrpc": "2.0", "id": n, "method": "test/ignore"})
            cancel = {"requestId": n, "reason": "client timeout"}
            await session.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
        answer = await ask_sampling(session)  # the proxy still samples for the server
        assert answer["result"]["content"]["text"].startswith("fake-claude says")
        seen = await session.request("n", "test/notifications")
        received = seen["result"]["notifications"]
        cancelled = [m["params"]["requestId"] for m in received if m["method"] == "notifications/cancelled"]
        assert cancelled == list(range(200))
        await session.send({"jsonrpc": "2.0", "id": "bye", "method": "test/exit", "params": {"code": 0}})
        errors: list[Any] = []
        while True:  # until the proxy, its upstream gone, closes its stdout
            try:
                message = await session.recv()
            except anyio.EndOfStream:
                break
            if "error" in message:
                errors.append(message["id"])
        assert await session.wait() == 0
    assert errors == ["kept"]


async def test_a_server_cancel_reaches_the_client_only_for_a_request_it_was_sent(
    fake_claude: FakeClaude,
) -> None:
    """The server cancels requests after their answers crossed: one the proxy answered (a sampling
    request, and a task-creating one), and one the client got (`roots/list`). Only the last cancel
    reaches the client: it never saw the other ids, which may even be ids of its own requests."""
    seen: list[Any] = []

    async def server_asks(request_id: str, ask: dict[str, Any]) -> Any:
        await session.send({"jsonrpc": "2.0", "id": request_id, "method": "test/ask_client", "params": ask})
        response, before = await session.recv_until(is_response(request_id), timeout=60)
        seen.extend(before)
        return response["result"]["client_response"]

    async def server_notifies(method: str, params: dict[str, Any]) -> None:
        notify = {"method": method, "params": params}
        await session.send(
            {"jsonrpc": "2.0", "id": "notify", "method": "test/notify_client", "params": notify}
        )
        _, before = await session.recv_until(is_response("notify"))
        seen.extend(before)

    async with echo_session(fake_claude) as session:
        sampled = await server_asks(
            "a", {"method": "sampling/createMessage", "params": PLAIN_PARAMS, "id": 1}
        )
        assert "result" in sampled
        tasked = {**PLAIN_PARAMS, "task": {"ttl": 60_000}}
        created = await server_asks("b", {"method": "sampling/createMessage", "params": tasked, "id": 2})
        assert "taskId" in created["result"]["task"]
        roots = {"method": "roots/list", "id": 3}
        await session.send({"jsonrpc": "2.0", "id": "c", "method": "test/ask_client", "params": roots})
        request, _ = await session.recv_until(lambda m: m.get("method") == "roots/list")
        assert request["id"] == 3
        for cancelled in (1, 2, 3):
            await server_notifies("notifications/cancelled", {"requestId": cancelled})
        await session.send({"jsonrpc": "2.0", "id": 3, "result": {"roots": []}})
        _, before = await session.recv_until(is_response("c"))
        seen.extend(before)
        await server_notifies("notifications/end", {})
    cancels = [m["params"]["requestId"] for m in seen if m.get("method") == "notifications/cancelled"]
    assert cancels == [3]


async def test_notification_flood_is_relayed_in_order_with_bounded_memory(fake_claude: FakeClaude) -> None:
    count = 10_000
    async with echo_session(fake_claude, warm=True) as session:  # the Claude client is in `before`
        pid = session.process.pid
        before = rss_kib(pid)
        params = {"count": count, "method": "notifications/flood"}
        await session.send({"jsonrpc": "2.0", "id": "flood", "method": "test/flood", "params": params})
        await anyio.sleep(1.0)  # read nothing for a while: the pipes fill up and push back
        during = rss_kib(pid)
        response, seen = await session.recv_until(is_response("flood"), timeout=60)
        after = rss_kib(pid)
        answer = await ask_sampling(session)  # still answering sampling for the server
        ping = await session.request("ping", "ping")
    assert response["result"] == {"flooded": count}
    flood = [m for m in seen if m.get("method") == "notifications/flood"]
    assert [m["params"]["seq"] for m in flood] == list(range(count))
    assert len(seen) - len(flood) <= 1  # at most the echo of our notifications/initialized
    assert "result" in answer
    assert ping["result"]["echo"]["method"] == "ping"
    assert max(during, after) - before < 30 * 1024, (before, during, after)


async def test_client_disconnect_mid_sampling_cancels_the_claude_call(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(hang_reply("a long answer that never ends"))
    async with echo_session(fake_claude) as session:
        ask = {"method": "sampling/createMessage", "params": PLAIN_PARAMS, "id": "slow"}
        await session.send({"jsonrpc": "2.0", "id": 5, "method": "test/ask_client", "params": ask})
        assert await fake_claude.await_requests(1, timeout=10)
        await session.close_stdin()  # the client goes away while Claude is still streaming
        assert await fake_claude.await_disconnects(1, timeout=15)
        status = await session.wait()
        log = session.stderr()
    assert status == 0
    assert "client closed its side of the session" in log


# --------------------------------------------------------------------------------------------------
# Claude misbehaves
# --------------------------------------------------------------------------------------------------


async def test_529_for_a_long_stretch_ends_at_the_deadline(fake_claude: FakeClaude) -> None:
    options = ("--sampling-timeout", "2", "--retry-max-attempts", "1000", *FAST_RETRIES)
    async with echo_session(fake_claude, *options, warm=True) as session:
        fake_claude.fallback = lambda request: error_reply(529, "overloaded_error", "Overloaded")
        failed = await ask_sampling(session)
        attempts = len(fake_claude.message_requests)
        fake_claude.fallback = None  # the outage ends
        recovered = await ask_sampling(session)
    error = failed["error"]
    assert error["code"] == -32603
    data = error["data"]
    assert data["provider"] == "anthropic"
    assert data["gave_up"] == "deadline"
    assert data["attempts"] >= 5
    # The attempt running at the deadline may be cut before its body reached the fake.
    assert data["attempts"] - 1 <= attempts <= data["attempts"] + 1
    assert "--sampling-timeout" in error["message"]
    if data["type"] != "timeout":  # on a slow machine the last attempt may still be running then
        assert (data["status"], data["type"]) == (529, "overloaded_error")
        assert data["request_id"].startswith("req_fake_")
    assert TEST_API_KEY not in json.dumps(error)
    assert recovered["result"]["content"]["text"].startswith("fake-claude says")


async def test_retry_after_is_honoured_only_up_to_the_cap(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(error_reply(429, "rate_limit_error", "Slow down", retry_after=3600))
    async with echo_session(fake_claude, *FAST_RETRIES) as session:
        answer = await ask_sampling(session, timeout=20)  # not an hour
    assert answer["result"]["content"]["text"].startswith("fake-claude says")
    assert len(fake_claude.message_requests) == 2
    assert fake_claude.message_requests[1].headers["x-stainless-retry-count"] == "0"  # the SDK did not retry


async def test_a_hanging_stream_is_cut_at_the_deadline(fake_claude: FakeClaude) -> None:
    async with echo_session(fake_claude, "--sampling-timeout", "2", warm=True) as session:
        fake_claude.enqueue(hang_reply("half an answer"))
        failed = await ask_sampling(session)
        assert await fake_claude.await_disconnects(1)
        fine = await ask_sampling(session)
    assert failed["error"]["code"] == -32603
    assert failed["error"]["data"] == {
        "provider": "anthropic",
        "type": "timeout",
        "attempts": 1,
        "gave_up": "deadline",
    }
    assert "result" in fine


async def test_malformed_streams_are_retried_then_reported(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(
        truncated_stream_reply(abrupt=True),  # the connection drops mid-stream: retried
        truncated_stream_reply(),  # the body ends before message_stop: retried
        text_reply("third time lucky"),
        garbage_stream_reply(),  # a non-JSON event, twice: reported after the 2 attempts
        garbage_stream_reply(),
    )
    async with echo_session(fake_claude, "--retry-max-attempts", "3", *FAST_RETRIES) as session:
        lucky = await ask_sampling(session)
        fake_claude.enqueue(garbage_stream_reply())
        broken = await ask_sampling(session)
        after = await ask_sampling(session)
    assert lucky["result"]["content"]["text"] == "third time lucky"
    error = broken["error"]
    assert error["code"] == -32603
    assert (error["data"]["type"], error["data"]["attempts"]) == ("malformed_response", 3)
    assert error["data"]["gave_up"] == "retries_exhausted"
    assert "malformed" in error["message"]
    assert after["result"]["content"]["text"].startswith("fake-claude says")
    assert len(fake_claude.message_requests) == 3 + 3 + 1


async def test_a_mid_stream_overloaded_error_is_retried(fake_claude: FakeClaude) -> None:
    seen: list[RecordedRequest] = []

    def overloaded_once(request: RecordedRequest) -> Reply:
        seen.append(request)
        from tests.fake_claude import stream_error_reply

        return stream_error_reply("overloaded_error", "Overloaded", partial_text="I was saying")

    fake_claude.enqueue(overloaded_once, text_reply("complete answer"))
    async with echo_session(fake_claude, *FAST_RETRIES) as session:
        answer = await ask_sampling(session)
    # The partial text of the failed attempt never reaches the server.
    assert answer["result"]["content"] == {"type": "text", "text": "complete answer"}
    assert len(seen) == 1
    assert (
        next(r.body for r in fake_claude.message_requests)
        == [r.body for r in fake_claude.message_requests][1]
    )


@pytest.mark.parametrize(
    "ending",
    [
        "dropped after message_stop",
        "stalled after message_stop",
        "dropped after message_delta",
        "an error event after message_stop",
        "a gateway's [DONE] after message_stop",
        "an error event after message_delta",
    ],
)
async def test_a_whole_message_is_the_answer_however_its_stream_then_ends(
    fake_claude: FakeClaude, tmp_path: Path, ending: str
) -> None:
    """A stream that had delivered the whole message (`message_delta`, with the stop reason and the
    final usage, and `message_stop`) and then broke off before the body's end was retried as a
    broken stream: Claude was called, and billed, again for an answer already paid for. One that
    then stalled was cut at `--sampling-timeout` and failed the request, the message thrown away
    and charged its whole reservation. Now the message is the answer, charged what it cost."""
    message = {
        "id": "msg_whole",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5",
        "content": [{"type": "text", "text": "all of it"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 12,
            "output_tokens": 4,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    frames = stream_frames(message)
    if ending.endswith("after message_delta"):
        frames = frames[:-1]  # message_stop
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    if ending.startswith("an error event"):
        frames.append(sse_event("error", overloaded))
    if "[DONE]" in ending:
        frames.append(b"data: [DONE]\n\n")
    reply = raw_reply(*frames, abort=ending.startswith("dropped"), hang=ending.startswith("stalled"))
    audit = tmp_path / "audit.jsonl"
    options = ("--sampling-timeout", "30", "--audit-log", str(audit), *FAST_RETRIES)
    async with echo_session(fake_claude, *options, warm=True) as session:
        fake_claude.enqueue(reply)
        answer = await ask_sampling(session, timeout=60)
    assert answer.get("result", {}).get("content") == {"type": "text", "text": "all of it"}, answer
    assert len(fake_claude.message_requests) == 1  # not called again
    charged = json.loads(audit.read_text().splitlines()[-1])["charged"]
    assert (charged["input_tokens"], charged["output_tokens"]) == (12, 4)
