"""Properties of the MCP <-> Claude mapping: MCP params -> Claude request -> Claude answer -> MCP result.

A small reference model (`expected_messages`) states what the request must look like; the answer
is built the way Claude would write it, with the request's Claude-side tool names and ids.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp_types import CreateMessageResult, CreateMessageResultWithTools

from mcp_backfill.errors import SamplingError
from mcp_backfill.sampling.convert import (
    META_KEY,
    ClaudeRequest,
    map_stop_reason,
    sanitize_tool_id,
    sanitize_tool_name,
    to_claude_request,
    to_mcp_result,
)
from tests.defaults import CONVERSION
from tests.unit.sampling_strategies import (
    DATA_URL_PREFIX,
    LEGAL_ID,
    LEGAL_NAME,
    TEXTS,
    TOOL_NAMES,
    history_refs,
    image_media_type,
    sampling_requests,
    text_block,
    tool_id_lists,
    tool_name_lists,
)

OPTIONS = replace(CONVERSION, prompt_cache=False)  # cache breakpoints are tested in test_prompt_cache.py

PROMISED_STOP_REASONS = {
    "end_turn": "endTurn",
    "stop_sequence": "stopSequence",
    "max_tokens": "maxTokens",
    "tool_use": "toolUse",
    "refusal": "refusal",
}
# Also mapped by convert.py's own table (not part of the five promised above).
EXTRA_STOP_REASONS = {"model_context_window_exceeded": "maxTokens", "pause_turn": "pauseTurn"}
KNOWN_STOP_REASONS = {**PROMISED_STOP_REASONS, **EXTRA_STOP_REASONS}
STOP_REASONS: st.SearchStrategy[str | None] = st.one_of(
    st.none(), st.sampled_from(sorted(KNOWN_STOP_REASONS)), st.text(max_size=20)
)


def blocks_of(content: Any) -> list[dict[str, Any]]:
    return content if isinstance(content, list) else [content]


def has_tools(params: dict[str, Any]) -> bool:
    return any(key in params for key in ("tools", "toolChoice", "tool_choice"))


# --- the reference model ------------------------------------------------------------------------


def name_map(params: dict[str, Any], request: ClaudeRequest) -> dict[str, str]:
    """Original -> Claude-side name: offered tools first, then tools only the history names."""
    offered = [tool["name"] for tool in params.get("tools") or []]
    history_names, _ = history_refs(params)
    originals = list(dict.fromkeys([*offered, *history_names]))
    claude = [tool["name"] for tool in request.kwargs.get("tools", [])]
    assert len(claude) == len(originals)
    return dict(zip(originals, claude, strict=True))


def id_map(params: dict[str, Any], request: ClaudeRequest) -> dict[str, str]:
    """Original -> Claude-side tool_use id, pairing the tool_use blocks of both sides in order."""
    _, originals = history_refs(params)
    claude = [
        block["id"]
        for message in request.kwargs["messages"]
        for block in message["content"]
        if block["type"] == "tool_use"
    ]
    return dict(zip(originals, claude, strict=True))


def expected_block(
    block: dict[str, Any], names: dict[str, str], ids: dict[str, str]
) -> dict[str, Any] | None:
    kind = block["type"]
    if kind == "text":
        return text_block(block["text"]) if block["text"].strip() else None
    if kind == "image":
        data = block["data"].removeprefix(DATA_URL_PREFIX)
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": image_media_type(data), "data": data},
        }
    if kind == "tool_use":
        return {
            "type": "tool_use",
            "id": ids[block["id"]],
            "name": names[block["name"]],
            "input": block["input"],
        }
    assert kind == "tool_result"
    converted: dict[str, Any] = {"type": "tool_result", "tool_use_id": ids[block["toolUseId"]]}
    content = [text_block(item["text"]) for item in block["content"] if item["text"].strip()]
    if content:
        converted["content"] = content
    if "isError" in block:
        converted["is_error"] = block["isError"]
    return converted


def expected_messages(
    params: dict[str, Any], names: dict[str, str], ids: dict[str, str]
) -> list[dict[str, Any]]:
    """Blocks in order, blank text dropped, same-role neighbours merged, a final prefill right-stripped."""
    out: list[dict[str, Any]] = []
    for message in params["messages"]:
        converted = [expected_block(block, names, ids) for block in blocks_of(message["content"])]
        blocks = [block for block in converted if block is not None]
        if not blocks:
            continue
        if out and out[-1]["role"] == message["role"]:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": message["role"], "content": blocks})
    if out and out[-1]["role"] == "assistant":
        texts = [block for block in out[-1]["content"] if block["type"] == "text"]
        if texts:
            texts[-1]["text"] = texts[-1]["text"].rstrip()
    return out


def any_blocks_left(params: dict[str, Any]) -> bool:
    return any(
        block["type"] != "text" or block["text"].strip()
        for message in params["messages"]
        for block in blocks_of(message["content"])
    )


def check_rewrites(mapping: dict[str, str], legal: str, reverse: dict[str, str]) -> None:
    """Claude-side values are legal and distinct, legal originals are kept, `reverse` undoes the rest."""
    assert all(re.fullmatch(legal, value) for value in mapping.values())
    assert len(set(mapping.values())) == len(mapping)
    for original, claude in mapping.items():
        if re.fullmatch(legal, original):
            assert claude == original
    assert reverse == {claude: original for original, claude in mapping.items() if claude != original}


# --- MCP -> Claude --------------------------------------------------------------------------------


@given(sampling_requests())
def test_request_keeps_content_and_order_and_rewrites_reversibly(params: dict[str, Any]) -> None:
    if not any_blocks_left(params):
        with pytest.raises(SamplingError, match="nothing left to send"):
            to_claude_request(params, OPTIONS)
        return
    request = to_claude_request(params, OPTIONS)
    names = name_map(params, request)
    ids = id_map(params, request)
    check_rewrites(names, LEGAL_NAME, request.tool_names)
    check_rewrites(ids, LEGAL_ID, request.tool_ids)
    assert request.kwargs["messages"] == expected_messages(params, names, ids)
    roles = [message["role"] for message in request.kwargs["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles))
    assert request.has_tools == has_tools(params)


@given(st.lists(TEXTS.filter(str.strip), min_size=1, max_size=4), st.booleans())
def test_only_a_final_assistant_turn_loses_trailing_whitespace(texts: list[str], final: bool) -> None:
    """The API refuses a prefill that ends in whitespace; nothing else is touched."""
    messages = [
        {"role": "user", "content": text_block("q")},
        {"role": "assistant", "content": [text_block(text) for text in texts]},
    ]
    if not final:
        messages.append({"role": "user", "content": text_block("more")})
    sent = to_claude_request({"messages": messages, "maxTokens": 5}, OPTIONS).kwargs["messages"][1]["content"]
    expected = [*texts[:-1], texts[-1].rstrip() if final else texts[-1]]
    assert sent == [text_block(text) for text in expected]


@given(st.lists(TEXTS, max_size=4))
def test_only_stop_sequences_with_non_whitespace_are_sent(stops: list[str]) -> None:
    """The API refuses an empty or whitespace-only stop sequence (400); the others keep their order."""
    params = {
        "messages": [{"role": "user", "content": text_block("q")}],
        "maxTokens": 5,
        "stopSequences": stops,
    }
    kwargs = to_claude_request(params, OPTIONS).kwargs
    assert kwargs.get("stop_sequences", []) == [stop for stop in stops if stop.strip()]


@given(tool_name_lists(min_size=1, max_size=25))
def test_tool_names_are_rewritten_legal_distinct_and_reversible(names: list[str]) -> None:
    request = to_claude_request(
        {
            "messages": [{"role": "user", "content": text_block("go")}],
            "maxTokens": 10,
            "tools": [{"name": n} for n in names],
        },
        OPTIONS,
    )
    claude_names = [tool["name"] for tool in request.kwargs["tools"]]
    check_rewrites(dict(zip(names, claude_names, strict=True)), LEGAL_NAME, request.tool_names)
    # Claude calls every tool once: the MCP result names the original tools, in the same order.
    answer = {
        "content": [
            {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {}}
            for i, name in enumerate(claude_names)
        ],
        "stop_reason": "tool_use",
    }
    result = to_mcp_result(answer, request)
    assert [block["name"] for block in result["content"]] == names


@given(tool_id_lists(min_size=1, max_size=12), TOOL_NAMES)
def test_parallel_tool_use_ids_are_rewritten_legal_distinct_and_reversible(ids: list[str], name: str) -> None:
    params = {
        "messages": [
            {"role": "user", "content": text_block("go")},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": i, "name": name, "input": {}} for i in ids],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "toolUseId": i, "content": []} for i in reversed(ids)],
            },
        ],
        "maxTokens": 10,
        "tools": [{"name": name}],
    }
    request = to_claude_request(params, OPTIONS)
    claude_uses = [block["id"] for block in request.kwargs["messages"][1]["content"]]
    claude_results = [block["tool_use_id"] for block in request.kwargs["messages"][2]["content"]]
    check_rewrites(dict(zip(ids, claude_uses, strict=True)), LEGAL_ID, request.tool_ids)
    assert claude_results == claude_uses[::-1]
    answer = {"content": [{"type": "tool_use", "id": i, "name": name, "input": {}} for i in claude_uses]}
    assert [block["id"] for block in to_mcp_result(answer, request)["content"]] == ids


@given(TOOL_NAMES, st.integers(0, 3))
def test_sanitise_is_deterministic_and_legal(value: str, attempt: int) -> None:
    name = sanitize_tool_name(value, attempt)
    assert name == sanitize_tool_name(value, attempt)
    assert re.fullmatch(LEGAL_NAME, name)
    assert (name == value) == (attempt == 0 and re.fullmatch(LEGAL_NAME, value) is not None)
    tool_id = sanitize_tool_id(value, attempt)
    assert tool_id == sanitize_tool_id(value, attempt)
    assert re.fullmatch(LEGAL_ID, tool_id)
    assert (tool_id == value) == (attempt == 0 and re.fullmatch(LEGAL_ID, value) is not None)


# --- Claude -> MCP --------------------------------------------------------------------------------


@given(sampling_requests(), st.data())
def test_answer_round_trips_to_original_names_and_ids(params: dict[str, Any], data: st.DataObject) -> None:
    if not any_blocks_left(params):
        return
    request = to_claude_request(params, OPTIONS)
    names = name_map(params, request)
    original_name = {claude: original for original, claude in names.items()}
    ids = id_map(params, request)
    claude_ids = set(ids.values())
    fresh_ids = st.from_regex(r"toolu_[a-zA-Z0-9]{4,24}", fullmatch=True).filter(
        lambda i: i not in claude_ids
    )
    seen_ids = {claude: original for original, claude in ids.items()}

    claude_content: list[dict[str, Any]] = []
    mcp_content: list[dict[str, Any]] = []  # what a server with tools must get back
    dropped: list[str] = []
    # Claude may call only the tools the request offers (a placeholder's call is refused: its own test).
    offered = sorted(name for name in original_name if name not in request.placeholders)
    kinds = ["text", "thinking"] + (["tool_use"] if offered else [])
    for kind in data.draw(st.lists(st.sampled_from(kinds), max_size=6), label="kinds"):
        if kind == "text":
            text = data.draw(TEXTS)
            claude_content.append(text_block(text))
            mcp_content.append(text_block(text))
        elif kind == "thinking":
            claude_content.append({"type": "thinking", "thinking": "hmm", "signature": "sig"})
            dropped.append("thinking")
        else:
            name = data.draw(st.sampled_from(offered))
            tool_id = data.draw(st.sampled_from(sorted(claude_ids)) | fresh_ids if claude_ids else fresh_ids)
            tool_input = data.draw(st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
            claude_content.append({"type": "tool_use", "id": tool_id, "name": name, "input": tool_input})
            mcp_content.append(
                {
                    "type": "tool_use",
                    "id": seen_ids.get(tool_id, tool_id),
                    "name": original_name[name],
                    "input": tool_input,
                }
            )
            if not request.has_tools:
                dropped.append("tool_use")
    stop_reason = data.draw(STOP_REASONS, label="stop_reason")
    answer = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": claude_content,
        "stop_reason": stop_reason,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }

    result = to_mcp_result(answer, request)

    assert result["role"] == "assistant"
    if request.has_tools:
        assert result["content"] == (mcp_content or [text_block("")])
        CreateMessageResultWithTools.model_validate(result)
    else:
        texts = "".join(block["text"] for block in mcp_content if block["type"] == "text")
        assert result["content"] == text_block(texts)
        CreateMessageResult.model_validate(result)
    if stop_reason is None:
        assert "stopReason" not in result
    else:
        assert result["stopReason"] == KNOWN_STOP_REASONS.get(stop_reason, stop_reason)
    assert result["_meta"][META_KEY].get("dropped_block_types", []) == list(dict.fromkeys(dropped))


@given(st.lists(st.sampled_from(["text", "tool_use", "thinking"]), max_size=6), st.data())
def test_answer_without_tools_is_one_text_block(kinds: list[str], data: st.DataObject) -> None:
    """A server that offered no tools gets exactly one block: Claude's texts joined, in order."""
    request = to_claude_request(
        {"messages": [{"role": "user", "content": text_block("hi")}], "maxTokens": 5}, OPTIONS
    )
    content: list[dict[str, Any]] = []
    texts: list[str] = []
    for kind in kinds:
        if kind == "text":
            texts.append(data.draw(TEXTS))
            content.append(text_block(texts[-1]))
        elif kind == "tool_use":
            content.append({"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}})
        else:
            content.append({"type": "thinking", "thinking": "hmm", "signature": "sig"})
    result = to_mcp_result({"content": content, "stop_reason": "end_turn"}, request)
    assert result["content"] == text_block("".join(texts))
    assert result["_meta"][META_KEY].get("dropped_block_types", []) == [
        kind for kind in dict.fromkeys(kinds) if kind != "text"
    ]
    CreateMessageResult.model_validate(result)


@given(STOP_REASONS)
def test_stop_reasons_map_as_promised(stop_reason: str | None) -> None:
    mapped = map_stop_reason(stop_reason)
    if stop_reason is None:
        assert mapped is None
    elif stop_reason in KNOWN_STOP_REASONS:
        assert mapped == KNOWN_STOP_REASONS[stop_reason]
    else:
        assert mapped == stop_reason


# --- found by these properties, and fixed ----------------------------------------------------------

LONE_SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
WITH_LONE_SURROGATE = st.builds(
    lambda a, s, b: a + s + b, st.text(max_size=4), LONE_SURROGATES, st.text(max_size=4)
)


@given(WITH_LONE_SURROGATE)
def test_tool_name_with_lone_surrogate_round_trips(name: str) -> None:
    params = {
        "messages": [{"role": "user", "content": text_block("go")}],
        "maxTokens": 10,
        "tools": [{"name": name}],
    }
    request = to_claude_request(params, OPTIONS)
    claude_name = request.kwargs["tools"][0]["name"]
    answer = {"content": [{"type": "tool_use", "id": "toolu_1", "name": claude_name, "input": {}}]}
    assert to_mcp_result(answer, request)["content"][0]["name"] == name


@given(WITH_LONE_SURROGATE)
def test_tool_use_id_with_lone_surrogate_round_trips(tool_id: str) -> None:
    params = {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": tool_id, "name": "t", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "toolUseId": tool_id, "content": []}]},
        ],
        "maxTokens": 10,
        "tools": [{"name": "t"}],
    }
    request = to_claude_request(params, OPTIONS)
    claude_id = request.kwargs["messages"][0]["content"][0]["id"]
    answer = {"content": [{"type": "tool_use", "id": claude_id, "name": "t", "input": {}}]}
    assert to_mcp_result(answer, request)["content"][0]["id"] == tool_id


@given(st.integers(1_100, 3_000))
def test_deeply_nested_tool_output_text_converts(depth: int) -> None:
    result = {
        "type": "tool_result",
        "toolUseId": "a",
        "content": [text_block("[" * depth + "]" * depth)],
        "structuredContent": {"ok": True},
    }
    params = {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "t", "input": {}}]},
            {"role": "user", "content": [result]},
        ],
        "maxTokens": 10,
    }
    converted = to_claude_request(params, OPTIONS).kwargs["messages"][1]["content"][0]["content"]
    assert [block["type"] for block in converted] == ["text", "text"]
