"""The spend ledger through real processes: every Claude call is charged, however it ended.

client (raw lines, mcp SDK or HTTP) -> `python -m mcp_backfill [serve]` -> tests/servers/sampling_server.py
                                              \\-> fake Claude (loopback HTTP, ANTHROPIC_BASE_URL)

Each test here reproduces a way the review found to spend without being charged (a cancel storm, a
timeout, a retried broken stream, a new session, a model upgrade) and shows the ledger catching it.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from tests.fake_claude import (
    FakeClaude,
    RecordedRequest,
    Reply,
    error_reply,
    hang_reply,
    raw_reply,
    sse_event,
    text_reply,
    truncated_stream_reply,
)
from tests.harness import (
    RawSession,
    free_port,
    initialize_params,
    proxy_argv,
    proxy_env,
    python_server,
    raw_proxy,
    stdio_params,
    tool_json,
)
from tests.sidecar_harness import run_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")
INPUT_REQUIRED_SERVER = python_server("input_required_server.py")
# Generous: under load a proxy, its upstream and the first Claude client import take seconds.
SLOW = 60.0


def plain_params(text: str, max_tokens: int = 20, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
        "maxTokens": max_tokens,
        **extra,
    }


async def initialize(session: RawSession) -> None:
    await session.request(0, "initialize", initialize_params())
    await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


async def raw_sample(session: RawSession, request_id: int, params: dict[str, Any]) -> dict[str, Any]:
    arguments = {"params_json": json.dumps(params)}
    response = await session.request(
        request_id,
        "tools/call",
        {"name": "sample_raw", "arguments": arguments},
    )
    outcome: dict[str, Any] = json.loads(response["result"]["content"][0]["text"])
    return outcome


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def wait_for_audit(path: Path, count: int) -> list[dict[str, Any]]:
    """The audit log once it has `count` lines (each exchange is audited once it is charged)."""
    with anyio.fail_after(SLOW):
        while len(lines := audit_lines(path)) < count:
            await anyio.sleep(0.05)
    return lines


async def wait_for_fake(fake: FakeClaude, count: int) -> None:
    assert await anyio.to_thread.run_sync(fake.wait_for_requests, count, SLOW)


async def test_cancelled_calls_are_charged_so_a_cancel_storm_exhausts_the_budget(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A server that cancels every sampling request as soon as Claude starts on it spent money
    that no budget saw; now each cancelled call is charged its input and its whole output
    reservation, and the budget runs out."""
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(text_reply("warm"), *(hang_reply("Once upon a time") for _ in range(3)))
    argv = proxy_argv("--budget-tokens", "1000", "--audit-log", str(audit), upstream=SAMPLING_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await initialize(session)
        warm = await raw_sample(session, 1, plain_params("warm up"))
        for n in range(3):
            call_id = 10 + n
            arguments = {"cancel_after": 600, "max_tokens": 400, "prompt": f"essay {n}"}
            await session.send(
                {
                    "jsonrpc": "2.0",
                    "id": call_id,
                    "method": "tools/call",
                    "params": {"name": "slow_sample", "arguments": arguments},
                }
            )
            await wait_for_fake(fake_claude, 2 + n)  # Claude has started on it...
            cancel = {"requestId": call_id, "reason": "changed my mind"}
            await session.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
            await wait_for_audit(audit, 2 + n)  # ...and the cancelled call is on the ledger
        refused = await raw_sample(session, 20, plain_params("and now?"))
        await session.close_stdin()
        await session.wait(SLOW)

    assert warm["result"]["content"]["text"] == "warm"
    lines = audit_lines(audit)
    assert [line["outcome"] for line in lines] == [
        "answered",
        "cancelled",
        "cancelled",
        "cancelled",
        "refused",
    ]
    for line in lines[1:4]:
        assert line["charged"]["output_tokens"] == 400  # Claude may have written all of it
        assert line["charged"]["input_tokens"] > 0  # as message_start reported it
        assert line["calls"] == 1
    error = refused["error"]
    assert error["code"] == -32603
    assert "process token budget is exhausted" in error["message"]
    assert error["data"]["used"] == sum(sum(line["charged"].values()) for line in lines[:4])
    assert lines[4]["charged"] is None
    assert len(fake_claude.message_requests) == 4  # the refusal cost nothing
    assert fake_claude.disconnects == 3  # each cancel closed its Claude stream


async def test_a_timed_out_call_is_charged(fake_claude: FakeClaude, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(hang_reply("Thinking"))
    argv = proxy_argv("--sampling-timeout", "2", "--audit-log", str(audit), upstream=SAMPLING_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await initialize(session)
        outcome = await raw_sample(session, 1, plain_params("slowly", max_tokens=300))
        await session.close_stdin()
        await session.wait(SLOW)
    assert "--sampling-timeout" in outcome["error"]["message"]
    [line] = audit_lines(audit)
    assert line["outcome"] == "timed_out"
    assert line["charged"]["output_tokens"] == 300
    assert line["charged"]["input_tokens"] > 0


async def test_every_attempt_of_a_retried_call_is_charged(fake_claude: FakeClaude, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    final = {"input_tokens": 11, "output_tokens": 7}
    fake_claude.enqueue(truncated_stream_reply("Par", abrupt=True), text_reply("whole", usage=final))
    argv = proxy_argv(
        "--retry-base-delay", "0.01", "--no-prompt-cache", "--audit-log", str(audit), upstream=SAMPLING_SERVER
    )
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await initialize(session)
        outcome = await raw_sample(session, 1, plain_params("again", max_tokens=50))
        await session.close_stdin()
        await session.wait(SLOW)
    assert outcome["result"]["content"]["text"] == "whole"
    [line] = audit_lines(audit)
    assert (line["outcome"], line["usage"]["output_tokens"]) == ("answered", 7)
    # The broken attempt: its input as message_start reported it, and its whole output reservation.
    assert line["charged"]["output_tokens"] == 50 + 7
    assert line["charged"]["input_tokens"] > 11
    assert len(fake_claude.message_requests) == 2


async def test_calls_that_were_never_billed_cost_nothing(fake_claude: FakeClaude, tmp_path: Path) -> None:
    """An HTTP error status (here a 529, retried) is not billed by the API; nor is a call whose
    connection could not be made. Neither is charged."""
    audit = tmp_path / "audit.jsonl"
    final = {"input_tokens": 11, "output_tokens": 7}
    fake_claude.enqueue(
        error_reply(529, "overloaded_error", "Overloaded", retry_after=0), text_reply("ok", usage=final)
    )
    argv = proxy_argv(
        "--retry-base-delay", "0.01", "--no-prompt-cache", "--audit-log", str(audit), upstream=SAMPLING_SERVER
    )
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await initialize(session)
        retried = await raw_sample(session, 1, plain_params("again", max_tokens=50))
        await session.close_stdin()
        await session.wait(SLOW)
    unreachable = tmp_path / "unreachable.jsonl"
    env = proxy_env(f"http://127.0.0.1:{free_port()}")
    argv = proxy_argv("--retry-max-attempts", "1", "--audit-log", str(unreachable), upstream=SAMPLING_SERVER)
    async with raw_proxy(argv, env) as session:
        await initialize(session)
        refused = await raw_sample(session, 1, plain_params("anyone?", max_tokens=50))
        await session.close_stdin()
        await session.wait(SLOW)

    assert retried["result"]["content"]["text"] == "ok"
    [line] = audit_lines(audit)
    assert line["charged"] == {**final, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    assert "unreachable" in refused["error"]["message"]
    [line] = audit_lines(unreachable)
    assert (line["outcome"], line["calls"], line["charged"]) == ("failed", 0, None)  # Claude never called


@pytest.mark.parametrize(
    ("options", "expected"),
    [((), "mock/claude-sonnet-5-5"), (("--allow-model-upgrade",), "mock/claude-opus-5-5")],
    ids=["default", "opted-in"],
)
async def test_a_server_cannot_pick_a_pricier_model_unless_the_operator_allows_it(
    options: tuple[str, ...], expected: str
) -> None:
    argv = proxy_argv("--provider", "mock", *options, upstream=SAMPLING_SERVER)
    async with raw_proxy(argv, proxy_env()) as session:
        await initialize(session)
        by_priority = await raw_sample(
            session, 1, plain_params("best", modelPreferences={"intelligencePriority": 1})
        )
        by_hint = await raw_sample(
            session, 2, plain_params("best", modelPreferences={"hints": [{"name": "opus"}]})
        )
        cheaper = await raw_sample(session, 3, plain_params("cheap", modelPreferences={"costPriority": 1}))
        await session.close_stdin()
        await session.wait(SLOW)
    assert by_priority["result"]["model"] == expected
    assert by_hint["result"]["model"] == expected
    assert cheaper["result"]["model"] == "mock/claude-haiku-5-5"  # cheaper is always allowed


async def test_a_new_session_does_not_reset_the_clients_budget(tmp_path: Path) -> None:
    """Deleting a session and opening another used to give a fresh budget; a client's budget now
    outlives its sessions."""
    async with run_sidecar(
        "--provider", "mock", "--client-budget-tokens", "10", upstream=SAMPLING_SERVER, env=proxy_env()
    ) as sidecar:
        async with Client(sidecar.url, mode="legacy") as client:
            first = tool_json(
                await client.call_tool("sample_raw", {"params_json": json.dumps(plain_params("one"))})
            )
        async with Client(sidecar.url, mode="legacy") as client:  # a new session of the same client
            again = tool_json(
                await client.call_tool("sample_raw", {"params_json": json.dumps(plain_params("two"))})
            )
        stderr = sidecar.stderr()
    assert "result" in first
    assert "token budget of client" in again["error"]["message"]
    assert "--client-budget-tokens" in again["error"]["message"]
    assert "no token budget" not in stderr


async def test_serve_warns_when_it_would_spend_without_a_budget() -> None:
    async with run_sidecar("--provider", "mock", upstream=SAMPLING_SERVER, env=proxy_env()) as sidecar:
        pass
    assert "no token budget" in sidecar.stderr()
    assert "--budget-tokens" in sidecar.stderr()


async def test_serve_writes_the_audit_log_and_flushes_it_on_sigterm(tmp_path: Path) -> None:
    """`--audit-log` wrote nothing under `serve` (only the stdio front ran its writer)."""
    audit = tmp_path / "audit.jsonl"
    options = ("--provider", "mock", "--budget-tokens", "1000000", "--audit-log", str(audit))
    async with run_sidecar(*options, upstream=SAMPLING_SERVER, env=proxy_env()) as sidecar:
        async with Client(sidecar.url, mode="legacy") as client:
            params = json.dumps(plain_params("one"))
            first = tool_json(await client.call_tool("sample_raw", {"params_json": params}))
            [line] = await wait_for_audit(audit, 1)  # written while serving, not only at exit
            for n in range(3):
                params = json.dumps(plain_params(f"more {n}"))
                tool_json(await client.call_tool("sample_raw", {"params_json": params}))
            async with httpx2.AsyncClient() as http:
                metrics = (await http.get(f"{sidecar.base}/metrics")).text
        sidecar.signal(signal.SIGTERM)
        assert await sidecar.wait(SLOW) == 0
    assert "result" in first
    assert (line["outcome"], line["session"]) == ("answered", "http-1")
    assert [entry["outcome"] for entry in audit_lines(audit)] == ["answered"] * 4
    assert "mcp_backfill_audit_lines_dropped_total 0" in metrics


async def test_nothing_the_api_served_goes_uncharged(fake_claude: FakeClaude, tmp_path: Path) -> None:
    """The ledger's invariant over answered, cancelled, retried and timed-out calls: the tokens the
    fake Claude served never exceed the tokens charged."""
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(
        text_reply("answered"),
        hang_reply("I will be cancelled"),
        truncated_stream_reply("Half of it", abrupt=True),
        text_reply("retried"),
        hang_reply("I will time out"),
    )
    argv = proxy_argv(
        "--sampling-timeout",
        "3",
        "--retry-base-delay",
        "0.01",
        "--audit-log",
        str(audit),
        upstream=SAMPLING_SERVER,
    )
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await initialize(session)
        answered = await raw_sample(session, 1, plain_params("first", max_tokens=30))
        arguments = {"cancel_after": 600, "max_tokens": 40, "prompt": "cancel me"}
        call = {"name": "slow_sample", "arguments": arguments}
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        await wait_for_fake(fake_claude, 2)
        await session.send(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
        )
        await wait_for_audit(audit, 2)
        retried = await raw_sample(session, 3, plain_params("third", max_tokens=30))
        timed_out = await raw_sample(session, 4, plain_params("fourth", max_tokens=30))
        await session.close_stdin()
        await session.wait(SLOW)
    assert answered["result"]["content"]["text"] == "answered"
    assert retried["result"]["content"]["text"] == "retried"
    assert "--sampling-timeout" in timed_out["error"]["message"]
    lines = audit_lines(audit)
    assert [line["outcome"] for line in lines] == ["answered", "cancelled", "answered", "timed_out"]
    charged = sum(sum(line["charged"].values()) for line in lines)
    served = fake_claude.served_tokens()
    assert len(fake_claude.served) == 5
    assert served > 0
    assert served <= charged


def gateway_stream(text: str, *, delta: bool) -> list[bytes]:
    """A stream as a broken gateway may pass it on: `message_delta` (the real output count) left
    out unless `delta`."""
    message: dict[str, Any] = {
        "id": "msg_gateway",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 1},
    }
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    piece = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
    events = [
        sse_event("message_start", {"type": "message_start", "message": message}),
        sse_event("content_block_start", block),
        sse_event("content_block_delta", piece),
        sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]
    if delta:
        ending = {"stop_reason": "end_turn", "stop_sequence": None}
        usage = {"output_tokens": max(1, len(text) // 4)}
        events.append(sse_event("message_delta", {"type": "message_delta", "delta": ending, "usage": usage}))
    return [*events, sse_event("message_stop", {"type": "message_stop"})]


async def test_what_a_broken_gateway_served_is_charged(fake_claude: FakeClaude, tmp_path: Path) -> None:
    """Streams no real API sends, through the proxy: one that stops without `message_delta` (it was
    answered and charged `message_start`'s placeholder of 1 output token) is retried and charged its
    reservation; a whole JSON message instead of a stream (it was retried as a broken stream, and
    billed again) is the answer. The fake never served more than was charged."""
    audit = tmp_path / "audit.jsonl"
    essay = "All work and no play. " * 40
    whole = {
        "id": "msg_whole",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [{"type": "text", "text": "whole"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 3},
    }
    fake_claude.enqueue(
        raw_reply(*gateway_stream(essay, delta=False)),
        raw_reply(*gateway_stream("streamed", delta=True)),
        raw_reply(json.dumps(whole), headers={"content-type": "application/json"}),
    )
    argv = proxy_argv("--retry-base-delay", "0.01", "--audit-log", str(audit), upstream=SAMPLING_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await initialize(session)
        streamed = await raw_sample(session, 1, plain_params("an essay", max_tokens=400))
        answered = await raw_sample(session, 2, plain_params("in one piece", max_tokens=30))
        await session.close_stdin()
        await session.wait(SLOW)
    assert streamed["result"]["content"]["text"] == "streamed"
    assert answered["result"]["content"]["text"] == "whole"
    assert answered["result"]["stopReason"] == "endTurn"
    first, second = audit_lines(audit)
    assert first["charged"]["output_tokens"] == 400 + 2  # the essay's attempt: its whole reservation
    assert second["charged"] == {**second["charged"], "input_tokens": 12, "output_tokens": 3}
    assert len(fake_claude.message_requests) == 3
    charged = sum(sum(line["charged"].values()) for line in (first, second))
    assert fake_claude.served_tokens() <= charged


async def test_2026_a_cancelled_request_charges_its_call_and_gives_back_the_slot_of_one_waiting(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """A 2026-07-28 client gives up on two requests the proxy samples for: one whose Claude call is
    streaming (charged its input and its whole output reservation), one waiting for the only slot
    (charged nothing, and holding nothing: the next request gets the slot). The client cancels both
    at once, but one after the other: when the first cancel frees the slot before the second cancel
    has arrived, the waiting request's call starts, and is charged, as any call that may be billed."""
    audit = tmp_path / "audit.jsonl"

    def hang_unless_third(request: RecordedRequest) -> Reply:
        third = "third" in json.dumps(request.body["messages"])
        return text_reply("after the cancel") if third else hang_reply("Once upon a time")

    fake_claude.enqueue(hang_reply("Once upon a time"), hang_unless_third, hang_unless_third)
    argv = proxy_argv(
        "--max-concurrent-sampling", "1", "--audit-log", str(audit), upstream=INPUT_REQUIRED_SERVER
    )
    async with Client(stdio_params(argv, proxy_env(fake_claude.url))) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "plain", {"prompt": "first"})
            await wait_for_fake(fake_claude, 1)
            tg.start_soon(client.call_tool, "plain", {"prompt": "second"})  # waits for the slot
            await anyio.sleep(0.5)
            tg.cancel_scope.cancel()
        assert await anyio.to_thread.run_sync(fake_claude.wait_for_disconnects, 1, SLOW)
        with anyio.fail_after(SLOW):
            after = tool_json(await client.call_tool("plain", {"prompt": "third"}))
    assert after["text"] == "after the cancel"
    *cancelled, answered = audit_lines(audit)
    assert answered["outcome"] == "answered"
    assert all(line["outcome"] == "cancelled" for line in cancelled)
    streaming, *raced = [line for line in cancelled if line["calls"]]
    assert streaming["charged"]["output_tokens"] == 200  # Claude may have written all of it
    assert streaming["charged"]["input_tokens"] > 0
    for line in cancelled:  # the one that waited for the slot, if it reached the proxy in time
        if line["calls"] == 0:
            assert not any((line["charged"] or {}).values())
    assert len(raced) <= 1  # the waiting one, if the slot came to it before its cancel did
    # A raced call may be cut before its request reached Claude; it is charged all the same (it may
    # have been billed), which the sum below checks from the other side.
    assert 2 <= len(fake_claude.message_requests) <= 2 + len(raced)
    charged = sum(sum((line["charged"] or {}).values()) for line in (*cancelled, answered))
    assert fake_claude.served_tokens() <= charged


async def test_a_paused_turn_whose_continuation_fails_is_the_answer(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """Claude paused its turn (paid for); the continuation failed with a 500 after the retries. The
    server got the error and lost the paused turn; it gets the paused turn (`pauseTurn`), and both
    calls are charged."""
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(
        text_reply("Searching...", stop_reason="pause_turn"),
        error_reply(500, "api_error", "Internal server error"),
        error_reply(500, "api_error", "Internal server error"),
    )
    argv = proxy_argv(
        "--retry-max-attempts",
        "2",
        "--retry-base-delay",
        "0.01",
        "--audit-log",
        str(audit),
        upstream=SAMPLING_SERVER,
    )
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await initialize(session)
        outcome = await raw_sample(session, 1, plain_params("search the web", max_tokens=50))
        await session.close_stdin()
        await session.wait(SLOW)
    assert outcome["result"]["stopReason"] == "pauseTurn"
    assert outcome["result"]["content"]["text"] == "Searching..."
    assert len(fake_claude.message_requests) == 3  # the continuation was tried twice
    [line] = audit_lines(audit)
    assert line["outcome"] == "answered"
    assert line["calls"] == 2


async def test_a_paused_turn_ending_in_a_space_is_continued(fake_claude: FakeClaude, tmp_path: Path) -> None:
    """Claude paused its turn after text that ends in a space: the continuation handed that text back
    as the final assistant content, which the API refuses (400: trailing whitespace), so the turn
    was never continued. The text handed back is stripped; the answer keeps it as Claude wrote it."""
    fake_claude.enqueue(text_reply("Searching... ", stop_reason="pause_turn"), text_reply("found it."))
    argv = proxy_argv(upstream=SAMPLING_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await initialize(session)
        outcome = await raw_sample(session, 1, plain_params("search the web", max_tokens=50))
        await session.close_stdin()
        await session.wait(SLOW)
    assert outcome["result"]["stopReason"] == "endTurn"
    assert outcome["result"]["content"]["text"] == "Searching... found it."
    assert len(fake_claude.message_requests) == 2


async def test_a_paused_turns_continuation_stays_within_the_requests_deadline(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    """`--sampling-timeout` bounds everything for one sampling request, but each continuation of a
    paused turn got a deadline of its own: a continuation that stalled ran (and billed) past the
    request's deadline, up to four times it, after the server had given up waiting (the answer,
    and the paused turn paid for, lost). Now the continuation has what is left of the request's
    deadline, and at the deadline the paused turn is the answer."""
    audit = tmp_path / "audit.jsonl"
    fake_claude.enqueue(
        text_reply("warm"),
        text_reply("Searching...", stop_reason="pause_turn", delay=7.0),
        hang_reply("still searching"),
    )
    argv = proxy_argv("--sampling-timeout", "10", "--audit-log", str(audit), upstream=SAMPLING_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await initialize(session)
        await raw_sample(session, 1, plain_params("warm up"))  # the Claude client is built
        arguments = {"params_json": json.dumps(plain_params("search the web", max_tokens=50)), "timeout": 15}
        call = {"name": "sample_raw", "arguments": arguments}
        await session.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        response, _ = await session.recv_until(lambda m: m.get("id") == 2, timeout=SLOW)
        outcome = json.loads(response["result"]["content"][0]["text"])
        await session.close_stdin()
        await session.wait(SLOW)
    assert outcome.get("result", {}).get("stopReason") == "pauseTurn", outcome  # not the server's timeout
    assert outcome["result"]["content"]["text"] == "Searching..."
    lines = audit_lines(audit)
    assert [line["outcome"] for line in lines] == ["answered", "answered"]
    assert lines[1]["calls"] == 2
    assert lines[1]["charged"]["output_tokens"] >= 50  # the continuation cut off is charged
