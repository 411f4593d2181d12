"""Prompt caching in a real multi-round sampling-with-tools loop, and the audit log it leaves.

The upstream's `loop` tool resends the system prompt, the tools and the growing history every
round; the fake Claude models the prompt cache, so what it records shows which prefix each round
read back.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, types

from tests.fake_claude import FakeClaude, text_reply, tool_use_reply
from tests.harness import TEST_API_KEY, proxy_argv, proxy_env, python_server, stdio_params

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAMPLING_SERVER = python_server("sampling_server.py")
META = "io.github.mcp-backfill/claude"
# Long enough (over 1024 tokens) for Claude to cache it at all: shorter prompts are never cached.
QUESTION = "What are alpha, beta and gamma? (a private question) " + "Some background to read. " * 200
CACHE_KEYS = ("cache_creation_input_tokens", "cache_read_input_tokens")


def client_for(fake: FakeClaude, *options: str) -> Client:
    argv = proxy_argv(*options, upstream=SAMPLING_SERVER)
    return Client(stdio_params(argv, proxy_env(fake.url)), mode="legacy")


async def run_loop(fake: FakeClaude, keys: list[str], *options: str) -> dict[str, Any]:
    fake.enqueue(
        *(tool_use_reply("lookup", {"key": key}, text=f"Looking up {key}.") for key in keys),
        text_reply("alpha=1, beta=2, gamma=3"),
    )
    async with client_for(fake, *options) as client:
        result = await client.call_tool("loop", {"question": QUESTION, "rounds": len(keys) + 1})
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    outcome: dict[str, Any] = json.loads(block.text)
    assert outcome["completed"] is True
    return outcome


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_each_round_of_a_tool_loop_reads_the_previous_rounds_prefix(
    fake_claude: FakeClaude, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    outcome = await run_loop(fake_claude, ["alpha", "beta", "gamma"], "--audit-log", str(audit))

    cached = fake_claude.cache_usages
    assert len(cached) == 4
    assert cached[0].cache_read_input_tokens == 0
    assert cached[0].cache_creation_input_tokens > 0
    for previous, current in itertools.pairwise(cached):
        # Round N reads exactly the prefix that round N-1 wrote at its last breakpoint: all of it.
        assert current.read == previous.written[-1]
        previous_prompt = (
            previous.input_tokens + previous.cache_creation_input_tokens + previous.cache_read_input_tokens
        )
        assert current.cache_read_input_tokens == previous_prompt
        assert current.cache_creation_input_tokens > 0  # this round's new messages

    # The server sees the cache counters in each result's _meta...
    reported = [{key: r["meta"][META]["usage"][key] for key in CACHE_KEYS} for r in outcome["rounds"]]
    expected = [
        {
            "cache_creation_input_tokens": c.cache_creation_input_tokens,
            "cache_read_input_tokens": c.cache_read_input_tokens,
        }
        for c in cached
    ]
    assert reported == expected
    # ...and the audit log has one line per round with the same usage, and no content or key.
    lines = audit_lines(audit)
    assert [line["outcome"] for line in lines] == ["answered"] * 4
    assert [{key: line["usage"][key] for key in CACHE_KEYS} for line in lines] == expected
    assert all(line["usage"]["cache_read_input_tokens"] > 0 for line in lines[1:])
    assert [line["stop_reason"] for line in lines] == ["tool_use"] * 3 + ["end_turn"]
    assert [line["session"] for line in lines] == ["stdio"] * 4
    assert all(line["tools"] == 1 and line["model"] == "claude-sonnet-5-5" for line in lines)
    assert len({line["request_id"] for line in lines}) == 4
    assert all(line["claude_request_id"].startswith("req_") for line in lines)
    text = audit.read_text()
    assert "private question" not in text
    assert "Looking up" not in text
    assert all("params" not in line and "result" not in line for line in lines)
    assert TEST_API_KEY not in text

    bodies = [request.body for request in fake_claude.message_requests]
    assert all(len(c.breakpoints) <= 4 for c in cached)
    assert all(body["tools"][-1]["cache_control"] == {"type": "ephemeral"} for body in bodies)


async def test_no_prompt_cache_sends_no_cache_control(fake_claude: FakeClaude, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    outcome = await run_loop(
        fake_claude, ["alpha"], "--no-prompt-cache", "--audit-log", str(audit), "--audit-content"
    )
    requests = fake_claude.message_requests
    assert len(requests) == 2
    assert all(b"cache_control" not in request.raw_body for request in requests)
    assert requests[0].body["system"] == "Answer using the lookup tool when a key is mentioned."
    assert all(c.breakpoints == () and c.cache_read_input_tokens == 0 for c in fake_claude.cache_usages)
    usages = [r["meta"][META]["usage"] for r in outcome["rounds"]]
    assert [{key: usage[key] for key in CACHE_KEYS} for usage in usages] == [dict.fromkeys(CACHE_KEYS, 0)] * 2

    # --audit-content: each line carries the MCP params and result (and still never the key).
    first, second = audit_lines(audit)
    assert first["params"]["messages"][0]["content"]["text"] == QUESTION
    assert first["result"]["content"][1]["type"] == "tool_use"
    assert second["result"]["content"][0]["text"] == "alpha=1, beta=2, gamma=3"
    assert TEST_API_KEY not in audit.read_text()
