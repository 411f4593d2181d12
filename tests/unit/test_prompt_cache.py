"""Prompt-cache breakpoints placed by conversion, checked against the fake's caching model.

The fake's `PromptCache` is the same model the e2e tests rely on, so these tests also pin down
that model: a prefix is read only when the same blocks (markers aside) were cached before.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anthropic
import pytest

from mcp_backfill.sampling.convert import ConversionOptions, to_claude_request
from tests.defaults import CONVERSION
from tests.fake_claude import (
    CACHE_LOOKBACK_BLOCKS,
    FakeClaude,
    PromptCache,
    minimum_cacheable_tokens,
    prompt_elements,
    text_reply,
)

CACHED = replace(CONVERSION, prompt_cache=True)
TOOLS = [
    {"name": "lookup", "description": "Look a key up", "inputSchema": {"type": "object"}},
    {"name": "store", "inputSchema": {"type": "object"}},
]
SYSTEM = "Use the tools."


def loop_params(rounds: int, calls_per_round: int = 1) -> dict[str, Any]:
    """The params a server sends on round `rounds` of a tool loop (each round answered by tool calls)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": {"type": "text", "text": "question"}}]
    for n in range(1, rounds):
        ids = [f"call_{n}_{k}" for k in range(calls_per_round)]
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": i, "name": "lookup", "input": {"k": n}} for i in ids],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "toolUseId": i, "content": [{"type": "text", "text": f"r{n}"}]}
                    for i in ids
                ],
            }
        )
    return {"messages": messages, "maxTokens": 100, "systemPrompt": SYSTEM, "tools": TOOLS}


def marks(kwargs: dict[str, Any]) -> list[int]:
    return [i for i, (_, marked) in enumerate(prompt_elements(kwargs)) if marked]


def body(params: dict[str, Any], options: ConversionOptions = CACHED) -> dict[str, Any]:
    return dict(to_claude_request(params, options).kwargs, model="claude-test")


def has_cache_control(value: Any) -> bool:
    if isinstance(value, dict):
        return "cache_control" in value or any(has_cache_control(v) for v in value.values())
    if isinstance(value, list):
        return any(has_cache_control(v) for v in value)
    return False


def test_off_no_block_is_marked() -> None:
    kwargs = to_claude_request(loop_params(3), replace(CACHED, prompt_cache=False)).kwargs
    assert not has_cache_control(kwargs)
    assert kwargs["system"] == SYSTEM


def test_first_round_marks_tools_system_and_the_final_block() -> None:
    kwargs = to_claude_request(loop_params(1), CACHED).kwargs
    assert "cache_control" not in kwargs["tools"][0]
    assert kwargs["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert kwargs["system"] == [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    assert kwargs["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert len(marks(kwargs)) == 3


def test_later_rounds_also_mark_where_the_previous_round_ended() -> None:
    kwargs = to_claude_request(loop_params(3), CACHED).kwargs
    messages = kwargs["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    marked = [i for i, m in enumerate(messages) if has_cache_control(m)]
    assert marked == [2, 4]  # round 2 ended with messages[2]
    assert len(marks(kwargs)) == 4  # never more than Claude allows


def test_no_system_and_no_tools_leaves_only_message_breakpoints() -> None:
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5}
    kwargs = to_claude_request(params, CACHED).kwargs
    assert "system" not in kwargs
    assert kwargs["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
    ]


@pytest.mark.parametrize("calls_per_round", [1, 12])
def test_each_round_reads_the_whole_previous_round_from_the_cache(calls_per_round: int) -> None:
    """12 parallel calls add 25 blocks a round: more than the lookback, so the extra breakpoint matters."""
    cache = PromptCache(min_tokens=0)  # the breakpoints, not the minimum length, are tested here
    previous_total = 0
    for n in range(1, 5):
        request = body(loop_params(n, calls_per_round))
        used = cache.apply(request)
        total = used.input_tokens + used.cache_creation_input_tokens + used.cache_read_input_tokens
        if n == 1:
            assert used.cache_read_input_tokens == 0
        else:
            assert used.cache_read_input_tokens == previous_total  # all of round n-1's prompt
        assert used.cache_creation_input_tokens == total - used.cache_read_input_tokens
        previous_total = total


def test_without_the_previous_round_breakpoint_a_long_round_misses() -> None:
    """The fake is faithful to the lookback window: only the final-block breakpoint is not enough."""
    cache = PromptCache(min_tokens=0)  # the breakpoints, not the minimum length, are tested here
    first = body(loop_params(1))
    cache.apply(first)
    second = body(loop_params(2, calls_per_round=12))
    for message in second["messages"][:-1]:
        blocks = message["content"]
        message["content"] = [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks]
    assert len(prompt_elements(second)) - len(prompt_elements(first)) >= CACHE_LOOKBACK_BLOCKS
    used = cache.apply(second)
    # Only the tools+system prefix (marked in both rounds) is read.
    assert 0 < used.cache_read_input_tokens < cache.apply(first).cache_read_input_tokens


def test_a_different_model_or_history_does_not_read_the_cache() -> None:
    cache = PromptCache(min_tokens=0)  # the breakpoints, not the minimum length, are tested here
    cache.apply(body(loop_params(2)))
    other_model = dict(body(loop_params(2)), model="claude-other")
    assert cache.apply(other_model).cache_read_input_tokens == 0
    changed = loop_params(2)
    changed["messages"][0]["content"]["text"] = "another question"
    used = cache.apply(body(changed))
    assert used.read_position == len(TOOLS)  # the prefix of tools + system only
    assert used.cache_read_input_tokens > 0


def test_prefixes_below_the_minimum_are_not_cached_and_entries_expire() -> None:
    now = [0.0]
    small = PromptCache(min_tokens=10**6)
    small.apply(body(loop_params(1)))
    assert small.apply(body(loop_params(1))).cache_read_input_tokens == 0
    cache = PromptCache(min_tokens=0, ttl=300, clock=lambda: now[0])
    cache.apply(body(loop_params(1)))
    now[0] = 200
    assert cache.apply(body(loop_params(1))).cache_read_input_tokens > 0  # and refreshed
    now[0] = 450
    assert cache.apply(body(loop_params(1))).cache_read_input_tokens > 0
    now[0] = 800
    assert cache.apply(body(loop_params(1))).cache_read_input_tokens == 0


@pytest.mark.anyio
@pytest.mark.parametrize("streaming", [False, True])
async def test_the_sdk_sees_cache_usage_streaming_or_not(streaming: bool) -> None:
    request = body(loop_params(2))
    with FakeClaude(cache_min_tokens=0) as fake:
        fake.enqueue(text_reply("one"), text_reply("two"))
        async with anthropic.AsyncAnthropic(api_key="k", base_url=fake.url, max_retries=0) as client:
            usages = []
            for _ in range(2):
                if streaming:
                    async with client.messages.stream(**request) as stream:
                        message = await stream.get_final_message()
                else:
                    message = await client.messages.create(**request)
                usages.append(message.usage)
        recorded = fake.cache_usages
    assert usages[0].cache_read_input_tokens == 0
    assert usages[0].cache_creation_input_tokens == recorded[0].cache_creation_input_tokens > 0
    assert usages[1].cache_read_input_tokens == recorded[1].cache_read_input_tokens
    assert usages[1].cache_read_input_tokens == usages[0].cache_creation_input_tokens
    assert usages[1].cache_creation_input_tokens == 0
    assert recorded[1].read == recorded[0].written[-1]


def test_more_than_four_breakpoints_is_a_400() -> None:
    request = body(loop_params(3))
    request["messages"][0]["content"][0]["cache_control"] = {"type": "ephemeral"}
    with FakeClaude(cache_min_tokens=0) as fake:
        client = anthropic.Anthropic(api_key="k", base_url=fake.url, max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control"):
            client.messages.create(**request)
        assert fake.cache_usages == []


def test_by_default_the_minimum_cacheable_length_is_the_real_apis_per_model() -> None:
    def marked(text: str) -> dict[str, Any]:
        block = {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}
        return {"role": "user", "content": [block]}

    short = {"model": "claude-sonnet-5-5", "messages": [marked("hi")]}
    long = {"model": "claude-sonnet-5-5", "messages": [marked("word " * 1200)]}
    haiku = {**long, "model": "claude-haiku-5-5"}
    cache = PromptCache()
    assert cache.apply(short).breakpoints == ()  # ~10 tokens: not cached, no error
    assert cache.apply(long).cache_creation_input_tokens > 1024
    assert cache.apply(haiku).breakpoints == ()  # ~1500 tokens: below Haiku's 2048
    assert (minimum_cacheable_tokens("claude-opus-5-5"), minimum_cacheable_tokens("claude-haiku-5-5")) == (
        1024,
        2048,
    )
