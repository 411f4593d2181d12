"""Limits, budgets, rate limit, concurrency cap and the audit log, through real processes.

client (mcp SDK or raw lines) -> `python -m mcp_backfill` -> tests/servers/sampling_server.py
                                        \\-> fake Claude (loopback HTTP, ANTHROPIC_BASE_URL)

What the fake received is the proof that a refused request cost nothing.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.fake_claude import FakeClaude, hang_reply, message_reply, text_reply
from tests.harness import (
    ROOT,
    TEST_API_KEY,
    RawSession,
    initialize_params,
    pid_alive,
    proxy_argv,
    proxy_env,
    python_server,
    raw_proxy,
    stdio_params,
    tool_json,
)

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")
ECHO_SERVER = python_server("echo_server.py")


def client_for(fake: FakeClaude, *options: str) -> Client:
    argv = proxy_argv(*options, upstream=SAMPLING_SERVER)
    return Client(stdio_params(argv, proxy_env(fake.url)), mode="legacy")


async def sample_raw(client: Client, params: dict[str, Any]) -> dict[str, Any]:
    outcome: dict[str, Any] = tool_json(
        await client.call_tool("sample_raw", {"params_json": json.dumps(params)})
    )
    return outcome


def user_text(text: str) -> dict[str, Any]:
    return {"role": "user", "content": {"type": "text", "text": text}}


def plain_params(text: str = "hello") -> dict[str, Any]:
    return {"messages": [user_text(text)], "maxTokens": 20}


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def tool(name: str) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}}


OVER_THE_LIMITS: list[tuple[str, dict[str, Any], str]] = [
    (
        "max_messages",
        {
            "messages": [
                user_text("a"),
                {"role": "assistant", "content": {"type": "text", "text": "b"}},
                user_text("c"),
                {"role": "assistant", "content": {"type": "text", "text": "d"}},
            ],
            "maxTokens": 10,
        },
        "--max-messages",
    ),
    ("max_text_bytes", plain_params("x" * 3001), "--max-text-bytes"),
    (
        "max_binary_bytes",
        {
            "messages": [
                {
                    "role": "user",
                    "content": {
                        "type": "image",
                        "data": base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(400)).decode(),
                        "mimeType": "image/png",
                    },
                }
            ],
            "maxTokens": 10,
        },
        "--max-binary-bytes",
    ),
    (
        "max_tools",
        {"messages": [user_text("q")], "maxTokens": 10, "tools": [tool("a"), tool("b"), tool("c")]},
        "--max-tools",
    ),
]


async def test_requests_over_a_limit_get_32602_and_cost_nothing(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    limits = (
        *("--max-messages", "3", "--max-text-bytes", "3000", "--max-binary-bytes", "300"),
        *("--max-tools", "2", "--max-tool-calls", "2", "--audit-log", str(audit)),
    )
    calls = [{"type": "tool_use", "id": f"toolu_{n}", "name": "a", "input": {}} for n in range(3)]
    fake_claude.enqueue(message_reply(calls, stop_reason="tool_use"))
    async with client_for(fake_claude, *limits) as client:
        refused = [await sample_raw(client, params) for _, params, _ in OVER_THE_LIMITS]
        assert fake_claude.message_requests == []  # no API call for any of them
        too_many_calls = await sample_raw(
            client, {"messages": [user_text("q")], "maxTokens": 10, "tools": [tool("a")]}
        )
        fine = await sample_raw(client, plain_params("within every limit"))

    for (name, _, option), outcome in zip(OVER_THE_LIMITS, refused, strict=True):
        error = outcome["error"]
        assert error["code"] == -32602, (name, error)
        assert option in error["message"]
        assert "MCP_BACKFILL_" + option[2:].replace("-", "_").upper() in error["message"]
        assert error["data"]["limit"] == name
    # The response limit: Claude was asked (and paid), the server gets -32603 instead of 3 tool calls.
    error = too_many_calls["error"]
    assert error["code"] == -32603
    assert "3 tool calls" in error["message"]
    assert "--max-tool-calls" in error["message"]
    assert fine["result"]["content"]["text"].startswith("fake-claude says")
    assert len(fake_claude.message_requests) == 2

    lines = audit_lines(audit)
    # The response limit refused an answer Claude had already given: a failure, charged.
    assert [line["outcome"] for line in lines] == ["refused"] * 4 + ["failed", "answered"]
    assert [line["error"]["limit"] for line in lines[:5]] == [
        *(name for name, _, _ in OVER_THE_LIMITS),
        "max_tool_calls",
    ]
    assert [line["error"]["code"] for line in lines[:5]] == [-32602] * 4 + [-32603]
    assert lines[4]["usage"]["output_tokens"] > 0  # the refused answer's tokens were still charged
    assert lines[4]["charged"]["output_tokens"] == lines[4]["usage"]["output_tokens"]
    assert all(line["usage"] is None and line["charged"] is None for line in lines[:4])


async def initialize(session: RawSession) -> None:
    await session.request(0, "initialize", initialize_params())
    await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


async def raw_sample(session: RawSession, request_id: int, params: dict[str, Any]) -> dict[str, Any]:
    arguments = {"params_json": json.dumps(params)}
    response = await session.request(request_id, "tools/call", {"name": "sample_raw", "arguments": arguments})
    outcome: dict[str, Any] = json.loads(response["result"]["content"][0]["text"])
    return outcome


@pytest.mark.parametrize(
    ("option", "other", "name", "log_field"),
    [
        ("--session-budget-tokens", "--budget-tokens", "session token budget", "session_budget_remaining"),
        ("--budget-tokens", "--session-budget-tokens", "process token budget", "budget_remaining"),
    ],
    ids=["session", "process"],
)
async def test_an_exhausted_budget_refuses_further_sampling(
    fake_claude: FakeClaude, option: str, other: str, name: str, log_field: str
) -> None:
    usage = {
        "input_tokens": 20,
        "cache_creation_input_tokens": 30,
        "cache_read_input_tokens": 10,
        "output_tokens": 30,
    }  # 90 tokens an exchange: every counter is charged
    fake_claude.enqueue(text_reply("first", usage=usage), text_reply("second", usage=usage))
    argv = proxy_argv("--log-format", "json", option, "100", other, "0", upstream=SAMPLING_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await initialize(session)
        first = await raw_sample(session, 1, plain_params("one"))
        crossing = await raw_sample(session, 2, plain_params("two"))  # 90 used: still allowed
        refused = await raw_sample(session, 3, plain_params("three"))  # 180 used: refused
        await session.close_stdin()
        await session.wait()
        stderr = session.stderr()

    assert first["result"]["content"]["text"] == "first"
    assert crossing["result"]["content"]["text"] == "second"  # the request that crosses completes
    error = refused["error"]
    assert error["code"] == -32603
    assert f"{name} is exhausted: 180 of 100 tokens used" in error["message"]
    assert option in error["message"]
    assert error["data"]["remaining"] == 0
    assert len(fake_claude.message_requests) == 2
    logged = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    remaining = [entry[log_field] for entry in logged if entry["msg"] == "sampling request answered"]
    assert remaining == [10, 0]  # logged after each exchange
    assert TEST_API_KEY not in stderr


async def test_rate_limit_refuses_at_once_with_retry_after(fake_claude: FakeClaude) -> None:
    async with client_for(fake_claude, "--rate-limit", "2") as client:
        outcomes = [await sample_raw(client, plain_params(f"n{n}")) for n in range(3)]
    assert [("result" in outcome) for outcome in outcomes] == [True, True, False]
    error = outcomes[2]["error"]
    assert error["code"] == -32603
    assert "at most 2 sampling requests per minute" in error["message"]
    assert "--rate-limit" in error["message"]
    assert error["data"]["limit"] == "rate_limit"
    assert 1 <= error["data"]["retryAfterSeconds"] <= 60
    assert len(fake_claude.message_requests) == 2


async def test_concurrent_claude_calls_are_capped_and_the_rest_wait(fake_claude: FakeClaude) -> None:
    count = 5
    fake_claude.enqueue(*(text_reply(f"slow {n}", delay=0.5) for n in range(count)))
    results: list[Any] = []
    async with client_for(fake_claude, "--max-concurrent-sampling", "2") as client:

        async def one(n: int) -> None:
            results.append(tool_json(await client.call_tool("plain", {"prompt": f"p{n}"})))

        async with anyio.create_task_group() as tg:
            for n in range(count):
                tg.start_soon(one, n)
    assert sorted(result["text"] for result in results) == [f"slow {n}" for n in range(count)]
    assert len(fake_claude.message_requests) == count
    assert fake_claude.max_in_flight == 2


async def test_requests_waiting_for_a_slot_are_bounded_and_the_rest_refused_at_once(
    fake_claude: FakeClaude,
) -> None:
    """A server sending sampling requests faster than Claude answers them, never cancelling one:
    one call in flight (it never ends), one waiting, and the rest refused at once, naming the option,
    instead of waiting, each holding its params, without end."""
    fake_claude.enqueue(hang_reply())
    outcomes: list[dict[str, Any]] = []
    done = anyio.Event()
    argv = ("--max-concurrent-sampling", "1", "--max-waiting-sampling", "1")
    async with client_for(fake_claude, *argv) as client, anyio.create_task_group() as tg:

        async def one(n: int) -> None:
            outcomes.append(await sample_raw(client, plain_params(f"n{n}")))
            if len(outcomes) == 2:
                done.set()

        for n in range(4):
            tg.start_soon(one, n)
        with anyio.fail_after(60):
            await done.wait()
        assert await anyio.to_thread.run_sync(fake_claude.wait_for_requests, 1, 30.0)
        # Counted while the limits hold: once the client leaves, the server cancels the first call
        # and the waiting one takes its slot (on a loaded machine, before the proxy has stopped).
        called = len(fake_claude.message_requests)
        tg.cancel_scope.cancel()
    assert [outcome["error"]["data"]["limit"] for outcome in outcomes] == ["max_waiting_sampling"] * 2
    assert all("--max-waiting-sampling" in outcome["error"]["message"] for outcome in outcomes)
    assert called == 1


def test_an_unwritable_audit_log_stops_the_proxy_before_the_upstream_gets_anything(tmp_path: Path) -> None:
    """The stdio wrapper starts its upstream before the relay is ready (its start overlaps ours), so
    an upstream can be running when the proxy finds it cannot start: it is sent nothing and does not
    outlive the proxy, even when it ignores the end of its stdin."""
    started, got = tmp_path / "upstream-pid", tmp_path / "upstream-got-a-message"
    script = (
        "import os, sys, time\n"
        f"open({str(started)!r} + '.new', 'w').write(str(os.getpid()))\n"
        f"os.replace({str(started)!r} + '.new', {str(started)!r})\n"
        f"if sys.stdin.readline(): open({str(got)!r}, 'w')\n"
        "time.sleep(60)\n"
    )
    unwritable = str(tmp_path / "no-such-dir" / "a.jsonl")
    argv = proxy_argv(
        "--provider", "mock", "--audit-log", unwritable, upstream=[sys.executable, "-c", script]
    )
    done = subprocess.run(
        argv, env=proxy_env(), cwd=ROOT, input=b"", capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert b"--audit-log" in done.stderr
    assert done.stdout == b""
    assert not got.exists()
    if started.exists():  # it got as far as starting (nearly always: the proxy fails later than that)
        assert not pid_alive(int(started.read_text()))


async def test_a_sampling_request_id_utf8_cannot_encode_is_audited_and_the_proxy_goes_on(
    tmp_path: Path,
) -> None:
    """A server's JSON-RPC id may be the string `"\\ud800"` (valid JSON): its audit line is written
    with the escape, and the writer (the proxy with it) goes on to the next exchange."""
    audit = tmp_path / "audit.jsonl"
    argv = proxy_argv("--provider", "mock", "--audit-log", str(audit), upstream=ECHO_SERVER)
    async with raw_proxy(argv, proxy_env()) as session:
        await session.request(0, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ask = {"method": "sampling/createMessage", "params": plain_params(), "id": "\ud800"}
        first = await session.request(1, "test/ask_client", ask)
        assert "result" in first["result"]["client_response"], first
        await anyio.sleep(0.5)  # the writer gets the line
        second = await session.request(2, "test/ask_client", {**ask, "id": "ok-2"})
        assert "result" in second["result"]["client_response"], second
        await session.close_stdin()
        assert await session.wait(30) == 0, session.stderr()
    assert [line["request_id"] for line in audit_lines(audit)] == ["\ud800", "ok-2"]


async def _written(path: Path, count: int) -> bytes:
    """The file's bytes once it holds `count` lines (the writer is a background task)."""
    with anyio.fail_after(30):
        while True:
            data = path.read_bytes() if path.exists() else b""
            if data.count(b"\n") >= count:
                return data
            await anyio.sleep(0.05)


@pytest.mark.parametrize("rotation", ["copytruncate", "create", "removed"])
async def test_the_audit_log_can_be_rotated_while_the_proxy_runs(tmp_path: Path, rotation: str) -> None:
    """logrotate's `copytruncate` (the file truncated in place) and `create` (renamed, then a new
    file) while the proxy runs: the next line is at the start of the file at the path, with no hole
    of NUL bytes before it. A renamed or removed file was written to for as long as the proxy ran."""
    audit = tmp_path / "audit.jsonl"
    argv = proxy_argv("--provider", "mock", "--audit-log", str(audit), upstream=ECHO_SERVER)
    async with raw_proxy(argv, proxy_env()) as session:
        await session.request(0, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ask = {"method": "sampling/createMessage", "params": plain_params(), "id": "before"}
        first = await session.request(1, "test/ask_client", ask)
        assert "result" in first["result"]["client_response"], first
        await _written(audit, 1)
        if rotation == "copytruncate":
            os.truncate(audit, 0)
        elif rotation == "create":
            audit.rename(tmp_path / "audit.jsonl.1")
            audit.touch()
        else:
            audit.unlink()
        second = await session.request(2, "test/ask_client", {**ask, "id": "after"})
        assert "result" in second["result"]["client_response"], second
        data = await _written(audit, 1)
        await session.close_stdin()
        assert await session.wait(30) == 0, session.stderr()
    assert b"\0" not in data
    assert data.startswith(b"{")
    assert [line["request_id"] for line in audit_lines(audit)] == ["after"]
    if rotation == "create":
        assert [line["request_id"] for line in audit_lines(tmp_path / "audit.jsonl.1")] == ["before"]


async def test_the_exit_summary_counts_the_audit_lines_dropped_at_the_end(fake_claude: FakeClaude) -> None:
    """Samplings in flight when the client leaves are cancelled, and their audit lines written as
    the proxy stops: a file that refuses them (a full disk) lost them after the exit summary had
    counted what was lost, so the summary undercounted (or was not there at all)."""
    calls = 3
    for _ in range(calls):
        fake_claude.enqueue(hang_reply())
    argv = proxy_argv("--audit-log", "/dev/full", upstream=ECHO_SERVER)
    async with raw_proxy(argv, proxy_env(fake_claude.url)) as session:
        await session.request(0, "initialize", initialize_params())
        await session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        for n in range(calls):
            ask = {"method": "sampling/createMessage", "params": plain_params(), "id": f"s{n}"}
            await session.send({"jsonrpc": "2.0", "id": n + 1, "method": "test/ask_client", "params": ask})
        assert await anyio.to_thread.run_sync(fake_claude.wait_for_requests, calls, 30.0)
        await session.close_stdin()
        await session.wait(30)
        stderr = session.stderr()
    [summary] = [line for line in stderr.splitlines() if "sampling summary" in line]
    assert f"audit_lines_dropped={calls}" in summary, stderr
